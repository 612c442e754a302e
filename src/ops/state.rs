//! Core ML states (iOS18): reading, writing, and the in-place `slice_update` they pair with.
//! `coreml_update_state` is coremltools' dialect op; its backend serializes it as the Core ML
//! ops `write_state` (no outputs) followed by `read_state`, and its loader maps `write_state`
//! back, so a package holds `write_state`.

use super::eval::{one, EvalCx, RValue};
use super::infer::InferCx;
use super::placement::{Flops, STATE_MACHINERY};
use super::DefaultValue;
use super::{opt_c, req, InputSpec, OpDef};
use crate::ir::{Dim, Opset, ValueType};
use crate::kernels;
use anyhow::{anyhow, ensure, Result};

fn infer_read_state(cx: &InferCx) -> Result<Vec<ValueType>> {
    let a = cx
        .all("input")
        .first()
        .ok_or_else(|| anyhow!("read_state needs `input`"))?;
    match a.ty.as_ref() {
        ValueType::State(t) => Ok(vec![ValueType::Tensor(t.clone())]),
        t => anyhow::bail!("read_state of a non-state {t}"),
    }
}

fn infer_update_state(cx: &InferCx) -> Result<Vec<ValueType>> {
    let s = cx
        .all("state")
        .first()
        .ok_or_else(|| anyhow!("coreml_update_state needs `state`"))?;
    let v = cx.t("value")?;
    match s.ty.as_ref() {
        ValueType::State(t) => {
            ensure!(
                t == v,
                "coreml_update_state: value {v} does not match state {t}"
            );
            Ok(vec![ValueType::Tensor(v.clone())])
        }
        t => anyhow::bail!("coreml_update_state of a non-state {t}"),
    }
}

/// `write_state(input: state<T>, data: T)`: stores `data` into the state; no outputs.
fn infer_write_state(cx: &InferCx) -> Result<Vec<ValueType>> {
    let s = cx
        .all("input")
        .first()
        .ok_or_else(|| anyhow!("write_state needs `input`"))?;
    let v = cx.t("data")?;
    match s.ty.as_ref() {
        ValueType::State(t) => {
            ensure!(t == v, "write_state: data {v} does not match state {t}");
            Ok(vec![])
        }
        t => anyhow::bail!("write_state of a non-state {t}"),
    }
}

/// As coremltools 9 declares it: `update` must have the shape `slice_by_index` would give
/// for the same begin/end/stride/masks (unknown dims match anything) and may not be rank 0.
fn infer_slice_update(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    let u = cx.t("update")?;
    ensure!(
        x.dtype == u.dtype,
        "slice_update: update {u} and x {x} differ in dtype"
    );
    ensure!(
        u.rank() > 0,
        "slice_update: a rank-0 update is not supported"
    );
    let slice = super::lookup("slice_by_index", cx.opset)
        .ok_or_else(|| anyhow!("slice_by_index is undefined"))?;
    if let Some(ValueType::Tensor(want)) = (slice.infer)(cx)?.first() {
        let fits = want.rank() == u.rank()
            && want
                .shape
                .iter()
                .zip(&u.shape)
                .all(|(a, b)| a == b || *a == Dim::Unknown || *b == Dim::Unknown);
        ensure!(
            fits,
            "slice_update: update {u} does not fit the slice {want} of {x}"
        );
    }
    Ok(vec![ValueType::Tensor(x.clone())])
}

const SLICE_UPDATE: &[InputSpec] = &[
    req("x"),
    req("update"),
    req("begin"),
    req("end"),
    // Its inference runs slice_by_index's on this context, which reads the default.
    opt_c("stride").or(DefaultValue::Ints(1)),
    opt_c("begin_mask"),
    opt_c("end_mask"),
    opt_c("squeeze_mask"),
];

// ---- evaluation: a state is a cell the session owns; `slice_update` is functional (it
// returns an updated copy, which `coreml_update_state` then stores) ----

fn eval_read_state(cx: &EvalCx) -> Result<Vec<RValue>> {
    one(cx.state("input")?.get())
}

fn eval_update_state(cx: &EvalCx) -> Result<Vec<RValue>> {
    let v = cx.t("value")?;
    cx.state("state")?.set(v.clone());
    one(v.clone())
}

fn eval_write_state(cx: &EvalCx) -> Result<Vec<RValue>> {
    cx.state("input")?.set(cx.t("data")?.clone());
    Ok(vec![])
}

fn eval_slice_update(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let (spans, _) = super::index::index_spans(cx, x.dims())?;
    one(kernels::strided_assign(x, &spans, cx.t("update")?)?)
}

/// The interpreter's fused `read_state → slice_update → write_state` with a
/// `slice_by_index` of the updated value (see `runtime::state_fusion`): writes `update` into
/// the state `state` in place at the slice `begin`/`end`/`stride`/masks, and returns a copy
/// of the slice `slice_begin`/`slice_end`/… of the updated state — the values the unfused
/// ops give, without copying the whole state per update.
pub fn eval_state_slice_update(cx: &EvalCx) -> Result<Vec<RValue>> {
    state_slice_update(cx, true)
}

/// As [`eval_state_slice_update`], handing out the slice as a view of the state instead of
/// a copy. Only for a plan that proves no later in-place write of the state can happen
/// while the view (or any value sharing its storage) is alive (`runtime::state_fusion`).
pub fn eval_state_slice_update_view(cx: &EvalCx) -> Result<Vec<RValue>> {
    state_slice_update(cx, false)
}

fn state_slice_update(cx: &EvalCx, copy: bool) -> Result<Vec<RValue>> {
    let update = cx.t("update")?;
    // The slice's parameters under their `slice_by_index` names.
    let slice_cx = EvalCx {
        inputs: cx
            .inputs
            .iter()
            .filter_map(|(k, v)| k.strip_prefix("slice_").map(|n| (n, v.clone())))
            .collect(),
        ..*cx
    };
    cx.state("state")?.update_in_place(|t| {
        let (spans, _) = super::index::index_spans(cx, t.dims())?;
        kernels::index::strided_assign_in_place(t, &spans, update)?;
        let (spans, sq) = super::index::index_spans(&slice_cx, t.dims())?;
        let shape: Vec<usize> = spans
            .iter()
            .zip(&sq)
            .filter(|(_, q)| !**q)
            .map(|(s, _)| s.len)
            .collect();
        let y = kernels::strided_slice(t, &spans)?;
        // A copy unless the plan allows a view: later updates write the state in place.
        let y = match copy {
            true => y.force_contiguous()?,
            false => y,
        };
        one(y.reshape(shape)?)
    })
}

pub static DEFS: &[OpDef] = &[
    OpDef {
        name: "read_state",
        since: Opset::Ios18,
        until: None,
        inputs: &[req("input")],
        infer: infer_read_state,
        eval: Some(eval_read_state),
        weight: None,
        f32_inputs: &[],
        fresh: false,
        placement: Some(&STATE_MACHINERY),
        flops: Flops::None,
    },
    OpDef {
        name: "coreml_update_state",
        since: Opset::Ios18,
        until: None,
        inputs: &[req("state"), req("value")],
        infer: infer_update_state,
        eval: Some(eval_update_state),
        weight: None,
        f32_inputs: &[],
        fresh: false,
        placement: Some(&STATE_MACHINERY),
        flops: Flops::None,
    },
    OpDef {
        name: "write_state",
        since: Opset::Ios18,
        until: None,
        inputs: &[req("input"), req("data")],
        infer: infer_write_state,
        eval: Some(eval_write_state),
        weight: None,
        f32_inputs: &[],
        fresh: false,
        placement: None,
        flops: Flops::PerOutput(1),
    },
    OpDef {
        name: "slice_update",
        since: Opset::Ios18,
        until: None,
        inputs: SLICE_UPDATE,
        infer: infer_slice_update,
        eval: Some(eval_slice_update),
        weight: None,
        f32_inputs: &[],
        fresh: false,
        placement: Some(&STATE_MACHINERY),
        flops: Flops::None,
    },
];
