//! Compressed-weight ops (`constexpr_*`): decoded by Core ML at load time, never constant
//! folded by milkit (folding would undo the compression). Shape rules follow coremltools 9's
//! declarations (`mil/ops/defs/iOS16/constexpr_ops.py`, `iOS18/compression.py`).

use super::infer::{tensor, InferCx};
use super::{opt_c, req_c, InputSpec, OpDef};
use crate::ir::{DType, Dim, Opset, ValueType};
use anyhow::{anyhow, ensure, Result};

fn const_shape(cx: &InferCx, name: &str) -> Result<Vec<usize>> {
    let t = cx.t(name)?;
    t.fixed_shape()
        .ok_or_else(|| anyhow!("`{name}` of {} needs a fixed shape", cx.op_type))
}

/// iOS18: `indices` uint1..uint8 of the weight's shape; `lut` of rank r+2 whose first r dims
/// count the groups along each axis, then 2^nbits entries, then the vector size.
fn infer_lut18(cx: &InferCx) -> Result<Vec<ValueType>> {
    let idx = cx.t("indices")?;
    let lut = cx.t("lut")?;
    let nbits = match idx.dtype {
        DType::U1 => 1,
        DType::U2 => 2,
        DType::U3 => 3,
        DType::U4 => 4,
        DType::U6 => 6,
        DType::U8 => 8,
        d => anyhow::bail!("constexpr_lut_to_dense indices must be uint1..uint8, are {d}"),
    };
    ensure!(
        lut.dtype.is_float() || lut.dtype.is_int(),
        "lut dtype {}",
        lut.dtype
    );
    let s = const_shape(cx, "indices")?;
    let l = const_shape(cx, "lut")?;
    let r = s.len();
    ensure!(
        l.len() == r + 2,
        "lut {l:?} must have rank {} for indices {s:?}",
        r + 2
    );
    ensure!(
        l[r] == 1 << nbits,
        "lut {l:?} must have {} entries for {}-bit indices",
        1 << nbits,
        nbits
    );
    for i in 0..r {
        ensure!(
            l[i] > 0 && s[i] % l[i] == 0,
            "lut {l:?}: {} groups do not divide axis {i} of indices {s:?}",
            l[i]
        );
    }
    let vs = l[r + 1];
    let mut out = s.clone();
    if vs > 1 {
        let ax = cx
            .opt_int("vector_axis")?
            .ok_or_else(|| anyhow!("vector palettization needs vector_axis"))?;
        let a = super::infer::axis(ax, r)?;
        out[a] *= vs;
    }
    Ok(vec![tensor(
        lut.dtype,
        out.into_iter().map(Dim::Fixed).collect(),
    )])
}

/// iOS18: `data` (int4/uint4/int8/uint8...) of the weight's shape; `scale` (and `offset`) of
/// the same rank, each dim dividing data's; output = scale · (data − offset), scale's dtype.
fn infer_shift_scale(cx: &InferCx) -> Result<Vec<ValueType>> {
    let data = cx.t("data")?;
    ensure!(
        data.dtype.is_int() || data.dtype.is_float(),
        "data dtype {}",
        data.dtype
    );
    let scale = cx.t("scale")?;
    ensure!(
        scale.dtype.is_float(),
        "scale must be fp16/fp32, is {}",
        scale.dtype
    );
    let s = const_shape(cx, "data")?;
    let sc = const_shape(cx, "scale")?;
    ensure!(
        sc.len() == s.len(),
        "scale {sc:?} must have the rank of data {s:?}"
    );
    for i in 0..s.len() {
        ensure!(
            sc[i] > 0 && s[i] % sc[i] == 0,
            "scale {sc:?} does not divide data {s:?} on axis {i}"
        );
    }
    if cx.has("offset") {
        let o = const_shape(cx, "offset")?;
        ensure!(o == sc, "offset {o:?} must have the shape of scale {sc:?}");
    }
    Ok(vec![tensor(
        scale.dtype,
        s.into_iter().map(Dim::Fixed).collect(),
    )])
}

/// iOS16: 1-D `lut` of 2^nbits values, packed uint8 `indices`, output `shape` (uint32).
fn infer_lut16(cx: &InferCx) -> Result<Vec<ValueType>> {
    let lut = cx.t("lut")?;
    let shape = cx.ints("shape")?;
    Ok(vec![tensor(
        lut.dtype,
        shape.into_iter().map(|d| Dim::Fixed(d as usize)).collect(),
    )])
}

/// iOS16: output = scale · (quantized_data − zero_point) along `axis`.
fn infer_affine(cx: &InferCx) -> Result<Vec<ValueType>> {
    let q = cx.t("quantized_data")?;
    let scale = cx.t("scale")?;
    Ok(vec![tensor(scale.dtype, q.shape.clone())])
}

const LUT18: &[InputSpec] = &[req_c("indices"), req_c("lut"), opt_c("vector_axis")];
const SHIFT: &[InputSpec] = &[req_c("data"), req_c("scale"), opt_c("offset")];
const LUT16: &[InputSpec] = &[req_c("lut"), req_c("indices"), req_c("shape")];
const AFFINE: &[InputSpec] = &[
    req_c("quantized_data"),
    req_c("zero_point"),
    req_c("scale"),
    req_c("axis"),
];

pub static DEFS: &[OpDef] = &[
    OpDef {
        name: "constexpr_lut_to_dense",
        since: Opset::Ios16,
        until: Some(Opset::Ios18),
        inputs: LUT16,
        infer: infer_lut16,
    },
    OpDef {
        name: "constexpr_lut_to_dense",
        since: Opset::Ios18,
        until: None,
        inputs: LUT18,
        infer: infer_lut18,
    },
    OpDef {
        name: "constexpr_affine_dequantize",
        since: Opset::Ios16,
        until: None,
        inputs: AFFINE,
        infer: infer_affine,
    },
    OpDef {
        name: "constexpr_blockwise_shift_scale",
        since: Opset::Ios18,
        until: None,
        inputs: SHIFT,
        infer: infer_shift_scale,
    },
];
