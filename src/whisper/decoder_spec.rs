//! What every decoder-side builder (`decoder`, `decoder_parts`, `decoder_prefill`) shares:
//! the decoder's dimensions and build options, their checks, the names of the CrossKV outputs
//! and of the vocabulary-head ops, and [`finish_model`], which wraps any finished block as a
//! model with milkit's metadata. A leaf of `whisper`'s decoder files, so that they need not
//! import each other both ways.

use super::config::WhisperConfig;
use crate::ir::{Description, Model, Opset};
use anyhow::{bail, ensure, Result};

/// The decoder's dimensions (Hugging Face `WhisperConfig` names in the comments).
#[derive(Clone, Debug)]
pub struct DecoderDims {
    /// `d_model`
    pub d_model: usize,
    /// `decoder_layers`
    pub layers: usize,
    /// `decoder_attention_heads`
    pub heads: usize,
    /// `decoder_ffn_dim`
    pub ffn: usize,
    /// `vocab_size`
    pub vocab: usize,
    /// `max_target_positions` (448): the cache length.
    pub n_text_ctx: usize,
    /// `max_source_positions` (1500): encoder output positions.
    pub n_audio_ctx: usize,
}

/// Where the self-attention key/value caches live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvCache {
    /// WhisperKit's ABI: `key_cache`/`value_cache` inputs, `key_cache_updates`/
    /// `value_cache_updates` outputs; the caller writes the updates back.
    Io,
    /// Core ML states `key_cache`/`value_cache` (iOS18), updated in-graph at `cache_length`;
    /// the cache inputs/outputs and `kv_cache_update_mask` disappear.
    State,
}

/// Where the cross-attention keys/values come from (`export --cross-kv`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CrossKv {
    /// Projected from `encoder_output_embeds` inside the decoder, every step.
    InGraph,
    /// Inputs `encoder_attn_key_cache`/`encoder_attn_value_cache` [1, d·layers, 1, 1500],
    /// made once per window by the CrossKV model (`milkit export --component crosskv`).
    Precomputed,
}

impl CrossKv {
    pub fn parse(s: &str) -> Result<CrossKv> {
        match s {
            "in-graph" | "ingraph" => Ok(CrossKv::InGraph),
            "precomputed" => Ok(CrossKv::Precomputed),
            o => bail!("unknown cross_kv `{o}` (expected in-graph or precomputed)"),
        }
    }
}

/// Build options of [`build_decoder`].
#[derive(Clone, Debug)]
pub struct DecoderOptions {
    /// (layer, head) pairs from generation_config.json `alignment_heads`; when empty the
    /// `alignment_heads_weights` output is left out (WhisperKit treats it as optional).
    pub alignment_heads: Vec<(usize, usize)>,
    /// Also output each alignment head's cross-attention row,
    /// [`PER_HEAD_ALIGNMENT_OUTPUT`] [1, heads, n_audio] (heads in layer order, then in
    /// `alignment_heads` order). Word timings from per-head rows normalise each head before
    /// averaging, as openai-whisper and Hugging Face do; WhisperKit ignores the extra output.
    pub per_head_alignment: bool,
    /// Number of row chunks of the vocabulary head (≥ 1). The Neural Engine limits a conv's
    /// output channels; whisper.cpp keeps chunks ≤ 16,384 rows ([`super::decoder::min_head_chunks`]).
    pub head_chunks: usize,
    pub kv_cache: KvCache,
    pub cross_kv: CrossKv,
}

impl Default for DecoderOptions {
    fn default() -> Self {
        DecoderOptions {
            alignment_heads: vec![],
            per_head_alignment: false,
            head_chunks: 1,
            kv_cache: KvCache::Io,
            cross_kv: CrossKv::InGraph,
        }
    }
}

pub(super) const P: &str = "model.decoder";

/// The optional per-head alignment output of milkit's decoders (see
/// [`DecoderOptions::per_head_alignment`]).
pub const PER_HEAD_ALIGNMENT_OUTPUT: &str = "alignment_heads_weights_per_head";

/// Names of the CrossKV model's outputs (= the precomputed decoder's inputs).
pub const CROSS_KV_NAMES: [&str; 2] = ["encoder_attn_key_cache", "encoder_attn_value_cache"];

pub(super) fn check(d: &DecoderDims, o: &DecoderOptions, opset: Opset) -> Result<()> {
    ensure!(
        d.heads > 0 && d.d_model.is_multiple_of(d.heads),
        "d_model {} is not divisible by {} heads",
        d.d_model,
        d.heads
    );
    ensure!(
        d.layers > 0 && d.vocab > 0 && d.n_text_ctx > 0 && d.n_audio_ctx > 0,
        "decoder dimensions must be positive: {d:?}"
    );
    ensure!(
        o.head_chunks >= 1 && o.head_chunks <= d.vocab,
        "head_chunks must be in 1..={}, got {}",
        d.vocab,
        o.head_chunks
    );
    for &(l, h) in &o.alignment_heads {
        ensure!(
            l < d.layers && h < d.heads,
            "alignment head (layer {l}, head {h}) is outside {} layers × {} heads",
            d.layers,
            d.heads
        );
    }
    if o.kv_cache == KvCache::State {
        ensure!(
            opset >= Opset::Ios18,
            "a stateful decoder needs target ios18 or later (Core ML states), got {opset}"
        );
    }
    Ok(())
}

/// Metadata key of a decoder package listing its vocabulary-head conv ops, comma-separated.
pub const HEAD_OPS_KEY: &str = "milkit.head_ops";

/// Conv op names of a head split in `chunks` row chunks (as `decoder_parts::head` names them).
pub fn head_op_names(chunks: usize) -> Vec<String> {
    if chunks == 1 {
        vec!["lm_head".into()]
    } else {
        (0..chunks).map(|c| format!("lm_head_{c}")).collect()
    }
}

/// Wraps a finished main block as a model with milkit's metadata.
pub(crate) fn finish_model(
    component: &str,
    inputs: Vec<crate::ir::Var>,
    block: crate::ir::Block,
    opset: Opset,
    mut description: Description,
) -> Model {
    description
        .user_defined
        .insert("milkit.component".into(), component.into());
    description
        .user_defined
        .insert("milkit.abi".into(), "whisperkit".into());
    description
        .user_defined
        .insert("milkit.version".into(), env!("CARGO_PKG_VERSION").into());
    Model::single(opset, inputs, block, description)
}

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
