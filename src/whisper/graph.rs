//! Shared pieces of the Whisper graphs in the Neural Engine's preferred layout: activations
//! are [1, C, 1, S] ("BC1S"), every linear is a 1x1 `conv`, layer norm runs over the channel
//! axis, attention reshapes to [1, heads, head_dim, S]. Where weights come from and how they
//! become constants; the typed op helpers themselves are `ops::builder`'s.

use crate::ir::{Bytes, DType, Tensor, Value};
use crate::ops::{Builder, V};
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
    let qh = b.reshape(&format!("{name}_q_heads"), q, &[1, h, dh, -1])?;
    let kh = b.reshape(&format!("{name}_k_heads"), k, &[1, h, dh, -1])?;
    let vh = b.reshape(&format!("{name}_v_heads"), v, &[1, h, dh, -1])?;
    let mut scores = b.matmul(&format!("{name}_scores"), &qh, &kh, true, false)?;
    if let Some(m) = mask {
        scores = b.add(&format!("{name}_masked"), &scores, m)?;
    }
    let w = b.softmax(&format!("{name}_weights"), &scores, -1)?;
    let o = b.matmul(&format!("{name}_context"), &vh, &w, false, true)?;
    let o = b.reshape(&format!("{name}_merge"), &o, &[1, d as i32, 1, -1])?;
    Ok((o, w))
}

/// The factor HF applies to queries, and whether folding it into fp16 weights is exact
/// (a power of two only changes the exponent).
pub fn query_scale(head_dim: usize) -> (f32, bool) {
    let s = (head_dim as f32).powf(-0.5);
    (s, s.log2().fract() == 0.0)
}
