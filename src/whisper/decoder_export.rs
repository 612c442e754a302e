//! From a Hugging Face checkpoint directory to the decoder-side WhisperKit models: the
//! one-token `TextDecoder` (cache I/O or states, cross-attention in-graph or precomputed),
//! the `CrossKV` model and the multilingual `TextDecoderContextPrefill`; alignment heads come
//! from generation_config.json. Also names the vocabulary-head ops of a built decoder (the
//! `milkit.head_ops` metadata), which is how `--head-only` compression finds them.

use super::config::WhisperConfig;
use super::decoder::{
    alignment_heads_from_json, build_cross_kv, build_decoder, CrossKv, DecoderDims, DecoderOptions,
    KvCache,
};
use super::decoder_prefill::{build_prefill, PrefillSpec};
pub use super::decoder_spec::{head_op_names, HEAD_OPS_KEY};
use super::export::{open_checked, source_name};
use super::weights::Component;
use crate::ir::{Model, Opset};
use crate::passes::compress::Selection;
use anyhow::{bail, Context, Result};
use std::path::Path;

impl DecoderDims {
    pub fn from_config(c: &WhisperConfig) -> DecoderDims {
        DecoderDims {
            d_model: c.d_model,
            layers: c.decoder_layers,
            heads: c.decoder_attention_heads,
            ffn: c.decoder_ffn_dim,
            vocab: c.vocab_size,
            n_text_ctx: c.max_target_positions,
            n_audio_ctx: c.max_source_positions,
        }
    }
}

/// The choices of a decoder export (the CLI's `--stateful`, `--cross-kv`, `--head-chunks`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecoderExport {
    /// Self-attention caches as Core ML states (iOS18).
    pub stateful: bool,
    pub cross_kv: CrossKv,
    /// Row chunks of the vocabulary head (≥ 1).
    pub head_chunks: usize,
    /// Add the per-head alignment output ([`DecoderOptions::per_head_alignment`]).
    pub per_head_alignment: bool,
}

impl Default for DecoderExport {
    fn default() -> Self {
        DecoderExport {
            stateful: false,
            cross_kv: CrossKv::InGraph,
            head_chunks: 1,
            per_head_alignment: false,
        }
    }
}

/// The vocabulary-head ops of a milkit decoder, from its `milkit.head_ops` metadata.
pub fn head_ops(m: &Model) -> Result<Vec<String>> {
    let Some(list) = m.description.user_defined.get(HEAD_OPS_KEY) else {
        bail!(
            "the package has no `{HEAD_OPS_KEY}` metadata: --head-only needs a text decoder \
             exported by milkit (or name the head ops with --op-names)"
        );
    };
    Ok(list.split(',').map(str::to_string).collect())
}

/// `base` narrowed to exactly the head ops of decoder `m` (their conv weights; nothing else,
/// in particular not the `embed_tokens` gather table).
pub fn head_only_selection(m: &Model, base: &Selection) -> Result<Selection> {
    Ok(Selection {
        op_types: vec!["conv".into()],
        op_names: head_ops(m)?,
        ..base.clone()
    })
}

/// `generation_config.json` of a checkpoint as JSON (derived when the file is missing, see
/// [`super::checkpoint::generation_json`]).
fn generation_json(model_dir: &Path) -> Result<Option<serde_json::Value>> {
    super::checkpoint::generation_json(model_dir)
}

/// Alignment heads from generation_config.json; none when the file or key is absent (the
/// decoder then has no `alignment_heads_weights` output).
pub fn alignment_heads(model_dir: &Path) -> Result<Vec<(usize, usize)>> {
    match generation_json(model_dir)? {
        Some(g) if !g["alignment_heads"].is_null() => {
            alignment_heads_from_json(&g["alignment_heads"])
                .with_context(|| format!("{}/generation_config.json", model_dir.display()))
        }
        _ => Ok(vec![]),
    }
}

fn tag(mut m: Model, model_dir: &Path) -> Model {
    m.description
        .user_defined
        .insert("milkit.source".into(), source_name(model_dir));
    m
}

/// Builds the WhisperKit `TextDecoder` of a checkpoint directory.
pub fn export_decoder(model_dir: &Path, o: &DecoderExport, opset: Opset) -> Result<Model> {
    if o.stateful && opset < Opset::Ios18 {
        bail!("a stateful decoder keeps its caches as Core ML states, which need target ios18 (got {opset})");
    }
    let (cfg, w) = open_checked(model_dir, Component::Decoder)?;
    let opts = DecoderOptions {
        alignment_heads: super::checkpoint::usable_alignment_heads(model_dir, &cfg)?,
        per_head_alignment: o.per_head_alignment,
        head_chunks: o.head_chunks,
        kv_cache: if o.stateful {
            KvCache::State
        } else {
            KvCache::Io
        },
        cross_kv: o.cross_kv,
    };
    let m = build_decoder(&DecoderDims::from_config(&cfg), &w, &opts, opset)
        .with_context(|| format!("building the text decoder of {}", model_dir.display()))?;
    Ok(tag(m, model_dir))
}

/// Builds the `CrossKV` model (encoder output → every layer's cross-attention keys/values).
pub fn export_cross_kv(model_dir: &Path, opset: Opset) -> Result<Model> {
    let (cfg, w) = open_checked(model_dir, Component::Decoder)?;
    let m = build_cross_kv(&DecoderDims::from_config(&cfg), &w, opset)
        .with_context(|| format!("building the CrossKV model of {}", model_dir.display()))?;
    Ok(tag(m, model_dir))
}

/// Builds `TextDecoderContextPrefill`; English-only checkpoints are refused with the reason.
pub fn export_prefill(model_dir: &Path, opset: Opset) -> Result<Model> {
    let g = generation_json(model_dir)?.with_context(|| {
        format!(
            "{}: the decoder context prefill needs generation_config.json (language and task tokens)",
            model_dir.display()
        )
    })?;
    let spec = PrefillSpec::from_generation_config(&g)
        .with_context(|| format!("cannot build a context prefill for {}", model_dir.display()))?;
    let (cfg, w) = open_checked(model_dir, Component::Decoder)?;
    let m = build_prefill(&DecoderDims::from_config(&cfg), &w, &spec, opset)
        .with_context(|| format!("building the context prefill of {}", model_dir.display()))?;
    Ok(tag(m, model_dir))
}

/// Whether a checkpoint is multilingual (has language tokens), by generation_config.json.
pub fn is_multilingual(model_dir: &Path) -> Result<bool> {
    Ok(generation_json(model_dir)?
        .map(|g| g["is_multilingual"] != false && g.get("lang_to_id").is_some())
        .unwrap_or(false))
}
