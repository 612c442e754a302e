//! What fine-tuned and distilled checkpoints lack or get wrong, made usable at export: a
//! missing `generation_config.json` is derived from `config.json` and `tokenizer.json` (with a
//! warning), and alignment heads past the decoder's layers (distilled models copy their
//! teacher's) are dropped with a warning naming them. Warnings go to stderr once per
//! checkpoint directory and message.

use super::config::{GenerationConfig, TokenIds, WhisperConfig, LANGUAGES};
use super::synth_tokenizer::synth_tokenizer_json;
use super::tokenizer::Tokenizer;
use anyhow::{Context, Result};
use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::Mutex;

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
    }
}

/// `generation_config.json` of a checkpoint as JSON: the file when it exists, else (with a
/// warning) [`derived_generation_config`] from config.json and tokenizer.json (or, without
/// a tokenizer, the standard Whisper layout of the vocabulary); `None` when config.json is
/// missing too.
pub fn generation_json(model_dir: &Path) -> Result<Option<serde_json::Value>> {
    let p = model_dir.join("generation_config.json");
    if p.exists() {
        let text =
            std::fs::read_to_string(&p).with_context(|| format!("cannot read {}", p.display()))?;
        return serde_json::from_str(&text)
            .map(Some)
            .with_context(|| format!("{}: malformed JSON", p.display()));
    }
    let cp = model_dir.join("config.json");
    if !cp.exists() {
        return Ok(None);
    }
    let cfg = WhisperConfig::from_file(&cp)?;
    let tp = model_dir.join("tokenizer.json");
    let (tok, from) = if tp.exists() {
        (Tokenizer::from_file(&tp)?, "config.json and tokenizer.json")
    } else {
        let layout = synth_tokenizer_json(&cfg, None).with_context(|| {
            format!(
                "{}: no generation_config.json and no tokenizer.json to derive one from",
                model_dir.display()
            )
        })?;
        (
            Tokenizer::from_json(&layout.to_string())?,
            "config.json and the standard Whisper token layout",
        )
    };
    warn_once(&format!(
        "{}: no generation_config.json; using defaults derived from {from} (no alignment \
         heads, so no word timestamps; copy the base model's generation_config.json for them)",
        model_dir.display()
    ));
    Ok(Some(derived_generation_config(&cfg, &tok).to_json()))
}

/// The alignment heads of a checkpoint that exist in its decoder; those past its layers or
/// heads are dropped with a warning naming them. None when there are no heads at all.
pub fn usable_alignment_heads(
    model_dir: &Path,
    cfg: &WhisperConfig,
) -> Result<Vec<(usize, usize)>> {
    let Some(g) = generation_json(model_dir)? else {
        return Ok(vec![]);
    };
    if g["alignment_heads"].is_null() {
        return Ok(vec![]);
    }
    let all = super::decoder::alignment_heads_from_json(&g["alignment_heads"])
        .with_context(|| format!("{}/generation_config.json", model_dir.display()))?;
    let gen = GenerationConfig {
        alignment_heads: Some(all.iter().map(|&(l, h)| [l, h]).collect()),
        ..Default::default()
    };
    let (kept, dropped) = gen.split_alignment_heads(cfg);
    if !dropped.is_empty() {
        let list = |v: &[[usize; 2]]| {
            v.iter()
                .map(|[l, h]| format!("[{l}, {h}]"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let consequence = if kept.is_empty() {
            "no alignment heads remain: the text decoder has no alignment_heads_weights output \
             and transcripts get no word timestamps"
                .to_string()
        } else {
            format!("{} kept", kept.len())
        };
        warn_once(&format!(
            "{}/generation_config.json: dropping alignment heads {} past the decoder's {} \
             layers x {} heads (copied from a larger model?); {consequence}",
            model_dir.display(),
            list(&dropped),
            cfg.decoder_layers,
            cfg.decoder_attention_heads
        ));
    }
    Ok(kept.into_iter().map(|[l, h]| (l, h)).collect())
}

/// The `generation_config.json` a models folder gets when it is not the checkpoint's file
/// as it is: the derived one when the checkpoint has none, or the checkpoint's with only the
/// alignment heads the decoder has. `None`: copy the file unchanged.
pub fn folder_generation_json(model_dir: &Path) -> Result<Option<serde_json::Value>> {
    let cfg = WhisperConfig::from_file(&model_dir.join("config.json"))?;
    let exists = model_dir.join("generation_config.json").is_file();
    let Some(mut g) = generation_json(model_dir)? else {
        return Ok(None);
    };
    if g["alignment_heads"].is_null() {
        return Ok((!exists).then_some(g));
    }
    let kept = usable_alignment_heads(model_dir, &cfg)?;
    let before = g["alignment_heads"].as_array().map_or(0, Vec::len);
    if exists && kept.len() == before {
        return Ok(None);
    }
    g["alignment_heads"] = serde_json::json!(kept.iter().map(|&(l, h)| [l, h]).collect::<Vec<_>>());
    Ok(Some(g))
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
