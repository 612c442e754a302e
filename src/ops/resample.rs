//! `resample` (iOS15; iOS16 and iOS17 widen the coordinates' dtypes), `affine` (iOS15) and
//! `crop_resize`:
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
//! modes coremltools allows). `crop_resize` (iOS15 `roi [N, 1, 4|5, 1, 1]`, iOS16 adds
//! `pad_value`, iOS17 `boxes [N, 4]` + `box_indices`) resizes each box bilinearly as TF's
//! `crop_and_resize` (which coremltools' TF frontend maps to ALIGN_CORNERS): sample `i` of
//! `T` at `start + i·(end − start)/(T − 1)` (one sample: the centre with ALIGN_CORNERS, the
//! start with STRICT_ALIGN_CORNERS), points outside `[0, n − 1]` read `pad_value`; the
//! other sampling modes are refused by name, coremltools not stating their in-box grid.
//! One pass over the output, in f64, rounded once to x's dtype.

use super::eval::{one, EvalCx, RValue};
use super::infer::{float_only, tensor, InferCx};
use super::DefaultValue;
use super::{opt_c, req, req_c, ver as v, InputSpec, OpDef};
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

/// `crop_resize`'s boxes: for iOS15/16 the roi rows (`[N, 1, 4|5, 1, 1]`), for iOS17 `boxes`.
fn crop_boxes_shape(cx: &InferCx) -> Result<(Dim, usize)> {
    if cx.opset >= Opset::Ios17 {
        let b = cx.t("boxes")?;
        ensure!(
            b.rank() == 2 && b.shape[1] == Dim::Fixed(4),
            "`crop_resize`: boxes {b} must be [N, 4]"
        );
        Ok((b.shape[0].clone(), 4))
    } else {
        let r = cx.t("roi")?;
        let k = match (r.rank(), &r.shape.get(2)) {
            (5, Some(Dim::Fixed(k))) if *k == 4 || *k == 5 => *k,
            _ => bail!("`crop_resize`: roi {r} must be [N, 1, 4 or 5, 1, 1]"),
        };
        Ok((r.shape[0].clone(), k))
    }
}

const BOX_MODES: &[&str] = &[
    "CORNERS_HEIGHT_FIRST",
    "CORNERS_WIDTH_FIRST",
    "CENTER_SIZE_HEIGHT_FIRST",
    "CENTER_SIZE_WIDTH_FIRST",
];

fn crop_modes(bm: &str, sm: &str) -> Result<()> {
    ensure!(
        BOX_MODES.contains(&bm),
        "`crop_resize`: unknown box_coordinate_mode `{bm}`"
    );
    ensure!(
        matches!(sm, "ALIGN_CORNERS" | "STRICT_ALIGN_CORNERS"),
        "`crop_resize`: sampling_mode `{sm}` is not supported (ALIGN_CORNERS, as TF's \
         crop_and_resize, or STRICT_ALIGN_CORNERS; coremltools 9 does not define the in-box \
         grid of the others)"
    );
    Ok(())
}

fn infer_crop_resize(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    float_only(x, "x")?;
    ensure!(x.rank() == 4, "`crop_resize`: x {x} must be rank 4");
    let (n, k) = crop_boxes_shape(cx)?;
    crop_modes(
        cx.str_or_default("box_coordinate_mode")?,
        cx.str_or_default("sampling_mode")?,
    )?;
    let th = cx.int_or_default("target_height")?;
    let tw = cx.int_or_default("target_width")?;
    ensure!(th > 0 && tw > 0, "`crop_resize`: target size {th} x {tw}");
    let (th, tw) = (Dim::Fixed(th as usize), Dim::Fixed(tw as usize));
    let c = x.shape[1].clone();
    Ok(vec![if cx.opset >= Opset::Ios17 {
        tensor(x.dtype, vec![n, c, th, tw])
    } else {
        // coremltools 9 types the output [N, B, C, h, w], B = x's batch, for either roi
        // width; with a batch index (5 wide) it does not say what fills B > 1 rows.
        ensure!(
            k == 4 || x.shape[0] == Dim::Fixed(1),
            "`crop_resize`: a roi of 5 (with a batch index) on x {x} of batch > 1: coremltools \
             9 types the output [N, B, C, h, w] but does not define its B rows; use iOS17's \
             `box_indices`"
        );
        tensor(x.dtype, vec![n, x.shape[0].clone(), c, th, tw])
    }])
}

fn eval_crop_resize(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let xd = x.dims().to_vec();
    let (bsz, ch, h, w) = (xd[0], xd[1], xd[2], xd[3]);
    let bm = cx.str_or_default("box_coordinate_mode")?;
    let sm = cx.str_or_default("sampling_mode")?;
    crop_modes(bm, sm)?;
    let th = cx.int_or_default("target_height")? as usize;
    let tw = cx.int_or_default("target_width")? as usize;
    let norm = cx.bool_or_default("normalized_coordinates")?;
    let scale = cx.f64_or_default("spatial_scale")?;
    let pad = cx.opt_f64("pad_value")?.unwrap_or(0.0);
    let ios17 = cx.opset >= Opset::Ios17;
    // (image indices, [h0, w0, h1, w1]) per box.
    let (raw, k) = if ios17 {
        (kernels::to_vec::<f64>(cx.t("boxes")?)?, 4)
    } else {
        let r = cx.t("roi")?;
        (kernels::to_vec::<f64>(r)?, r.dims()[2])
    };
    let nbox = raw.len() / k;
    let indices: Option<Vec<i64>> = if ios17 {
        cx.opt_ints("box_indices")?
    } else {
        None
    };
    let mut boxes = vec![];
    for bi in 0..nbox {
        let row = &raw[bi * k..(bi + 1) * k];
        let (imgs, c): (Vec<usize>, &[f64]) = if k == 5 {
            (vec![row[0] as usize], &row[1..])
        } else if ios17 {
            let j = indices.as_ref().map_or(bi as i64, |v| v[bi]);
            (vec![j as usize], row)
        } else {
            ((0..bsz).collect(), row)
        };
        for &j in &imgs {
            ensure!(j < bsz, "`crop_resize`: box {bi} reads image {j} of {bsz}");
        }
        let [h0, w0, h1, w1] = match bm {
            "CORNERS_HEIGHT_FIRST" => [c[0], c[1], c[2], c[3]],
            "CORNERS_WIDTH_FIRST" => [c[1], c[0], c[3], c[2]],
            "CENTER_SIZE_HEIGHT_FIRST" => [
                c[0] - c[2] / 2.0,
                c[1] - c[3] / 2.0,
                c[0] + c[2] / 2.0,
                c[1] + c[3] / 2.0,
            ],
            _ => [
                c[1] - c[3] / 2.0,
                c[0] - c[2] / 2.0,
                c[1] + c[3] / 2.0,
                c[0] + c[2] / 2.0,
            ],
        };
        let (sh, sw) = if norm {
            ((h - 1) as f64, (w - 1) as f64)
        } else {
            (1.0, 1.0)
        };
        let bx = [
            h0 * sh * scale,
            w0 * sw * scale,
            h1 * sh * scale,
            w1 * sw * scale,
        ];
        boxes.push((imgs, bx));
    }
    let pos = |start: f64, end: f64, i: usize, t: usize| {
        if t == 1 {
            if sm == "ALIGN_CORNERS" {
                (start + end) / 2.0
            } else {
                start
            }
        } else {
            start + i as f64 * (end - start) / (t - 1) as f64
        }
    };
    let xv = kernels::to_vec::<f64>(x)?;
    let mut y = vec![];
    for (imgs, b) in &boxes {
        for &j in imgs {
            for ci in 0..ch {
                let img = &xv[(j * ch + ci) * h * w..][..h * w];
                for i in 0..th {
                    let py = pos(b[0], b[2], i, th);
                    for q in 0..tw {
                        let px = pos(b[1], b[3], q, tw);
                        if py < 0.0 || py > (h - 1) as f64 || px < 0.0 || px > (w - 1) as f64 {
                            y.push(pad);
                            continue;
                        }
                        let (y0, x0) = (py.floor() as usize, px.floor() as usize);
                        let (y1, x1) = ((y0 + 1).min(h - 1), (x0 + 1).min(w - 1));
                        let (fy, fx) = (py - y0 as f64, px - x0 as f64);
                        let top = img[y0 * w + x0] * (1.0 - fx) + img[y0 * w + x1] * fx;
                        let bot = img[y1 * w + x0] * (1.0 - fx) + img[y1 * w + x1] * fx;
                        y.push(top * (1.0 - fy) + bot * fy);
                    }
                }
            }
        }
    }
    let shape: Vec<usize> = if ios17 {
        vec![nbox, ch, th, tw]
    } else {
        vec![nbox, if k == 5 { 1 } else { bsz }, ch, th, tw]
    };
    one(kernels::data::from_f64(y, &shape, x.dtype())?)
}

const CROP15: &[InputSpec] = &[
    req("x"),
    req("roi"),
    opt_c("target_height").or(DefaultValue::Int(1)),
    opt_c("target_width").or(DefaultValue::Int(1)),
    opt_c("normalized_coordinates").or(DefaultValue::Bool(false)),
    opt_c("spatial_scale").or(DefaultValue::Float(1.0)),
    opt_c("box_coordinate_mode").or(DefaultValue::Str("CORNERS_HEIGHT_FIRST")),
    opt_c("sampling_mode").or(DefaultValue::Str("DEFAULT")),
];
const CROP16: &[InputSpec] = &[
    req("x"),
    req("roi"),
    opt_c("target_height").or(DefaultValue::Int(1)),
    opt_c("target_width").or(DefaultValue::Int(1)),
    opt_c("normalized_coordinates").or(DefaultValue::Bool(false)),
    opt_c("spatial_scale").or(DefaultValue::Float(1.0)),
    opt_c("box_coordinate_mode").or(DefaultValue::Str("CORNERS_HEIGHT_FIRST")),
    opt_c("sampling_mode").or(DefaultValue::Str("DEFAULT")),
    opt_c("pad_value"),
];
const CROP17: &[InputSpec] = &[
    req("x"),
    req("boxes"),
    super::opt("box_indices"),
    opt_c("target_height").or(DefaultValue::Int(1)),
    opt_c("target_width").or(DefaultValue::Int(1)),
    opt_c("normalized_coordinates").or(DefaultValue::Bool(false)),
    opt_c("spatial_scale").or(DefaultValue::Float(1.0)),
    opt_c("box_coordinate_mode").or(DefaultValue::Str("CORNERS_HEIGHT_FIRST")),
    opt_c("sampling_mode").or(DefaultValue::Str("DEFAULT")),
    opt_c("pad_value"),
];

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
    v(
        "crop_resize",
        I15,
        Some(I16),
        CROP15,
        infer_crop_resize,
        eval_crop_resize,
    ),
    v(
        "crop_resize",
        I16,
        Some(I17),
        CROP16,
        infer_crop_resize,
        eval_crop_resize,
    ),
    v(
        "crop_resize",
        I17,
        None,
        CROP17,
        infer_crop_resize,
        eval_crop_resize,
    ),
];
