//! Graph pieces of the Whisper text decoder (see `decoder`): projections as 1x1 convs with the
//! query scale, the two ways a layer reaches its full self-attention cache (mask blend of the
//! cache inputs, or an in-place update of a Core ML state), token/position embeddings by
//! `gather`, the untied vocabulary head, and the CrossKV model.

use super::decoder_spec::{check, finish_model, DecoderDims, DecoderOptions, CROSS_KV_NAMES, P};
use super::graph::{query_scale, scaled, weight, WeightSource};
use crate::ir::{ArrayDType, Description, Feature, Model, Opset, Tensor, Value, ValueType};
use crate::ops::builder::{int, ints};
use crate::ops::{Builder, In, V};
use anyhow::{ensure, Result};

/// A `[rows, cols]` checkpoint weight as a `[rows, cols, 1, 1]` 1x1 conv kernel.
pub(super) fn w4(w: &dyn WeightSource, name: &str, rows: usize, cols: usize) -> Result<Value> {
    weight(w, name, &[rows, cols, 1, 1])
}

pub(super) fn vec1(w: &dyn WeightSource, name: &str, n: usize) -> Result<Value> {
    weight(w, name, &[n])
}

/// A query projection with the 1/sqrt(head_dim) scale folded into weight and bias when that is
/// exact in fp16 (a power of two), else applied by a `mul` after the conv.
pub(super) fn query(
    b: &mut Builder,
    name: &str,
    x: &V,
    w: &dyn WeightSource,
    hf: &str,
    d: usize,
    heads: usize,
) -> Result<V> {
    let (s, exact) = query_scale(d / heads);
    if exact {
        let wq = scaled(w, &format!("{hf}.weight"), &[d, d, 1, 1], s)?;
        let bq = scaled(w, &format!("{hf}.bias"), &[d], s)?;
        return b.conv(name, x, wq, Some(bq));
    }
    let q = b.conv(
        name,
        x,
        w4(w, &format!("{hf}.weight"), d, d)?,
        Some(vec1(w, &format!("{hf}.bias"), d)?),
    )?;
    let sv = b.konst(&format!("{name}_scale"), Value::f16_scalar(s));
    b.op1(
        "mul",
        &format!("{name}_scaled"),
        vec![("x", In::V(q)), ("y", In::V(sv))],
    )
}

/// Key (no bias: HF Whisper's k_proj has none) and value projections of `x`.
pub(super) fn key_value(
    b: &mut Builder,
    n: &str,
    x: &V,
    w: &dyn WeightSource,
    hf: &str,
    d: usize,
) -> Result<(V, V)> {
    let k = b.conv(
        &format!("{n}_k_proj"),
        x,
        w4(w, &format!("{hf}.k_proj.weight"), d, d)?,
        None,
    )?;
    let v = b.conv(
        &format!("{n}_v_proj"),
        x,
        w4(w, &format!("{hf}.v_proj.weight"), d, d)?,
        Some(vec1(w, &format!("{hf}.v_proj.bias"), d)?),
    )?;
    Ok((k, v))
}

pub(super) fn mul(b: &mut Builder, name: &str, x: &V, y: &V) -> Result<V> {
    b.op1("mul", name, vec![("x", x.into()), ("y", y.into())])
}

/// Splits a [1, d·layers, 1, S] tensor into per-layer [1, d, 1, S] parts.
pub(super) fn split_layers(b: &mut Builder, name: &str, x: &V, layers: usize) -> Result<Vec<V>> {
    if layers == 1 {
        return Ok(vec![x.clone()]);
    }
    b.op(
        "split",
        name,
        vec![
            ("x", x.into()),
            ("num_splits", int(layers as i32)),
            ("axis", int(1)),
        ],
    )
}

/// How one layer's self-attention reaches the full cache.
pub(super) enum SelfKv {
    /// Per-layer caches from the inputs, and the blend masks `mask` and `1 − mask`.
    Blend {
        keys: Vec<V>,
        values: Vec<V>,
        mask: V,
        keep: V,
    },
    /// The state variables, the write position (`cache_length`), d_model and cache length.
    State {
        key: V,
        value: V,
        pos: V,
        d: usize,
        len: usize,
    },
}

impl SelfKv {
    /// The [1, d, 1, S] key and value caches of layer `l` with this token's `k`, `v` merged in.
    pub(super) fn merge(&self, b: &mut Builder, n: &str, l: usize, k: &V, v: &V) -> Result<(V, V)> {
        match self {
            SelfKv::Blend {
                keys,
                values,
                mask,
                keep,
            } => {
                let mut out = vec![];
                for (what, cache, new) in [("key", &keys[l], k), ("value", &values[l], v)] {
                    let old = mul(b, &format!("{n}_{what}_cache_kept"), cache, keep)?;
                    let put = mul(b, &format!("{n}_{what}_cache_new"), new, mask)?;
                    out.push(b.add(&format!("{n}_{what}_cache_merged"), &old, &put)?);
                }
                Ok((out[0].clone(), out[1].clone()))
            }
            SelfKv::State {
                key,
                value,
                pos,
                d,
                len,
            } => {
                let mut out = vec![];
                for (what, state, new) in [("key", key, k), ("value", value, v)] {
                    out.push(state_update(
                        b,
                        &format!("{n}_{what}_cache"),
                        state,
                        new,
                        pos,
                        l,
                        *d,
                        *len,
                    )?);
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
pub(super) fn state_update(
    b: &mut Builder,
    n: &str,
    state: &V,
    new: &V,
    pos: &V,
    l: usize,
    d: usize,
    s: usize,
) -> Result<V> {
    let cur = b.op1(
        "read_state",
        &format!("{n}_read"),
        vec![("input", state.into())],
    )?;
    let lo = b.konst(
        &format!("{n}_begin_prefix"),
        Value::i32s(&[0, (l * d) as i32, 0]),
    );
    let begin = b.op1(
        "concat",
        &format!("{n}_begin"),
        vec![("values", In::Vs(vec![lo, pos.clone()])), ("axis", int(0))],
    )?;
    let end = b.op1(
        "add",
        &format!("{n}_end"),
        vec![
            ("x", In::V(begin.clone())),
            ("y", ints(&[1, d as i32, 1, 1])),
        ],
    )?;
    let upd = b.op1(
        "slice_update",
        &format!("{n}_update"),
        vec![
            ("x", In::V(cur)),
            ("update", new.into()),
            ("begin", In::V(begin)),
            ("end", In::V(end)),
        ],
    )?;
    b.op(
        "write_state",
        &format!("{n}_write"),
        vec![("input", state.into()), ("data", In::V(upd.clone()))],
    )?;
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
pub(super) fn head(
    b: &mut Builder,
    w: &dyn WeightSource,
    h: &V,
    d: usize,
    vocab: usize,
    chunks: usize,
) -> Result<V> {
    let (shape, data) = match w.f16("proj_out.weight") {
        Ok(t) => t,
        Err(_) => w.f16(&format!("{P}.embed_tokens.weight"))?,
    };
    ensure!(
        shape == [vocab, d],
        "vocabulary head has shape {shape:?}, expected [{vocab}, {d}]"
    );
    let rows_per = vocab.div_ceil(chunks);
    let names = super::decoder_spec::head_op_names(chunks);
    let mut parts = vec![];
    for (c, name) in names.iter().enumerate() {
        let (r0, r1) = (c * rows_per, ((c + 1) * rows_per).min(vocab));
        ensure!(
            r0 < r1,
            "{chunks} head chunks leave chunk {c} empty for vocab {vocab}"
        );
        let bytes = data.slice(r0 * d * 2..r1 * d * 2)?;
        let t = Value::Tensor(Tensor::new(
            crate::ir::DType::F16,
            vec![r1 - r0, d, 1, 1],
            bytes,
        )?);
        parts.push(b.conv(name, h, t, None)?);
    }
    let logits = if parts.len() == 1 {
        parts.remove(0)
    } else {
        b.op1(
            "concat",
            "lm_head_concat",
            vec![("values", In::Vs(parts)), ("axis", int(1))],
        )?
    };
    b.reshape("logits_1_1_v", &logits, &[1, 1, vocab as i32])
}

/// Embedding row `index` of table `name` ([rows, d] fp16) by `gather` → [1, d].
pub(super) fn embed(
    b: &mut Builder,
    w: &dyn WeightSource,
    name: &str,
    rows: usize,
    d: usize,
    index: &V,
) -> Result<V> {
    let table = b.konst(name, weight(w, &format!("{P}.{name}.weight"), &[rows, d])?);
    b.op1(
        "gather",
        &format!("{name}_row"),
        vec![
            ("x", In::V(table)),
            ("indices", index.into()),
            ("axis", int(0)),
        ],
    )
}

/// The CrossKV model: `encoder_output_embeds` [1, d, 1, 1500] → every layer's cross-attention
/// keys and values, concatenated on channels like the self-attention caches:
/// `encoder_attn_key_cache`/`encoder_attn_value_cache` [1, d·layers, 1, 1500].
pub fn build_cross_kv(dims: &DecoderDims, w: &dyn WeightSource, opset: Opset) -> Result<Model> {
    check(dims, &DecoderOptions::default(), opset)?;
    let d = dims.d_model;
    let dl = d * dims.layers;
    let fin = Feature::new(
        "encoder_output_embeds",
        ArrayDType::F16,
        &[1, d, 1, dims.n_audio_ctx],
    );
    let fout: Vec<Feature> = CROSS_KV_NAMES
        .iter()
        .map(|n| Feature::new(n, ArrayDType::F16, &[1, dl, 1, dims.n_audio_ctx]))
        .collect();
    let mut b = Builder::new(opset);
    let x = b.input(&fin.name, ValueType::Tensor(fin.tensor_type()));
    let (mut ks, mut vs) = (vec![], vec![]);
    for l in 0..dims.layers {
        let (k, v) = key_value(
            &mut b,
            &format!("layers_{l}_encoder_attn"),
            &x,
            w,
            &format!("{P}.layers.{l}.encoder_attn"),
            d,
        )?;
        ks.push(k);
        vs.push(v);
    }
    let mut outs = vec![];
    for (name, parts) in [
        ("encoder_attn_key_concat", ks),
        ("encoder_attn_value_concat", vs),
    ] {
        outs.push(if parts.len() == 1 {
            b.op1("identity", name, vec![("x", In::V(parts[0].clone()))])?
        } else {
            b.op1(
                "concat",
                name,
                vec![("values", In::Vs(parts)), ("axis", int(1))],
            )?
        });
    }
    let named: Vec<(V, &str)> = outs.into_iter().zip(CROSS_KV_NAMES).collect();
    let (inputs, block) = b.finish(&named)?;
    let mut description = Description {
        inputs: vec![fin],
        outputs: fout,
        ..Default::default()
    };
    description.short_description =
        "Whisper cross-attention keys/values of all decoder layers from the encoder output, fp16, BC1S".into();
    Ok(finish_model("cross_kv", inputs, block, opset, description))
}
