//! `resample` (iOS15; iOS16 and iOS17 widen the coordinates' dtypes) and `affine` (iOS15):
//! sampling `x [B, C, H, W]` at given points, as coremltools 9 defines them (PyTorch's
//! `grid_sample` / `affine_grid` conventions). A point `(x, y)` is mapped to input pixel
//! coordinates `u` per axis of length `n`: `unnormalized` `u = c`; `normalized_minus_one_to_one`
//! `(c+1)/2·(n−1)` with `align_corners`, else `((c+1)·n − 1)/2`; `normalized_zero_to_one`
//! `c·(n−1)`, else `c·n − ½`. `bilinear` mixes the four neighbours of `u`, `nearest` takes
//! `floor(u + ½)`; a neighbour outside the image reads the padding: `constant` the
//! `padding_value`, `border` the edge, `reflection` the image mirrored without repeating the
//! edge (`|1 2 3| → 2 3 2 1 2 3 2 1`), `symmetric` mirrored with it (`3 2 1 1 2 3 3 2 1`).
//! `affine` samples output pixel `(j, i)` at `(a0·x + a1·y + a2, b0·x + b1·y + b2)` where
//! `(x, y)` are the pixel's normalized `[-1, 1]` coordinates (bilinear, zero padding, the
//! modes coremltools allows). One pass over the output, in f64, rounded once to x's dtype.

use super::eval::{one, EvalCx, RValue};
use super::infer::{float_only, tensor, InferCx};
use super::{req, req_c, ver as v, InputSpec, OpDef};
use crate::ir::{Dim, Opset, ValueType};
use crate::kernels;
use anyhow::{bail, ensure, Result};

/// How points are read: coordinates mode, sampling, padding.
struct Sampler<'a> {
    coords: &'a str,
    align: bool,
    nearest: bool,
    padding: &'a str,
    pad_value: f64,
}

fn check_modes(op: &str, sampling: &str, padding: &str, coords: &str) -> Result<()> {
    ensure!(
        matches!(sampling, "bilinear" | "nearest"),
        "`{op}`: unknown sampling_mode `{sampling}` (bilinear or nearest)"
    );
    ensure!(
        matches!(padding, "constant" | "border" | "reflection" | "symmetric"),
        "`{op}`: unknown padding_mode `{padding}` (constant, border, reflection, symmetric)"
    );
    ensure!(
        matches!(
            coords,
            "unnormalized" | "normalized_minus_one_to_one" | "normalized_zero_to_one"
        ),
        "`{op}`: unknown coordinates_mode `{coords}`"
    );
    Ok(())
}

impl Sampler<'_> {
    /// Input pixel coordinate of `c` along an axis of `n` pixels.
    fn pixel(&self, c: f64, n: usize) -> f64 {
        let n = n as f64;
        match (self.coords, self.align) {
            ("normalized_minus_one_to_one", true) => (c + 1.0) / 2.0 * (n - 1.0),
            ("normalized_minus_one_to_one", false) => ((c + 1.0) * n - 1.0) / 2.0,
            ("normalized_zero_to_one", true) => c * (n - 1.0),
            ("normalized_zero_to_one", false) => c * n - 0.5,
            _ => c,
        }
    }
    /// The index a possibly outside index `i` reads along an axis of `n`, or None (constant).
    fn index(&self, i: i64, n: usize) -> Option<usize> {
        let n = n as i64;
        if (0..n).contains(&i) {
            return Some(i as usize);
        }
        match self.padding {
            "border" => Some(i.clamp(0, n - 1) as usize),
            "reflection" if n == 1 => Some(0),
            "reflection" => {
                let p = 2 * (n - 1);
                let m = i.rem_euclid(p);
                Some(if m < n { m } else { p - m } as usize)
            }
            "symmetric" => {
                let p = 2 * n;
                let m = i.rem_euclid(p);
                Some(if m < n { m } else { p - 1 - m } as usize)
            }
            _ => None,
        }
    }
    /// The value of plane `img` (`h × w`) at point `(px, py)` (input coordinates).
    fn sample(&self, img: &[f64], h: usize, w: usize, px: f64, py: f64) -> f64 {
        let (u, v) = (self.pixel(px, w), self.pixel(py, h));
        let at = |y: i64, x: i64| match (self.index(y, h), self.index(x, w)) {
            (Some(y), Some(x)) => img[y * w + x],
            _ => self.pad_value,
        };
        if self.nearest {
            return at((v + 0.5).floor() as i64, (u + 0.5).floor() as i64);
        }
        let (x0, y0) = (u.floor(), v.floor());
        let (fx, fy) = (u - x0, v - y0);
        let (x0, y0) = (x0 as i64, y0 as i64);
        (1.0 - fy) * ((1.0 - fx) * at(y0, x0) + fx * at(y0, x0 + 1))
            + fy * ((1.0 - fx) * at(y0 + 1, x0) + fx * at(y0 + 1, x0 + 1))
    }
}

fn infer_resample(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    float_only(x, "x")?;
    let c = cx.t("coordinates")?;
    ensure!(
        x.rank() == 4 && c.rank() == 4,
        "`resample`: x {x} and coordinates {c} must be rank 4"
    );
    ensure!(
        c.dtype.is_float() || c.dtype.is_int(),
        "`resample`: coordinates {c} must be numeric"
    );
    ensure!(
        matches!(c.shape[3], Dim::Fixed(2) | Dim::Unknown),
        "`resample`: coordinates {c} must end in 2 (x, y)"
    );
    if let (Dim::Fixed(a), Dim::Fixed(b)) = (&x.shape[0], &c.shape[0]) {
        ensure!(a == b, "`resample`: batch {a} of x vs {b} of coordinates");
    }
    check_modes(
        "resample",
        cx.opt_str("sampling_mode")?.unwrap_or(""),
        cx.opt_str("padding_mode")?.unwrap_or(""),
        cx.opt_str("coordinates_mode")?.unwrap_or(""),
    )?;
    let mut s = x.shape.clone();
    s[2] = c.shape[1].clone();
    s[3] = c.shape[2].clone();
    Ok(vec![tensor(x.dtype, s)])
}

fn sampler<'a>(cx: &EvalCx<'a>) -> Result<Sampler<'a>> {
    let s = |n: &str| -> Result<&'a str> {
        cx.opt_str(n)?
            .ok_or_else(|| anyhow::anyhow!("`{}` needs `{n}`", cx.op_type))
    };
    let (sampling, padding, coords) = (
        s("sampling_mode")?,
        s("padding_mode")?,
        s("coordinates_mode")?,
    );
    check_modes(cx.op_type, sampling, padding, coords)?;
    Ok(Sampler {
        coords,
        align: cx.opt_bool("align_corners")?.unwrap_or(false),
        nearest: sampling == "nearest",
        padding,
        pad_value: cx.opt_f64("padding_value")?.unwrap_or(0.0),
    })
}

fn eval_resample(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let sm = sampler(cx)?;
    let xd = x.dims().to_vec();
    let c = cx.t("coordinates")?;
    let cd = c.dims().to_vec();
    let (b, ch, h, w) = (xd[0], xd[1], xd[2], xd[3]);
    let (oh, ow) = (cd[1], cd[2]);
    let xv = kernels::to_vec::<f64>(x)?;
    let cv = kernels::to_vec::<f64>(c)?;
    let mut y = Vec::with_capacity(b * ch * oh * ow);
    for bi in 0..b {
        for ci in 0..ch {
            let img = &xv[(bi * ch + ci) * h * w..][..h * w];
            for p in 0..oh * ow {
                let at = (bi * oh * ow + p) * 2;
                y.push(sm.sample(img, h, w, cv[at], cv[at + 1]));
            }
        }
    }
    one(kernels::data::from_f64(y, &[b, ch, oh, ow], x.dtype())?)
}

fn infer_affine(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    float_only(x, "x")?;
    let m = cx.t("transform_matrix")?;
    ensure!(x.rank() == 4, "`affine`: x {x} must be rank 4");
    ensure!(
        m.rank() == 2 && m.shape[1] == Dim::Fixed(6),
        "`affine`: transform_matrix {m} must be [B or 1, 6]"
    );
    if let (Dim::Fixed(d), Dim::Fixed(b)) = (&m.shape[0], &x.shape[0]) {
        ensure!(
            *d == 1 || d == b,
            "`affine`: transform_matrix has {d} rows for a batch of {b}"
        );
    }
    let (sm, pm, cm) = (
        cx.opt_str("sampling_mode")?.unwrap_or(""),
        cx.opt_str("padding_mode")?.unwrap_or(""),
        cx.opt_str("coordinates_mode")?.unwrap_or(""),
    );
    if sm.to_lowercase() != "bilinear"
        || pm.to_lowercase() != "constant"
        || cm.to_lowercase() != "normalized_minus_one_to_one"
        || cx.opt_bool("align_corners")? != Some(true)
    {
        bail!(
            "`affine` supports bilinear sampling, constant padding, normalized_minus_one_to_one \
             coordinates and align_corners true only (coremltools 9), got {sm}, {pm}, {cm}"
        );
    }
    let (h, w) = (cx.int("output_height")?, cx.int("output_width")?);
    ensure!(h > 0 && w > 0, "`affine`: output size {h} x {w}");
    Ok(vec![tensor(
        x.dtype,
        vec![
            x.shape[0].clone(),
            x.shape[1].clone(),
            Dim::Fixed(h as usize),
            Dim::Fixed(w as usize),
        ],
    )])
}

fn eval_affine(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let sm = Sampler {
        coords: "normalized_minus_one_to_one",
        align: true,
        nearest: false,
        padding: "constant",
        pad_value: cx.opt_f64("padding_value")?.unwrap_or(0.0),
    };
    let xd = x.dims().to_vec();
    let (b, ch, h, w) = (xd[0], xd[1], xd[2], xd[3]);
    let (oh, ow) = (
        cx.int("output_height")? as usize,
        cx.int("output_width")? as usize,
    );
    let m = kernels::to_vec::<f64>(cx.t("transform_matrix")?)?;
    let xv = kernels::to_vec::<f64>(x)?;
    let norm = |i: usize, n: usize| {
        if n > 1 {
            -1.0 + 2.0 * i as f64 / (n - 1) as f64
        } else {
            0.0
        }
    };
    let mut y = Vec::with_capacity(b * ch * oh * ow);
    for bi in 0..b {
        let t = &m[if m.len() == 6 { 0 } else { bi * 6 }..][..6];
        for ci in 0..ch {
            let img = &xv[(bi * ch + ci) * h * w..][..h * w];
            for i in 0..oh {
                for j in 0..ow {
                    let (xn, yn) = (norm(j, ow), norm(i, oh));
                    let (px, py) = (t[0] * xn + t[1] * yn + t[2], t[3] * xn + t[4] * yn + t[5]);
                    y.push(sm.sample(img, h, w, px, py));
                }
            }
        }
    }
    one(kernels::data::from_f64(y, &[b, ch, oh, ow], x.dtype())?)
}

use Opset::{Ios15 as I15, Ios16 as I16, Ios17 as I17};

const RESAMPLE: &[InputSpec] = &[
    req("x"),
    req("coordinates"),
    req_c("sampling_mode"),
    req_c("padding_mode"),
    req_c("padding_value"),
    req_c("coordinates_mode"),
    req_c("align_corners"),
];
const AFFINE: &[InputSpec] = &[
    req("x"),
    req("transform_matrix"),
    req_c("output_height"),
    req_c("output_width"),
    req_c("sampling_mode"),
    req_c("padding_mode"),
    req_c("padding_value"),
    req_c("coordinates_mode"),
    req_c("align_corners"),
];

pub static DEFS: &[OpDef] = &[
    v(
        "resample",
        I15,
        Some(I16),
        RESAMPLE,
        infer_resample,
        eval_resample,
    ),
    v(
        "resample",
        I16,
        Some(I17),
        RESAMPLE,
        infer_resample,
        eval_resample,
    ),
    v(
        "resample",
        I17,
        None,
        RESAMPLE,
        infer_resample,
        eval_resample,
    ),
    v("affine", I15, None, AFFINE, infer_affine, eval_affine),
];
