//! A Hugging Face Whisper checkpoint opened once ([`Checkpoint`]): `config.json` is read when
//! it is opened; the generation config, the tokenizer, the mel filter bank and the weights
//! the first time an export asks for them, and kept — so a whole conversion reads each file
//! at most once ([`super::file_reads`] counts), and a part that needs no weights (the mel
//! spectrogram) or no generation config (the encoder) reads none. Like candle's VarBuilder,
//! the opened checkpoint is what the exporters take.
//!
//! Also what fine-tuned and distilled checkpoints lack or get wrong, made usable at export: a
//! missing `generation_config.json` is derived from `config.json` and `tokenizer.json` (with
//! a warning), and alignment heads past the decoder's layers (distilled models copy their
//! teacher's) are dropped with a warning naming them. Warnings go to stderr once per
//! checkpoint directory and message.

use super::audio::MelFilters;
use super::config::{GenerationConfig, TokenIds, WhisperConfig, LANGUAGES};
use super::synth_tokenizer::synth_tokenizer_json;
use super::tokenizer::Tokenizer;
use super::weights::{Component, WhisperWeights};
use anyhow::{Context, Result};
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// Prints `msg` as a warning, once per process.
pub fn warn_once(msg: &str) {
    static SEEN: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if seen
        .get_or_insert_with(HashSet::new)
        .insert(msg.to_string())
    {
        eprintln!("warning: {msg}");
    }
}

/// The value in `cell`, loaded by `load` the first time. A failed load is not kept (the
/// conversion stops on it anyway).
fn once<T>(cell: &OnceLock<T>, load: impl FnOnce() -> Result<T>) -> Result<&T> {
    if let Some(v) = cell.get() {
        return Ok(v);
    }
    let v = load()?;
    Ok(cell.get_or_init(|| v))
}

/// A Hugging Face Whisper checkpoint directory, each of its files read at most once.
pub struct Checkpoint {
    dir: PathBuf,
    config: WhisperConfig,
    generation: OnceLock<GenerationConfig>,
    tokenizer: OnceLock<Option<Tokenizer>>,
    mel_filters: OnceLock<MelFilters>,
    weights: OnceLock<WhisperWeights>,
}

impl Checkpoint {
    /// Opens a checkpoint directory: reads and validates its `config.json`. The other files
    /// are read when first needed.
    pub fn open(dir: &Path) -> Result<Checkpoint> {
        let config_path = super::weights::config_path(dir)?;
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            config: WhisperConfig::from_file(&config_path)?,
            generation: OnceLock::new(),
            tokenizer: OnceLock::new(),
            mel_filters: OnceLock::new(),
            weights: OnceLock::new(),
        })
    }

    /// The checkpoint directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `config.json`.
    pub fn config(&self) -> &WhisperConfig {
        &self.config
    }

    /// The directory's name (not its full path, so outputs don't depend on where the
    /// checkpoint lives): the `milkit.source` of every exported model.
    pub fn source_name(&self) -> String {
        self.dir
            .canonicalize()
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| self.dir.display().to_string())
    }

    /// The tensors (see [`WhisperWeights::open_weights`]).
    pub fn weights(&self) -> Result<&WhisperWeights> {
        once(&self.weights, || WhisperWeights::open_weights(&self.dir))
    }

    /// The tensors, checked to hold every tensor `component` needs, shaped as config.json says.
    pub fn checked_weights(&self, component: Component) -> Result<&WhisperWeights> {
        let w = self.weights()?;
        w.check(&self.config, component)?;
        Ok(w)
    }

    /// `tokenizer.json`, when the checkpoint has one.
    pub fn tokenizer(&self) -> Result<Option<&Tokenizer>> {
        let t = once(&self.tokenizer, || {
            let p = self.dir.join("tokenizer.json");
            p.is_file().then(|| Tokenizer::from_file(&p)).transpose()
        })?;
        Ok(t.as_ref())
    }

    /// Whether the directory has its own `generation_config.json`.
    pub fn has_generation_file(&self) -> bool {
        self.dir.join("generation_config.json").is_file()
    }

    /// `generation_config.json` when it exists, else (with a warning)
    /// [`derived_generation_config`] from config.json and tokenizer.json (or, without a
    /// tokenizer, the standard Whisper layout of the vocabulary).
    pub fn generation(&self) -> Result<&GenerationConfig> {
        once(&self.generation, || {
            let p = self.dir.join("generation_config.json");
            if p.exists() {
                return GenerationConfig::from_file(&p);
            }
            let cfg = &self.config;
            let layout;
            let (tok, from) = match self.tokenizer()? {
                Some(t) => (t, "config.json and tokenizer.json"),
                None => {
                    let json = synth_tokenizer_json(cfg, None).with_context(|| {
                        format!(
                            "{}: no generation_config.json and no tokenizer.json to derive one from",
                            self.dir.display()
                        )
                    })?;
                    layout = Tokenizer::from_json(&json.to_string())?;
                    (&layout, "config.json and the standard Whisper token layout")
                }
            };
            warn_once(&format!(
                "{}: no generation_config.json; using defaults derived from {from} (no \
                 alignment heads, so no word timestamps; copy the base model's \
                 generation_config.json for them)",
                self.dir.display()
            ));
            Ok(derived_generation_config(cfg, tok))
        })
    }

    /// Whether the checkpoint is multilingual (has language tokens), by its generation config.
    pub fn is_multilingual(&self) -> Result<bool> {
        let g = self.generation()?;
        Ok(g.is_multilingual != Some(false) && g.lang_to_id.is_some())
    }

    /// The alignment heads of the checkpoint that exist in its decoder; those past its layers
    /// or heads are dropped with a warning naming them. Empty when there are none at all.
    pub fn alignment_heads(&self) -> Result<Vec<(usize, usize)>> {
        let cfg = &self.config;
        let (kept, dropped) = self.generation()?.split_alignment_heads(cfg);
        if !dropped.is_empty() {
            let list = |v: &[[usize; 2]]| {
                v.iter()
                    .map(|[l, h]| format!("[{l}, {h}]"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let consequence = if kept.is_empty() {
                "no alignment heads remain: the text decoder has no alignment_heads_weights \
                 output and transcripts get no word timestamps"
                    .to_string()
            } else {
                format!("{} kept", kept.len())
            };
            warn_once(&format!(
                "{}/generation_config.json: dropping alignment heads {} past the decoder's {} \
                 layers x {} heads (copied from a larger model?); {consequence}",
                self.dir.display(),
                list(&dropped),
                cfg.decoder_layers,
                cfg.decoder_attention_heads
            ));
        }
        Ok(kept.into_iter().map(|[l, h]| (l, h)).collect())
    }

    /// The `generation_config.json` a models folder gets when it is not the checkpoint's file
    /// as it is: the derived one when the checkpoint has none, or the checkpoint's with only
    /// the alignment heads the decoder has. `None`: copy the file unchanged.
    pub fn folder_generation_json(&self) -> Result<Option<serde_json::Value>> {
        let exists = self.has_generation_file();
        let g = self.generation()?;
        let Some(before) = g.alignment_heads.as_ref().map(Vec::len) else {
            return Ok((!exists).then(|| g.to_json()));
        };
        let kept = self.alignment_heads()?;
        if exists && kept.len() == before {
            return Ok(None);
        }
        let g = GenerationConfig {
            alignment_heads: Some(kept.iter().map(|&(l, h)| [l, h]).collect()),
            ..g.clone()
        };
        Ok(Some(g.to_json()))
    }

    /// The mel filter bank: `mel_filters` of preprocessor_config.json when present, else
    /// the Slaney bank with config.json's `num_mel_bins` bands.
    pub fn mel_filters(&self) -> Result<&MelFilters> {
        once(&self.mel_filters, || {
            super::mel::model_filters(&self.dir, &self.config)
        })
    }
}

/// The generation config Hugging Face would use for `cfg` when a checkpoint has none: token
/// ids from config.json, the special tokens (language, task, timestamps) looked up in the
/// tokenizer, no alignment heads (so no word timestamps). Multilingual when the vocabulary
/// has 51,865 tokens or more, as in Hugging Face.
pub fn derived_generation_config(cfg: &WhisperConfig, tok: &Tokenizer) -> GenerationConfig {
    let multilingual = cfg.vocab_size >= 51865;
    let id = |t: &str| tok.token_id(t);
    let lang_to_id: BTreeMap<String, u32> = LANGUAGES
        .iter()
        .filter_map(|c| {
            let t = format!("<|{c}|>");
            id(&t).map(|i| (t, i))
        })
        .collect();
    let task_to_id: BTreeMap<String, u32> = ["translate", "transcribe"]
        .iter()
        .filter_map(|t| id(&format!("<|{t}|>")).map(|i| (t.to_string(), i)))
        .collect();
    let no_ts = id("<|notimestamps|>");
    let forced = if multilingual {
        vec![(1, None), (2, task_to_id.get("transcribe").copied())]
    } else {
        vec![(1, no_ts)]
    };
    GenerationConfig {
        alignment_heads: None,
        forced_decoder_ids: Some(forced),
        suppress_tokens: Some(cfg.suppress_tokens.clone()),
        begin_suppress_tokens: Some(cfg.begin_suppress_tokens.clone()),
        no_timestamps_token_id: no_ts,
        bos_token_id: Some(cfg.bos_token_id),
        eos_token_id: Some(TokenIds::One(cfg.eos_token_id)),
        pad_token_id: Some(cfg.pad_token_id),
        decoder_start_token_id: Some(cfg.decoder_start_token_id),
        prev_sot_token_id: id("<|startofprev|>"),
        max_initial_timestamp_index: Some(50),
        max_length: Some(cfg.max_target_positions),
        is_multilingual: Some(multilingual),
        return_timestamps: Some(false),
        lang_to_id: (multilingual && !lang_to_id.is_empty()).then_some(lang_to_id),
        task_to_id: (multilingual && !task_to_id.is_empty()).then_some(task_to_id),
        other: BTreeMap::new(),
    }
}

/// The set of files a single package needs is config.json and the weights; a folder also
/// needs the tokenizer. The error for a checkpoint without one, with the fix.
pub fn missing_tokenizer_error(model_dir: &Path) -> anyhow::Error {
    anyhow::anyhow!(
        "{}: missing tokenizer.json, which the models folder must contain (transcription \
         decodes tokens with it); copy the tokenizer.json of the model this checkpoint was \
         fine-tuned from (the same vocabulary), or export single packages with --component \
         encoder|decoder, which need none",
        model_dir.display()
    )
}
