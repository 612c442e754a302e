//! Shared pieces of the Whisper graphs in the Neural Engine's preferred layout: activations
//! are [1, C, 1, S] ("BC1S"), every linear is a 1x1 `conv`, layer norm runs over the channel
//! axis, attention reshapes to [1, heads, head_dim, S].

use crate::ir::{Bytes, DType, Tensor, Value};
use crate::ops::{Builder, In, V};
use anyhow::{ensure, Context, Result};
use half::f16;

/// Where graph builders get fp16 weights by Hugging Face tensor name.
pub trait WeightSource {
    /// Shape and little-endian fp16 bytes of a tensor.
    fn f16(&self, name: &str) -> Result<(Vec<usize>, Bytes)>;
}

/// A weight as an fp16 tensor constant of `shape` (same element count as stored).
pub fn weight(w: &dyn WeightSource, name: &str, shape: &[usize]) -> Result<Value> {
    let (s, data) = w.f16(name)?;
    ensure!(
        s.iter().product::<usize>() == shape.iter().product::<usize>(),
        "tensor {name} has shape {s:?}, expected {} elements ({shape:?})",
        shape.iter().product::<usize>()
    );
    Ok(Value::Tensor(
        Tensor::new(DType::F16, shape.to_vec(), data).with_context(|| name.to_string())?,
    ))
}

/// Multiplies an fp16 weight by `s`, for folding a power-of-two scale exactly.
pub fn scaled(w: &dyn WeightSource, name: &str, shape: &[usize], s: f32) -> Result<Value> {
    let (_, data) = w.f16(name)?;
    let v: Vec<f16> = data
        .to_f16_vec()
        .into_iter()
        .map(|x| f16::from_f32(x.to_f32() * s))
        .collect();
    ensure!(
        v.len() == shape.iter().product::<usize>(),
        "tensor {name}: wrong element count"
    );
    Ok(Value::Tensor(Tensor::f16(shape, &v)))
}

pub fn ints(v: &[i32]) -> In {
    In::C(Value::i32s(v))
}

pub fn int(v: i32) -> In {
    In::C(Value::i32_scalar(v))
}

/// A 1x1 convolution (a linear layer in BC1S) with weight `[out, in]` → `[out, in, 1, 1]`.
pub fn conv1x1(b: &mut Builder, name: &str, x: &V, w: Value, bias: Option<Value>) -> Result<V> {
    let wv = b.konst(&format!("{name}_weight"), w);
    let mut inputs = vec![("x", In::from(x)), ("weight", In::V(wv))];
    if let Some(bv) = bias {
        let bv = b.konst(&format!("{name}_bias"), bv);
        inputs.push(("bias", In::V(bv)));
    }
    inputs.extend([
        ("strides", ints(&[1, 1])),
        ("pad_type", In::C(Value::str("valid"))),
        ("dilations", ints(&[1, 1])),
        ("groups", int(1)),
    ]);
    b.op1("conv", name, inputs)
}

/// Layer norm over the channel axis of a BC1S tensor, fp16 epsilon as Core ML stores it.
pub fn layer_norm_c(
    b: &mut Builder,
    name: &str,
    x: &V,
    gamma: Value,
    beta: Value,
    eps: f32,
) -> Result<V> {
    let g = b.konst(&format!("{name}_gamma"), gamma);
    let bt = b.konst(&format!("{name}_beta"), beta);
    b.op1(
        "layer_norm",
        name,
        vec![
            ("x", x.into()),
            ("axes", ints(&[1])),
            ("gamma", In::V(g)),
            ("beta", In::V(bt)),
            ("epsilon", In::C(Value::f16_scalar(eps))),
        ],
    )
}

pub fn gelu(b: &mut Builder, name: &str, x: &V) -> Result<V> {
    b.op1(
        "gelu",
        name,
        vec![("x", x.into()), ("mode", In::C(Value::str("EXACT")))],
    )
}

pub fn add(b: &mut Builder, name: &str, x: &V, y: &V) -> Result<V> {
    b.op1("add", name, vec![("x", x.into()), ("y", y.into())])
}

pub fn reshape(b: &mut Builder, name: &str, x: &V, shape: &[i32]) -> Result<V> {
    b.op1(
        "reshape",
        name,
        vec![("x", x.into()), ("shape", ints(shape))],
    )
}

/// Multi-head attention core in BC1S: `q` [1, d, 1, Sq], `k`/`v` [1, d, 1, Sk] → [1, d, 1, Sq].
/// One `softmax` for all heads; the 1/sqrt(head_dim) scale must already be applied to `q`.
/// `mask`, if given, is added to the [1, H, Sq, Sk] scores before the softmax.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    b: &mut Builder,
    name: &str,
    q: &V,
    k: &V,
    v: &V,
    heads: usize,
    d: usize,
    mask: Option<&V>,
) -> Result<(V, V)> {
    let dh = (d / heads) as i32;
    let h = heads as i32;
    let qh = reshape(b, &format!("{name}_q_heads"), q, &[1, h, dh, -1])?;
    let kh = reshape(b, &format!("{name}_k_heads"), k, &[1, h, dh, -1])?;
    let vh = reshape(b, &format!("{name}_v_heads"), v, &[1, h, dh, -1])?;
    let mut scores = b.op1(
        "matmul",
        &format!("{name}_scores"),
        vec![
            ("x", In::V(qh)),
            ("y", In::V(kh)),
            ("transpose_x", In::C(Value::bool_scalar(true))),
            ("transpose_y", In::C(Value::bool_scalar(false))),
        ],
    )?;
    if let Some(m) = mask {
        scores = add(b, &format!("{name}_masked"), &scores, m)?;
    }
    let w = b.op1(
        "softmax",
        &format!("{name}_weights"),
        vec![("x", In::V(scores)), ("axis", int(-1))],
    )?;
    let o = b.op1(
        "matmul",
        &format!("{name}_context"),
        vec![
            ("x", In::V(vh)),
            ("y", In::from(&w)),
            ("transpose_x", In::C(Value::bool_scalar(false))),
            ("transpose_y", In::C(Value::bool_scalar(true))),
        ],
    )?;
    let o = reshape(b, &format!("{name}_merge"), &o, &[1, d as i32, 1, -1])?;
    Ok((o, w))
}

/// The factor HF applies to queries, and whether folding it into fp16 weights is exact
/// (a power of two only changes the exponent).
pub fn query_scale(head_dim: usize) -> (f32, bool) {
    let s = (head_dim as f32).powf(-0.5);
    (s, s.log2().fract() == 0.0)
}
