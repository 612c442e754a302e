//! Reductions: `reduce_*` over axes and `reduce_argmax` / `reduce_argmin` — type inference
//! and evaluation (rows reduced in f64 by `kernels::norm::reduce`). iOS17's arg reductions
//! add `output_dtype` (int32 or uint16).

use super::eval::{one, EvalCx, RValue};
use super::infer::{axis, tensor, InferCx};
use super::nn::{norm_axes, sorted_axes};
use super::placement::Flops;
use super::DefaultValue;
use super::{def, ver};
use super::{opt_c, req, InputSpec, OpDef};
use crate::ir::{Dim, Opset::Ios15 as I15, Opset::Ios17 as I17, ValueType};
use crate::kernels::{self, Reduce};
use anyhow::Result;

fn infer_reduce(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    let keep = cx.bool_or_default("keep_dims")?;
    let axes = norm_axes(cx, "axes", x.rank())?.unwrap_or((0..x.rank()).collect());
    let mut s = Vec::new();
    for (i, d) in x.shape.iter().enumerate() {
        if axes.contains(&i) {
            if keep {
                s.push(Dim::Fixed(1));
            }
        } else {
            s.push(d.clone());
        }
    }
    Ok(vec![tensor(x.dtype, s)])
}

fn infer_argmax(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    let keep = cx.bool_or_default("keep_dims")?;
    let a = axis(cx.int_or_default("axis")?, x.rank())?;
    let mut s = x.shape.clone();
    if keep {
        s[a] = Dim::Fixed(1);
    } else {
        s.remove(a);
    }
    Ok(vec![tensor(arg_dtype(cx.opt_str("output_dtype")?)?, s)])
}

/// iOS17's `output_dtype` (int32, the default, or uint16, as coremltools allows).
fn arg_dtype(name: Option<&str>) -> Result<crate::ir::DType> {
    match name.unwrap_or("int32") {
        "int32" => Ok(crate::ir::DType::I32),
        "uint16" => Ok(crate::ir::DType::U16),
        other => anyhow::bail!("output_dtype `{other}`: only int32 and uint16 are defined"),
    }
}

const REDUCE: &[InputSpec] = &[
    req("x"),
    opt_c("axes"),
    opt_c("keep_dims").or(DefaultValue::Bool(false)),
];
const ARGRED: &[InputSpec] = &[
    req("x"),
    opt_c("axis").or(DefaultValue::Int(-1)),
    opt_c("keep_dims").or(DefaultValue::Bool(false)),
];
const ARGRED17: &[InputSpec] = &[
    req("x"),
    opt_c("axis").or(DefaultValue::Int(-1)),
    opt_c("keep_dims").or(DefaultValue::Bool(false)),
    opt_c("output_dtype"),
];

fn reduce(cx: &EvalCx, how: Reduce) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let keep = cx.bool_or_default("keep_dims")?;
    let axes = sorted_axes(cx, "axes", x.rank())?;
    one(kernels::reduce(x, &axes, keep, how)?)
}
fn eval_reduce_mean(cx: &EvalCx) -> Result<Vec<RValue>> {
    reduce(cx, Reduce::Mean)
}
fn eval_reduce_sum(cx: &EvalCx) -> Result<Vec<RValue>> {
    reduce(cx, Reduce::Sum)
}
fn eval_reduce_max(cx: &EvalCx) -> Result<Vec<RValue>> {
    reduce(cx, Reduce::Max)
}
fn eval_reduce_min(cx: &EvalCx) -> Result<Vec<RValue>> {
    reduce(cx, Reduce::Min)
}
fn eval_reduce_prod(cx: &EvalCx) -> Result<Vec<RValue>> {
    reduce(cx, Reduce::Prod)
}
fn eval_reduce_l2_norm(cx: &EvalCx) -> Result<Vec<RValue>> {
    reduce(cx, Reduce::L2)
}
fn eval_reduce_log_sum_exp(cx: &EvalCx) -> Result<Vec<RValue>> {
    reduce(cx, Reduce::LogSumExp)
}
fn eval_reduce_l1_norm(cx: &EvalCx) -> Result<Vec<RValue>> {
    reduce(cx, Reduce::L1)
}
fn eval_reduce_sum_square(cx: &EvalCx) -> Result<Vec<RValue>> {
    reduce(cx, Reduce::SumSquare)
}
fn eval_reduce_log_sum(cx: &EvalCx) -> Result<Vec<RValue>> {
    reduce(cx, Reduce::LogSum)
}
fn arg_reduce(cx: &EvalCx, how: Reduce) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let keep = cx.bool_or_default("keep_dims")?;
    let a = axis(cx.int_or_default("axis")?, x.rank())?;
    let y = kernels::reduce(x, &[a], keep, how)?;
    let to = cx.out_dtype(0)?;
    one(if y.dtype() == to {
        y
    } else {
        kernels::cast(&y, to)?
    })
}
fn eval_reduce_argmax(cx: &EvalCx) -> Result<Vec<RValue>> {
    arg_reduce(cx, Reduce::ArgMax)
}
fn eval_reduce_argmin(cx: &EvalCx) -> Result<Vec<RValue>> {
    arg_reduce(cx, Reduce::ArgMin)
}

pub static DEFS: &[OpDef] = &[
    def("reduce_mean", REDUCE, infer_reduce, eval_reduce_mean).with_flops(Flops::PerInput),
    def("reduce_sum", REDUCE, infer_reduce, eval_reduce_sum).with_flops(Flops::PerInput),
    def("reduce_max", REDUCE, infer_reduce, eval_reduce_max).with_flops(Flops::PerInput),
    def("reduce_min", REDUCE, infer_reduce, eval_reduce_min).with_flops(Flops::PerInput),
    def("reduce_prod", REDUCE, infer_reduce, eval_reduce_prod).with_flops(Flops::PerInput),
    def("reduce_l2_norm", REDUCE, infer_reduce, eval_reduce_l2_norm).with_flops(Flops::PerInput),
    def(
        "reduce_log_sum_exp",
        REDUCE,
        infer_reduce,
        eval_reduce_log_sum_exp,
    )
    .with_flops(Flops::PerInput),
    def("reduce_l1_norm", REDUCE, infer_reduce, eval_reduce_l1_norm).with_flops(Flops::PerInput),
    def(
        "reduce_sum_square",
        REDUCE,
        infer_reduce,
        eval_reduce_sum_square,
    )
    .with_flops(Flops::PerInput),
    def("reduce_log_sum", REDUCE, infer_reduce, eval_reduce_log_sum).with_flops(Flops::PerInput),
    ver(
        "reduce_argmax",
        I15,
        Some(I17),
        ARGRED,
        infer_argmax,
        eval_reduce_argmax,
    )
    .with_flops(Flops::PerInput),
    ver(
        "reduce_argmax",
        I17,
        None,
        ARGRED17,
        infer_argmax,
        eval_reduce_argmax,
    )
    .with_flops(Flops::PerInput),
    ver(
        "reduce_argmin",
        I15,
        Some(I17),
        ARGRED,
        infer_argmax,
        eval_reduce_argmin,
    )
    .with_flops(Flops::PerInput),
    ver(
        "reduce_argmin",
        I17,
        None,
        ARGRED17,
        infer_argmax,
        eval_reduce_argmin,
    )
    .with_flops(Flops::PerInput),
];
