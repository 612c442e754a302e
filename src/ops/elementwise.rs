//! Elementwise ops: `const`, `cast`, `identity`, binary arithmetic with broadcasting,
//! comparisons, logical ops and unary math.

use super::infer::{broadcast, float_only, tensor, InferCx};
use super::{opt_c, req, req_c, OpDef};
use crate::ir::{DType, Opset, ValueType};
use anyhow::{anyhow, bail, ensure, Result};

const fn def(
    name: &'static str,
    inputs: &'static [super::InputSpec],
    infer: fn(&InferCx) -> Result<Vec<ValueType>>,
) -> OpDef {
    OpDef {
        name,
        since: Opset::Ios15,
        until: None,
        inputs,
        infer,
    }
}

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

pub static DEFS: &[OpDef] = &[
    def("const", &[], infer_const),
    def("cast", &[req("x"), req_c("dtype")], infer_cast),
    def("identity", X, infer_same),
    def("add", XY, infer_arith),
    def("sub", XY, infer_arith),
    def("mul", XY, infer_arith),
    def("real_div", XY, infer_arith),
    def("floor_div", XY, infer_arith),
    def("mod", XY, infer_arith),
    def("maximum", XY, infer_arith),
    def("minimum", XY, infer_arith),
    def("pow", XY, infer_pow_like),
    def("equal", XY, infer_compare),
    def("not_equal", XY, infer_compare),
    def("less", XY, infer_compare),
    def("less_equal", XY, infer_compare),
    def("greater", XY, infer_compare),
    def("greater_equal", XY, infer_compare),
    def("logical_and", XY, infer_logical),
    def("logical_or", XY, infer_logical),
    def("logical_xor", XY, infer_logical),
    def("logical_not", X, infer_not),
    def("select", &[req("cond"), req("a"), req("b")], infer_select),
    def("abs", X, infer_same),
    def("sign", X, infer_same),
    def("square", X, infer_same),
    def("sqrt", X, infer_float_same),
    def("rsqrt", X_EPS, infer_float_same),
    def("inverse", X_EPS, infer_float_same),
    def("exp", X, infer_float_same),
    def("exp2", X, infer_float_same),
    def("log", X_EPS, infer_float_same),
    def("tanh", X, infer_float_same),
    def("sin", X, infer_float_same),
    def("cos", X, infer_float_same),
    def("erf", X, infer_float_same),
    def("floor", X, infer_float_same),
    def("ceil", X, infer_float_same),
    def("round", X, infer_float_same),
    def("relu", X, infer_float_same),
    def("sigmoid", X, infer_float_same),
    def("silu", X, infer_float_same),
    def(
        "clip",
        &[req("x"), req_c("alpha"), req_c("beta")],
        infer_clip,
    ),
];
