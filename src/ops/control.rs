//! Control flow (iOS15): `cond` (two blocks without inputs, one run by a bool scalar
//! `pred`) and `while_loop` (a condition block and a body block, both taking the loop
//! variables; the condition runs first, the body while it is true), as coremltools 9's
//! `defs/iOS15/control_flow.py` defines them. The blocks are compiled and run by the
//! interpreter through [`ExecEnv`]; a loop stops with an error naming it after
//! [`ExecEnv::max_iterations`] iterations or when its variables outgrow the memory cap.

use super::eval::{EvalCx, ExecEnv, RValue};
use super::infer::InferCx;
use super::{req, var, InputSpec, OpDef};
use crate::ir::{DType, Dim, ValueType};
use crate::kernels;
use anyhow::{bail, ensure, Result};

/// Whether a value of type `a` may stand where `b` is expected: equal, or tensors of the
/// same dtype and rank whose every dimension is the same or unknown in `b` (lists: the
/// same for the element type, and any length where `b`'s is unknown).
pub fn subtype(a: &ValueType, b: &ValueType) -> bool {
    match (a, b) {
        (ValueType::Tensor(x), ValueType::Tensor(y)) => {
            x.dtype == y.dtype
                && x.rank() == y.rank()
                && x.shape
                    .iter()
                    .zip(&y.shape)
                    .all(|(p, q)| p == q || *q == Dim::Unknown)
        }
        (ValueType::List { elem: e1, len: l1 }, ValueType::List { elem: e2, len: l2 }) => {
            subtype(e1, e2) && (l1 == l2 || l2.is_none())
        }
        (a, b) => a == b,
    }
}

fn is_bool_scalar(t: &ValueType) -> bool {
    matches!(t, ValueType::Tensor(t) if t.dtype == DType::Bool && t.shape.iter().all(|d| *d == Dim::Fixed(1)))
}

fn infer_cond(cx: &InferCx) -> Result<Vec<ValueType>> {
    let p = cx.t("pred")?;
    ensure!(
        p.dtype == DType::Bool && p.shape.iter().all(|d| *d == Dim::Fixed(1)),
        "`pred` must be a bool scalar, is {p}"
    );
    let [t, f] = cx.blocks.as_slice() else {
        bail!(
            "cond needs two blocks (true and false branches), has {}",
            cx.blocks.len()
        )
    };
    ensure!(
        t.inputs.is_empty() && f.inputs.is_empty(),
        "the branches of a cond take no inputs"
    );
    ensure!(
        t.outputs.len() == f.outputs.len(),
        "the true branch returns {} values, the false branch {}",
        t.outputs.len(),
        f.outputs.len()
    );
    for (i, (a, b)) in t.outputs.iter().zip(&f.outputs).enumerate() {
        ensure!(
            subtype(a, b) || subtype(b, a),
            "output {i}: the true branch returns {a}, the false branch {b}"
        );
    }
    Ok(t.outputs.clone())
}

fn infer_while(cx: &InferCx) -> Result<Vec<ValueType>> {
    let vars: Vec<&ValueType> = cx.all("loop_vars").iter().map(|a| a.ty.as_ref()).collect();
    let [c, b] = cx.blocks.as_slice() else {
        bail!(
            "while_loop needs two blocks (condition and body), has {}",
            cx.blocks.len()
        )
    };
    for (what, blk) in [("condition", c), ("body", b)] {
        ensure!(
            blk.inputs.len() == vars.len(),
            "the {what} block takes {} inputs for {} loop variables",
            blk.inputs.len(),
            vars.len()
        );
        for (i, (v, t)) in vars.iter().zip(&blk.inputs).enumerate() {
            ensure!(
                subtype(v, t),
                "loop variable {i} is {v} but the {what} block's input is {t}"
            );
        }
    }
    ensure!(
        c.outputs.len() == 1 && is_bool_scalar(&c.outputs[0]),
        "the condition block must return one bool scalar, returns ({})",
        c.outputs
            .iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    ensure!(
        b.outputs.len() == vars.len(),
        "the body returns {} values for {} loop variables",
        b.outputs.len(),
        vars.len()
    );
    for (i, (o, t)) in b.outputs.iter().zip(&b.inputs).enumerate() {
        ensure!(
            subtype(o, t),
            "loop variable {i} changes type in the body: {t} -> {o}"
        );
    }
    Ok(b.outputs.clone())
}

fn truth(v: &RValue, what: &str) -> Result<bool> {
    let t = v.tensor()?;
    let x = kernels::to_vec::<f64>(t)?;
    ensure!(
        x.len() == 1,
        "{what} must be a scalar, has {} values",
        x.len()
    );
    Ok(x[0] != 0.0)
}

fn eval_cond(cx: &EvalCx) -> Result<Vec<RValue>> {
    let env = cx.env()?;
    let pred = truth(&RValue::T(cx.t("pred")?.clone()), "`pred`")?;
    env.run_block(if pred { 0 } else { 1 }, vec![])
}

/// Bytes a set of runtime values holds (tensors and list elements).
fn held_bytes(vs: &[RValue]) -> u64 {
    let t = |t: &candle_core::Tensor| (t.elem_count() * t.dtype().size_in_bytes()) as u64;
    vs.iter()
        .map(|v| match v {
            RValue::T(x) => t(x),
            RValue::List(l) => l.elems.iter().flatten().map(t).sum(),
            _ => 0,
        })
        .fold(0u64, |a, b| a.saturating_add(b))
}

fn eval_while(cx: &EvalCx) -> Result<Vec<RValue>> {
    let env: &dyn ExecEnv = cx.env()?;
    let mut vars: Vec<RValue> = cx.all("loop_vars").iter().map(|b| b.val.clone()).collect();
    let cap = env.max_iterations();
    let mut n: u64 = 0;
    loop {
        let c = env.run_block(0, vars.clone())?;
        if !truth(&c[0], "the condition")? {
            return Ok(vars);
        }
        if n >= cap {
            bail!(
                "while_loop `{}`: still running after {n} iterations, the interpreter's bound \
                 (its condition never turned false)",
                cx.op_name
            );
        }
        vars = env.run_block(1, vars)?;
        n += 1;
        let held = held_bytes(&vars);
        ensure!(
            held <= env.max_memory(),
            "while_loop `{}`: after {n} iterations its loop variables hold {held} bytes, over \
             the memory cap of {} bytes (--max-memory)",
            cx.op_name,
            env.max_memory()
        );
    }
}

/// Whether ops of `op_type` hold nested blocks (only the control flow ops do).
pub fn takes_blocks(op_type: &str) -> bool {
    DEFS.iter().any(|d| d.name == op_type)
}

const COND_IN: &[InputSpec] = &[req("pred")];
const WHILE_IN: &[InputSpec] = &[var("loop_vars")];

pub const DEFS: &[OpDef] = &[
    super::def("cond", COND_IN, infer_cond, eval_cond),
    super::def("while_loop", WHILE_IN, infer_while, eval_while),
];
