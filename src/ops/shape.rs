//! Shape and data-movement ops: reshape, transpose, expand/squeeze, concat/split/stack,
//! slicing, gather, pad, fill, tile, range.

use super::infer::{axis, tensor, InferCx};
use super::{opt, opt_c, req, req_c, var, InputSpec, OpDef};
use crate::ir::{DType, Dim, Opset, ValueType};
use anyhow::{anyhow, bail, ensure, Result};

const fn def(
    name: &'static str,
    inputs: &'static [InputSpec],
    infer: fn(&InferCx) -> Result<Vec<ValueType>>,
) -> OpDef {
    OpDef {
        name,
        since: Opset::Ios15,
        until: None,
        inputs,
        infer,
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

pub static DEFS: &[OpDef] = &[
    def("reshape", &[req("x"), req("shape")], infer_reshape),
    def("transpose", &[req("x"), req_c("perm")], infer_transpose),
    def("expand_dims", &[req("x"), req_c("axes")], infer_expand_dims),
    def("squeeze", &[req("x"), opt_c("axes")], infer_squeeze),
    def(
        "concat",
        &[var("values"), req_c("axis"), opt_c("interleave")],
        infer_concat,
    ),
    def("stack", &[var("values"), req_c("axis")], infer_stack),
    def(
        "split",
        &[
            req("x"),
            opt_c("num_splits"),
            opt_c("split_sizes"),
            req_c("axis"),
        ],
        infer_split,
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
    ),
    def(
        "slice_by_size",
        &[req("x"), req("begin"), req_c("size")],
        infer_slice_by_size,
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
    ),
    def(
        "pad",
        &[req("x"), req("pad"), opt_c("mode"), opt_c("constant_val")],
        infer_pad,
    ),
    def("fill", &[req("shape"), opt("value")], infer_fill),
    def(
        "range_1d",
        &[req("end"), req("start"), req("step")],
        infer_range,
    ),
    def("tile", &[req("x"), req_c("reps")], infer_tile),
    def("shape", &[req("x")], infer_shape),
    def(
        "band_part",
        &[req("x"), opt_c("lower"), opt_c("upper")],
        infer_band_part,
    ),
];
