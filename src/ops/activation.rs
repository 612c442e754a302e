//! The activation family beyond `relu` / `sigmoid` / `silu` / `gelu` (`elu`, `leaky_relu`,
//! `prelu`, `softplus`, `softsign`, `relu6`, `scaled_tanh`, `sigmoid_hard`, ...) and the
//! remaining float unary maths (`acos`, `asin`, `atan`, `atanh`, `cosh`, `sinh`, `tan`,
//! `threshold`): type inference and evaluation. Floats are computed in f32 and rounded once
//! to the input dtype (see `kernels::elementwise`); the per-channel parameters of `prelu`
//! and `softplus_parametric` index axis 1 (`C` of `[B, C, ...]`).

use super::eval::{one, EvalCx, RValue};
use super::infer::{float_only, InferCx};
use super::{req, req_c, ver as v, InputSpec, OpDef};
use crate::ir::{Opset, ValueType};
use crate::kernels::{self, fastmath};
use anyhow::{anyhow, ensure, Result};

const X: &[InputSpec] = &[req("x")];
const X_A: &[InputSpec] = &[req("x"), req_c("alpha")];
const X_AB: &[InputSpec] = &[req("x"), req_c("alpha"), req_c("beta")];

fn infer_float_same(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    float_only(x, "x")?;
    Ok(vec![ValueType::Tensor(x.clone())])
}

/// `alpha` / `beta` as one f32.
fn scalar(cx: &EvalCx, name: &str) -> Result<f32> {
    cx.opt_f64(name)?
        .map(|v| v as f32)
        .ok_or_else(|| anyhow!("`{}` needs `{name}`", cx.op_type))
}

fn map(cx: &EvalCx, f: impl Fn(f32) -> f32 + Sync + Send) -> Result<Vec<RValue>> {
    one(kernels::map_f32(cx.t("x")?, f)?)
}

macro_rules! unary {
    ($name:ident, $f:expr) => {
        fn $name(cx: &EvalCx) -> Result<Vec<RValue>> {
            map(cx, $f)
        }
    };
}

unary!(eval_acos, f32::acos);
unary!(eval_asin, f32::asin);
unary!(eval_atan, f32::atan);
unary!(eval_atanh, f32::atanh);
unary!(eval_cosh, f32::cosh);
unary!(eval_sinh, f32::sinh);
unary!(eval_tan, f32::tan);
unary!(eval_relu6, |x| x.clamp(0.0, 6.0));
unary!(eval_softsign, |x| x / (1.0 + x.abs()));
// log(1 + e^-|x|) + max(x, 0), as coremltools' value inference (no overflow).
unary!(eval_softplus, |x| (-x.abs()).exp().ln_1p() + x.max(0.0));

fn eval_threshold(cx: &EvalCx) -> Result<Vec<RValue>> {
    let a = scalar(cx, "alpha")?;
    map(cx, move |x| x.max(a))
}
fn eval_elu(cx: &EvalCx) -> Result<Vec<RValue>> {
    let a = scalar(cx, "alpha")?;
    map(cx, move |x| if x > 0.0 { x } else { a * x.exp_m1() })
}
fn eval_leaky_relu(cx: &EvalCx) -> Result<Vec<RValue>> {
    let a = scalar(cx, "alpha")?;
    map(cx, move |x| if x >= 0.0 { x } else { a * x })
}
fn eval_thresholded_relu(cx: &EvalCx) -> Result<Vec<RValue>> {
    let a = scalar(cx, "alpha")?;
    map(cx, move |x| if x >= a { x } else { 0.0 })
}
fn eval_clamped_relu(cx: &EvalCx) -> Result<Vec<RValue>> {
    let (a, b) = (scalar(cx, "alpha")?, scalar(cx, "beta")?);
    map(
        cx,
        move |x| if x >= 0.0 { x.min(b) } else { (a * x).min(b) },
    )
}
fn eval_linear_activation(cx: &EvalCx) -> Result<Vec<RValue>> {
    let (a, b) = (scalar(cx, "alpha")?, scalar(cx, "beta")?);
    map(cx, move |x| a * x + b)
}
fn eval_scaled_tanh(cx: &EvalCx) -> Result<Vec<RValue>> {
    let (a, b) = (scalar(cx, "alpha")?, scalar(cx, "beta")?);
    map(cx, move |x| a * fastmath::tanh(x * b))
}
fn eval_sigmoid_hard(cx: &EvalCx) -> Result<Vec<RValue>> {
    let (a, b) = (scalar(cx, "alpha")?, scalar(cx, "beta")?);
    map(cx, move |x| (a * x + b).clamp(0.0, 1.0))
}

/// Per-channel parameter vectors of length C = x.shape[1].
fn infer_per_channel(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    float_only(x, "x")?;
    ensure!(x.rank() >= 3, "`{}` needs x of rank ≥ 3", cx.op_type);
    if cx.op_type == "prelu" {
        ensure!(
            (3..=5).contains(&x.rank()),
            "`prelu`: x {x} must be rank 3, 4 or 5"
        );
        // coremltools' rule: on rank 3 and 5 the per-channel form is not supported, every
        // alpha must be the same (within 1e-5).
        if x.rank() != 4 {
            if let Some(a) = cx
                .opt_tensor_val("alpha")?
                .map(|t| t.to_f64_vec())
                .transpose()?
            {
                ensure!(
                    a.iter().all(|v| (v - a[0]).abs() <= 1e-5),
                    "`prelu`: on rank {} x, coremltools 9 supports only one alpha value for \
                     every channel",
                    x.rank()
                );
            }
        }
    }
    for p in ["alpha", "beta"] {
        if let Some(t) = cx.opt_t(p)? {
            ensure!(t.rank() == 1, "`{p}` must be a vector [C]");
            if let (Some(c), crate::ir::Dim::Fixed(xc)) = (t.fixed_shape(), &x.shape[1]) {
                ensure!(c[0] == *xc, "`{p}` has {} entries for {xc} channels", c[0]);
            }
        }
    }
    Ok(vec![ValueType::Tensor(x.clone())])
}

/// Applies `f(x, channel)` over [B, C, rest...].
fn per_channel(cx: &EvalCx, f: impl Fn(f32, usize) -> f32 + Sync + Send) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let d = x.dims();
    ensure!(d.len() >= 3, "`{}` needs x of rank ≥ 3", cx.op_type);
    let (c, inner): (usize, usize) = (d[1], d[2..].iter().product());
    let v = kernels::to_f32_vec(x)?;
    let out: Vec<f32> = v
        .iter()
        .enumerate()
        .map(|(i, &e)| f(e, (i / inner.max(1)) % c))
        .collect();
    one(kernels::from_f32(out, d, x.dtype())?)
}

fn channel_params(cx: &EvalCx, name: &str, c: usize) -> Result<Vec<f32>> {
    let v: Vec<f32> = cx.floats(name)?.into_iter().map(|v| v as f32).collect();
    ensure!(
        v.len() == c,
        "`{name}` has {} entries for {c} channels",
        v.len()
    );
    Ok(v)
}

fn eval_prelu(cx: &EvalCx) -> Result<Vec<RValue>> {
    let c = cx.t("x")?.dims().get(1).copied().unwrap_or(0);
    let a = channel_params(cx, "alpha", c)?;
    per_channel(cx, move |x, ch| if x > 0.0 { x } else { a[ch] * x })
}
fn eval_softplus_parametric(cx: &EvalCx) -> Result<Vec<RValue>> {
    let c = cx.t("x")?.dims().get(1).copied().unwrap_or(0);
    let (a, b) = (
        channel_params(cx, "alpha", c)?,
        channel_params(cx, "beta", c)?,
    );
    per_channel(cx, move |x, ch| {
        let z = x * b[ch];
        a[ch] * ((-z.abs()).exp().ln_1p() + z.max(0.0))
    })
}

use Opset::{Ios15 as I15, Ios17 as I17};

pub static DEFS: &[OpDef] = &[
    v("acos", I15, None, X, infer_float_same, eval_acos),
    v("asin", I15, None, X, infer_float_same, eval_asin),
    v("atan", I15, None, X, infer_float_same, eval_atan),
    v("atanh", I15, None, X, infer_float_same, eval_atanh),
    v("cosh", I15, None, X, infer_float_same, eval_cosh),
    v("sinh", I15, None, X, infer_float_same, eval_sinh),
    v("tan", I15, None, X, infer_float_same, eval_tan),
    v(
        "threshold",
        I15,
        None,
        X_A,
        infer_float_same,
        eval_threshold,
    ),
    v("relu6", I15, None, X, infer_float_same, eval_relu6),
    v("softsign", I15, None, X, infer_float_same, eval_softsign),
    v("softplus", I15, None, X, infer_float_same, eval_softplus),
    // iOS17 versions only widen alpha/beta's type domain; the maths is the same.
    v("elu", I15, Some(I17), X_A, infer_float_same, eval_elu),
    v("elu", I17, None, X_A, infer_float_same, eval_elu),
    v(
        "leaky_relu",
        I15,
        Some(I17),
        X_A,
        infer_float_same,
        eval_leaky_relu,
    ),
    v(
        "leaky_relu",
        I17,
        None,
        X_A,
        infer_float_same,
        eval_leaky_relu,
    ),
    v(
        "thresholded_relu",
        I15,
        Some(I17),
        X_A,
        infer_float_same,
        eval_thresholded_relu,
    ),
    v(
        "thresholded_relu",
        I17,
        None,
        X_A,
        infer_float_same,
        eval_thresholded_relu,
    ),
    v(
        "clamped_relu",
        I15,
        Some(I17),
        X_AB,
        infer_float_same,
        eval_clamped_relu,
    ),
    v(
        "clamped_relu",
        I17,
        None,
        X_AB,
        infer_float_same,
        eval_clamped_relu,
    ),
    v(
        "linear_activation",
        I15,
        Some(I17),
        X_AB,
        infer_float_same,
        eval_linear_activation,
    ),
    v(
        "linear_activation",
        I17,
        None,
        X_AB,
        infer_float_same,
        eval_linear_activation,
    ),
    v(
        "scaled_tanh",
        I15,
        Some(I17),
        X_AB,
        infer_float_same,
        eval_scaled_tanh,
    ),
    v(
        "scaled_tanh",
        I17,
        None,
        X_AB,
        infer_float_same,
        eval_scaled_tanh,
    ),
    v(
        "sigmoid_hard",
        I15,
        Some(I17),
        X_AB,
        infer_float_same,
        eval_sigmoid_hard,
    ),
    v(
        "sigmoid_hard",
        I17,
        None,
        X_AB,
        infer_float_same,
        eval_sigmoid_hard,
    ),
    v("prelu", I15, Some(I17), X_A, infer_per_channel, eval_prelu),
    v("prelu", I17, None, X_A, infer_per_channel, eval_prelu),
    v(
        "softplus_parametric",
        I15,
        Some(I17),
        X_AB,
        infer_per_channel,
        eval_softplus_parametric,
    ),
    v(
        "softplus_parametric",
        I17,
        None,
        X_AB,
        infer_per_channel,
        eval_softplus_parametric,
    ),
];
