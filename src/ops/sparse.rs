//! The sparse and cast `constexpr_*` ops: `constexpr_cast` (fp16 → fp32), iOS16's
//! `constexpr_sparse_to_dense` (bit mask packed LSB-first in uint8 bytes, explicit shape),
//! and iOS18's `constexpr_sparse_to_dense`, `constexpr_lut_to_sparse` and
//! `constexpr_sparse_blockwise_shift_scale` (uint1 masks; the last two yield (mask, nonzero
//! values) for a following `constexpr_sparse_to_dense`). Decoded as coremltools'
//! `materialized_val_inference` does: the palette and shift-scale steps are the dense ops'
//! own evaluations (`compression`) run on the densified indices / data, then the nonzero
//! positions are read back in row-major order.

use super::eval::{one, Bound, EvalCx, EvalFn, RValue};
use super::infer::{axis, tensor, InferCx};
use super::placement::{Flops, LOAD_TIME};
use super::{opt_c, req_c, ver as v, InputSpec, OpDef};
use crate::ir::{DType, Dim, Opset, TensorType, ValueType};
use crate::kernels;
use anyhow::{anyhow, bail, ensure, Result};
use candle_core::Tensor;
use std::collections::BTreeMap;

fn fixed(cx: &InferCx, name: &str) -> Result<Vec<usize>> {
    let t = cx.t(name)?;
    t.fixed_shape()
        .ok_or_else(|| anyhow!("`{name}` of {} needs a fixed shape", cx.op_type))
}

fn dims(s: &[usize]) -> Vec<Dim> {
    s.iter().map(|&d| Dim::Fixed(d)).collect()
}

// ---- constexpr_cast ----

fn infer_cast(cx: &InferCx) -> Result<Vec<ValueType>> {
    let s = cx.t("source_val")?;
    ensure!(
        s.dtype == DType::F16,
        "constexpr_cast: source_val must be fp16, is {}",
        s.dtype
    );
    match cx.opt_str("output_dtype")? {
        Some("fp32") => Ok(vec![tensor(DType::F32, s.shape.clone())]),
        Some(o) => bail!("constexpr_cast: output_dtype `{o}` (only fp32 is defined)"),
        None => bail!("constexpr_cast needs a constant `output_dtype`"),
    }
}

fn eval_cast(cx: &EvalCx) -> Result<Vec<RValue>> {
    one(kernels::cast(cx.t("source_val")?, candle_core::DType::F32)?)
}

// ---- sparse_to_dense ----

/// `out[i] = nonzero[k]` for the k-th set bit i of `mask`, zero elsewhere.
fn densify(nonzero: &[f64], mask: impl Iterator<Item = bool>, n: usize) -> Result<Vec<f64>> {
    let mut out = vec![0f64; n];
    let mut k = 0;
    for (i, m) in mask.take(n).enumerate() {
        if m {
            ensure!(
                k < nonzero.len(),
                "the mask has more set bits than the {} nonzero values",
                nonzero.len()
            );
            out[i] = nonzero[k];
            k += 1;
        }
    }
    ensure!(
        k == nonzero.len(),
        "the mask has {k} set bits for {} nonzero values",
        nonzero.len()
    );
    Ok(out)
}

fn infer_sparse16(cx: &InferCx) -> Result<Vec<ValueType>> {
    let d = cx.t("nonzero_data")?;
    ensure!(d.rank() == 1, "nonzero_data must be a vector");
    let m = cx.t("mask")?;
    ensure!(
        m.dtype == DType::U8 && m.rank() == 1,
        "mask must be a uint8 vector"
    );
    let shape: Vec<usize> = cx.ints("shape")?.into_iter().map(|d| d as usize).collect();
    let n: usize = shape.iter().product();
    ensure!(
        fixed(cx, "mask")?[0] == n.div_ceil(8),
        "mask must have ceil({n} / 8) bytes"
    );
    Ok(vec![tensor(d.dtype, dims(&shape))])
}

fn eval_sparse16(cx: &EvalCx) -> Result<Vec<RValue>> {
    let shape: Vec<usize> = cx.ints("shape")?.into_iter().map(|d| d as usize).collect();
    let n = shape.iter().product();
    let bytes = kernels::to_vec::<u8>(cx.t("mask")?)?;
    let bits = (0..bytes.len() * 8).map(|i| (bytes[i / 8] >> (i % 8)) & 1 != 0);
    let nz = kernels::to_vec::<f64>(cx.t("nonzero_data")?)?;
    let out = densify(&nz, bits, n)?;
    one(kernels::data::from_f64(out, &shape, cx.out_dtype(0)?)?)
}

fn infer_sparse18(cx: &InferCx) -> Result<Vec<ValueType>> {
    let d = cx.t("nonzero_data")?;
    ensure!(d.rank() == 1, "nonzero_data must be a vector");
    let m = cx.t("mask")?;
    ensure!(m.dtype == DType::U1, "mask must be uint1, is {}", m.dtype);
    if let Some(mv) = cx.opt_tensor_val("mask")? {
        // uint1 packed LSB-first; padding bits are zero.
        let set: usize = mv
            .data
            .as_slice()
            .iter()
            .map(|b| b.count_ones() as usize)
            .sum();
        if let Some(ds) = d.fixed_shape() {
            ensure!(
                set == ds[0],
                "the mask has {set} set bits for {} nonzero values",
                ds[0]
            );
        }
    }
    Ok(vec![tensor(d.dtype, m.shape.clone())])
}

fn mask_bits(t: &Tensor) -> Result<Vec<bool>> {
    Ok(kernels::to_vec::<u8>(t)?
        .into_iter()
        .map(|b| b != 0)
        .collect())
}

fn eval_sparse18(cx: &EvalCx) -> Result<Vec<RValue>> {
    let m = cx.t("mask")?;
    let bits = mask_bits(m)?;
    let nz = kernels::to_vec::<f64>(cx.t("nonzero_data")?)?;
    let out = densify(&nz, bits.into_iter(), m.elem_count())?;
    one(kernels::data::from_f64(out, m.dims(), cx.out_dtype(0)?)?)
}

// ---- lut_to_sparse / sparse_blockwise_shift_scale ----

/// Runs a dense constexpr evaluation on values made here (not program constants).
fn run_dense(
    cx: &EvalCx,
    f: EvalFn,
    ins: &[(&'static str, RValue)],
    out: ValueType,
) -> Result<Tensor> {
    let outs = [out];
    let mut inputs = BTreeMap::new();
    for (n, val) in ins {
        inputs.insert(
            *n,
            vec![Bound {
                val,
                konst: None,
                f32_cache: None,
                packed: None,
            }],
        );
    }
    let sub = EvalCx {
        op_type: cx.op_type,
        op_name: cx.op_name,
        opset: cx.opset,
        inputs,
        attributes: cx.attributes,
        outputs: &outs,
        env: None,
        spec: cx.spec,
    };
    let r = f(&sub)?;
    Ok(r.first()
        .ok_or_else(|| anyhow!("no output"))?
        .tensor()?
        .clone())
}

/// The values of `dense` where `mask` is set, row-major.
fn pick(dense: &Tensor, mask: &[bool]) -> Result<Vec<f64>> {
    let v = kernels::to_vec::<f64>(dense)?;
    ensure!(v.len() == mask.len(), "mask and values differ in size");
    Ok(v.into_iter()
        .zip(mask)
        .filter_map(|(x, &m)| m.then_some(x))
        .collect())
}

fn infer_lut_to_sparse(cx: &InferCx) -> Result<Vec<ValueType>> {
    let m = cx.t("indices_mask")?;
    ensure!(
        m.dtype == DType::U1,
        "indices_mask must be uint1, is {}",
        m.dtype
    );
    let ms = fixed(cx, "indices_mask")?;
    let nz = fixed(cx, "indices_nonzero_data")?;
    ensure!(nz.len() == 1, "indices_nonzero_data must be a vector");
    let lut = cx.t("lut")?;
    let ls = fixed(cx, "lut")?;
    ensure!(
        ls.len() == ms.len() + 2,
        "lut {ls:?} must have rank {} for a mask {ms:?}",
        ms.len() + 2
    );
    let vs = ls[ls.len() - 1];
    let mut out_mask = ms.clone();
    let mut out_nz = nz[0];
    if vs > 1 {
        let a = axis(
            cx.opt_int("vector_axis")?
                .ok_or_else(|| anyhow!("vector palettization needs vector_axis"))?,
            ms.len(),
        )?;
        out_mask[a] *= vs;
        out_nz *= vs;
    }
    Ok(vec![
        tensor(DType::U1, dims(&out_mask)),
        tensor(lut.dtype, vec![Dim::Fixed(out_nz)]),
    ])
}

fn eval_lut_to_sparse(cx: &EvalCx) -> Result<Vec<RValue>> {
    let m = cx.t("indices_mask")?;
    let bits = mask_bits(m)?;
    let nz = kernels::to_vec::<f64>(cx.t("indices_nonzero_data")?)?;
    let codes: Vec<u8> = densify(&nz, bits.iter().copied(), m.elem_count())?
        .into_iter()
        .map(|c| c as u8)
        .collect();
    let indices = kernels::from_vec(codes, m.dims())?;
    let mut ins = vec![
        ("indices", RValue::T(indices)),
        ("lut", RValue::T(cx.t("lut")?.clone())),
    ];
    if let Some(a) = cx.opt_t("vector_axis")? {
        ins.push(("vector_axis", RValue::T(a.clone())));
    }
    let out_mask_t = cx.out(0)?;
    let lut_dt = cx.out(1)?.dtype;
    let dense = run_dense(
        cx,
        super::compression::eval_lut18,
        &ins,
        ValueType::Tensor(TensorType {
            dtype: lut_dt,
            shape: out_mask_t.shape.clone(),
        }),
    )?;
    // The mask repeated along the vector axis, as the dense output is.
    let oshape = dense.dims().to_vec();
    let vs = oshape
        .iter()
        .zip(m.dims())
        .find(|(o, i)| o != i)
        .map(|(o, i)| o / i);
    let out_mask: Vec<bool> = match vs {
        None => bits,
        Some(vs) => {
            let a = axis(cx.int("vector_axis")?, m.rank())?;
            let ist = kernels::data::strides(m.dims());
            let ost = kernels::data::strides(&oshape);
            (0..dense.elem_count())
                .map(|o| {
                    let mut i = 0;
                    for d in 0..oshape.len() {
                        let c = (o / ost[d]) % oshape[d];
                        i += if d == a { c / vs } else { c } * ist[d];
                    }
                    bits[i]
                })
                .collect()
        }
    };
    let values = pick(&dense, &out_mask)?;
    let n = values.len();
    Ok(vec![
        RValue::T(kernels::from_vec(
            out_mask.iter().map(|&b| b as u8).collect::<Vec<u8>>(),
            &oshape,
        )?),
        RValue::T(kernels::data::from_f64(values, &[n], cx.out_dtype(1)?)?),
    ])
}

fn infer_sparse_shift_scale(cx: &InferCx) -> Result<Vec<ValueType>> {
    let m = cx.t("data_mask")?;
    ensure!(
        m.dtype == DType::U1,
        "data_mask must be uint1, is {}",
        m.dtype
    );
    let ms = fixed(cx, "data_mask")?;
    let nz = cx.t("nonzero_data")?;
    ensure!(nz.rank() == 1, "nonzero_data must be a vector");
    let sc = cx.t("scale")?;
    ensure!(
        sc.dtype.is_float(),
        "scale must be fp16 or fp32, is {}",
        sc.dtype
    );
    let ss = fixed(cx, "scale")?;
    ensure!(
        ss.len() == ms.len()
            && ss
                .iter()
                .zip(&ms)
                .all(|(s, d)| *s > 0 && d.is_multiple_of(*s)),
        "scale {ss:?} does not tile the data {ms:?}"
    );
    if cx.has("offset") {
        ensure!(
            fixed(cx, "offset")? == ss,
            "offset must have the shape of scale {ss:?}"
        );
    }
    Ok(vec![
        ValueType::Tensor(m.clone()),
        tensor(sc.dtype, nz.shape.clone()),
    ])
}

fn eval_sparse_shift_scale(cx: &EvalCx) -> Result<Vec<RValue>> {
    let m = cx.t("data_mask")?;
    let bits = mask_bits(m)?;
    let nz = kernels::to_vec::<f64>(cx.t("nonzero_data")?)?;
    let data = densify(&nz, bits.iter().copied(), m.elem_count())?;
    let data = kernels::from_vec(
        data.into_iter().map(|x| x as f32).collect::<Vec<f32>>(),
        m.dims(),
    )?;
    let mut ins = vec![
        ("data", RValue::T(data)),
        ("scale", RValue::T(cx.t("scale")?.clone())),
    ];
    if let Some(o) = cx.opt_t("offset")? {
        ins.push(("offset", RValue::T(o.clone())));
    }
    let dt = cx.out(1)?.dtype;
    let dense = run_dense(
        cx,
        super::compression::eval_shift_scale,
        &ins,
        ValueType::Tensor(TensorType {
            dtype: dt,
            shape: dims(m.dims()),
        }),
    )?;
    let values = pick(&dense, &bits)?;
    let n = values.len();
    Ok(vec![
        RValue::T(m.clone()),
        RValue::T(kernels::data::from_f64(values, &[n], cx.out_dtype(1)?)?),
    ])
}

use Opset::{Ios16 as I16, Ios18 as I18};

const CAST: &[InputSpec] = &[req_c("source_val"), req_c("output_dtype")];

pub static DEFS: &[OpDef] = &[
    v(
        "constexpr_cast",
        I16,
        Some(I18),
        CAST,
        infer_cast,
        eval_cast,
    )
    .with_flops(Flops::None)
    .with_placement(&LOAD_TIME),
    v("constexpr_cast", I18, None, CAST, infer_cast, eval_cast)
        .with_flops(Flops::None)
        .with_placement(&LOAD_TIME),
    v(
        "constexpr_sparse_to_dense",
        I16,
        Some(I18),
        &[req_c("nonzero_data"), req_c("mask"), req_c("shape")],
        infer_sparse16,
        eval_sparse16,
    )
    .with_flops(Flops::None)
    .with_placement(&LOAD_TIME),
    v(
        "constexpr_sparse_to_dense",
        I18,
        None,
        &[req_c("nonzero_data"), req_c("mask")],
        infer_sparse18,
        eval_sparse18,
    )
    .with_flops(Flops::None)
    .with_placement(&LOAD_TIME),
    v(
        "constexpr_lut_to_sparse",
        I18,
        None,
        &[
            req_c("indices_mask"),
            req_c("indices_nonzero_data"),
            req_c("lut"),
            opt_c("vector_axis"),
        ],
        infer_lut_to_sparse,
        eval_lut_to_sparse,
    )
    .with_flops(Flops::None)
    .with_placement(&LOAD_TIME),
    v(
        "constexpr_sparse_blockwise_shift_scale",
        I18,
        None,
        &[
            req_c("data_mask"),
            req_c("nonzero_data"),
            req_c("scale"),
            opt_c("offset"),
        ],
        infer_sparse_shift_scale,
        eval_sparse_shift_scale,
    )
    .with_flops(Flops::None)
    .with_placement(&LOAD_TIME),
];
