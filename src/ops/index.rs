//! Indexing ops: `slice_by_index`, `slice_by_size`, `gather`, `gather_along_axis`, `pad`,
//! `band_part` — type inference and evaluation (index copies via `kernels::index`).

use super::def;
use super::eval::{one, EvalCx, RValue};
use super::infer::{axis, tensor, InferCx};
use super::placement::Flops;
use super::DefaultValue;
use super::{opt, opt_c, req, req_c, OpDef};
use crate::ir::{Dim, ValueType};
use crate::kernels::{self, PadMode, Span};
use anyhow::{bail, ensure, Result};

fn mask(cx: &InferCx, name: &str, rank: usize) -> Result<Vec<bool>> {
    Ok(cx
        .opt_ints(name)?
        .map(|v| v.into_iter().map(|b| b != 0).collect())
        .unwrap_or(vec![false; rank]))
}

fn infer_slice_by_index(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    let r = x.rank();
    let (Some(begin), Some(end)) = (cx.opt_ints("begin")?, cx.opt_ints("end")?) else {
        let sq = mask(cx, "squeeze_mask", r)?;
        let s = (0..r).filter(|&i| !sq[i]).map(|_| Dim::Unknown).collect();
        return Ok(vec![tensor(x.dtype, s)]);
    };
    let stride = cx.ints_or_default("stride", r)?;
    let (bm, em, sq) = (
        mask(cx, "begin_mask", r)?,
        mask(cx, "end_mask", r)?,
        mask(cx, "squeeze_mask", r)?,
    );
    ensure!(
        begin.len() == r && end.len() == r && stride.len() == r,
        "slice_by_index of {x}: begin/end/stride need {r} values"
    );
    let mut s = Vec::new();
    for i in 0..r {
        let Dim::Fixed(n) = x.shape[i] else {
            if !sq[i] {
                s.push(Dim::Unknown);
            }
            continue;
        };
        let n = n as i64;
        if sq[i] {
            // A squeezed axis reads the element at `begin` (0 with begin_mask); its end and
            // stride are not read (coremltools writes end = begin for a causal mask's row of
            // a variable-length sequence).
            let b = if bm[i] { 0 } else { begin[i] };
            let b = if b < 0 { b + n } else { b };
            ensure!(
                (0..n).contains(&b),
                "squeezed slice index {} out of range for an axis of {n}",
                begin[i]
            );
            continue;
        }
        let st = stride[i];
        ensure!(st != 0, "slice stride 0");
        let clampi = |v: i64, lo: i64, hi: i64| v.max(lo).min(hi);
        let norm = |v: i64| if v < 0 { v + n } else { v };
        let len = if st > 0 {
            let b = if bm[i] {
                0
            } else {
                clampi(norm(begin[i]), 0, n)
            };
            let e = if em[i] { n } else { clampi(norm(end[i]), 0, n) };
            if e > b {
                (e - b + st - 1) / st
            } else {
                0
            }
        } else {
            let b = if bm[i] {
                n - 1
            } else {
                clampi(norm(begin[i]), -1, n - 1)
            };
            let e = if em[i] {
                -1
            } else {
                clampi(norm(end[i]), -1, n - 1)
            };
            if b > e {
                (b - e - st - 1) / (-st)
            } else {
                0
            }
        };
        s.push(Dim::Fixed(len as usize));
    }
    Ok(vec![tensor(x.dtype, s)])
}

fn infer_slice_by_size(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    let size = cx.ints("size")?;
    ensure!(
        size.len() == x.rank(),
        "slice_by_size of {x} needs {} sizes",
        x.rank()
    );
    let begin = cx.opt_ints("begin")?;
    let s = size
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            if n >= 0 {
                Dim::Fixed(n as usize)
            } else {
                match (&x.shape[i], &begin) {
                    (Dim::Fixed(d), Some(b)) => Dim::Fixed((*d as i64 - b[i]).max(0) as usize),
                    _ => Dim::Unknown,
                }
            }
        })
        .collect();
    Ok(vec![tensor(x.dtype, s)])
}

fn infer_gather(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    let idx = cx.t("indices")?;
    ensure!(
        idx.dtype.is_int(),
        "gather indices must be integers, are {}",
        idx.dtype
    );
    let a = axis(cx.int_or_default("axis")?, x.rank())?;
    let bd = cx.int_or_default("batch_dims")? as usize;
    let mut s: Vec<Dim> = x.shape[..a].to_vec();
    s.extend(idx.shape[bd.min(idx.rank())..].iter().cloned());
    s.extend(x.shape[a + 1..].iter().cloned());
    Ok(vec![tensor(x.dtype, s)])
}

fn infer_gather_along_axis(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    let idx = cx.t("indices")?;
    ensure!(
        idx.rank() == x.rank(),
        "gather_along_axis indices {idx} and input {x} differ in rank"
    );
    Ok(vec![tensor(x.dtype, idx.shape.clone())])
}

fn infer_pad(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    let pad = cx.ints("pad")?;
    ensure!(
        pad.len() % 2 == 0 && pad.len() / 2 <= x.rank(),
        "pad {pad:?} for {x}"
    );
    let mode = cx.str_or_default("mode")?;
    ensure!(
        matches!(mode, "constant" | "reflect" | "replicate"),
        "unknown pad mode `{mode}`"
    );
    let k = pad.len() / 2;
    let off = x.rank() - k;
    let mut s = x.shape.clone();
    for i in 0..k {
        if let Dim::Fixed(n) = s[off + i] {
            s[off + i] = Dim::Fixed(n + pad[2 * i] as usize + pad[2 * i + 1] as usize);
        }
    }
    Ok(vec![tensor(x.dtype, s)])
}

fn infer_band_part(cx: &InferCx) -> Result<Vec<ValueType>> {
    Ok(vec![ValueType::Tensor(cx.t("x")?.clone())])
}

/// Per-axis spans of a `slice_by_index` / `slice_update` (MIL begin/end/stride/masks), plus
/// the squeezed axes.
pub(super) fn index_spans(cx: &EvalCx, dims: &[usize]) -> Result<(Vec<Span>, Vec<bool>)> {
    let r = dims.len();
    let begin = cx.ints("begin")?;
    let end = cx.ints("end")?;
    let stride = cx.opt_ints("stride")?.unwrap_or(vec![1; r]);
    let m = |n: &str| -> Result<Vec<bool>> {
        Ok(cx
            .opt_ints(n)?
            .map(|v| v.into_iter().map(|b| b != 0).collect())
            .unwrap_or(vec![false; r]))
    };
    let (bm, em, sq) = (m("begin_mask")?, m("end_mask")?, m("squeeze_mask")?);
    ensure!(
        [
            begin.len(),
            end.len(),
            stride.len(),
            bm.len(),
            em.len(),
            sq.len()
        ]
        .iter()
        .all(|&l| l == r),
        "slice of a rank-{r} tensor needs {r} begin/end/stride/mask values"
    );
    let mut spans = Vec::with_capacity(r);
    for i in 0..r {
        let n = dims[i] as i64;
        let st = stride[i];
        ensure!(st != 0, "slice stride 0 on axis {i}");
        let norm = |v: i64| if v < 0 { v + n } else { v };
        if sq[i] {
            let b = if bm[i] { 0 } else { norm(begin[i]) };
            ensure!(
                b >= 0 && b < n,
                "squeezed slice index {} out of range for an axis of {n}",
                begin[i]
            );
            spans.push(Span {
                start: b as usize,
                step: 1,
                len: 1,
            });
            continue;
        }
        let (b, len) = if st > 0 {
            let b = if bm[i] { 0 } else { norm(begin[i]).clamp(0, n) };
            let e = if em[i] { n } else { norm(end[i]).clamp(0, n) };
            (b, if e > b { (e - b + st - 1) / st } else { 0 })
        } else {
            let b = if bm[i] {
                n - 1
            } else {
                norm(begin[i]).clamp(-1, n - 1)
            };
            let e = if em[i] {
                -1
            } else {
                norm(end[i]).clamp(-1, n - 1)
            };
            (b, if b > e { (b - e - st - 1) / (-st) } else { 0 })
        };
        spans.push(Span {
            start: if len == 0 { 0 } else { b as usize },
            step: st as isize,
            len: len as usize,
        });
    }
    Ok((spans, sq))
}

fn eval_slice_by_index(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let (spans, sq) = index_spans(cx, x.dims())?;
    let y = kernels::strided_slice(x, &spans)?;
    let s: Vec<usize> = spans
        .iter()
        .zip(&sq)
        .filter(|(_, q)| !**q)
        .map(|(s, _)| s.len)
        .collect();
    one(y.reshape(s)?)
}

fn eval_slice_by_size(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let (begin, size) = (cx.ints("begin")?, cx.ints("size")?);
    ensure!(
        begin.len() == x.rank() && size.len() == x.rank(),
        "slice_by_size of rank {} needs {0} begins and sizes",
        x.rank()
    );
    let spans = (0..x.rank())
        .map(|i| {
            let n = x.dims()[i] as i64;
            let b = if begin[i] < 0 { begin[i] + n } else { begin[i] };
            let len = if size[i] < 0 { n - b } else { size[i] };
            ensure!(
                b >= 0 && len >= 0 && b + len <= n,
                "slice_by_size begin {} size {} on an axis of {n}",
                begin[i],
                size[i]
            );
            Ok(Span {
                start: b as usize,
                step: 1,
                len: len as usize,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    one(kernels::strided_slice(x, &spans)?)
}

fn eval_gather(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let idx_t = cx.t("indices")?;
    let idx = kernels::to_vec::<i64>(idx_t)?;
    let a = axis(cx.int_or_default("axis")?, x.rank())?;
    let bd = cx.int_or_default("batch_dims")? as usize;
    if bd == 0 {
        return one(kernels::take(x, &idx, idx_t.dims(), a)?);
    }
    ensure!(
        bd <= a && bd <= idx_t.rank() && x.dims()[..bd] == idx_t.dims()[..bd],
        "gather batch_dims {bd} for {:?} and indices {:?}",
        x.dims(),
        idx_t.dims()
    );
    let nb: usize = x.dims()[..bd].iter().product();
    let xr = x.reshape([vec![nb], x.dims()[bd..].to_vec()].concat())?;
    let per = idx.len() / nb.max(1);
    let parts = (0..nb)
        .map(|b| {
            kernels::take(
                &xr.get(b)?,
                &idx[b * per..(b + 1) * per],
                &idx_t.dims()[bd..],
                a - bd,
            )
        })
        .collect::<Result<Vec<_>>>()?;
    let y = candle_core::Tensor::stack(&parts, 0)?;
    let mut s = x.dims()[..bd].to_vec();
    s.extend_from_slice(&y.dims()[1..]);
    one(y.reshape(s)?)
}

fn eval_gather_along_axis(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let idx_t = cx.t("indices")?;
    let a = axis(cx.int_or_default("axis")?, x.rank())?;
    one(kernels::take_along(
        x,
        &kernels::to_vec::<i64>(idx_t)?,
        idx_t.dims(),
        a,
    )?)
}

fn eval_pad(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let p = cx.ints("pad")?;
    ensure!(
        p.len() % 2 == 0 && p.len() / 2 <= x.rank() && p.iter().all(|&v| v >= 0),
        "pad {p:?} for rank {}",
        x.rank()
    );
    let mut pairs = vec![(0usize, 0usize); x.rank() - p.len() / 2];
    pairs.extend(p.chunks(2).map(|c| (c[0] as usize, c[1] as usize)));
    let mode = match cx.str_or_default("mode")? {
        "constant" => PadMode::Constant(cx.f64_or_default("constant_val")?),
        "reflect" => PadMode::Reflect,
        "replicate" => PadMode::Replicate,
        m => bail!("unknown pad mode `{m}`"),
    };
    one(kernels::pad(x, &pairs, mode)?)
}

fn eval_band_part(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    ensure!(x.rank() >= 2, "band_part needs rank ≥ 2");
    let (lo, up) = (cx.int_or_default("lower")?, cx.int_or_default("upper")?);
    let (m, n) = (x.dims()[x.rank() - 2], x.dims()[x.rank() - 1]);
    let mask: Vec<u8> = (0..m * n)
        .map(|k| {
            let (i, j) = ((k / n) as i64, (k % n) as i64);
            ((lo < 0 || i - j <= lo) && (up < 0 || j - i <= up)) as u8
        })
        .collect();
    let zero = kernels::index::full(&[], 0.0, x.dtype())?;
    one(kernels::select(
        &kernels::from_vec(mask, &[m, n])?,
        x,
        &zero,
    )?)
}

pub static DEFS: &[OpDef] = &[
    def(
        "slice_by_index",
        &[
            req("x"),
            req("begin"),
            req("end"),
            opt("stride").or(DefaultValue::Ints(1)),
            opt_c("begin_mask"),
            opt_c("end_mask"),
            opt_c("squeeze_mask"),
        ],
        infer_slice_by_index,
        eval_slice_by_index,
    )
    .with_flops(Flops::None),
    def(
        "slice_by_size",
        &[req("x"), req("begin"), req_c("size")],
        infer_slice_by_size,
        eval_slice_by_size,
    )
    .with_flops(Flops::None),
    def(
        "gather",
        &[
            req("x"),
            req("indices"),
            opt_c("axis").or(DefaultValue::Int(0)),
            opt_c("batch_dims").or(DefaultValue::Int(0)),
            opt_c("validate_indices"),
        ],
        infer_gather,
        eval_gather,
    )
    .with_flops(Flops::None),
    def(
        "gather_along_axis",
        &[
            req("x"),
            req("indices"),
            opt_c("axis").or(DefaultValue::Int(0)),
            opt_c("validate_indices"),
        ],
        infer_gather_along_axis,
        eval_gather_along_axis,
    )
    .with_flops(Flops::None),
    def(
        "pad",
        &[
            req("x"),
            req("pad"),
            opt_c("mode").or(DefaultValue::Str("constant")),
            opt_c("constant_val").or(DefaultValue::Float(0.0)),
        ],
        infer_pad,
        eval_pad,
    )
    .with_flops(Flops::None),
    def(
        "band_part",
        &[
            req("x"),
            opt_c("lower").or(DefaultValue::Int(-1)),
            opt_c("upper").or(DefaultValue::Int(-1)),
        ],
        infer_band_part,
        eval_band_part,
    ),
];
