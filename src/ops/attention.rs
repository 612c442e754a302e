//! iOS18's fused `scaled_dot_product_attention`: `softmax(Q·Kᵀ/√E + mask)·V` with an
//! optional bool mask (false → −∞) or float mask (added), broadcast to `[B, *, L, S]`.
//! Evaluated by `kernels::attention` (blocks of query rows; the [L, S] score matrix never
//! exists whole), intermediates rounded to the compute dtype as the unfused chain would be;
//! on bf16 products in a session computing them (`--compute bf16`).

use super::eval::{one, EvalCx, RValue};
use super::infer::{broadcast, float_only, tensor, InferCx};
use super::{opt, req, ver, InputSpec, OpDef};
use crate::ir::{DType, Dim, Opset, ValueType};
use crate::kernels::{self, Attention};
use anyhow::{ensure, Result};

fn infer_sdpa(cx: &InferCx) -> Result<Vec<ValueType>> {
    let dt = cx.same_dtype(&["query", "key", "value"])?;
    let (q, k, v) = (cx.t("query")?, cx.t("key")?, cx.t("value")?);
    float_only(q, "query")?;
    ensure!(
        q.rank() == k.rank() && q.rank() == v.rank(),
        "query, key and value must have the same rank ({}, {}, {})",
        q.rank(),
        k.rank(),
        v.rank()
    );
    ensure!(
        q.rank() >= 3,
        "query, key and value need rank ≥ 3, have {}",
        q.rank()
    );
    let r = q.rank();
    let fixed_ne = |a: &Dim, b: &Dim| matches!((a, b), (Dim::Fixed(x), Dim::Fixed(y)) if x != y);
    ensure!(
        !fixed_ne(&q.shape[r - 1], &k.shape[r - 1]),
        "query and key embeddings differ ({} vs {})",
        q.shape[r - 1],
        k.shape[r - 1]
    );
    ensure!(
        !fixed_ne(&k.shape[r - 2], &v.shape[r - 2]),
        "key and value sequence lengths differ ({} vs {})",
        k.shape[r - 2],
        v.shape[r - 2]
    );
    for i in 0..r - 2 {
        ensure!(
            !fixed_ne(&q.shape[i], &k.shape[i]) && !fixed_ne(&q.shape[i], &v.shape[i]),
            "query, key and value batch dimensions differ"
        );
    }
    if let Some(m) = cx.opt_t("attn_mask")? {
        ensure!(
            matches!(m.dtype, DType::Bool | DType::F16 | DType::F32),
            "attn_mask must be bool, fp16 or fp32, is {}",
            m.dtype
        );
        ensure!(m.rank() >= 1, "attn_mask needs rank ≥ 1");
        ensure!(
            !fixed_ne(&m.shape[m.rank() - 1], &k.shape[r - 2]),
            "attn_mask's last dimension {} is not the key length {}",
            m.shape[m.rank() - 1],
            k.shape[r - 2]
        );
        broadcast(&q.shape[..r - 1], &m.shape[..m.rank() - 1])?;
    }
    let mut s = q.shape[..r - 1].to_vec();
    s.push(v.shape[r - 1].clone());
    Ok(vec![tensor(dt, s)])
}

fn eval_sdpa(cx: &EvalCx) -> Result<Vec<RValue>> {
    let q = cx.t("query")?;
    let e = *q.dims().last().unwrap_or(&1);
    let qs = kernels::to_f32(q)?.affine(1.0 / (e as f64).sqrt(), 0.0)?;
    let (k, v) = (cx.t("key")?, cx.t("value")?);
    let mask = match cx.opt_t("attn_mask")? {
        Some(m) if m.dtype() == candle_core::DType::U8 => {
            let keep = kernels::to_vec::<u8>(m)?;
            let add: Vec<f32> = keep
                .iter()
                .map(|&b| if b != 0 { 0.0 } else { f32::NEG_INFINITY })
                .collect();
            Some(kernels::from_vec(add, m.dims())?)
        }
        Some(m) => Some(m.clone()),
        None => None,
    };
    let round = q.dtype();
    let a = Attention {
        x: &qs,
        tx: false,
        y: k,
        ty: true,
        mask: mask.as_ref(),
        round: [round; 3],
        v,
        tv: false,
        probs_left: true,
    };
    // A session computing bf16 products runs the panels on them (`--compute bf16`).
    let kernel = kernels::Kernel::for_products(cx.products());
    let (out, _) = kernels::attention_with(&a, false, kernel)?;
    one(kernels::cast(&out, cx.out_dtype(0)?)?)
}

const SDPA: &[InputSpec] = &[req("query"), req("key"), req("value"), opt("attn_mask")];

pub static DEFS: &[OpDef] = &[ver(
    "scaled_dot_product_attention",
    Opset::Ios18,
    None,
    SDPA,
    infer_sdpa,
    eval_sdpa,
)];
