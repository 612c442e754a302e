//! From an opened checkpoint ([`Checkpoint`]) to the decoder-side WhisperKit models: the
//! one-token `TextDecoder` (cache I/O or states, cross-attention in-graph or precomputed),
//! the `CrossKV` model and the multilingual `TextDecoderContextPrefill`; alignment heads come
//! from its generation config. Also names the vocabulary-head ops of a built decoder (the
//! `milkit.head_ops` metadata), which is how `--head-only` compression finds them.

use super::export::tag;
use crate::ir::{Model, Opset};
use crate::passes::compress::Selection;
use crate::whisper::checkpoint::Checkpoint;
use crate::whisper::decoder::{
    build_cross_kv, build_decoder, CrossKv, DecoderDims, DecoderOptions, KvCache,
};
use crate::whisper::decoder_prefill::{build_prefill, PrefillSpec};
pub use crate::whisper::decoder_spec::{head_op_names, head_ops, HEAD_OPS_KEY};
use crate::whisper::weights::Component;
use anyhow::{bail, Context, Result};

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

/// `base` narrowed to exactly the head ops of decoder `m` (their conv weights; nothing else,
/// in particular not the `embed_tokens` gather table).
pub fn head_only_selection(m: &Model, base: &Selection) -> Result<Selection> {
    Ok(Selection {
        op_types: vec!["conv".into()],
        op_names: head_ops(m)?,
        ..base.clone()
    })
}

/// Builds the WhisperKit `TextDecoder` of a checkpoint.
pub fn export_decoder(ckpt: &Checkpoint, o: &DecoderExport, opset: Opset) -> Result<Model> {
    if o.stateful && opset < Opset::Ios18 {
        bail!("a stateful decoder keeps its caches as Core ML states, which need target ios18 (got {opset})");
    }
    let w = ckpt.checked_weights(Component::Decoder)?;
    let opts = DecoderOptions {
        alignment_heads: ckpt.alignment_heads()?,
        per_head_alignment: o.per_head_alignment,
        head_chunks: o.head_chunks,
        kv_cache: if o.stateful {
            KvCache::State
        } else {
            KvCache::Io
        },
        cross_kv: o.cross_kv,
    };
    let m = build_decoder(&DecoderDims::from_config(ckpt.config()), w, &opts, opset)
        .with_context(|| format!("building the text decoder of {}", ckpt.dir().display()))?;
    Ok(tag(m, ckpt))
}

/// Builds the `CrossKV` model (encoder output → every layer's cross-attention keys/values).
pub fn export_cross_kv(ckpt: &Checkpoint, opset: Opset) -> Result<Model> {
    let w = ckpt.checked_weights(Component::Decoder)?;
    let m = build_cross_kv(&DecoderDims::from_config(ckpt.config()), w, opset)
        .with_context(|| format!("building the CrossKV model of {}", ckpt.dir().display()))?;
    Ok(tag(m, ckpt))
}

/// Builds `TextDecoderContextPrefill`; English-only checkpoints are refused with the reason.
pub fn export_prefill(ckpt: &Checkpoint, opset: Opset) -> Result<Model> {
    let dir = ckpt.dir().display();
    let spec = PrefillSpec::from_generation_config(ckpt.generation()?)
        .with_context(|| format!("cannot build a context prefill for {dir}"))?;
    let w = ckpt.checked_weights(Component::Decoder)?;
    let m = build_prefill(&DecoderDims::from_config(ckpt.config()), w, &spec, opset)
        .with_context(|| format!("building the context prefill of {dir}"))?;
    Ok(tag(m, ckpt))
}
