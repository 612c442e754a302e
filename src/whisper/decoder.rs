//! The Whisper text decoder as fp16 MIL programs in BC1S layout, one token per call, with
//! WhisperKit's `TextDecoder` I/O ABI: the self-attention caches of all layers concatenated
//! on the channel axis ([1, d_model·layers, 1, 448]), merged with the new token's key/value
//! in-graph by a mask blend, an additive padding mask (0 visible, −1e4 hidden), cross-attention
//! on the encoder output, an untied vocabulary head (its own `lm_head` constant, optionally in
//! row chunks) and the mean cross-attention weights of the alignment heads.
//!
//! Variants: the caches as Core ML states (iOS18), and cross-attention keys/values computed
//! once per audio window by a separate CrossKV model. The forced-prefix cache lookup table
//! (WhisperKit's TextDecoderContextPrefill) lives in `decoder_prefill`.

use super::graph::{
    add, attention, conv1x1, gelu, int, ints, layer_norm_c, query_scale, reshape, scaled, weight,
    WeightSource,
};
use crate::ir::{ArrayDType, Description, Feature, Function, Model, Opset, Program, Tensor, Value, ValueType};
use crate::ops::{Builder, In, V};
use anyhow::{bail, ensure, Context, Result};

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

/// Where the cross-attention keys/values come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrossKv {
    /// Projected from `encoder_output_embeds` inside the decoder, every step.
    InGraph,
    /// Inputs `encoder_attn_key_cache`/`encoder_attn_value_cache` [1, d·layers, 1, 1500],
    /// made once per window by the CrossKV model ([`build_cross_kv`]).
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
    /// Number of row chunks of the vocabulary head (≥ 1). The Neural Engine limits a conv's
    /// output channels; whisper.cpp keeps chunks ≤ 16,384 rows ([`min_head_chunks`]).
    pub head_chunks: usize,
    pub kv_cache: KvCache,
    pub cross_kv: CrossKv,
}

impl Default for DecoderOptions {
    fn default() -> Self {
        DecoderOptions { alignment_heads: vec![], head_chunks: 1, kv_cache: KvCache::Io, cross_kv: CrossKv::InGraph }
    }
}

/// Largest head chunk the Neural Engine takes comfortably (whisper.cpp's split size).
pub const ANE_MAX_HEAD_ROWS: usize = 16_384;

/// Fewest chunks that keep every head chunk within [`ANE_MAX_HEAD_ROWS`] rows.
pub fn min_head_chunks(vocab: usize) -> usize {
    vocab.div_ceil(ANE_MAX_HEAD_ROWS).max(1)
}

/// Parses generation_config.json's `alignment_heads` ([[layer, head], ...]).
pub fn alignment_heads_from_json(v: &serde_json::Value) -> Result<Vec<(usize, usize)>> {
    let arr = v.as_array().context("alignment_heads must be a list of [layer, head] pairs")?;
    arr.iter()
        .map(|p| match p.as_array().map(|a| a.as_slice()) {
            Some([l, h]) => match (l.as_u64(), h.as_u64()) {
                (Some(l), Some(h)) => Ok((l as usize, h as usize)),
                _ => bail!("alignment head {p} is not a pair of non-negative integers"),
            },
            _ => bail!("alignment head {p} is not a [layer, head] pair"),
        })
        .collect()
}

/// The additive padding-mask value WhisperKit uses for hidden positions.
pub const MASK_HIDDEN: f32 = -1e4;
const LN_EPS: f32 = 1e-5;
const P: &str = "model.decoder";

/// The ABI of one decoder variant: description inputs, states and outputs, in order.
pub fn decoder_features(d: &DecoderDims, o: &DecoderOptions) -> (Vec<Feature>, Vec<Feature>, Vec<Feature>) {
    let dl = d.d_model * d.layers;
    let s = d.n_text_ctx;
    let mut inputs = vec![
        Feature::new("input_ids", ArrayDType::I32, &[1]),
        Feature::new("cache_length", ArrayDType::I32, &[1]),
    ];
    let mut states = vec![];
    match o.kv_cache {
        KvCache::Io => {
            inputs.push(Feature::new("key_cache", ArrayDType::F16, &[1, dl, 1, s]));
            inputs.push(Feature::new("value_cache", ArrayDType::F16, &[1, dl, 1, s]));
            inputs.push(Feature::new("kv_cache_update_mask", ArrayDType::F16, &[1, s]));
        }
        KvCache::State => {
            states.push(Feature::new("key_cache", ArrayDType::F16, &[1, dl, 1, s]));
            states.push(Feature::new("value_cache", ArrayDType::F16, &[1, dl, 1, s]));
        }
    }
    match o.cross_kv {
        CrossKv::InGraph => {
            inputs.push(Feature::new("encoder_output_embeds", ArrayDType::F16, &[1, d.d_model, 1, d.n_audio_ctx]))
        }
        CrossKv::Precomputed => {
            for n in CROSS_KV_NAMES {
                inputs.push(Feature::new(n, ArrayDType::F16, &[1, dl, 1, d.n_audio_ctx]));
            }
        }
    }
    inputs.push(Feature::new("decoder_key_padding_mask", ArrayDType::F16, &[1, s]));
    let mut outputs = vec![Feature::new("logits", ArrayDType::F16, &[1, 1, d.vocab])];
    if o.kv_cache == KvCache::Io {
        outputs.push(Feature::new("key_cache_updates", ArrayDType::F16, &[1, dl, 1, 1]));
        outputs.push(Feature::new("value_cache_updates", ArrayDType::F16, &[1, dl, 1, 1]));
    }
    if !o.alignment_heads.is_empty() {
        outputs.push(Feature::new("alignment_heads_weights", ArrayDType::F16, &[1, d.n_audio_ctx]));
    }
    (inputs, states, outputs)
}

/// Names of the CrossKV model's outputs (= the precomputed decoder's inputs).
pub const CROSS_KV_NAMES: [&str; 2] = ["encoder_attn_key_cache", "encoder_attn_value_cache"];

fn check(d: &DecoderDims, o: &DecoderOptions, opset: Opset) -> Result<()> {
    ensure!(d.heads > 0 && d.d_model % d.heads == 0, "d_model {} is not divisible by {} heads", d.d_model, d.heads);
    ensure!(d.layers > 0 && d.vocab > 0 && d.n_text_ctx > 0 && d.n_audio_ctx > 0, "decoder dimensions must be positive: {d:?}");
    ensure!(o.head_chunks >= 1 && o.head_chunks <= d.vocab, "head_chunks must be in 1..={}, got {}", d.vocab, o.head_chunks);
    for &(l, h) in &o.alignment_heads {
        ensure!(l < d.layers && h < d.heads, "alignment head (layer {l}, head {h}) is outside {} layers × {} heads", d.layers, d.heads);
    }
    if o.kv_cache == KvCache::State {
        ensure!(opset >= Opset::Ios18, "a stateful decoder needs target ios18 or later (Core ML states), got {opset}");
    }
    Ok(())
}

/// A `[rows, cols]` checkpoint weight as a `[rows, cols, 1, 1]` 1x1 conv kernel.
fn w4(w: &dyn WeightSource, name: &str, rows: usize, cols: usize) -> Result<Value> {
    weight(w, name, &[rows, cols, 1, 1])
}

fn vec1(w: &dyn WeightSource, name: &str, n: usize) -> Result<Value> {
    weight(w, name, &[n])
}

/// A query projection with the 1/sqrt(head_dim) scale folded into weight and bias when that is
/// exact in fp16 (a power of two), else applied by a `mul` after the conv.
fn query(b: &mut Builder, name: &str, x: &V, w: &dyn WeightSource, hf: &str, d: usize, heads: usize) -> Result<V> {
    let (s, exact) = query_scale(d / heads);
    if exact {
        let wq = scaled(w, &format!("{hf}.weight"), &[d, d, 1, 1], s)?;
        let bq = scaled(w, &format!("{hf}.bias"), &[d], s)?;
        return conv1x1(b, name, x, wq, Some(bq));
    }
    let q = conv1x1(b, name, x, w4(w, &format!("{hf}.weight"), d, d)?, Some(vec1(w, &format!("{hf}.bias"), d)?))?;
    let sv = b.konst(&format!("{name}_scale"), Value::f16_scalar(s));
    b.op1("mul", &format!("{name}_scaled"), vec![("x", In::V(q)), ("y", In::V(sv))])
}

/// Key (no bias: HF Whisper's k_proj has none) and value projections of `x`.
fn key_value(b: &mut Builder, n: &str, x: &V, w: &dyn WeightSource, hf: &str, d: usize) -> Result<(V, V)> {
    let k = conv1x1(b, &format!("{n}_k_proj"), x, w4(w, &format!("{hf}.k_proj.weight"), d, d)?, None)?;
    let v = conv1x1(
        b,
        &format!("{n}_v_proj"),
        x,
        w4(w, &format!("{hf}.v_proj.weight"), d, d)?,
        Some(vec1(w, &format!("{hf}.v_proj.bias"), d)?),
    )?;
    Ok((k, v))
}

fn mul(b: &mut Builder, name: &str, x: &V, y: &V) -> Result<V> {
    b.op1("mul", name, vec![("x", x.into()), ("y", y.into())])
}

/// Splits a [1, d·layers, 1, S] tensor into per-layer [1, d, 1, S] parts.
fn split_layers(b: &mut Builder, name: &str, x: &V, layers: usize) -> Result<Vec<V>> {
    if layers == 1 {
        return Ok(vec![x.clone()]);
    }
    b.op("split", name, vec![("x", x.into()), ("num_splits", int(layers as i32)), ("axis", int(1))])
}

/// How one layer's self-attention reaches the full cache.
enum SelfKv {
    /// Per-layer caches from the inputs, and the blend masks `mask` and `1 − mask`.
    Blend { keys: Vec<V>, values: Vec<V>, mask: V, keep: V },
    /// The state variables and the `[0, ?, 0, cache_length]` begin index pieces.
    State { key: V, value: V, pos: V },
}

impl SelfKv {
    /// The [1, d, 1, S] key and value caches of layer `l` with this token's `k`, `v` merged in.
    fn merge(&self, b: &mut Builder, n: &str, l: usize, d: usize, s: usize, k: &V, v: &V) -> Result<(V, V)> {
        match self {
            SelfKv::Blend { keys, values, mask, keep } => {
                let mut out = vec![];
                for (what, cache, new) in [("key", &keys[l], k), ("value", &values[l], v)] {
                    let old = mul(b, &format!("{n}_{what}_cache_kept"), cache, keep)?;
                    let put = mul(b, &format!("{n}_{what}_cache_new"), new, mask)?;
                    out.push(add(b, &format!("{n}_{what}_cache_merged"), &old, &put)?);
                }
                Ok((out[0].clone(), out[1].clone()))
            }
            SelfKv::State { key, value, pos } => {
                let mut out = vec![];
                for (what, state, new) in [("key", key, k), ("value", value, v)] {
                    out.push(state_update(b, &format!("{n}_{what}_cache"), state, new, pos, l, d, s)?);
                }
                Ok((out[0].clone(), out[1].clone()))
            }
        }
    }
}

/// read_state → slice_update at [0, l·d, 0, cache_length] → write_state, then this layer's
/// [1, d, 1, S] slice of the updated cache. Writing per layer mirrors the in-place pattern
/// coremltools emits for `cache[..., pos] = x` on a state.
#[allow(clippy::too_many_arguments)]
fn state_update(b: &mut Builder, n: &str, state: &V, new: &V, pos: &V, l: usize, d: usize, s: usize) -> Result<V> {
    let cur = b.op1("read_state", &format!("{n}_read"), vec![("input", state.into())])?;
    let lo = b.konst(&format!("{n}_begin_prefix"), Value::i32s(&[0, (l * d) as i32, 0]));
    let begin = b.op1("concat", &format!("{n}_begin"), vec![("values", In::Vs(vec![lo, pos.clone()])), ("axis", int(0))])?;
    let end = b.op1("add", &format!("{n}_end"), vec![("x", In::V(begin.clone())), ("y", ints(&[1, d as i32, 1, 1]))])?;
    let upd = b.op1(
        "slice_update",
        &format!("{n}_update"),
        vec![("x", In::V(cur)), ("update", new.into()), ("begin", In::V(begin)), ("end", In::V(end))],
    )?;
    b.op("write_state", &format!("{n}_write"), vec![("input", state.into()), ("data", In::V(upd.clone()))])?;
    b.op1(
        "slice_by_index",
        &format!("{n}_layer"),
        vec![
            ("x", In::V(upd)),
            ("begin", ints(&[0, (l * d) as i32, 0, 0])),
            ("end", ints(&[1, ((l + 1) * d) as i32, 1, s as i32])),
        ],
    )
}

/// The vocabulary head: `lm_head` 1x1 conv(s) on the final hidden state [1, d, 1, 1] →
/// logits [1, 1, vocab]. A separate constant from the `embed_tokens` gather table (HF ties
/// them) so compression can treat it alone; `proj_out.weight` when the checkpoint has one.
fn head(b: &mut Builder, w: &dyn WeightSource, h: &V, d: usize, vocab: usize, chunks: usize) -> Result<V> {
    let (shape, data) = match w.f16("proj_out.weight") {
        Ok(t) => t,
        Err(_) => w.f16(&format!("{P}.embed_tokens.weight"))?,
    };
    ensure!(shape == [vocab, d], "vocabulary head has shape {shape:?}, expected [{vocab}, {d}]");
    let rows_per = vocab.div_ceil(chunks);
    let mut parts = vec![];
    for c in 0..chunks {
        let (r0, r1) = (c * rows_per, ((c + 1) * rows_per).min(vocab));
        ensure!(r0 < r1, "{chunks} head chunks leave chunk {c} empty for vocab {vocab}");
        let bytes = data.slice(r0 * d * 2..r1 * d * 2)?;
        let t = Value::Tensor(Tensor::new(crate::ir::DType::F16, vec![r1 - r0, d, 1, 1], bytes)?);
        let name = if chunks == 1 { "lm_head".to_string() } else { format!("lm_head_{c}") };
        parts.push(conv1x1(b, &name, h, t, None)?);
    }
    let logits = if parts.len() == 1 {
        parts.remove(0)
    } else {
        b.op1("concat", "lm_head_concat", vec![("values", In::Vs(parts)), ("axis", int(1))])?
    };
    reshape(b, "logits_1_1_v", &logits, &[1, 1, vocab as i32])
}

/// Embedding row `index` of table `name` ([rows, d] fp16) by `gather` → [1, d].
fn embed(b: &mut Builder, w: &dyn WeightSource, name: &str, rows: usize, d: usize, index: &V) -> Result<V> {
    let table = b.konst(name, weight(w, &format!("{P}.{name}.weight"), &[rows, d])?);
    b.op1("gather", &format!("{name}_row"), vec![("x", In::V(table)), ("indices", index.into()), ("axis", int(0))])
}

/// Builds the one-token decoder program (see the module doc and [`DecoderOptions`]).
pub fn build_decoder(dims: &DecoderDims, w: &dyn WeightSource, opts: &DecoderOptions, opset: Opset) -> Result<Model> {
    check(dims, opts, opset)?;
    let (d, s, l_n) = (dims.d_model, dims.n_text_ctx, dims.layers);
    let (fin, fstates, fout) = decoder_features(dims, opts);
    let mut b = Builder::new(opset);
    let mut vars = std::collections::HashMap::new();
    for f in &fin {
        vars.insert(f.name.clone(), b.input(&f.name, ValueType::Tensor(f.tensor_type())));
    }
    for f in &fstates {
        vars.insert(f.name.clone(), b.input(&f.name, ValueType::State(f.tensor_type())));
    }
    let var = |n: &str| vars.get(n).cloned().with_context(|| format!("decoder input `{n}` missing"));

    // Token + position embedding → [1, d, 1, 1].
    let tok = embed(&mut b, w, "embed_tokens", dims.vocab, d, &var("input_ids")?)?;
    let pos = embed(&mut b, w, "embed_positions", s, d, &var("cache_length")?)?;
    let h = add(&mut b, "embed", &tok, &pos)?;
    let mut h = reshape(&mut b, "embed_bc1s", &h, &[1, d as i32, 1, 1])?;

    let pad = reshape(&mut b, "decoder_key_padding_mask_4d", &var("decoder_key_padding_mask")?, &[1, 1, 1, s as i32])?;
    let self_kv = match opts.kv_cache {
        KvCache::Io => {
            let mask = reshape(&mut b, "kv_cache_update_mask_4d", &var("kv_cache_update_mask")?, &[1, 1, 1, s as i32])?;
            let keep = b.op1("sub", "kv_cache_keep_mask", vec![("x", In::C(Value::f16_scalar(1.0))), ("y", In::V(mask.clone()))])?;
            let keys = split_layers(&mut b, "key_cache_layers", &var("key_cache")?, l_n)?;
            let values = split_layers(&mut b, "value_cache_layers", &var("value_cache")?, l_n)?;
            SelfKv::Blend { keys, values, mask, keep }
        }
        KvCache::State => SelfKv::State { key: var("key_cache")?, value: var("value_cache")?, pos: var("cache_length")? },
    };
    let cross: Option<(Vec<V>, Vec<V>)> = match opts.cross_kv {
        CrossKv::InGraph => None,
        CrossKv::Precomputed => Some((
            split_layers(&mut b, "encoder_attn_key_layers", &var(CROSS_KV_NAMES[0])?, l_n)?,
            split_layers(&mut b, "encoder_attn_value_layers", &var(CROSS_KV_NAMES[1])?, l_n)?,
        )),
    };

    let mut k_updates = vec![];
    let mut v_updates = vec![];
    let mut align = vec![];
    for l in 0..l_n {
        let lp = format!("{P}.layers.{l}");
        let n = format!("layers_{l}");
        let ln_w = |b: &mut Builder, what: &str, x: &V| -> Result<V> {
            layer_norm_c(
                b,
                &format!("{n}_{what}"),
                x,
                vec1(w, &format!("{lp}.{what}.weight"), d)?,
                vec1(w, &format!("{lp}.{what}.bias"), d)?,
                LN_EPS,
            )
        };
        let out_proj = |b: &mut Builder, what: &str, x: &V| -> Result<V> {
            conv1x1(
                b,
                &format!("{n}_{what}_out_proj"),
                x,
                w4(w, &format!("{lp}.{what}.out_proj.weight"), d, d)?,
                Some(vec1(w, &format!("{lp}.{what}.out_proj.bias"), d)?),
            )
        };

        // Self-attention over the cache with this token merged in.
        let x = ln_w(&mut b, "self_attn_layer_norm", &h)?;
        let q = query(&mut b, &format!("{n}_self_attn_q_proj"), &x, w, &format!("{lp}.self_attn.q_proj"), d, dims.heads)?;
        let (k, v) = key_value(&mut b, &format!("{n}_self_attn"), &x, w, &format!("{lp}.self_attn"), d)?;
        let (kc, vc) = self_kv.merge(&mut b, &format!("{n}_self_attn"), l, d, s, &k, &v)?;
        k_updates.push(k);
        v_updates.push(v);
        let (ctx, _) = attention(&mut b, &format!("{n}_self_attn"), &q, &kc, &vc, dims.heads, d, Some(&pad))?;
        let o = out_proj(&mut b, "self_attn", &ctx)?;
        h = add(&mut b, &format!("{n}_self_attn_residual"), &h, &o)?;

        // Cross-attention on the encoder output.
        let x = ln_w(&mut b, "encoder_attn_layer_norm", &h)?;
        let q = query(&mut b, &format!("{n}_encoder_attn_q_proj"), &x, w, &format!("{lp}.encoder_attn.q_proj"), d, dims.heads)?;
        let (ek, ev) = match &cross {
            Some((ks, vs)) => (ks[l].clone(), vs[l].clone()),
            None => key_value(&mut b, &format!("{n}_encoder_attn"), &var("encoder_output_embeds")?, w, &format!("{lp}.encoder_attn"), d)?,
        };
        let (ctx, weights) = attention(&mut b, &format!("{n}_encoder_attn"), &q, &ek, &ev, dims.heads, d, None)?;
        let heads: Vec<i32> = opts.alignment_heads.iter().filter(|a| a.0 == l).map(|a| a.1 as i32).collect();
        if !heads.is_empty() {
            align.push(b.op1(
                "gather",
                &format!("{n}_alignment_heads"),
                vec![("x", In::V(weights)), ("indices", ints(&heads)), ("axis", int(1))],
            )?);
        }
        let o = out_proj(&mut b, "encoder_attn", &ctx)?;
        h = add(&mut b, &format!("{n}_encoder_attn_residual"), &h, &o)?;

        // Feed-forward.
        let x = ln_w(&mut b, "final_layer_norm", &h)?;
        let f = conv1x1(
            &mut b,
            &format!("{n}_fc1"),
            &x,
            w4(w, &format!("{lp}.fc1.weight"), dims.ffn, d)?,
            Some(vec1(w, &format!("{lp}.fc1.bias"), dims.ffn)?),
        )?;
        let f = gelu(&mut b, &format!("{n}_fc1_gelu"), &f)?;
        let f = conv1x1(
            &mut b,
            &format!("{n}_fc2"),
            &f,
            w4(w, &format!("{lp}.fc2.weight"), d, dims.ffn)?,
            Some(vec1(w, &format!("{lp}.fc2.bias"), d)?),
        )?;
        h = add(&mut b, &format!("{n}_mlp_residual"), &h, &f)?;
    }
    let h = layer_norm_c(
        &mut b,
        "layer_norm",
        &h,
        vec1(w, &format!("{P}.layer_norm.weight"), d)?,
        vec1(w, &format!("{P}.layer_norm.bias"), d)?,
        LN_EPS,
    )?;
    let mut outs = vec![head(&mut b, w, &h, d, dims.vocab, opts.head_chunks)?];
    if opts.kv_cache == KvCache::Io {
        for (name, parts) in [("key_cache_updates_concat", k_updates), ("value_cache_updates_concat", v_updates)] {
            outs.push(if parts.len() == 1 {
                b.op1("identity", name, vec![("x", In::V(parts[0].clone()))])?
            } else {
                b.op1("concat", name, vec![("values", In::Vs(parts)), ("axis", int(1))])?
            });
        }
    }
    if !align.is_empty() {
        let all = if align.len() == 1 {
            align.remove(0)
        } else {
            b.op1("concat", "alignment_heads_concat", vec![("values", In::Vs(align)), ("axis", int(1))])?
        };
        // [1, n, 1, n_audio] → mean over the n heads → [1, n_audio].
        outs.push(b.op1(
            "reduce_mean",
            "alignment_heads_mean",
            vec![("x", In::V(all)), ("axes", ints(&[1, 2])), ("keep_dims", In::C(Value::bool_scalar(false)))],
        )?);
    }
    let named: Vec<(V, &str)> = outs.into_iter().zip(fout.iter().map(|f| f.name.as_str())).collect();
    let (inputs, block) = b.finish(&named)?;
    let component = match (opts.kv_cache, opts.cross_kv) {
        (KvCache::Io, CrossKv::InGraph) => "decoder",
        (KvCache::Io, CrossKv::Precomputed) => "decoder_cross_kv",
        (KvCache::State, CrossKv::InGraph) => "decoder_stateful",
        (KvCache::State, CrossKv::Precomputed) => "decoder_stateful_cross_kv",
    };
    let mut description = Description { inputs: fin, outputs: fout, states: fstates, ..Default::default() };
    description.short_description = format!(
        "Whisper text decoder, one token per call (WhisperKit TextDecoder ABI{}), fp16, BC1S layout",
        if opts.kv_cache == KvCache::State { ", caches as states" } else { "" }
    );
    let heads = opts.alignment_heads.iter().map(|(l, h)| format!("[{l},{h}]")).collect::<Vec<_>>().join(",");
    description.user_defined.insert("milkit.alignment_heads".into(), format!("[{heads}]"));
    description.user_defined.insert("milkit.head_chunks".into(), opts.head_chunks.to_string());
    Ok(finish_model(component, inputs, block, opset, description))
}

/// Wraps a finished main block as a model with milkit's metadata.
pub(crate) fn finish_model(
    component: &str,
    inputs: Vec<crate::ir::Var>,
    block: crate::ir::Block,
    opset: Opset,
    mut description: Description,
) -> Model {
    let mut program = Program::default();
    program.functions.insert("main".into(), Function { inputs, opset, block });
    description.user_defined.insert("milkit.component".into(), component.into());
    description.user_defined.insert("milkit.abi".into(), "whisperkit".into());
    description.user_defined.insert("milkit.version".into(), env!("CARGO_PKG_VERSION").into());
    Model { spec_version: opset.spec_version(), description, program }
}

/// The CrossKV model: `encoder_output_embeds` [1, d, 1, 1500] → every layer's cross-attention
/// keys and values, concatenated on channels like the self-attention caches:
/// `encoder_attn_key_cache`/`encoder_attn_value_cache` [1, d·layers, 1, 1500].
pub fn build_cross_kv(dims: &DecoderDims, w: &dyn WeightSource, opset: Opset) -> Result<Model> {
    check(dims, &DecoderOptions::default(), opset)?;
    let d = dims.d_model;
    let dl = d * dims.layers;
    let fin = Feature::new("encoder_output_embeds", ArrayDType::F16, &[1, d, 1, dims.n_audio_ctx]);
    let fout: Vec<Feature> =
        CROSS_KV_NAMES.iter().map(|n| Feature::new(n, ArrayDType::F16, &[1, dl, 1, dims.n_audio_ctx])).collect();
    let mut b = Builder::new(opset);
    let x = b.input(&fin.name, ValueType::Tensor(fin.tensor_type()));
    let (mut ks, mut vs) = (vec![], vec![]);
    for l in 0..dims.layers {
        let (k, v) = key_value(&mut b, &format!("layers_{l}_encoder_attn"), &x, w, &format!("{P}.layers.{l}.encoder_attn"), d)?;
        ks.push(k);
        vs.push(v);
    }
    let mut outs = vec![];
    for (name, parts) in [("encoder_attn_key_concat", ks), ("encoder_attn_value_concat", vs)] {
        outs.push(if parts.len() == 1 {
            b.op1("identity", name, vec![("x", In::V(parts[0].clone()))])?
        } else {
            b.op1("concat", name, vec![("values", In::Vs(parts)), ("axis", int(1))])?
        });
    }
    let named: Vec<(V, &str)> = outs.into_iter().zip(CROSS_KV_NAMES).collect();
    let (inputs, block) = b.finish(&named)?;
    let mut description = Description { inputs: vec![fin], outputs: fout, ..Default::default() };
    description.short_description =
        "Whisper cross-attention keys/values of all decoder layers from the encoder output, fp16, BC1S".into();
    Ok(finish_model("cross_kv", inputs, block, opset, description))
}
