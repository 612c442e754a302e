//! iOS17 activation quantization: `quantize` (`round_half_even(x / scale) + zero_point`,
//! clipped to int8 / uint8) and `dequantize` (`(q − zero_point) · scale`), with scalar or
//! per-`axis` scale and zero point, as coremltools' `quantize_by_scale_and_zp` computes.

use super::eval::{one, EvalCx, RValue};
use super::infer::{axis, tensor, InferCx};
use super::{opt_c, req, req_c, ver as v, InputSpec, OpDef};
use crate::ir::{DType, Dim, Opset, ValueType};
use crate::kernels;
use anyhow::{anyhow, bail, ensure, Result};

/// Checks scale / zero point: scalars without `axis`, vectors of x.shape[axis] with it.
fn check_params(cx: &InferCx, x: &crate::ir::TensorType) -> Result<()> {
    let s = cx.t("scale")?;
    match s.rank() {
        0 => ensure!(
            !cx.has("axis"),
            "axis must not be given with a scalar scale"
        ),
        1 => {
            let a = axis(
                cx.opt_int("axis")?
                    .ok_or_else(|| anyhow!("a vector scale needs `axis`"))?,
                x.rank(),
            )?;
            if let (Dim::Fixed(n), Some(sv)) = (&x.shape[a], s.fixed_shape()) {
                ensure!(sv[0] == *n, "scale has {} values for an axis of {n}", sv[0]);
            }
        }
        r => bail!("scale must be a scalar or a vector, has rank {r}"),
    }
    if let Some(z) = cx.opt_t("zero_point")? {
        ensure!(
            z.rank() == s.rank(),
            "zero_point must have the rank of scale"
        );
    }
    Ok(())
}

fn infer_quantize(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("input")?;
    ensure!(
        x.dtype.is_float(),
        "quantize input must be fp16/fp32, is {}",
        x.dtype
    );
    check_params(cx, x)?;
    let d = match cx.opt_str("output_dtype")? {
        Some("int8") => DType::I8,
        Some("uint8") => DType::U8,
        Some(o) => bail!("quantize output_dtype `{o}` (int8 or uint8)"),
        None => bail!("quantize needs `output_dtype`"),
    };
    Ok(vec![tensor(d, x.shape.clone())])
}

fn infer_dequantize(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("input")?;
    ensure!(
        matches!(x.dtype, DType::I8 | DType::U8),
        "dequantize input must be int8/uint8, is {}",
        x.dtype
    );
    check_params(cx, x)?;
    let s = cx.t("scale")?;
    ensure!(s.dtype.is_float(), "scale must be fp16/fp32");
    Ok(vec![tensor(s.dtype, x.shape.clone())])
}

/// Per element: (scale, zero point).
fn params(cx: &EvalCx, shape: &[usize]) -> Result<impl Fn(usize) -> (f64, f64)> {
    let s = cx.floats("scale")?;
    let z = if cx.has("zero_point") {
        cx.floats("zero_point")?
    } else {
        vec![0.0; s.len()]
    };
    let (n, inner) = match cx.opt_int("axis")? {
        Some(a) => {
            let a = axis(a, shape.len())?;
            (shape[a], shape[a + 1..].iter().product::<usize>())
        }
        None => (1, 1),
    };
    ensure!(
        s.len() == n && z.len() == n,
        "scale / zero_point have {} / {} values for {n}",
        s.len(),
        z.len()
    );
    Ok(move |i: usize| {
        let k = (i / inner.max(1)) % n;
        (s[k], z[k])
    })
}

fn eval_quantize(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("input")?;
    let p = params(cx, x.dims())?;
    let (lo, hi) = match cx.out(0)?.dtype {
        DType::I8 => (-128.0, 127.0),
        _ => (0.0, 255.0),
    };
    let v: Vec<f64> = kernels::to_vec::<f64>(x)?
        .into_iter()
        .enumerate()
        .map(|(i, e)| {
            let (s, z) = p(i);
            // numpy divides in the input's precision (f32 for fp32 / fp16 programs).
            ((e as f32 / s as f32).round_ties_even() as f64 + z).clamp(lo, hi)
        })
        .collect();
    one(kernels::data::from_f64(v, x.dims(), cx.out_dtype(0)?)?)
}

fn eval_dequantize(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("input")?;
    let p = params(cx, x.dims())?;
    let v: Vec<f64> = kernels::to_vec::<f64>(x)?
        .into_iter()
        .enumerate()
        .map(|(i, q)| {
            let (s, z) = p(i);
            (q - z) * s
        })
        .collect();
    one(kernels::data::from_f64(v, x.dims(), cx.out_dtype(0)?)?)
}

const Q: &[InputSpec] = &[
    req("input"),
    opt_c("zero_point"),
    req_c("scale"),
    opt_c("axis"),
    req_c("output_dtype"),
];
const DQ: &[InputSpec] = &[
    req("input"),
    opt_c("zero_point"),
    req_c("scale"),
    opt_c("axis"),
];

pub static DEFS: &[OpDef] = &[
    v(
        "quantize",
        Opset::Ios17,
        None,
        Q,
        infer_quantize,
        eval_quantize,
    ),
    v(
        "dequantize",
        Opset::Ios17,
        None,
        DQ,
        infer_dequantize,
        eval_dequantize,
    ),
];
