//! Elementwise ops: `const`, `cast`, `identity`, binary arithmetic with broadcasting,
//! comparisons, logical ops and unary math. Evaluation computes floats in f32 and rounds
//! once to the output dtype (see `kernels::elementwise`).

use super::def;
use super::eval::{one, value_from_ir, EvalCx, RValue};
use super::infer::{broadcast, float_only, tensor, InferCx};
use super::placement::{Flops, LOAD_TIME};
use super::{opt_c, req, req_c, OpDef};
use crate::ir::{DType, ValueType};
use crate::kernels::{self, fastmath, BinOp, CmpOp, LogicOp};
use anyhow::{anyhow, bail, ensure, Result};
use half::f16;

const XY: &[super::InputSpec] = &[req("x"), req("y")];
const X: &[super::InputSpec] = &[req("x")];
const X_EPS: &[super::InputSpec] = &[req("x"), opt_c("epsilon")];

fn infer_const(cx: &InferCx) -> Result<Vec<ValueType>> {
    let v = cx
        .attributes
        .get("val")
        .ok_or_else(|| anyhow!("const without a `val` attribute"))?;
    Ok(vec![v.value_type()])
}

fn infer_cast(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    let name = cx
        .opt_str("dtype")?
        .ok_or_else(|| anyhow!("cast needs a constant `dtype`"))?;
    let d = DType::from_name(name).ok_or_else(|| anyhow!("cast to unknown dtype `{name}`"))?;
    ensure!(
        matches!(
            d,
            DType::F16
                | DType::F32
                | DType::I32
                | DType::Bool
                | DType::I8
                | DType::U8
                | DType::I16
                | DType::U16
        ),
        "cast to {d} is not supported"
    );
    Ok(vec![tensor(d, x.shape.clone())])
}

fn infer_same(cx: &InferCx) -> Result<Vec<ValueType>> {
    Ok(vec![ValueType::Tensor(cx.t("x")?.clone())])
}

fn infer_float_same(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    float_only(x, "x")?;
    Ok(vec![ValueType::Tensor(x.clone())])
}

fn infer_arith(cx: &InferCx) -> Result<Vec<ValueType>> {
    let d = cx.same_dtype(&["x", "y"])?;
    ensure!(d != DType::Bool && d != DType::Str, "arithmetic on {d}");
    Ok(vec![tensor(
        d,
        broadcast(&cx.t("x")?.shape, &cx.t("y")?.shape)?,
    )])
}

fn infer_compare(cx: &InferCx) -> Result<Vec<ValueType>> {
    cx.same_dtype(&["x", "y"])?;
    Ok(vec![tensor(
        DType::Bool,
        broadcast(&cx.t("x")?.shape, &cx.t("y")?.shape)?,
    )])
}

fn infer_logical(cx: &InferCx) -> Result<Vec<ValueType>> {
    let d = cx.same_dtype(&["x", "y"])?;
    ensure!(d == DType::Bool, "logical op on {d}");
    Ok(vec![tensor(
        DType::Bool,
        broadcast(&cx.t("x")?.shape, &cx.t("y")?.shape)?,
    )])
}

fn infer_not(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    ensure!(x.dtype == DType::Bool, "logical_not on {}", x.dtype);
    Ok(vec![ValueType::Tensor(x.clone())])
}

fn infer_select(cx: &InferCx) -> Result<Vec<ValueType>> {
    let c = cx.t("cond")?;
    let d = cx.same_dtype(&["a", "b"])?;
    let s = broadcast(&cx.t("a")?.shape, &cx.t("b")?.shape)?;
    Ok(vec![tensor(d, broadcast(&c.shape, &s)?)])
}

fn infer_clip(cx: &InferCx) -> Result<Vec<ValueType>> {
    infer_float_same(cx)
}

fn infer_pow_like(cx: &InferCx) -> Result<Vec<ValueType>> {
    let r = infer_arith(cx)?;
    if let ValueType::Tensor(t) = &r[0] {
        if !t.dtype.is_float() {
            bail!("`{}` needs float inputs", cx.op_type);
        }
    }
    Ok(r)
}

// ---- evaluation ----

fn eval_const(cx: &EvalCx) -> Result<Vec<RValue>> {
    let v = cx
        .attributes
        .get("val")
        .ok_or_else(|| anyhow!("const without a `val` attribute"))?;
    Ok(vec![value_from_ir(v)?])
}

fn eval_cast(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let to = cx.out(0)?.dtype;
    if to == DType::Bool {
        let zero = kernels::index::full(&[], 0.0, x.dtype())?;
        return one(kernels::compare(x, &zero, CmpOp::Ne)?);
    }
    // Float → integer rounds toward zero, as numpy's astype (coremltools' value inference).
    one(kernels::cast(x, cx.out_dtype(0)?)?)
}

fn eval_identity(cx: &EvalCx) -> Result<Vec<RValue>> {
    one(cx.t("x")?.clone())
}

fn binary(cx: &EvalCx, op: BinOp) -> Result<Vec<RValue>> {
    one(kernels::binary(cx.t("x")?, cx.t("y")?, op)?)
}
fn eval_add(cx: &EvalCx) -> Result<Vec<RValue>> {
    binary(cx, BinOp::Add)
}
fn eval_sub(cx: &EvalCx) -> Result<Vec<RValue>> {
    binary(cx, BinOp::Sub)
}
fn eval_mul(cx: &EvalCx) -> Result<Vec<RValue>> {
    binary(cx, BinOp::Mul)
}
fn eval_real_div(cx: &EvalCx) -> Result<Vec<RValue>> {
    binary(cx, BinOp::Div)
}
fn eval_floor_div(cx: &EvalCx) -> Result<Vec<RValue>> {
    binary(cx, BinOp::FloorDiv)
}
fn eval_mod(cx: &EvalCx) -> Result<Vec<RValue>> {
    binary(cx, BinOp::Mod)
}
fn eval_maximum(cx: &EvalCx) -> Result<Vec<RValue>> {
    binary(cx, BinOp::Max)
}
fn eval_minimum(cx: &EvalCx) -> Result<Vec<RValue>> {
    binary(cx, BinOp::Min)
}
fn eval_pow(cx: &EvalCx) -> Result<Vec<RValue>> {
    binary(cx, BinOp::Pow)
}

fn compare(cx: &EvalCx, op: CmpOp) -> Result<Vec<RValue>> {
    one(kernels::compare(cx.t("x")?, cx.t("y")?, op)?)
}
fn eval_equal(cx: &EvalCx) -> Result<Vec<RValue>> {
    compare(cx, CmpOp::Eq)
}
fn eval_not_equal(cx: &EvalCx) -> Result<Vec<RValue>> {
    compare(cx, CmpOp::Ne)
}
fn eval_less(cx: &EvalCx) -> Result<Vec<RValue>> {
    compare(cx, CmpOp::Lt)
}
fn eval_less_equal(cx: &EvalCx) -> Result<Vec<RValue>> {
    compare(cx, CmpOp::Le)
}
fn eval_greater(cx: &EvalCx) -> Result<Vec<RValue>> {
    compare(cx, CmpOp::Gt)
}
fn eval_greater_equal(cx: &EvalCx) -> Result<Vec<RValue>> {
    compare(cx, CmpOp::Ge)
}

fn logical(cx: &EvalCx, op: LogicOp) -> Result<Vec<RValue>> {
    one(kernels::logical(cx.t("x")?, cx.t("y")?, op)?)
}
fn eval_logical_and(cx: &EvalCx) -> Result<Vec<RValue>> {
    logical(cx, LogicOp::And)
}
fn eval_logical_or(cx: &EvalCx) -> Result<Vec<RValue>> {
    logical(cx, LogicOp::Or)
}
fn eval_logical_xor(cx: &EvalCx) -> Result<Vec<RValue>> {
    logical(cx, LogicOp::Xor)
}
fn eval_logical_not(cx: &EvalCx) -> Result<Vec<RValue>> {
    one(kernels::map_i64(cx.t("x")?, |v| (v == 0) as i64)?)
}

fn eval_select(cx: &EvalCx) -> Result<Vec<RValue>> {
    one(kernels::select(cx.t("cond")?, cx.t("a")?, cx.t("b")?)?)
}

/// A float map (generic, so `f` inlines and vectorises), or an integer one for ops MIL
/// also defines on integers.
fn map(
    cx: &EvalCx,
    f: impl Fn(f32) -> f32 + Sync + Send,
    int: Option<fn(i64) -> i64>,
) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    match int {
        Some(g) if !kernels::data::is_float(x.dtype()) => one(kernels::map_i64(x, g)?),
        _ => one(kernels::map_f32(x, f)?),
    }
}

/// `epsilon` as the op sees it: the given constant, else the default rounded to x's dtype
/// (an fp16 program's 1e-12 default is 0).
fn epsilon(cx: &EvalCx, default: f64) -> Result<f32> {
    Ok(match cx.opt_f64("epsilon")? {
        Some(e) => e as f32,
        None if cx.t("x")?.dtype() == candle_core::DType::F16 => f16::from_f64(default).to_f32(),
        None => default as f32,
    })
}

macro_rules! unary {
    ($name:ident, $f:expr) => {
        fn $name(cx: &EvalCx) -> Result<Vec<RValue>> {
            map(cx, $f, None)
        }
    };
    ($name:ident, $f:expr, $g:expr) => {
        fn $name(cx: &EvalCx) -> Result<Vec<RValue>> {
            map(cx, $f, Some($g))
        }
    };
}

unary!(eval_abs, f32::abs, i64::abs);
unary!(
    eval_sign,
    |x| if x > 0.0 {
        1.0
    } else if x < 0.0 {
        -1.0
    } else {
        0.0
    },
    i64::signum
);
unary!(eval_square, |x| x * x, |x| x.wrapping_mul(x));
unary!(eval_sqrt, f32::sqrt);
unary!(eval_exp, fastmath::exp);
unary!(eval_exp2, f32::exp2);
unary!(eval_tanh, fastmath::tanh);
unary!(eval_sin, f32::sin);
unary!(eval_cos, f32::cos);
unary!(eval_erf, fastmath::erf);
unary!(eval_floor, f32::floor);
unary!(eval_ceil, f32::ceil);
// numpy rounds half to even.
unary!(eval_round, f32::round_ties_even);
unary!(eval_relu, |x| x.max(0.0));
unary!(eval_sigmoid, fastmath::sigmoid);
unary!(eval_silu, |x| x * fastmath::sigmoid(x));

fn eval_rsqrt(cx: &EvalCx) -> Result<Vec<RValue>> {
    let e = epsilon(cx, 1e-12)?;
    one(kernels::map_f32(cx.t("x")?, move |x| 1.0 / (x + e).sqrt())?)
}
fn eval_inverse(cx: &EvalCx) -> Result<Vec<RValue>> {
    let e = epsilon(cx, 1e-4)?;
    one(kernels::map_f32(cx.t("x")?, move |x| 1.0 / (x + e))?)
}
fn eval_log(cx: &EvalCx) -> Result<Vec<RValue>> {
    let e = epsilon(cx, 1e-45)?;
    one(kernels::map_f32(cx.t("x")?, move |x| (x + e).ln())?)
}
fn eval_clip(cx: &EvalCx) -> Result<Vec<RValue>> {
    let lo = cx
        .opt_f64("alpha")?
        .ok_or_else(|| anyhow!("clip needs `alpha`"))? as f32;
    let hi = cx
        .opt_f64("beta")?
        .ok_or_else(|| anyhow!("clip needs `beta`"))? as f32;
    one(kernels::map_f32(cx.t("x")?, move |x| x.max(lo).min(hi))?)
}

pub static DEFS: &[OpDef] = &[
    def("const", &[], infer_const, eval_const)
        .with_flops(Flops::None)
        .with_placement(&LOAD_TIME),
    def("cast", &[req("x"), req_c("dtype")], infer_cast, eval_cast).with_flops(Flops::None),
    def("identity", X, infer_same, eval_identity).with_flops(Flops::None),
    def("add", XY, infer_arith, eval_add),
    def("sub", XY, infer_arith, eval_sub),
    def("mul", XY, infer_arith, eval_mul),
    def("real_div", XY, infer_arith, eval_real_div),
    def("floor_div", XY, infer_arith, eval_floor_div),
    def("mod", XY, infer_arith, eval_mod),
    def("maximum", XY, infer_arith, eval_maximum),
    def("minimum", XY, infer_arith, eval_minimum),
    def("pow", XY, infer_pow_like, eval_pow).with_flops(Flops::PerOutput(8)),
    def("equal", XY, infer_compare, eval_equal),
    def("not_equal", XY, infer_compare, eval_not_equal),
    def("less", XY, infer_compare, eval_less),
    def("less_equal", XY, infer_compare, eval_less_equal),
    def("greater", XY, infer_compare, eval_greater),
    def("greater_equal", XY, infer_compare, eval_greater_equal),
    def("logical_and", XY, infer_logical, eval_logical_and),
    def("logical_or", XY, infer_logical, eval_logical_or),
    def("logical_xor", XY, infer_logical, eval_logical_xor),
    def("logical_not", X, infer_not, eval_logical_not),
    def(
        "select",
        &[req("cond"), req("a"), req("b")],
        infer_select,
        eval_select,
    ),
    def("abs", X, infer_same, eval_abs),
    def("sign", X, infer_same, eval_sign),
    def("square", X, infer_same, eval_square),
    def("sqrt", X, infer_float_same, eval_sqrt).with_flops(Flops::PerOutput(8)),
    def("rsqrt", X_EPS, infer_float_same, eval_rsqrt).with_flops(Flops::PerOutput(8)),
    def("inverse", X_EPS, infer_float_same, eval_inverse),
    def("exp", X, infer_float_same, eval_exp).with_flops(Flops::PerOutput(8)),
    def("exp2", X, infer_float_same, eval_exp2),
    def("log", X_EPS, infer_float_same, eval_log).with_flops(Flops::PerOutput(8)),
    def("tanh", X, infer_float_same, eval_tanh).with_flops(Flops::PerOutput(8)),
    def("sin", X, infer_float_same, eval_sin).with_flops(Flops::PerOutput(8)),
    def("cos", X, infer_float_same, eval_cos).with_flops(Flops::PerOutput(8)),
    def("erf", X, infer_float_same, eval_erf).with_flops(Flops::PerOutput(8)),
    def("floor", X, infer_float_same, eval_floor),
    def("ceil", X, infer_float_same, eval_ceil),
    def("round", X, infer_float_same, eval_round),
    def("relu", X, infer_float_same, eval_relu),
    def("sigmoid", X, infer_float_same, eval_sigmoid).with_flops(Flops::PerOutput(8)),
    def("silu", X, infer_float_same, eval_silu).with_flops(Flops::PerOutput(8)),
    def(
        "clip",
        &[req("x"), req_c("alpha"), req_c("beta")],
        infer_clip,
        eval_clip,
    ),
];
