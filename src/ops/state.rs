//! Core ML states (iOS18): reading, writing, and the in-place `slice_update` they pair with.

use super::infer::InferCx;
use super::{opt, opt_c, req, InputSpec, OpDef};
use crate::ir::{Opset, ValueType};
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

fn infer_slice_update(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    let u = cx.t("update")?;
    ensure!(
        x.dtype == u.dtype,
        "slice_update: update {u} and x {x} differ in dtype"
    );
    Ok(vec![ValueType::Tensor(x.clone())])
}

const SLICE_UPDATE: &[InputSpec] = &[
    req("x"),
    req("update"),
    req("begin"),
    req("end"),
    opt("stride"),
    opt_c("begin_mask"),
    opt_c("end_mask"),
    opt_c("squeeze_mask"),
];

pub static DEFS: &[OpDef] = &[
    OpDef {
        name: "read_state",
        since: Opset::Ios18,
        until: None,
        inputs: &[req("input")],
        infer: infer_read_state,
    },
    OpDef {
        name: "coreml_update_state",
        since: Opset::Ios18,
        until: None,
        inputs: &[req("state"), req("value")],
        infer: infer_update_state,
    },
    OpDef {
        name: "slice_update",
        since: Opset::Ios18,
        until: None,
        inputs: SLICE_UPDATE,
        infer: infer_slice_update,
    },
];
