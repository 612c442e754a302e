//! `gather_nd` and the scatter family (`scatter`, `scatter_along_axis`, `scatter_nd`, with
//! the modes update / add / sub / mul / div / max / min): type inference and evaluation.
//! Values move through f64 (exact for every storage dtype milkit runs), one pass over the
//! indices, so each op is linear in its data; an index out of range is an error naming it,
//! except in an iOS17 scatter whose `validate_indices` is false (its default), where Core ML
//! leaves the result undefined and milkit drops the updates at such indices. From iOS17 on a
//! scatter's negative index is out of range (coremltools: "negative values are considered
//! out-of-bound"), not counted from the end as in iOS15/16.

use super::eval::{one, EvalCx, RValue};
use super::infer::{axis, tensor, InferCx};
use super::DefaultValue;
use super::{opt_c, req, ver as v, InputSpec, OpDef};
use crate::ir::{Dim, Opset, ValueType};
use crate::kernels::{self, data::strides};
use anyhow::{bail, ensure, Result};

fn infer_gather_nd(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    let idx = cx.t("indices")?;
    ensure!(
        idx.dtype.is_int(),
        "`indices` must be integers, is {}",
        idx.dtype
    );
    let b = cx.opt_int("batch_dims")?.unwrap_or(0) as usize;
    let depth = match idx.shape.last() {
        Some(Dim::Fixed(d)) => *d,
        _ => bail!("`indices` needs a fixed last dimension"),
    };
    ensure!(
        depth + b <= x.rank(),
        "indices.shape[-1] ({depth}) + batch_dims ({b}) exceeds the rank of x ({})",
        x.rank()
    );
    let mut s = idx.shape[..idx.rank() - 1].to_vec();
    s.extend_from_slice(&x.shape[b + depth..]);
    Ok(vec![tensor(x.dtype, s)])
}

fn norm_index(i: i64, n: usize, what: &str) -> Result<usize> {
    let j = if i < 0 { i + n as i64 } else { i };
    ensure!(
        j >= 0 && (j as usize) < n,
        "{what} index {i} out of range for a dimension of {n}"
    );
    Ok(j as usize)
}

fn eval_gather_nd(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let xs = x.dims().to_vec();
    let idx_t = cx.t("indices")?;
    let is = idx_t.dims().to_vec();
    let idx = cx.ints("indices")?;
    let b = cx.opt_int("batch_dims")?.unwrap_or(0) as usize;
    let depth = *is.last().unwrap_or(&0);
    ensure!(
        depth + b <= xs.len() && is.len() > b,
        "gather_nd: indices {is:?} for x {xs:?}"
    );
    let xv = kernels::to_vec::<f64>(x)?;
    let st = strides(&xs);
    let inner: usize = xs[b + depth..].iter().product();
    let batch: usize = xs[..b].iter().product();
    let per_batch: usize = is[b..is.len() - 1].iter().product();
    let mut out = Vec::with_capacity(batch * per_batch * inner);
    for bi in 0..batch {
        for r in 0..per_batch {
            let row = &idx[(bi * per_batch + r) * depth..(bi * per_batch + r + 1) * depth];
            let mut off = if b > 0 { bi * st[b - 1] } else { 0 };
            for (k, &i) in row.iter().enumerate() {
                off += norm_index(i, xs[b + k], "gather_nd")? * st[b + k];
            }
            out.extend_from_slice(&xv[off..off + inner]);
        }
    }
    let mut shape = is[..is.len() - 1].to_vec();
    shape.extend_from_slice(&xs[b + depth..]);
    one(kernels::data::from_f64(out, &shape, x.dtype())?)
}

/// How an update combines with the value already there.
fn combine(mode: &str) -> Result<fn(f64, f64) -> f64> {
    Ok(match mode {
        "update" => |_, u| u,
        "add" => |a, u| a + u,
        "sub" => |a, u| a - u,
        "mul" => |a, u| a * u,
        "div" => |a, u| a / u,
        "max" => f64::max,
        "min" => f64::min,
        m => bail!("unknown scatter mode `{m}` (update, add, sub, mul, div, max, min)"),
    })
}

fn infer_data_same(cx: &InferCx) -> Result<Vec<ValueType>> {
    let d = cx.same_dtype(&["data", "updates"])?;
    let i = cx.t("indices")?;
    ensure!(
        i.dtype.is_int(),
        "`indices` must be integers, is {}",
        i.dtype
    );
    if let Some(m) = cx.opt_str("mode")? {
        combine(m)?;
    }
    Ok(vec![tensor(d, cx.t("data")?.shape.clone())])
}

/// An index along a dimension of `n`, negative ones counted from the end (before iOS17) or
/// out of range (`ios17`); out of range it is an error naming it, or `None` (the update is
/// dropped) where `drop` says so.
fn place(i: i64, n: usize, what: &str, drop: bool, ios17: bool) -> Result<Option<usize>> {
    let r = if ios17 && i < 0 {
        Err(anyhow::anyhow!(
            "{what}: index {i} is out of range for a dimension of {n} (from iOS17 a scatter's \
             indices are not negative)"
        ))
    } else {
        norm_index(i, n, what)
    };
    match r {
        Ok(j) => Ok(Some(j)),
        Err(_) if drop => Ok(None),
        Err(e) => Err(e),
    }
}

/// Applies `updates[u]` at data offset `target(u, indices, drop)` for every update element,
/// in order; `drop` (iOS17 with `validate_indices` false) lets `target` skip an update at an
/// index out of range by answering `None`.
fn scatter_with(
    cx: &EvalCx,
    target: impl Fn(usize, &[i64], bool) -> Result<Option<usize>>,
) -> Result<Vec<RValue>> {
    let data = cx.t("data")?;
    let mut v = kernels::to_vec::<f64>(data)?;
    let upd = kernels::to_vec::<f64>(cx.t("updates")?)?;
    let idx = cx.ints("indices")?;
    let f = combine(cx.str_or_default("mode")?)?;
    let int = !kernels::data::is_float(data.dtype());
    let drop = cx.opset >= Opset::Ios17 && cx.opt_bool("validate_indices")? != Some(true);
    for (u, &x) in upd.iter().enumerate() {
        let Some(o) = target(u, &idx, drop)? else {
            continue;
        };
        let mut r = f(v[o], x);
        if int {
            // Integer division rounds as numpy's `//` would not: MIL truncates.
            r = r.trunc();
        }
        v[o] = r;
    }
    one(kernels::data::from_f64(v, data.dims(), data.dtype())?)
}

fn eval_scatter(cx: &EvalCx) -> Result<Vec<RValue>> {
    let ios17 = cx.opset >= Opset::Ios17;
    let ds = cx.t("data")?.dims().to_vec();
    let a = axis(cx.int_or_default("axis")?, ds.len())?;
    let us = cx.t("updates")?.dims().to_vec();
    let ni = cx.t("indices")?.elem_count();
    let mut want = ds[..a].to_vec();
    want.extend_from_slice(cx.t("indices")?.dims());
    want.extend_from_slice(&ds[a + 1..]);
    ensure!(
        us == want,
        "scatter: updates {us:?}, expected {want:?} (data {ds:?})"
    );
    let inner: usize = ds[a + 1..].iter().product();
    let dst = strides(&ds);
    scatter_with(cx, |u, idx, drop| {
        let (outer, rest) = (u / (ni * inner), u % (ni * inner));
        let (k, i) = (rest / inner, rest % inner);
        let j = place(idx[k], ds[a], "scatter", drop, ios17)?;
        Ok(j.map(|j| outer * dst[a] * ds[a] + j * dst[a] + i))
    })
}

fn eval_scatter_along_axis(cx: &EvalCx) -> Result<Vec<RValue>> {
    let ios17 = cx.opset >= Opset::Ios17;
    let ds = cx.t("data")?.dims().to_vec();
    let a = axis(cx.int_or_default("axis")?, ds.len())?;
    let is = cx.t("indices")?.dims().to_vec();
    let us = cx.t("updates")?.dims().to_vec();
    ensure!(
        is == us && is.len() == ds.len(),
        "scatter_along_axis: indices {is:?} and updates {us:?} for data {ds:?}"
    );
    let (ist, dst) = (strides(&is), strides(&ds));
    scatter_with(cx, |u, idx, drop| {
        let mut o = 0;
        for d in 0..is.len() {
            let c = (u / ist[d]) % is[d];
            let c = if d == a {
                match place(idx[u], ds[a], "scatter_along_axis", drop, ios17)? {
                    Some(c) => c,
                    None => return Ok(None),
                }
            } else {
                ensure!(
                    c < ds[d],
                    "scatter_along_axis: indices {is:?} for data {ds:?}"
                );
                c
            };
            o += c * dst[d];
        }
        Ok(Some(o))
    })
}

fn eval_scatter_nd(cx: &EvalCx) -> Result<Vec<RValue>> {
    let ios17 = cx.opset >= Opset::Ios17;
    let ds = cx.t("data")?.dims().to_vec();
    let is = cx.t("indices")?.dims().to_vec();
    let depth = *is.last().unwrap_or(&0);
    ensure!(
        depth <= ds.len(),
        "scatter_nd: indices {is:?} for data {ds:?}"
    );
    let inner: usize = ds[depth..].iter().product();
    let dst = strides(&ds);
    scatter_with(cx, |u, idx, drop| {
        let (r, i) = (u / inner, u % inner);
        let mut o = i;
        for k in 0..depth {
            match place(idx[r * depth + k], ds[k], "scatter_nd", drop, ios17)? {
                Some(j) => o += j * dst[k],
                None => return Ok(None),
            }
        }
        Ok(Some(o))
    })
}

use Opset::{Ios15 as I15, Ios16 as I16, Ios17 as I17};

const GND15: &[InputSpec] = &[req("x"), req("indices")];
const GND16: &[InputSpec] = &[
    req("x"),
    req("indices"),
    opt_c("batch_dims").or(DefaultValue::Int(0)),
];
const GND17: &[InputSpec] = &[
    req("x"),
    req("indices"),
    opt_c("batch_dims").or(DefaultValue::Int(0)),
    opt_c("validate_indices"),
];
const SC15: &[InputSpec] = &[
    req("data"),
    req("indices"),
    req("updates"),
    opt_c("axis").or(DefaultValue::Int(0)),
    opt_c("mode").or(DefaultValue::Str("add")),
];
const SC17: &[InputSpec] = &[
    req("data"),
    req("indices"),
    req("updates"),
    opt_c("axis").or(DefaultValue::Int(0)),
    opt_c("mode").or(DefaultValue::Str("add")),
    opt_c("validate_indices"),
];
const SND15: &[InputSpec] = &[
    req("data"),
    req("indices"),
    req("updates"),
    opt_c("mode").or(DefaultValue::Str("add")),
];
const SND17: &[InputSpec] = &[
    req("data"),
    req("indices"),
    req("updates"),
    opt_c("mode").or(DefaultValue::Str("add")),
    opt_c("validate_indices"),
];

pub static DEFS: &[OpDef] = &[
    v(
        "gather_nd",
        I15,
        Some(I16),
        GND15,
        infer_gather_nd,
        eval_gather_nd,
    ),
    v(
        "gather_nd",
        I16,
        Some(I17),
        GND16,
        infer_gather_nd,
        eval_gather_nd,
    ),
    v(
        "gather_nd",
        I17,
        None,
        GND17,
        infer_gather_nd,
        eval_gather_nd,
    ),
    v(
        "scatter",
        I15,
        Some(I17),
        SC15,
        infer_data_same,
        eval_scatter,
    ),
    v("scatter", I17, None, SC17, infer_data_same, eval_scatter),
    v(
        "scatter_along_axis",
        I15,
        Some(I17),
        SC15,
        infer_data_same,
        eval_scatter_along_axis,
    ),
    v(
        "scatter_along_axis",
        I17,
        None,
        SC17,
        infer_data_same,
        eval_scatter_along_axis,
    ),
    v(
        "scatter_nd",
        I15,
        Some(I17),
        SND15,
        infer_data_same,
        eval_scatter_nd,
    ),
    v(
        "scatter_nd",
        I17,
        None,
        SND17,
        infer_data_same,
        eval_scatter_nd,
    ),
];
