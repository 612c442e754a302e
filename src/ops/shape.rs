//! Shape and data-movement ops: reshape, transpose, expand/squeeze, concat/split/stack,
//! slicing, gather, pad, fill, tile, range.

use super::eval::{one, EvalCx, EvalFn, RValue};
use super::infer::{axis, tensor, InferCx};
use super::{opt, opt_c, req, req_c, var, InputSpec, OpDef};
use crate::ir::{DType, Dim, Opset, ValueType};
use crate::kernels::{self, PadMode, Span};
use anyhow::{anyhow, bail, ensure, Result};

const fn def(
    name: &'static str,
    inputs: &'static [InputSpec],
    infer: fn(&InferCx) -> Result<Vec<ValueType>>,
    eval: EvalFn,
) -> OpDef {
    OpDef {
        name,
        since: Opset::Ios15,
        until: None,
        inputs,
        infer,
        eval: Some(eval),
    }
}

fn infer_reshape(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    let Some(target) = cx.opt_ints("shape")? else {
        let s = cx.t("shape")?;
        let n = match s.shape.first() {
            Some(Dim::Fixed(n)) => *n,
            _ => bail!("reshape with a dynamic shape of unknown rank"),
        };
        return Ok(vec![tensor(x.dtype, vec![Dim::Unknown; n])]);
    };
    let total = x.num_elements();
    let mut out: Vec<Option<usize>> = Vec::new();
    for (i, &d) in target.iter().enumerate() {
        out.push(match d {
            -1 => None,
            0 => match x.shape.get(i) {
                Some(Dim::Fixed(n)) => Some(*n),
                _ => None,
            },
            d if d > 0 => Some(d as usize),
            d => bail!("reshape to a negative dimension {d}"),
        });
    }
    ensure!(
        out.iter().filter(|d| d.is_none()).count() <= 1,
        "reshape with more than one -1"
    );
    let known: usize = out.iter().flatten().product();
    let dims = match total {
        Some(t) => {
            if out.iter().any(|d| d.is_none()) {
                ensure!(
                    known > 0 && t % known == 0,
                    "cannot reshape {x} to {target:?}"
                );
            } else {
                ensure!(
                    t == known,
                    "cannot reshape {x} ({t} elements) to {target:?}"
                );
            }
            out.iter()
                .map(|d| Dim::Fixed(d.unwrap_or(t.checked_div(known).unwrap_or(0))))
                .collect()
        }
        None => out
            .iter()
            .map(|d| d.map(Dim::Fixed).unwrap_or(Dim::Unknown))
            .collect(),
    };
    Ok(vec![tensor(x.dtype, dims)])
}

fn infer_transpose(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    let perm = cx.ints("perm")?;
    ensure!(perm.len() == x.rank(), "transpose perm {perm:?} for {x}");
    let mut seen = vec![false; x.rank()];
    let mut s = Vec::new();
    for p in perm {
        let a = axis(p, x.rank())?;
        ensure!(!seen[a], "transpose perm repeats axis {a}");
        seen[a] = true;
        s.push(x.shape[a].clone());
    }
    Ok(vec![tensor(x.dtype, s)])
}

fn infer_expand_dims(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    let axes = cx.ints("axes")?;
    let out_rank = x.rank() + axes.len();
    let mut norm: Vec<usize> = axes
        .iter()
        .map(|&a| axis(a, out_rank))
        .collect::<Result<_>>()?;
    norm.sort();
    let mut s = x.shape.clone();
    for a in norm {
        s.insert(a, Dim::Fixed(1));
    }
    Ok(vec![tensor(x.dtype, s)])
}

fn infer_squeeze(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    let s = match cx.opt_ints("axes")? {
        Some(axes) => {
            let norm: Vec<usize> = axes
                .iter()
                .map(|&a| axis(a, x.rank()))
                .collect::<Result<_>>()?;
            for &a in &norm {
                ensure!(
                    x.shape[a] == Dim::Fixed(1),
                    "squeeze of axis {a} of {x}, which is not 1"
                );
            }
            x.shape
                .iter()
                .enumerate()
                .filter(|(i, _)| !norm.contains(i))
                .map(|(_, d)| d.clone())
                .collect()
        }
        None => x
            .shape
            .iter()
            .filter(|d| **d != Dim::Fixed(1))
            .cloned()
            .collect(),
    };
    Ok(vec![tensor(x.dtype, s)])
}

fn infer_concat(cx: &InferCx) -> Result<Vec<ValueType>> {
    let vals = cx.all("values");
    ensure!(!vals.is_empty(), "concat of nothing");
    let first = vals[0]
        .ty
        .as_tensor()
        .ok_or_else(|| anyhow!("concat of a non-tensor"))?;
    let a = axis(cx.int("axis")?, first.rank())?;
    let mut s = first.shape.clone();
    let mut total = Some(0usize);
    for v in vals {
        let t =
            v.ty.as_tensor()
                .ok_or_else(|| anyhow!("concat of a non-tensor"))?;
        ensure!(
            t.dtype == first.dtype && t.rank() == first.rank(),
            "concat of {first} and {t}"
        );
        for (i, (d, e)) in t.shape.iter().zip(&first.shape).enumerate() {
            ensure!(
                i == a || d == e || *d == Dim::Unknown || *e == Dim::Unknown,
                "concat of {first} and {t} on axis {a}"
            );
        }
        total = match (total, &t.shape[a]) {
            (Some(n), Dim::Fixed(m)) => Some(n + m),
            _ => None,
        };
    }
    s[a] = total.map(Dim::Fixed).unwrap_or(Dim::Unknown);
    Ok(vec![tensor(first.dtype, s)])
}

fn infer_stack(cx: &InferCx) -> Result<Vec<ValueType>> {
    let vals = cx.all("values");
    ensure!(!vals.is_empty(), "stack of nothing");
    let first = vals[0]
        .ty
        .as_tensor()
        .ok_or_else(|| anyhow!("stack of a non-tensor"))?;
    for v in vals {
        ensure!(v.ty.as_tensor() == Some(first), "stack of differing types");
    }
    let a = axis(cx.int("axis")?, first.rank() + 1)?;
    let mut s = first.shape.clone();
    s.insert(a, Dim::Fixed(vals.len()));
    Ok(vec![tensor(first.dtype, s)])
}

fn infer_split(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    let a = axis(cx.int("axis")?, x.rank())?;
    let n = match x.shape[a] {
        Dim::Fixed(n) => n,
        Dim::Unknown => bail!("split along an axis of unknown size"),
    };
    let sizes: Vec<usize> = match (cx.opt_ints("split_sizes")?, cx.opt_int("num_splits")?) {
        (Some(s), _) => s.into_iter().map(|v| v as usize).collect(),
        (None, Some(k)) => {
            ensure!(
                k > 0 && n % k as usize == 0,
                "split of {n} into {k} equal parts"
            );
            vec![n / k as usize; k as usize]
        }
        _ => bail!("split needs split_sizes or num_splits"),
    };
    ensure!(
        sizes.iter().sum::<usize>() == n,
        "split sizes {sizes:?} do not add up to {n}"
    );
    Ok(sizes
        .into_iter()
        .map(|k| {
            let mut s = x.shape.clone();
            s[a] = Dim::Fixed(k);
            tensor(x.dtype, s)
        })
        .collect())
}

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
    let stride = cx.opt_ints("stride")?.unwrap_or(vec![1; r]);
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
        if sq[i] {
            ensure!(len == 1, "squeeze_mask on a slice of length {len}");
        } else {
            s.push(Dim::Fixed(len as usize));
        }
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
    let a = axis(cx.opt_int("axis")?.unwrap_or(0), x.rank())?;
    let bd = cx.opt_int("batch_dims")?.unwrap_or(0) as usize;
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
    let mode = cx.opt_str("mode")?.unwrap_or("constant");
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

fn infer_fill(cx: &InferCx) -> Result<Vec<ValueType>> {
    let dt = cx.opt_t("value")?.map(|t| t.dtype).unwrap_or(DType::F32);
    let s = match cx.opt_ints("shape")? {
        Some(v) => v.into_iter().map(|d| Dim::Fixed(d as usize)).collect(),
        None => match cx.t("shape")?.shape.first() {
            Some(Dim::Fixed(n)) => vec![Dim::Unknown; *n],
            _ => bail!("fill with a shape of unknown rank"),
        },
    };
    Ok(vec![tensor(dt, s)])
}

fn infer_range(cx: &InferCx) -> Result<Vec<ValueType>> {
    let d = cx.same_dtype(&["end", "start", "step"])?;
    let get = |n: &str| -> Result<Option<f64>> {
        Ok(match cx.opt_tensor_val(n)? {
            Some(t) => t.to_f64_vec()?.first().copied(),
            None => None,
        })
    };
    let len = match (get("start")?, get("end")?, get("step")?) {
        (Some(a), Some(b), Some(s)) if s != 0.0 => {
            Dim::Fixed(((b - a) / s).ceil().max(0.0) as usize)
        }
        _ => Dim::Unknown,
    };
    Ok(vec![tensor(d, vec![len])])
}

fn infer_tile(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    let reps = cx.ints("reps")?;
    ensure!(reps.len() == x.rank(), "tile reps {reps:?} for {x}");
    let s = x
        .shape
        .iter()
        .zip(&reps)
        .map(|(d, &r)| match d {
            Dim::Fixed(n) => Dim::Fixed(n * r as usize),
            Dim::Unknown => Dim::Unknown,
        })
        .collect();
    Ok(vec![tensor(x.dtype, s)])
}

fn infer_shape(cx: &InferCx) -> Result<Vec<ValueType>> {
    Ok(vec![tensor(
        DType::I32,
        vec![Dim::Fixed(cx.t("x")?.rank())],
    )])
}

fn infer_band_part(cx: &InferCx) -> Result<Vec<ValueType>> {
    Ok(vec![ValueType::Tensor(cx.t("x")?.clone())])
}

// ---- evaluation: views where candle has them (reshape, permute, narrow), index copies
// otherwise ----

/// Resolves a MIL reshape target (`0` copies the input dim, one `-1` is inferred).
fn resolve_reshape(dims: &[usize], target: &[i64]) -> Result<Vec<usize>> {
    let total: usize = dims.iter().product();
    let mut out: Vec<Option<usize>> = Vec::new();
    for (i, &d) in target.iter().enumerate() {
        out.push(match d {
            -1 => None,
            0 => {
                Some(*dims.get(i).ok_or_else(|| {
                    anyhow!("reshape: 0 at axis {i} of a rank-{} input", dims.len())
                })?)
            }
            d if d > 0 => Some(d as usize),
            d => bail!("reshape to a negative dimension {d}"),
        });
    }
    ensure!(
        out.iter().filter(|d| d.is_none()).count() <= 1,
        "reshape with more than one -1"
    );
    let known: usize = out.iter().flatten().product();
    let fill = total.checked_div(known).unwrap_or(0);
    let s: Vec<usize> = out.into_iter().map(|d| d.unwrap_or(fill)).collect();
    ensure!(
        s.iter().product::<usize>() == total,
        "cannot reshape {dims:?} to {target:?}"
    );
    Ok(s)
}

fn eval_reshape(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let shape = match cx.out_shape(0) {
        Some(s) => s,
        None => resolve_reshape(x.dims(), &cx.ints("shape")?)?,
    };
    one(x.reshape(shape)?)
}

fn eval_transpose(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let perm = cx
        .ints("perm")?
        .into_iter()
        .map(|p| axis(p, x.rank()))
        .collect::<Result<Vec<_>>>()?;
    one(x.permute(perm)?)
}

fn eval_expand_dims(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let axes = cx.ints("axes")?;
    let r = x.rank() + axes.len();
    let mut norm = axes
        .iter()
        .map(|&a| axis(a, r))
        .collect::<Result<Vec<_>>>()?;
    norm.sort();
    let mut s = x.dims().to_vec();
    for a in norm {
        s.insert(a, 1);
    }
    one(x.reshape(s)?)
}

fn eval_squeeze(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let s: Vec<usize> = match cx.opt_ints("axes")? {
        Some(axes) => {
            let norm = axes
                .iter()
                .map(|&a| axis(a, x.rank()))
                .collect::<Result<Vec<_>>>()?;
            x.dims()
                .iter()
                .enumerate()
                .filter(|(i, _)| !norm.contains(i))
                .map(|(_, d)| *d)
                .collect()
        }
        None => x.dims().iter().copied().filter(|&d| d != 1).collect(),
    };
    one(x.reshape(s)?)
}

fn eval_concat(cx: &EvalCx) -> Result<Vec<RValue>> {
    let vals = cx.ts("values")?;
    let first = vals.first().ok_or_else(|| anyhow!("concat of nothing"))?;
    let a = axis(cx.int("axis")?, first.rank())?;
    if cx.opt_bool("interleave")?.unwrap_or(false) {
        // Interleaving equal parts: stack on a new axis after `a`, then merge the two.
        let st = candle_core::Tensor::stack(&vals, a + 1)?;
        let mut s = first.dims().to_vec();
        s[a] *= vals.len();
        return one(st.reshape(s)?);
    }
    one(candle_core::Tensor::cat(&vals, a)?)
}

fn eval_stack(cx: &EvalCx) -> Result<Vec<RValue>> {
    let vals = cx.ts("values")?;
    let first = vals.first().ok_or_else(|| anyhow!("stack of nothing"))?;
    one(candle_core::Tensor::stack(
        &vals,
        axis(cx.int("axis")?, first.rank() + 1)?,
    )?)
}

fn eval_split(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let a = axis(cx.int("axis")?, x.rank())?;
    let n = x.dims()[a];
    let sizes: Vec<usize> = match (cx.opt_ints("split_sizes")?, cx.opt_int("num_splits")?) {
        (Some(s), _) => s
            .into_iter()
            .map(|v| usize::try_from(v).map_err(|_| anyhow!("negative split size {v}")))
            .collect::<Result<_>>()?,
        (None, Some(k)) if k > 0 && n % k as usize == 0 => vec![n / k as usize; k as usize],
        _ => bail!("split of an axis of {n} needs split_sizes or a num_splits dividing it"),
    };
    ensure!(
        sizes.iter().sum::<usize>() == n && sizes.len() == cx.outputs.len(),
        "split sizes {sizes:?} for an axis of {n} into {} outputs",
        cx.outputs.len()
    );
    let mut start = 0;
    let mut out = Vec::new();
    for len in sizes {
        out.push(RValue::T(x.narrow(a, start, len)?));
        start += len;
    }
    Ok(out)
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
    let a = axis(cx.opt_int("axis")?.unwrap_or(0), x.rank())?;
    let bd = cx.opt_int("batch_dims")?.unwrap_or(0) as usize;
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
    let a = axis(cx.opt_int("axis")?.unwrap_or(0), x.rank())?;
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
    let mode = match cx.opt_str("mode")?.unwrap_or("constant") {
        "constant" => PadMode::Constant(cx.opt_f64("constant_val")?.unwrap_or(0.0)),
        "reflect" => PadMode::Reflect,
        "replicate" => PadMode::Replicate,
        m => bail!("unknown pad mode `{m}`"),
    };
    one(kernels::pad(x, &pairs, mode)?)
}

fn eval_fill(cx: &EvalCx) -> Result<Vec<RValue>> {
    let s: Vec<usize> = cx
        .ints("shape")?
        .into_iter()
        .map(|d| usize::try_from(d).map_err(|_| anyhow!("fill to a negative dimension {d}")))
        .collect::<Result<_>>()?;
    let v = cx.opt_f64("value")?.unwrap_or(0.0);
    one(kernels::index::full(&s, v, cx.out_dtype(0)?)?)
}

fn eval_range_1d(cx: &EvalCx) -> Result<Vec<RValue>> {
    let get = |n: &str| -> Result<f64> {
        cx.opt_f64(n)?
            .ok_or_else(|| anyhow!("range_1d needs `{n}`"))
    };
    let (start, end, step) = (get("start")?, get("end")?, get("step")?);
    ensure!(step != 0.0, "range_1d step 0");
    let n = ((end - start) / step).ceil().max(0.0) as usize;
    let v: Vec<f64> = (0..n).map(|i| start + i as f64 * step).collect();
    one(kernels::data::from_f64(v, &[n], cx.out_dtype(0)?)?)
}

fn eval_tile(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let reps: Vec<usize> = cx
        .ints("reps")?
        .into_iter()
        .map(|r| usize::try_from(r).map_err(|_| anyhow!("negative tile count {r}")))
        .collect::<Result<_>>()?;
    ensure!(
        reps.len() == x.rank(),
        "tile reps {reps:?} for rank {}",
        x.rank()
    );
    one(x.repeat(reps)?)
}

fn eval_shape(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    one(kernels::from_vec(
        x.dims().iter().map(|&d| d as i32).collect::<Vec<i32>>(),
        &[x.rank()],
    )?)
}

fn eval_band_part(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    ensure!(x.rank() >= 2, "band_part needs rank ≥ 2");
    let (lo, up) = (
        cx.opt_int("lower")?.unwrap_or(-1),
        cx.opt_int("upper")?.unwrap_or(-1),
    );
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
        "reshape",
        &[req("x"), req("shape")],
        infer_reshape,
        eval_reshape,
    ),
    def(
        "transpose",
        &[req("x"), req_c("perm")],
        infer_transpose,
        eval_transpose,
    ),
    def(
        "expand_dims",
        &[req("x"), req_c("axes")],
        infer_expand_dims,
        eval_expand_dims,
    ),
    def(
        "squeeze",
        &[req("x"), opt_c("axes")],
        infer_squeeze,
        eval_squeeze,
    ),
    def(
        "concat",
        &[var("values"), req_c("axis"), opt_c("interleave")],
        infer_concat,
        eval_concat,
    ),
    def(
        "stack",
        &[var("values"), req_c("axis")],
        infer_stack,
        eval_stack,
    ),
    def(
        "split",
        &[
            req("x"),
            opt_c("num_splits"),
            opt_c("split_sizes"),
            req_c("axis"),
        ],
        infer_split,
        eval_split,
    ),
    def(
        "slice_by_index",
        &[
            req("x"),
            req("begin"),
            req("end"),
            opt("stride"),
            opt_c("begin_mask"),
            opt_c("end_mask"),
            opt_c("squeeze_mask"),
        ],
        infer_slice_by_index,
        eval_slice_by_index,
    ),
    def(
        "slice_by_size",
        &[req("x"), req("begin"), req_c("size")],
        infer_slice_by_size,
        eval_slice_by_size,
    ),
    def(
        "gather",
        &[
            req("x"),
            req("indices"),
            opt_c("axis"),
            opt_c("batch_dims"),
            opt_c("validate_indices"),
        ],
        infer_gather,
        eval_gather,
    ),
    def(
        "gather_along_axis",
        &[
            req("x"),
            req("indices"),
            opt_c("axis"),
            opt_c("validate_indices"),
        ],
        infer_gather_along_axis,
        eval_gather_along_axis,
    ),
    def(
        "pad",
        &[req("x"), req("pad"), opt_c("mode"), opt_c("constant_val")],
        infer_pad,
        eval_pad,
    ),
    def("fill", &[req("shape"), opt("value")], infer_fill, eval_fill),
    def(
        "range_1d",
        &[req("end"), req("start"), req("step")],
        infer_range,
        eval_range_1d,
    ),
    def("tile", &[req("x"), req_c("reps")], infer_tile, eval_tile),
    def("shape", &[req("x")], infer_shape, eval_shape),
    def(
        "band_part",
        &[req("x"), opt_c("lower"), opt_c("upper")],
        infer_band_part,
        eval_band_part,
    ),
];
