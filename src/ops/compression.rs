//! Compressed-weight ops (`constexpr_*`): decoded by Core ML at load time, never constant
//! folded by milkit (folding would undo the compression). Shape rules follow coremltools 9's
//! declarations (`mil/ops/defs/iOS16/constexpr_ops.py`, `iOS18/compression.py`).

use super::eval::{out0, EvalCx, RValue};
use super::infer::{axis, tensor, InferCx};
use super::placement::{Flops, LOAD_TIME};
use super::{opt_c, req_c, InputSpec, OpDef};
use crate::ir::{DType, Dim, Opset, ValueType};
use crate::kernels;
use anyhow::{anyhow, bail, ensure, Result};
use rayon::prelude::*;

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
        // coremltools: a float offset, or one of data's own dtype.
        let od = cx.t("offset")?.dtype;
        ensure!(
            od.is_float() || od == data.dtype,
            "offset dtype {od} must be a float or data's dtype {}",
            data.dtype
        );
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

// ---- evaluation: decoded once when the interpreter loads the program; results keep the
// LUT's / scale's dtype, computed in f32 with one rounding ----

/// Row-major strides.
fn strides(s: &[usize]) -> Vec<usize> {
    kernels::data::strides(s)
}

/// The f32 values of a constant input.
fn values(cx: &EvalCx, name: &str) -> Result<Vec<f32>> {
    kernels::to_f32_vec(cx.t(name)?)
}

// ---- the one decode of the iOS18 compressed forms: the interpreter's evaluation below and
// the compression passes' decoders (`passes::lut::decode_lut`, `passes::quant::decode_blockwise`)
// both call these, so how a parameter grid tiles a weight is stated once ----

/// Decodes a tensor of `shape` whose parameters form a grid of `grid` (same rank, each grid
/// dim dividing the shape's: a LUT's tables, a shift/scale's scales): `value(i, g)` gives the
/// element of flat row-major index `i` from the parameters of grid cell `g` (flat, row-major
/// in `grid`). `what` names the op in errors.
pub fn decode_grid<T: Copy + Default + Send>(
    what: &str,
    shape: &[usize],
    grid: &[usize],
    value: impl Fn(usize, usize) -> T + Sync,
) -> Result<Vec<T>> {
    ensure!(
        !shape.is_empty() && grid.len() == shape.len(),
        "{what}: parameter grid {grid:?} and weight shape {shape:?} differ in rank"
    );
    let mut blocks = Vec::with_capacity(shape.len());
    for (a, (&d, &g)) in shape.iter().zip(grid).enumerate() {
        ensure!(
            g > 0 && d % g == 0,
            "{what}: axis {a}: weight dim {d} is not a multiple of parameter dim {g}"
        );
        blocks.push(d / g);
    }
    let numel: usize = shape.iter().product();
    if numel == 0 {
        return Ok(Vec::new());
    }
    // Trailing size-1 axes (linear weights stored as [out, in, 1, 1]) change no flat index
    // (their grid dims are 1 too); without them rows stay long, keeping the per-row index
    // arithmetic and rayon's per-task cost off the per-element path.
    let rank = shape.iter().rposition(|&d| d != 1).map_or(1, |i| i + 1);
    let (shape, grid, blocks) = (&shape[..rank], &grid[..rank], &blocks[..rank]);
    let gstride = strides(grid);
    let last = shape[rank - 1];
    let last_map: Vec<usize> = (0..last)
        .map(|i| (i / blocks[rank - 1]) * gstride[rank - 1])
        .collect();
    let outer = &shape[..rank - 1];
    let mut out = vec![T::default(); numel];
    out.par_chunks_mut(last)
        .enumerate()
        .with_min_len((4096 / last).max(1))
        .for_each(|(row, dst)| {
            // Grid cell contributed by the outer axes of this row.
            let (mut rem, mut base) = (row, 0usize);
            for a in (0..outer.len()).rev() {
                let i = rem % outer[a];
                rem /= outer[a];
                base += (i / blocks[a]) * gstride[a];
            }
            for (j, (o, &m)) in dst.iter_mut().zip(&last_map).enumerate() {
                *o = value(row * last + j, base + m);
            }
        });
    Ok(out)
}

/// iOS18 `constexpr_lut_to_dense` with scalar palettization (`lut` of shape `[b_0, …,
/// b_{r-1}, 2^nbits, 1]`, each `b_a` dividing `shape[a]`): `out[i] = lut[cell(i), codes[i]]`.
/// The entries keep their type (fp16 stays fp16: no rounding).
pub fn decode_lut<T: Copy + Default + Send + Sync>(
    codes: &[u8],
    shape: &[usize],
    lut: &[T],
    lut_shape: &[usize],
) -> Result<Vec<T>> {
    const WHAT: &str = "constexpr_lut_to_dense";
    let r = shape.len();
    let numel: usize = shape.iter().product();
    ensure!(
        r >= 1 && codes.len() == numel,
        "{WHAT}: {} indices for shape {shape:?}",
        codes.len()
    );
    ensure!(
        lut_shape.len() == r + 2,
        "{WHAT}: lut shape {lut_shape:?} must have rank {} (indices rank + 2)",
        r + 2
    );
    ensure!(
        lut_shape[r + 1] == 1,
        "{WHAT}: vector palettization (lut last dim {}) is not scalar",
        lut_shape[r + 1]
    );
    let entries = lut_shape[r];
    ensure!(
        entries.is_power_of_two() && entries <= 256,
        "{WHAT}: palette size {entries} is not 2^nbits with nbits ≤ 8"
    );
    ensure!(
        lut.len() == lut_shape.iter().product::<usize>(),
        "{WHAT}: lut has {} values for shape {lut_shape:?}",
        lut.len()
    );
    if let Some((i, &bad)) = codes
        .iter()
        .enumerate()
        .find(|(_, &v)| v as usize >= entries)
    {
        bail!("{WHAT}: index {i} is {bad}, but the palette has {entries} entries");
    }
    decode_grid(WHAT, shape, &lut_shape[..r], |i, g| {
        lut[g * entries + codes[i] as usize]
    })
}

/// iOS18 `constexpr_blockwise_shift_scale`: `out[i] = round(scale[cell(i)] · (data[i] −
/// offset[cell(i)]))`, computed in f32 and rounded once by `round` (to the output dtype),
/// `scale` (and `offset`, when given) row-major in `scale_shape`.
pub fn decode_shift_scale<T: Copy + Default + Send>(
    shape: &[usize],
    scale_shape: &[usize],
    data: impl Fn(usize) -> f32 + Sync,
    scale: impl Fn(usize) -> f32 + Sync,
    offset: Option<&(dyn Fn(usize) -> f32 + Sync)>,
    round: impl Fn(f32) -> T + Sync,
) -> Result<Vec<T>> {
    decode_grid(
        "constexpr_blockwise_shift_scale",
        shape,
        scale_shape,
        |i, g| round(scale(g) * (data(i) - offset.map_or(0.0, |o| o(g)))),
    )
}

/// iOS18 `constexpr_lut_to_dense` with vector palettization (`lut` of shape `[b_0, …,
/// b_{r-1}, 2^nbits, vs]`, each `b_a` dividing `shape[a]`, `vs` ≥ 1): the output is `shape`
/// with axis `vector_axis` multiplied by `vs`, and `out[o] = lut[cell(i), codes[i], o[va] %
/// vs]` where `i` is `o` with the vector axis divided by `vs` (so `vs` consecutive elements
/// along the vector axis come from one entry). Returns the values and the output shape.
/// With `vs` = 1 this is [`decode_lut`].
pub fn decode_lut_vector<T: Copy + Default + Send + Sync>(
    codes: &[u8],
    shape: &[usize],
    lut: &[T],
    lut_shape: &[usize],
    vector_axis: i64,
) -> Result<(Vec<T>, Vec<usize>)> {
    const WHAT: &str = "constexpr_lut_to_dense";
    let r = shape.len();
    ensure!(
        r >= 1 && lut_shape.len() == r + 2,
        "{WHAT}: lut shape {lut_shape:?} must have rank {} (indices rank + 2)",
        r + 2
    );
    let (palette, vs) = (lut_shape[r], lut_shape[r + 1]);
    if vs == 1 {
        return Ok((decode_lut(codes, shape, lut, lut_shape)?, shape.to_vec()));
    }
    let numel: usize = shape.iter().product();
    ensure!(
        codes.len() == numel,
        "{WHAT}: {} indices for shape {shape:?}",
        codes.len()
    );
    ensure!(
        vs > 0 && palette.is_power_of_two() && palette <= 256,
        "{WHAT}: lut shape {lut_shape:?}: palette size {palette} is not 2^nbits with nbits ≤ 8"
    );
    ensure!(
        lut.len() == lut_shape.iter().product::<usize>(),
        "{WHAT}: lut has {} values for shape {lut_shape:?}",
        lut.len()
    );
    for a in 0..r {
        ensure!(
            lut_shape[a] > 0 && shape[a].is_multiple_of(lut_shape[a]),
            "{WHAT}: lut {lut_shape:?}: {} groups do not divide axis {a} of indices {shape:?}",
            lut_shape[a]
        );
    }
    if let Some((i, &bad)) = codes
        .iter()
        .enumerate()
        .find(|(_, &v)| v as usize >= palette)
    {
        bail!("{WHAT}: index {i} is {bad}, but the palette has {palette} entries");
    }
    let va = axis(vector_axis, r)?;
    let block: Vec<usize> = (0..r).map(|k| shape[k] / lut_shape[k]).collect();
    let mut oshape = shape.to_vec();
    oshape[va] *= vs;
    let (ist, lst) = (strides(shape), strides(lut_shape));
    let last = oshape[r - 1];
    let mut out = vec![T::default(); oshape.iter().product()];
    if out.is_empty() {
        return Ok((out, oshape));
    }
    out.par_chunks_mut(last).enumerate().for_each(|(row, dst)| {
        // Offsets of the row's prefix (all axes but the last) in indices and lut.
        let (mut ioff, mut loff, mut rem) = (0usize, 0usize, row);
        let mut comp = 0usize;
        for k in (0..r - 1).rev() {
            let o = rem % oshape[k];
            rem /= oshape[k];
            let i = if k == va {
                comp = o % vs;
                o / vs
            } else {
                o
            };
            ioff += i * ist[k];
            loff += (i / block[k]) * lst[k];
        }
        for (j, d) in dst.iter_mut().enumerate() {
            let (i, c) = if va == r - 1 {
                (j / vs, j % vs)
            } else {
                (j, comp)
            };
            let code = codes[ioff + i] as usize;
            *d = lut[loff + (i / block[r - 1]) * lst[r - 1] + code * lst[r] + c];
        }
    });
    Ok((out, oshape))
}

/// iOS18 LUT, scalar or vector ([`decode_lut_vector`]; a missing `vector_axis` reads as 0).
pub(super) fn eval_lut18(cx: &EvalCx) -> Result<Vec<RValue>> {
    let it = cx.t("indices")?;
    let ishape = it.dims().to_vec();
    let codes = kernels::to_vec::<u8>(it)?;
    let lut_t = cx.t("lut")?;
    let lshape = lut_t.dims().to_vec();
    let lut = kernels::to_f32_vec(lut_t)?;
    let va = cx.opt_int("vector_axis")?.unwrap_or(0);
    let (out, oshape) = decode_lut_vector(&codes, &ishape, &lut, &lshape, va)?;
    out0(cx, kernels::from_vec(out, &oshape)?)
}

/// iOS16 LUT: one 1-D palette, indices packed LSB-first into `uint8` bytes.
fn eval_lut16(cx: &EvalCx) -> Result<Vec<RValue>> {
    let lut = values(cx, "lut")?;
    let nbits = lut.len().trailing_zeros() as usize;
    ensure!(
        lut.len().is_power_of_two() && (1..=8).contains(&nbits),
        "lut of {} entries",
        lut.len()
    );
    let shape: Vec<usize> = cx.ints("shape")?.into_iter().map(|d| d as usize).collect();
    let n: usize = shape.iter().product();
    let bytes = kernels::to_vec::<u8>(cx.t("indices")?)?;
    let codes = kernels::unpack_bits(&bytes, nbits, n)?;
    out0(
        cx,
        kernels::from_vec(
            codes
                .into_iter()
                .map(|c| lut[c as usize])
                .collect::<Vec<f32>>(),
            &shape,
        )?,
    )
}

/// iOS18: `scale[block(i)] · (data[i] − offset[block(i)])`, blocks tiling `data`.
pub(super) fn eval_shift_scale(cx: &EvalCx) -> Result<Vec<RValue>> {
    let dt = cx.t("data")?;
    let shape = dt.dims().to_vec();
    let data = kernels::to_f32_vec(dt)?;
    let st = cx.t("scale")?;
    let sshape = st.dims().to_vec();
    let scale = kernels::to_f32_vec(st)?;
    let offset = if cx.has("offset") {
        Some(values(cx, "offset")?)
    } else {
        None
    };
    ensure!(
        data.len() == shape.iter().product::<usize>()
            && scale.len() == sshape.iter().product::<usize>()
            && offset.as_ref().is_none_or(|o| o.len() == scale.len()),
        "scale {sshape:?} for data {shape:?}"
    );
    let off = offset.as_ref().map(|o| move |g: usize| o[g]);
    let out = decode_shift_scale(
        &shape,
        &sshape,
        |i| data[i],
        |g| scale[g],
        off.as_ref().map(|f| f as &(dyn Fn(usize) -> f32 + Sync)),
        |v| v,
    )?;
    out0(cx, kernels::from_vec(out, &shape)?)
}

/// iOS16: `scale · (quantized − zero_point)`, scale / zero point scalar or per `axis`.
fn eval_affine(cx: &EvalCx) -> Result<Vec<RValue>> {
    let qt = cx.t("quantized_data")?;
    let shape = qt.dims().to_vec();
    let q = kernels::to_f32_vec(qt)?;
    let (zp, scale) = (values(cx, "zero_point")?, values(cx, "scale")?);
    let a = axis(cx.int("axis")?, shape.len())?;
    let inner: usize = shape[a + 1..].iter().product();
    let n = shape[a];
    for (p, what) in [(&zp, "zero_point"), (&scale, "scale")] {
        ensure!(
            p.len() == 1 || p.len() == n,
            "{what} has {} values for an axis of {n}",
            p.len()
        );
    }
    let pick = |p: &[f32], i: usize| {
        if p.len() == 1 {
            p[0]
        } else {
            p[(i / inner.max(1)) % n]
        }
    };
    let out: Vec<f32> = q
        .iter()
        .enumerate()
        .map(|(i, &v)| (v - pick(&zp, i)) * pick(&scale, i))
        .collect();
    out0(cx, kernels::from_vec(out, &shape)?)
}

pub static DEFS: &[OpDef] = &[
    OpDef {
        name: "constexpr_lut_to_dense",
        since: Opset::Ios16,
        until: Some(Opset::Ios18),
        inputs: LUT16,
        infer: infer_lut16,
        eval: Some(eval_lut16),
        weight: None,
        f32_inputs: &[],
        fresh: false,
        placement: Some(&LOAD_TIME),
        flops: Flops::None,
    },
    OpDef {
        name: "constexpr_lut_to_dense",
        since: Opset::Ios18,
        until: None,
        inputs: LUT18,
        infer: infer_lut18,
        eval: Some(eval_lut18),
        weight: None,
        f32_inputs: &[],
        fresh: false,
        placement: Some(&LOAD_TIME),
        flops: Flops::None,
    },
    OpDef {
        name: "constexpr_affine_dequantize",
        since: Opset::Ios16,
        until: None,
        inputs: AFFINE,
        infer: infer_affine,
        eval: Some(eval_affine),
        weight: None,
        f32_inputs: &[],
        fresh: false,
        placement: Some(&LOAD_TIME),
        flops: Flops::None,
    },
    OpDef {
        name: "constexpr_blockwise_shift_scale",
        since: Opset::Ios18,
        until: None,
        inputs: SHIFT,
        infer: infer_shift_scale,
        eval: Some(eval_shift_scale),
        weight: None,
        f32_inputs: &[],
        fresh: false,
        placement: Some(&LOAD_TIME),
        flops: Flops::None,
    },
];
