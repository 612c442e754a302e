//! Resizing of the last two (spatial) axes: `upsample_nearest_neighbor`,
//! `resize_nearest_neighbor`, `upsample_bilinear` (iOS15; iOS16 adds `half_pixel_centers`),
//! `resize_bilinear`, iOS17's `resize` (the rightmost `resized_dims` axes, to a shape
//! given by a tensor) and `crop`, as coremltools 9 defines them.
//!
//! Every resize samples each output index `i` of an axis at a grid point of the input
//! (`resize_bilinear`'s sampling modes: STRICT_ALIGN_CORNERS `i·(in−1)/(out−1)`,
//! ALIGN_CORNERS the same but `(in−1)/2` for one output, DEFAULT `i·in/out`, OFFSET_CORNERS
//! `δ/2 + i·δ` with `δ = max(1, in−1)/out`, UNALIGN_CORNERS `(i+½)·in/out − ½`), clamped to
//! `[0, in−1]`; linear interpolation mixes the two neighbours; `resize_nearest_neighbor`
//! takes `floor` of the DEFAULT grid point (TF's ResizeNearestNeighbor), iOS17 `resize`'s
//! NEAREST_NEIGHBOR the grid point rounded half up in every mode (coremltools' test resizes
//! 2 rows to 3 with DEFAULT: grid 0, ⅔, 1⅓ reads rows 0, 1, 1). Axes are resampled one after the other (separable), in f64, rounded once.

use super::eval::{one, EvalCx, RValue};
use super::infer::{float_only, tensor, InferCx};
use super::DefaultValue;
use super::{opt_c, req, req_c, ver as v, InputSpec, OpDef};
use crate::ir::{DType, Dim, Opset, ValueType};
use crate::kernels;
use anyhow::{anyhow, bail, ensure, Result};

const MODES: &[&str] = &[
    "STRICT_ALIGN_CORNERS",
    "ALIGN_CORNERS",
    "DEFAULT",
    "OFFSET_CORNERS",
    "UNALIGN_CORNERS",
];

/// The input coordinate output index `i` of `out` samples, clamped to `[0, input−1]`.
fn grid(mode: &str, i: usize, input: usize, out: usize) -> f64 {
    let (i, xin, xout) = (i as f64, input as f64, out as f64);
    let g = match mode {
        "STRICT_ALIGN_CORNERS" | "ALIGN_CORNERS" if out == 1 => {
            if mode == "ALIGN_CORNERS" {
                (xin - 1.0) / 2.0
            } else {
                0.0
            }
        }
        "STRICT_ALIGN_CORNERS" | "ALIGN_CORNERS" => i * (xin - 1.0) / (xout - 1.0),
        "OFFSET_CORNERS" => {
            let delta = (xin - 1.0).max(1.0) / xout;
            0.5 * delta + i * delta
        }
        "UNALIGN_CORNERS" => (i + 0.5) * xin / xout - 0.5,
        _ => i * xin / xout,
    };
    g.clamp(0.0, xin - 1.0)
}

/// How one axis is resampled.
#[derive(Clone, Copy)]
enum Interp<'a> {
    Linear(&'a str),
    /// The grid point of the mode, rounded half up.
    Nearest(&'a str),
    /// `resize_nearest_neighbor`: the DEFAULT grid point, floored.
    NearestFloor,
    /// `upsample_nearest_neighbor`: input index `floor(i / scale)`.
    NearestScale(f64),
}

/// For each output index: (low index, high index, weight of the high one).
fn taps(interp: Interp, input: usize, out: usize) -> Vec<(usize, usize, f64)> {
    (0..out)
        .map(|i| match interp {
            Interp::Linear(m) => {
                let g = grid(m, i, input, out);
                let lo = g.floor() as usize;
                let hi = (lo + 1).min(input - 1);
                (lo, hi, g - lo as f64)
            }
            Interp::Nearest(m) => {
                let k = ((grid(m, i, input, out) + 0.5).floor() as usize).min(input - 1);
                (k, k, 0.0)
            }
            Interp::NearestFloor => {
                let k = (grid("DEFAULT", i, input, out).floor() as usize).min(input - 1);
                (k, k, 0.0)
            }
            Interp::NearestScale(s) => {
                let k = ((i as f64 / s).floor() as usize).min(input - 1);
                (k, k, 0.0)
            }
        })
        .collect()
}

/// Resamples axis `axis` of `v` (shape `shape`) to length `out`; updates `shape`.
fn resample_axis(
    v: &[f64],
    shape: &mut [usize],
    axis: usize,
    out: usize,
    interp: Interp,
) -> Vec<f64> {
    let input = shape[axis];
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    let t = taps(interp, input, out);
    let mut y = Vec::with_capacity(outer * out * inner);
    for o in 0..outer {
        let base = o * input * inner;
        for &(lo, hi, f) in &t {
            let (a, b) = (
                &v[base + lo * inner..][..inner],
                &v[base + hi * inner..][..inner],
            );
            y.extend(a.iter().zip(b).map(|(a, b)| a + (b - a) * f));
        }
    }
    shape[axis] = out;
    y
}

/// Resizes the given axes of `x` to the given lengths.
fn resize_axes(
    x: &candle_core::Tensor,
    to: &[(usize, usize)],
    interp: Interp,
) -> Result<Vec<RValue>> {
    let mut shape = x.dims().to_vec();
    let mut v = kernels::to_vec::<f64>(x)?;
    for &(axis, out) in to {
        ensure!(shape[axis] > 0 && out > 0, "resize of an empty axis");
        if shape[axis] != out || !matches!(interp, Interp::NearestScale(_)) {
            v = resample_axis(&v, &mut shape, axis, out, interp);
        }
    }
    if !x.dtype().is_float() {
        // Integer tensors (iOS17 `resize` of int32): the value rounded to the nearest one.
        v.iter_mut().for_each(|e| *e = e.round());
    }
    one(kernels::data::from_f64(v, &shape, x.dtype())?)
}

fn rank3<'a>(cx: &'a InferCx) -> Result<&'a crate::ir::TensorType> {
    let x = cx.t("x")?;
    float_only(x, "x")?;
    ensure!(
        x.rank() >= 3,
        "`{}` needs x of rank ≥ 3, is {x}",
        cx.op_type
    );
    Ok(x)
}

/// A scale factor (int32 or fp32 constant), default 1.
fn scale_in(cx: &InferCx, name: &str) -> Result<f64> {
    Ok(match cx.opt_val(name) {
        Some(v) => {
            let t = v
                .as_tensor()
                .ok_or_else(|| anyhow!("`{}`: `{name}` must be a tensor", cx.op_type))?;
            let f = t.to_f64_vec()?;
            ensure!(f.len() == 1, "`{}`: `{name}` must be a scalar", cx.op_type);
            f[0]
        }
        None if cx.has(name) => bail!("`{}`: `{name}` must be a constant", cx.op_type),
        None => 1.0,
    })
}
fn scale_ev(cx: &EvalCx, name: &str) -> Result<f64> {
    Ok(cx.opt_f64(name)?.unwrap_or(1.0))
}

fn scaled(op: &str, d: &Dim, s: f64) -> Result<Dim> {
    ensure!(s > 0.0, "`{op}`: scale factor {s} must be positive");
    Ok(match d {
        Dim::Fixed(n) => {
            let o = (*n as f64 * s).floor() as usize;
            ensure!(o > 0, "`{op}`: scale factor {s} makes axis {n} empty");
            Dim::Fixed(o)
        }
        Dim::Unknown => Dim::Unknown,
    })
}

fn infer_upsample(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = rank3(cx)?;
    let (sh, sw) = (
        scale_in(cx, "scale_factor_height")?,
        scale_in(cx, "scale_factor_width")?,
    );
    let r = x.rank();
    let mut s = x.shape.clone();
    s[r - 2] = scaled(cx.op_type, &x.shape[r - 2], sh)?;
    s[r - 1] = scaled(cx.op_type, &x.shape[r - 1], sw)?;
    if cx.op_type == "upsample_bilinear" {
        bilinear_mode(
            cx.opt_bool("align_corners")?,
            cx.opt_bool("half_pixel_centers")?,
        )?;
    }
    Ok(vec![tensor(x.dtype, s)])
}

/// `upsample_bilinear`'s sampling mode from `align_corners` (default true) and iOS16's
/// `half_pixel_centers` (default `!align_corners`).
fn bilinear_mode(align: Option<bool>, half: Option<bool>) -> Result<&'static str> {
    let align = align.unwrap_or(true);
    Ok(match (align, half.unwrap_or(!align)) {
        (true, false) => "STRICT_ALIGN_CORNERS",
        (false, true) => "UNALIGN_CORNERS",
        (false, false) => "DEFAULT",
        (true, true) => {
            bail!("`upsample_bilinear`: align_corners and half_pixel_centers cannot both be true")
        }
    })
}

fn eval_upsample(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let r = x.rank();
    let (sh, sw) = (
        scale_ev(cx, "scale_factor_height")?,
        scale_ev(cx, "scale_factor_width")?,
    );
    let d = x.dims();
    let (oh, ow) = (
        (d[r - 2] as f64 * sh).floor() as usize,
        (d[r - 1] as f64 * sw).floor() as usize,
    );
    if cx.op_type == "upsample_bilinear" {
        let m = bilinear_mode(
            cx.opt_bool("align_corners")?,
            cx.opt_bool("half_pixel_centers")?,
        )?;
        resize_axes(x, &[(r - 2, oh), (r - 1, ow)], Interp::Linear(m))
    } else {
        let mut y = resize_axes(x, &[(r - 2, oh)], Interp::NearestScale(sh))?;
        let RValue::T(t) = y.remove(0) else {
            unreachable!()
        };
        resize_axes(&t, &[(r - 1, ow)], Interp::NearestScale(sw))
    }
}

fn target(cx: &InferCx, name: &str, default: Option<i64>) -> Result<usize> {
    let v = match cx.opt_int(name)? {
        Some(v) => v,
        None => default.ok_or_else(|| anyhow!("`{}` needs `{name}`", cx.op_type))?,
    };
    ensure!(v > 0, "`{}`: {name} {v} must be positive", cx.op_type);
    Ok(v as usize)
}

fn sampling(op: &str, m: Option<&str>) -> Result<String> {
    let m = m.unwrap_or("DEFAULT");
    ensure!(
        MODES.contains(&m),
        "`{op}`: unknown sampling_mode `{m}` (one of {})",
        MODES.join(", ")
    );
    Ok(m.to_string())
}

fn infer_resize_hw(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = rank3(cx)?;
    let def = (cx.op_type == "resize_bilinear").then_some(1);
    let (h, w) = (
        target(cx, "target_size_height", def)?,
        target(cx, "target_size_width", def)?,
    );
    sampling(cx.op_type, cx.opt_str("sampling_mode")?)?;
    let r = x.rank();
    let mut s = x.shape.clone();
    s[r - 2] = Dim::Fixed(h);
    s[r - 1] = Dim::Fixed(w);
    Ok(vec![tensor(x.dtype, s)])
}

fn eval_resize_hw(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let r = x.rank();
    let (h, w) = (
        cx.opt_int("target_size_height")?.unwrap_or(1) as usize,
        cx.opt_int("target_size_width")?.unwrap_or(1) as usize,
    );
    if cx.op_type == "resize_bilinear" {
        let m = sampling(cx.op_type, cx.opt_str("sampling_mode")?)?;
        resize_axes(x, &[(r - 2, h), (r - 1, w)], Interp::Linear(&m))
    } else {
        resize_axes(x, &[(r - 2, h), (r - 1, w)], Interp::NearestFloor)
    }
}

/// iOS17 `resize`: output axis `rank − resized_dims + i` takes `shape[K − resized_dims + i]`
/// (0 keeps x's length).
fn resize_targets(xs: &[Dim], shape: Option<Vec<i64>>, k: usize, nd: usize) -> Result<Vec<Dim>> {
    ensure!(
        nd <= k,
        "`resize`: resized_dims {nd} exceeds the {k} values of shape"
    );
    ensure!(
        k <= xs.len(),
        "`resize`: shape has {k} values, x only {} axes",
        xs.len()
    );
    let mut out = xs.to_vec();
    for i in 0..nd {
        let a = xs.len() - nd + i;
        out[a] = match &shape {
            Some(s) => match s[k - nd + i] {
                0 => xs[a].clone(),
                v if v > 0 => Dim::Fixed(v as usize),
                v => bail!("`resize`: target length {v}"),
            },
            None => Dim::Unknown,
        };
    }
    Ok(out)
}

fn infer_resize(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    ensure!(
        matches!(x.dtype, DType::F16 | DType::F32 | DType::I32),
        "`resize`: x must be fp16, fp32 or int32, is {x}"
    );
    let st = cx.t("shape")?;
    ensure!(st.rank() == 1, "`resize`: shape must be rank 1, is {st}");
    let k = match st.shape[0] {
        Dim::Fixed(k) => k,
        Dim::Unknown => bail!("`resize`: shape needs a fixed length"),
    };
    let nd = cx.int("resized_dims")?;
    ensure!(nd >= 0, "`resize`: resized_dims {nd}");
    let im = cx.str_or_default("interpolation_mode")?;
    ensure!(
        matches!(im, "LINEAR" | "NEAREST_NEIGHBOR"),
        "`resize`: unknown interpolation_mode `{im}` (LINEAR or NEAREST_NEIGHBOR)"
    );
    sampling("resize", cx.opt_str("sampling_mode")?)?;
    let shape = match cx.opt_val("shape") {
        Some(v) => Some(
            v.as_tensor()
                .ok_or_else(|| anyhow!("`resize`: shape must be a tensor"))?
                .to_i64_vec()?,
        ),
        None => None,
    };
    Ok(vec![tensor(
        x.dtype,
        resize_targets(&x.shape, shape, k, nd as usize)?,
    )])
}

fn eval_resize(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let shape = cx.ints("shape")?;
    let nd = cx.int("resized_dims")? as usize;
    let xs: Vec<Dim> = x.dims().iter().map(|&d| Dim::Fixed(d)).collect();
    let out = resize_targets(&xs, Some(shape.clone()), shape.len(), nd)?;
    let m = sampling("resize", cx.opt_str("sampling_mode")?)?;
    let interp = match cx.str_or_default("interpolation_mode")? {
        "NEAREST_NEIGHBOR" => Interp::Nearest(&m),
        _ => Interp::Linear(&m),
    };
    let to: Vec<(usize, usize)> = (x.rank() - nd..x.rank())
        .map(|a| match out[a] {
            Dim::Fixed(n) => (a, n),
            Dim::Unknown => (a, x.dims()[a]),
        })
        .collect();
    resize_axes(x, &to, interp)
}

fn crop_amounts(op: &str, v: Vec<i64>, what: &str) -> Result<(usize, usize)> {
    ensure!(
        v.len() == 2 && v.iter().all(|&e| e >= 0),
        "`{op}`: {what} {v:?} must be 2 non-negative values"
    );
    Ok((v[0] as usize, v[1] as usize))
}

fn cropped(op: &str, d: &Dim, (a, b): (usize, usize)) -> Result<Dim> {
    Ok(match d {
        Dim::Fixed(n) => {
            ensure!(a + b < *n, "`{op}`: cropping {a} + {b} from an axis of {n}");
            Dim::Fixed(n - a - b)
        }
        Dim::Unknown => Dim::Unknown,
    })
}

fn infer_crop(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = rank3(cx)?;
    let ch = crop_amounts("crop", cx.ints("crop_height")?, "crop_height")?;
    let cw = crop_amounts("crop", cx.ints("crop_width")?, "crop_width")?;
    let r = x.rank();
    let mut s = x.shape.clone();
    s[r - 2] = cropped("crop", &x.shape[r - 2], ch)?;
    s[r - 1] = cropped("crop", &x.shape[r - 1], cw)?;
    Ok(vec![tensor(x.dtype, s)])
}

fn eval_crop(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let r = x.rank();
    let (t, b) = crop_amounts("crop", cx.ints("crop_height")?, "crop_height")?;
    let (l, rt) = crop_amounts("crop", cx.ints("crop_width")?, "crop_width")?;
    let d = x.dims();
    let y = x
        .narrow(r - 2, t, d[r - 2] - t - b)?
        .narrow(r - 1, l, d[r - 1] - l - rt)?
        .contiguous()?;
    one(y)
}

use Opset::{Ios15 as I15, Ios16 as I16, Ios17 as I17};

const UP_NN: &[InputSpec] = &[
    req("x"),
    opt_c("scale_factor_height"),
    opt_c("scale_factor_width"),
];
const UP_BI15: &[InputSpec] = &[
    req("x"),
    opt_c("scale_factor_height"),
    opt_c("scale_factor_width"),
    opt_c("align_corners"),
];
const UP_BI16: &[InputSpec] = &[
    req("x"),
    opt_c("scale_factor_height"),
    opt_c("scale_factor_width"),
    opt_c("align_corners"),
    opt_c("half_pixel_centers"),
];
const RS_NN: &[InputSpec] = &[
    req("x"),
    req_c("target_size_height"),
    req_c("target_size_width"),
];
const RS_BI: &[InputSpec] = &[
    req("x"),
    opt_c("target_size_height"),
    opt_c("target_size_width"),
    opt_c("sampling_mode"),
];
const RESIZE: &[InputSpec] = &[
    req("x"),
    req("shape"),
    req_c("resized_dims"),
    opt_c("interpolation_mode").or(DefaultValue::Str("LINEAR")),
    opt_c("sampling_mode"),
];
const CROP: &[InputSpec] = &[req("x"), req_c("crop_height"), req_c("crop_width")];

pub static DEFS: &[OpDef] = &[
    v(
        "upsample_nearest_neighbor",
        I15,
        None,
        UP_NN,
        infer_upsample,
        eval_upsample,
    ),
    v(
        "upsample_bilinear",
        I15,
        Some(I16),
        UP_BI15,
        infer_upsample,
        eval_upsample,
    ),
    v(
        "upsample_bilinear",
        I16,
        None,
        UP_BI16,
        infer_upsample,
        eval_upsample,
    ),
    v(
        "resize_nearest_neighbor",
        I15,
        None,
        RS_NN,
        infer_resize_hw,
        eval_resize_hw,
    ),
    v(
        "resize_bilinear",
        I15,
        None,
        RS_BI,
        infer_resize_hw,
        eval_resize_hw,
    ),
    v("resize", I17, None, RESIZE, infer_resize, eval_resize),
    v("crop", I15, None, CROP, infer_crop, eval_crop),
];
