//! Whisper model and generation configuration: `config.json` and `generation_config.json` in
//! Hugging Face's key names, their validation, and the dimensions of the released models
//! (`Preset`) that synthetic checkpoints are built from.

use anyhow::{bail, ensure, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// The model hyper-parameters milkit needs from a Hugging Face `config.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct WhisperConfig {
    pub d_model: usize,
    pub encoder_layers: usize,
    pub decoder_layers: usize,
    pub encoder_attention_heads: usize,
    pub decoder_attention_heads: usize,
    pub encoder_ffn_dim: usize,
    pub decoder_ffn_dim: usize,
    pub num_mel_bins: usize,
    pub vocab_size: usize,
    pub max_source_positions: usize,
    pub max_target_positions: usize,
    pub activation_function: String,
    pub scale_embedding: bool,
    pub tie_word_embeddings: bool,
    pub bos_token_id: u32,
    pub eos_token_id: u32,
    pub pad_token_id: u32,
    pub decoder_start_token_id: u32,
    pub suppress_tokens: Vec<u32>,
    pub begin_suppress_tokens: Vec<u32>,
}

/// `config.json` as written, every key optional so that a missing key gets our own message
/// (serde's "missing field" names neither the file nor what the key is for).
#[derive(Deserialize)]
struct RawConfig {
    d_model: Option<usize>,
    encoder_layers: Option<usize>,
    decoder_layers: Option<usize>,
    encoder_attention_heads: Option<usize>,
    decoder_attention_heads: Option<usize>,
    encoder_ffn_dim: Option<usize>,
    decoder_ffn_dim: Option<usize>,
    num_mel_bins: Option<usize>,
    vocab_size: Option<usize>,
    max_source_positions: Option<usize>,
    max_target_positions: Option<usize>,
    activation_function: Option<String>,
    scale_embedding: Option<bool>,
    tie_word_embeddings: Option<bool>,
    bos_token_id: Option<u32>,
    eos_token_id: Option<u32>,
    pad_token_id: Option<u32>,
    decoder_start_token_id: Option<u32>,
    suppress_tokens: Option<Vec<u32>>,
    begin_suppress_tokens: Option<Vec<u32>>,
}

fn required(v: Option<usize>, key: &str) -> Result<usize> {
    v.with_context(|| format!("missing key \"{key}\" (a required model dimension)"))
}

impl WhisperConfig {
    /// Reads and validates `config.json`. Every error names the file.
    pub fn from_file(path: &Path) -> Result<WhisperConfig> {
        super::file_reads::note(path);
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read model config {}", path.display()))?;
        Self::from_json_str(&text).with_context(|| format!("model config {}", path.display()))
    }

    /// Parses and validates the text of a `config.json`. The dimension keys are required;
    /// the others fall back to the defaults of Hugging Face's `WhisperConfig`.
    pub fn from_json_str(text: &str) -> Result<WhisperConfig> {
        let raw: RawConfig = serde_json::from_str(text).context("malformed JSON")?;
        let cfg = WhisperConfig {
            d_model: required(raw.d_model, "d_model")?,
            encoder_layers: required(raw.encoder_layers, "encoder_layers")?,
            decoder_layers: required(raw.decoder_layers, "decoder_layers")?,
            encoder_attention_heads: required(
                raw.encoder_attention_heads,
                "encoder_attention_heads",
            )?,
            decoder_attention_heads: required(
                raw.decoder_attention_heads,
                "decoder_attention_heads",
            )?,
            encoder_ffn_dim: required(raw.encoder_ffn_dim, "encoder_ffn_dim")?,
            decoder_ffn_dim: required(raw.decoder_ffn_dim, "decoder_ffn_dim")?,
            num_mel_bins: required(raw.num_mel_bins, "num_mel_bins")?,
            vocab_size: required(raw.vocab_size, "vocab_size")?,
            max_source_positions: raw.max_source_positions.unwrap_or(1500),
            max_target_positions: raw.max_target_positions.unwrap_or(448),
            activation_function: raw.activation_function.unwrap_or_else(|| "gelu".into()),
            scale_embedding: raw.scale_embedding.unwrap_or(false),
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(true),
            bos_token_id: raw.bos_token_id.unwrap_or(50256),
            eos_token_id: raw.eos_token_id.unwrap_or(50256),
            pad_token_id: raw.pad_token_id.unwrap_or(50256),
            decoder_start_token_id: raw.decoder_start_token_id.unwrap_or(50257),
            suppress_tokens: raw.suppress_tokens.unwrap_or_default(),
            begin_suppress_tokens: raw
                .begin_suppress_tokens
                .unwrap_or_else(|| vec![220, 50256]),
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks the invariants the graph builders rely on.
    pub fn validate(&self) -> Result<()> {
        for (key, v) in [
            ("d_model", self.d_model),
            ("encoder_layers", self.encoder_layers),
            ("decoder_layers", self.decoder_layers),
            ("encoder_attention_heads", self.encoder_attention_heads),
            ("decoder_attention_heads", self.decoder_attention_heads),
            ("encoder_ffn_dim", self.encoder_ffn_dim),
            ("decoder_ffn_dim", self.decoder_ffn_dim),
            ("num_mel_bins", self.num_mel_bins),
            ("vocab_size", self.vocab_size),
            ("max_source_positions", self.max_source_positions),
            ("max_target_positions", self.max_target_positions),
        ] {
            ensure!(v > 0, "\"{key}\" must be positive, got 0");
        }
        // Sane caps on the sizes that shape allocations before any tensor is read (the mel
        // filter bank, position tables, vocabulary-sized buffers): each far above any Whisper
        // (large-v3: d_model 1280, ffn 5120, 128 mel bins, 51866 tokens). Layer counts are
        // checked against the tensors present instead (`WhisperWeights::check`).
        for (key, v, cap) in [
            ("d_model", self.d_model, 1 << 16),
            ("encoder_ffn_dim", self.encoder_ffn_dim, 1 << 20),
            ("decoder_ffn_dim", self.decoder_ffn_dim, 1 << 20),
            ("num_mel_bins", self.num_mel_bins, 1 << 12),
            ("vocab_size", self.vocab_size, 1 << 24),
            ("max_source_positions", self.max_source_positions, 1 << 20),
            ("max_target_positions", self.max_target_positions, 1 << 20),
        ] {
            ensure!(
                v <= cap,
                "\"{key}\" = {v} is implausibly large (at most {cap} accepted)"
            );
        }
        for (key, heads) in [
            ("encoder_attention_heads", self.encoder_attention_heads),
            ("decoder_attention_heads", self.decoder_attention_heads),
        ] {
            ensure!(
                self.d_model.is_multiple_of(heads),
                "d_model {} is not divisible by {key} {heads}",
                self.d_model
            );
        }
        // Whisper uses exact (erf) GELU; "gelu_new"/"relu" would need other graphs.
        ensure!(
            self.activation_function == "gelu",
            "activation_function \"{}\" is not supported (Whisper uses \"gelu\")",
            self.activation_function
        );
        for (key, id) in [
            ("bos_token_id", self.bos_token_id),
            ("eos_token_id", self.eos_token_id),
            ("pad_token_id", self.pad_token_id),
            ("decoder_start_token_id", self.decoder_start_token_id),
        ] {
            ensure!(
                (id as usize) < self.vocab_size,
                "{key} {id} is outside the vocabulary of {} tokens",
                self.vocab_size
            );
        }
        Ok(())
    }

    /// Per-head width of the encoder attention.
    pub fn encoder_head_dim(&self) -> usize {
        self.d_model / self.encoder_attention_heads
    }

    /// Per-head width of the decoder attention.
    pub fn decoder_head_dim(&self) -> usize {
        self.d_model / self.decoder_attention_heads
    }

    /// Mel frames the encoder consumes: conv2 has stride 2, so twice the source positions.
    pub fn n_audio_frames(&self) -> usize {
        2 * self.max_source_positions
    }

    /// The `config.json` Hugging Face would write for this model.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "architectures": ["WhisperForConditionalGeneration"],
            "model_type": "whisper",
            "activation_function": self.activation_function,
            "activation_dropout": 0.0,
            "attention_dropout": 0.0,
            "dropout": 0.0,
            "init_std": 0.02,
            "encoder_layerdrop": 0.0,
            "decoder_layerdrop": 0.0,
            "scale_embedding": self.scale_embedding,
            "use_cache": true,
            "is_encoder_decoder": true,
            "tie_word_embeddings": self.tie_word_embeddings,
            "num_hidden_layers": self.encoder_layers,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "pad_token_id": self.pad_token_id,
            "decoder_start_token_id": self.decoder_start_token_id,
            "suppress_tokens": self.suppress_tokens,
            "begin_suppress_tokens": self.begin_suppress_tokens,
            "d_model": self.d_model,
            "encoder_layers": self.encoder_layers,
            "decoder_layers": self.decoder_layers,
            "encoder_attention_heads": self.encoder_attention_heads,
            "decoder_attention_heads": self.decoder_attention_heads,
            "encoder_ffn_dim": self.encoder_ffn_dim,
            "decoder_ffn_dim": self.decoder_ffn_dim,
            "num_mel_bins": self.num_mel_bins,
            "vocab_size": self.vocab_size,
            "max_source_positions": self.max_source_positions,
            "max_target_positions": self.max_target_positions,
        })
    }
}

/// `eos_token_id` is an int in Whisper's files, but Hugging Face allows a list.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum TokenIds {
    One(u32),
    Many(Vec<u32>),
}

impl TokenIds {
    /// The first id (the one Whisper's decoding loop stops on).
    pub fn first(&self) -> Option<u32> {
        match self {
            TokenIds::One(id) => Some(*id),
            TokenIds::Many(ids) => ids.first().copied(),
        }
    }
}

/// `generation_config.json`: decoding defaults. Every key is optional, as in Hugging Face.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct GenerationConfig {
    /// `[decoder layer, head]` pairs whose cross-attention follows the audio (for timestamps).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alignment_heads: Option<Vec<[usize; 2]>>,
    /// `[position, token]`; a `null` token (the language slot) is left to the decoder.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forced_decoder_ids: Option<Vec<(usize, Option<u32>)>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suppress_tokens: Option<Vec<u32>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub begin_suppress_tokens: Option<Vec<u32>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_timestamps_token_id: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bos_token_id: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eos_token_id: Option<TokenIds>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pad_token_id: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decoder_start_token_id: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prev_sot_token_id: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_initial_timestamp_index: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_length: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub is_multilingual: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub return_timestamps: Option<bool>,
    /// `"<|en|>" → id`; only multilingual models have it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lang_to_id: Option<BTreeMap<String, u32>>,
    /// `"transcribe"/"translate" → id`; only multilingual models have it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_to_id: Option<BTreeMap<String, u32>>,
    /// Every other key of the file, kept as it is, so that a models folder's rewritten copy
    /// (alignment heads dropped) loses nothing.
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

impl GenerationConfig {
    /// Reads `generation_config.json`. Errors name the file.
    pub fn from_file(path: &Path) -> Result<GenerationConfig> {
        super::file_reads::note(path);
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read generation config {}", path.display()))?;
        serde_json::from_str(&text)
            .with_context(|| format!("generation config {}: malformed JSON", path.display()))
    }

    /// Reads `dir/generation_config.json` when the file exists.
    pub fn from_dir(dir: &Path) -> Result<Option<GenerationConfig>> {
        let path = dir.join("generation_config.json");
        if !path.exists() {
            return Ok(None);
        }
        Self::from_file(&path).map(Some)
    }

    /// Checks the ids against the model: every token inside the vocabulary. Alignment heads
    /// outside the decoder are not an error here (distilled models copy their teacher's):
    /// [`GenerationConfig::split_alignment_heads`] tells them apart, and the export drops
    /// them with a warning.
    pub fn validate(&self, cfg: &WhisperConfig) -> Result<()> {
        let mut ids: Vec<u32> = Vec::new();
        ids.extend(
            self.forced_decoder_ids
                .iter()
                .flatten()
                .filter_map(|(_, t)| *t),
        );
        ids.extend(self.suppress_tokens.iter().flatten());
        ids.extend(self.begin_suppress_tokens.iter().flatten());
        ids.extend(self.no_timestamps_token_id);
        ids.extend(self.decoder_start_token_id);
        ids.extend(self.eos_token_id.as_ref().and_then(TokenIds::first));
        ids.extend(self.lang_to_id.iter().flat_map(|m| m.values()));
        ids.extend(self.task_to_id.iter().flat_map(|m| m.values()));
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= cfg.vocab_size) {
            bail!(
                "token id {bad} is outside the vocabulary of {} tokens",
                cfg.vocab_size
            );
        }
        Ok(())
    }

    /// The alignment heads inside a decoder of `cfg`'s layers and heads, and those outside
    /// it (as `[layer, head]`, in file order).
    pub fn split_alignment_heads(&self, cfg: &WhisperConfig) -> (Vec<[usize; 2]>, Vec<[usize; 2]>) {
        self.alignment_heads
            .iter()
            .flatten()
            .copied()
            .partition(|&[l, h]| l < cfg.decoder_layers && h < cfg.decoder_attention_heads)
    }

    pub fn to_json(&self) -> serde_json::Value {
        // Serialising plain data into a Value cannot fail.
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }
}

/// The released multilingual Whisper models, by the dimensions of their checkpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Preset {
    Tiny,
    Base,
    Small,
    Medium,
    LargeV3,
    LargeV3Turbo,
    /// distil-whisper/distil-large-v3: large-v3's encoder, 2 decoder layers, and the
    /// teacher's generation config (alignment heads in layers it does not have).
    DistilLargeV3,
}

/// Whisper language codes in token order (`<|en|>` is the first language token). v3 added
/// Cantonese at the end, which shifts every special token after the languages by one.
pub const LANGUAGES: [&str; 100] = [
    "en", "zh", "de", "es", "ru", "ko", "fr", "ja", "pt", "tr", "pl", "ca", "nl", "ar", "sv", "it",
    "id", "hi", "fi", "vi", "he", "uk", "el", "ms", "cs", "ro", "da", "hu", "ta", "no", "th", "ur",
    "hr", "bg", "lt", "la", "mi", "ml", "cy", "sk", "te", "fa", "lv", "bn", "sr", "az", "sl", "kn",
    "et", "mk", "br", "eu", "is", "hy", "ne", "mn", "bs", "kk", "sq", "sw", "gl", "mr", "pa", "si",
    "km", "sn", "yo", "so", "af", "oc", "ka", "be", "tg", "sd", "gu", "am", "yi", "lo", "uz", "fo",
    "ht", "ps", "tk", "nn", "mt", "sa", "lb", "my", "bo", "tl", "mg", "as", "tt", "haw", "ln",
    "ha", "ba", "jw", "su", "yue",
];

/// Token ids of the special tokens of the multilingual vocabularies (51865 and 51866 tokens).
struct Specials {
    eot: u32,
    sot: u32,
    n_langs: u32,
    translate: u32,
    transcribe: u32,
    prev: u32,
    no_timestamps: u32,
}

impl Specials {
    fn multilingual(vocab_size: usize) -> Specials {
        let n_langs = if vocab_size >= 51866 { 100 } else { 99 };
        let translate = 50259 + n_langs;
        Specials {
            eot: 50257,
            sot: 50258,
            n_langs,
            translate,
            transcribe: translate + 1,
            prev: translate + 3,
            no_timestamps: translate + 5,
        }
    }
}

/// Non-speech symbols of the multilingual GPT-2 vocabulary that Whisper never emits; the
/// special-token tail is appended per vocabulary.
const SUPPRESS_TEXT: [u32; 82] = [
    1, 2, 7, 8, 9, 10, 14, 25, 26, 27, 28, 29, 31, 58, 59, 60, 61, 62, 63, 90, 91, 92, 93, 359,
    503, 522, 542, 873, 893, 902, 918, 922, 931, 1350, 1853, 1982, 2460, 2627, 3246, 3253, 3268,
    3536, 3846, 3961, 4183, 4667, 6585, 6647, 7273, 9061, 9383, 10428, 10929, 11938, 12033, 12331,
    12562, 13793, 14157, 14635, 15265, 15618, 16553, 16604, 18362, 18956, 20075, 21675, 22520,
    26130, 26161, 26435, 28279, 29464, 31650, 32302, 32470, 36865, 42863, 47425, 49870, 50254,
];

impl Preset {
    pub const ALL: [Preset; 7] = [
        Preset::Tiny,
        Preset::Base,
        Preset::Small,
        Preset::Medium,
        Preset::LargeV3,
        Preset::LargeV3Turbo,
        Preset::DistilLargeV3,
    ];

    /// The name used on the command line: tiny, base, small, medium, large-v3, large-v3-turbo.
    pub fn name(self) -> &'static str {
        match self {
            Preset::Tiny => "tiny",
            Preset::Base => "base",
            Preset::Small => "small",
            Preset::Medium => "medium",
            Preset::LargeV3 => "large-v3",
            Preset::LargeV3Turbo => "large-v3-turbo",
            Preset::DistilLargeV3 => "distil-large-v3",
        }
    }

    /// The model configuration, with the dimensions of the released checkpoint.
    pub fn config(self) -> WhisperConfig {
        // (d_model, encoder layers, decoder layers, heads, ffn, mels, vocab)
        let (d, enc, dec, heads, ffn, mels, vocab) = match self {
            Preset::Tiny => (384, 4, 4, 6, 1536, 80, 51865),
            Preset::Base => (512, 6, 6, 8, 2048, 80, 51865),
            Preset::Small => (768, 12, 12, 12, 3072, 80, 51865),
            Preset::Medium => (1024, 24, 24, 16, 4096, 80, 51865),
            Preset::LargeV3 => (1280, 32, 32, 20, 5120, 128, 51866),
            Preset::LargeV3Turbo => (1280, 32, 4, 20, 5120, 128, 51866),
            Preset::DistilLargeV3 => (1280, 32, 2, 20, 5120, 128, 51866),
        };
        let sp = Specials::multilingual(vocab);
        let mut suppress = SUPPRESS_TEXT.to_vec();
        // sot, translate, transcribe, startoflm, startofprev, nospeech.
        suppress.extend([
            sp.sot,
            sp.translate,
            sp.transcribe,
            sp.transcribe + 1,
            sp.prev,
            sp.prev + 1,
        ]);
        WhisperConfig {
            d_model: d,
            encoder_layers: enc,
            decoder_layers: dec,
            encoder_attention_heads: heads,
            decoder_attention_heads: heads,
            encoder_ffn_dim: ffn,
            decoder_ffn_dim: ffn,
            num_mel_bins: mels,
            vocab_size: vocab,
            max_source_positions: 1500,
            max_target_positions: 448,
            activation_function: "gelu".into(),
            scale_embedding: false,
            tie_word_embeddings: true,
            bos_token_id: sp.eot,
            eos_token_id: sp.eot,
            pad_token_id: sp.eot,
            decoder_start_token_id: sp.sot,
            suppress_tokens: suppress,
            begin_suppress_tokens: vec![220, sp.eot],
        }
    }

    /// The generation config of the released multilingual checkpoint (alignment heads as
    /// published for each model; language and task tables in token order).
    pub fn generation_config(self) -> GenerationConfig {
        let cfg = self.config();
        let sp = Specials::multilingual(cfg.vocab_size);
        let heads: &[[usize; 2]] = match self {
            Preset::Tiny => &[[2, 2], [3, 0], [3, 2], [3, 3], [3, 4], [3, 5]],
            Preset::Base => &[
                [3, 1],
                [4, 2],
                [4, 3],
                [4, 7],
                [5, 1],
                [5, 2],
                [5, 4],
                [5, 6],
            ],
            Preset::Small => &[
                [5, 3],
                [5, 9],
                [8, 0],
                [8, 4],
                [8, 7],
                [8, 8],
                [9, 0],
                [9, 7],
                [9, 9],
                [10, 5],
            ],
            Preset::Medium => &[[13, 15], [15, 4], [15, 15], [16, 1], [20, 0], [23, 4]],
            Preset::LargeV3 | Preset::DistilLargeV3 => &[
                [7, 0],
                [10, 17],
                [12, 18],
                [13, 12],
                [16, 1],
                [17, 14],
                [19, 11],
                [21, 4],
                [24, 1],
                [25, 6],
            ],
            Preset::LargeV3Turbo => &[[2, 4], [2, 11], [3, 3], [3, 6], [3, 11], [3, 14]],
        };
        let lang_to_id = LANGUAGES[..sp.n_langs as usize]
            .iter()
            .zip(sp.sot + 1..)
            .map(|(code, id)| (format!("<|{code}|>"), id))
            .collect();
        let task_to_id = [
            ("translate".to_string(), sp.translate),
            ("transcribe".to_string(), sp.transcribe),
        ]
        .into_iter()
        .collect();
        GenerationConfig {
            alignment_heads: Some(heads.to_vec()),
            // Position 1 (language) is left open, 2 is the task; as in Hugging Face's files.
            forced_decoder_ids: Some(vec![(1, None), (2, Some(sp.transcribe))]),
            suppress_tokens: Some(cfg.suppress_tokens.clone()),
            begin_suppress_tokens: Some(cfg.begin_suppress_tokens.clone()),
            no_timestamps_token_id: Some(sp.no_timestamps),
            bos_token_id: Some(sp.eot),
            eos_token_id: Some(TokenIds::One(sp.eot)),
            pad_token_id: Some(sp.eot),
            decoder_start_token_id: Some(sp.sot),
            prev_sot_token_id: Some(sp.prev),
            max_initial_timestamp_index: Some(50),
            max_length: Some(cfg.max_target_positions),
            is_multilingual: Some(true),
            return_timestamps: Some(false),
            lang_to_id: Some(lang_to_id),
            task_to_id: Some(task_to_id),
            other: BTreeMap::new(),
        }
    }
}

impl std::str::FromStr for Preset {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Preset> {
        Preset::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .with_context(|| {
                let names: Vec<_> = Preset::ALL.iter().map(|p| p.name()).collect();
                format!(
                    "unknown preset \"{s}\"; expected one of {}",
                    names.join(", ")
                )
            })
    }
}

impl std::fmt::Display for Preset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
