//! Shape ops: reshape, transpose, expand/squeeze, concat/split/stack, fill, tile, range,
//! shape (slicing, gather and pad are in `index`).

use super::def;
use super::eval::{one, EvalCx, RValue};
use super::infer::{axis, tensor, InferCx};
use super::placement::Flops;
use super::DefaultValue;
use super::{opt, opt_c, req, req_c, var, OpDef};
use crate::ir::{DType, Dim, ValueType};
use crate::kernels;
use anyhow::{anyhow, bail, ensure, Result};

/// The input axis a `0` at position `i` of a length-`k` reshape target copies: counted from
/// the right (`k - i == rank - j`), as iOS17 defines it; `None` where no axis lines up, and
/// the dimension is 1 (an `expand_dims`). Equal lengths, the only case iOS15 allows, copy
/// the same axis `i`.
fn zero_axis(i: usize, k: usize, rank: usize) -> Option<usize> {
    (rank + i).checked_sub(k)
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
            0 => match zero_axis(i, target.len(), x.rank()).map(|j| &x.shape[j]) {
                Some(Dim::Fixed(n)) => Some(*n),
                Some(Dim::Unknown) => None,
                None => Some(1),
            },
            d if d > 0 => Some(d as usize),
            d => bail!("reshape to a negative dimension {d}"),
        });
    }
    ensure!(
        target.iter().filter(|&&d| d == -1).count() <= 1,
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
    if first.rank() == 0 {
        // coremltools' concat: 0-d values count one element each and make a vector.
        scalar_concat_axis(cx.int("axis")?)?;
        for v in vals {
            let t =
                v.ty.as_tensor()
                    .ok_or_else(|| anyhow!("concat of a non-tensor"))?;
            ensure!(
                t.dtype == first.dtype && t.rank() == 0,
                "concat of {first} and {t}"
            );
        }
        return Ok(vec![tensor(first.dtype, vec![Dim::Fixed(vals.len())])]);
    }
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

/// The axis of a concat of 0-d values: its result is a vector, so 0 or -1.
fn scalar_concat_axis(a: i64) -> Result<()> {
    ensure!(
        a == 0 || a == -1,
        "concat of 0-d values on axis {a}: their result is a vector (axis 0 or -1)"
    );
    Ok(())
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
    let Some(reps) = cx.opt_ints("reps")? else {
        // A run-time `reps`: one count per axis of `x`, the sizes known only when it runs.
        let r = cx.t("reps")?;
        ensure!(
            r.dtype.is_int()
                && r.rank() == 1
                && matches!(r.shape[0], Dim::Fixed(n) if n == x.rank()),
            "tile of {x} with reps {r}: reps must be an integer vector of {} counts",
            x.rank()
        );
        return Ok(vec![tensor(x.dtype, vec![Dim::Unknown; x.rank()])]);
    };
    ensure!(reps.len() == x.rank(), "tile reps {reps:?} for {x}");
    ensure!(
        reps.iter().all(|&r| r >= 0),
        "tile reps {reps:?}: a negative count"
    );
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

// ---- evaluation: views where candle has them (reshape, permute, narrow), index copies
// otherwise ----

/// Resolves a MIL reshape target (`0` copies the input dim [`zero_axis`] names, one `-1` is
/// inferred).
fn resolve_reshape(dims: &[usize], target: &[i64]) -> Result<Vec<usize>> {
    let total: usize = dims.iter().product();
    let mut out: Vec<Option<usize>> = Vec::new();
    for (i, &d) in target.iter().enumerate() {
        out.push(match d {
            -1 => None,
            0 => Some(zero_axis(i, target.len(), dims.len()).map_or(1, |j| dims[j])),
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
    if vals.iter().any(|v| v.rank() == 0) {
        ensure!(
            vals.iter().all(|v| v.rank() == 0),
            "concat of 0-d values with values of rank > 0"
        );
        scalar_concat_axis(cx.int("axis")?)?;
        // Interleaving single elements is plain concatenation.
        let vs = vals
            .iter()
            .map(|v| v.reshape(1))
            .collect::<candle_core::Result<Vec<_>>>()?;
        return one(candle_core::Tensor::cat(&vs, 0)?);
    }
    let a = axis(cx.int("axis")?, first.rank())?;
    if cx.bool_or_default("interleave")? {
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

fn eval_fill(cx: &EvalCx) -> Result<Vec<RValue>> {
    let s: Vec<usize> = cx
        .ints("shape")?
        .into_iter()
        .map(|d| usize::try_from(d).map_err(|_| anyhow!("fill to a negative dimension {d}")))
        .collect::<Result<_>>()?;
    let v = cx.f64_or_default("value")?;
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

pub static DEFS: &[OpDef] = &[
    def(
        "reshape",
        &[req("x"), req("shape")],
        infer_reshape,
        eval_reshape,
    )
    .with_flops(Flops::None),
    def(
        "transpose",
        &[req("x"), req_c("perm")],
        infer_transpose,
        eval_transpose,
    )
    .with_flops(Flops::None),
    def(
        "expand_dims",
        &[req("x"), req_c("axes")],
        infer_expand_dims,
        eval_expand_dims,
    )
    .with_flops(Flops::None),
    def(
        "squeeze",
        &[req("x"), opt_c("axes")],
        infer_squeeze,
        eval_squeeze,
    )
    .with_flops(Flops::None),
    def(
        "concat",
        &[
            var("values"),
            req_c("axis"),
            opt_c("interleave").or(DefaultValue::Bool(false)),
        ],
        infer_concat,
        eval_concat,
    )
    .fresh()
    .with_flops(Flops::None),
    def(
        "stack",
        &[var("values"), req_c("axis")],
        infer_stack,
        eval_stack,
    )
    .with_flops(Flops::None),
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
    )
    .with_flops(Flops::None),
    def(
        "fill",
        &[req("shape"), opt("value").or(DefaultValue::Float(0.0))],
        infer_fill,
        eval_fill,
    )
    .with_flops(Flops::None),
    def(
        "range_1d",
        &[req("end"), req("start"), req("step")],
        infer_range,
        eval_range_1d,
    ),
    def("tile", &[req("x"), req("reps")], infer_tile, eval_tile).with_flops(Flops::None),
    def("shape", &[req("x")], infer_shape, eval_shape).with_flops(Flops::None),
];
