//! Tensor operations and transformations beyond reshape / slice / concat: `cumsum`, `topk`
//! (iOS15, iOS16 with `sort` / `return_indices`, iOS17 with `output_indices_dtype`),
//! `argsort`, `fill_like`, `one_hot`, `non_zero`, `reverse`, `reverse_sequence`, `flatten2d`,
//! `reshape_like`, `sliding_windows`, `space_to_depth` / `depth_to_space` (TensorFlow's
//! DCR order), `pixel_shuffle` / `pixel_unshuffle` (PyTorch's CRD order), `space_to_batch` /
//! `batch_to_space` (TensorFlow's batch order). Values move through
//! f64 (exact for every storage dtype) or through candle's layout ops.

use super::eval::{one, EvalCx, RValue};
use super::infer::{axis, tensor, InferCx};
use super::DefaultValue;
use super::{opt_c, req, req_c, var, ver as v, InputSpec, OpDef};
use crate::ir::{DType, Dim, Opset, ValueType};
use crate::kernels::{self, data::strides};
use anyhow::{anyhow, bail, ensure, Result};

fn infer_same(cx: &InferCx) -> Result<Vec<ValueType>> {
    Ok(vec![ValueType::Tensor(cx.t("x")?.clone())])
}

/// (outer, n, inner) of `shape` around axis `a`.
fn lanes(shape: &[usize], a: usize) -> (usize, usize, usize) {
    (
        shape[..a].iter().product(),
        shape[a],
        shape[a + 1..].iter().product(),
    )
}

// ---- cumsum ----

fn eval_cumsum(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let a = axis(cx.int_or_default("axis")?, x.rank())?;
    let excl = cx.bool_or_default("exclusive")?;
    let rev = cx.bool_or_default("reverse")?;
    let mut v = kernels::to_vec::<f64>(x)?;
    let (outer, n, inner) = lanes(x.dims(), a);
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| o * n * inner + k * inner + i;
            let mut acc = 0f64;
            for s in 0..n {
                let k = if rev { n - 1 - s } else { s };
                let e = v[at(k)];
                if excl {
                    v[at(k)] = acc;
                    acc += e;
                } else {
                    acc += e;
                    v[at(k)] = acc;
                }
            }
        }
    }
    one(kernels::data::from_f64(v, x.dims(), x.dtype())?)
}

// ---- topk / argsort ----

fn topk_k(cx: &InferCx) -> Result<i64> {
    cx.int_or_default("k")
}

fn infer_topk(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    let a = axis(cx.int_or_default("axis")?, x.rank())?;
    let k = topk_k(cx)?;
    let mut s = x.shape.clone();
    s[a] = match (&x.shape[a], k) {
        (_, k) if k > 0 => Dim::Fixed(k as usize),
        // k = -1 (iOS17): every element.
        (d, -1) => d.clone(),
        (_, k) => bail!("topk: k = {k}"),
    };
    if let Dim::Fixed(n) = x.shape[a] {
        ensure!(k <= n as i64, "topk: k = {k} exceeds the axis length {n}");
    }
    let values = tensor(x.dtype, s.clone());
    if !cx.opt_bool("return_indices")?.unwrap_or(true) {
        ensure!(
            !cx.has("output_indices_dtype"),
            "`output_indices_dtype` needs return_indices = true"
        );
        return Ok(vec![values]);
    }
    let idt = match cx.opt_str("output_indices_dtype")?.unwrap_or("int32") {
        "int32" => DType::I32,
        "uint16" => DType::U16,
        o => bail!("output_indices_dtype `{o}` (int32 or uint16)"),
    };
    Ok(vec![values, tensor(idt, s)])
}

/// Per lane along `a`: the element order (stable; descending unless `ascending`).
fn order(v: &[f64], shape: &[usize], a: usize, ascending: bool) -> Vec<Vec<usize>> {
    let (outer, n, inner) = lanes(shape, a);
    let mut out = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| v[o * n * inner + k * inner + i];
            let mut p: Vec<usize> = (0..n).collect();
            p.sort_by(|&x, &y| {
                let (ex, ey) = (at(x), at(y));
                let c = ex.partial_cmp(&ey).unwrap_or(std::cmp::Ordering::Equal);
                if ascending {
                    c
                } else {
                    c.reverse()
                }
            });
            out.push(p);
        }
    }
    out
}

fn eval_topk(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let a = axis(cx.int_or_default("axis")?, x.rank())?;
    let asc = cx.bool_or_default("ascending")?;
    let (outer, n, inner) = lanes(x.dims(), a);
    let k = match cx.int_or_default("k")? {
        -1 => n,
        k => k as usize,
    };
    ensure!(k <= n, "topk: k = {k} exceeds the axis length {n}");
    let v = kernels::to_vec::<f64>(x)?;
    let ord = order(&v, x.dims(), a, asc);
    let mut vals = vec![0f64; outer * k * inner];
    let mut idx = vec![0f64; outer * k * inner];
    for o in 0..outer {
        for i in 0..inner {
            let p = &ord[o * inner + i];
            for (j, &src) in p[..k].iter().enumerate() {
                let d = o * k * inner + j * inner + i;
                vals[d] = v[o * n * inner + src * inner + i];
                idx[d] = src as f64;
            }
        }
    }
    let mut shape = x.dims().to_vec();
    shape[a] = k;
    let mut out = vec![RValue::T(kernels::data::from_f64(vals, &shape, x.dtype())?)];
    if cx.outputs.len() > 1 {
        out.push(RValue::T(kernels::data::from_f64(
            idx,
            &shape,
            cx.out_dtype(1)?,
        )?));
    }
    Ok(out)
}

fn infer_argsort(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    axis(cx.int_or_default("axis")?, x.rank())?;
    Ok(vec![tensor(DType::I32, x.shape.clone())])
}

fn eval_argsort(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let a = axis(cx.int_or_default("axis")?, x.rank())?;
    let asc = cx.bool_or_default("ascending")?;
    let (outer, n, inner) = lanes(x.dims(), a);
    let ord = order(&kernels::to_vec::<f64>(x)?, x.dims(), a, asc);
    let mut idx = vec![0i32; x.elem_count()];
    for o in 0..outer {
        for i in 0..inner {
            for (j, &src) in ord[o * inner + i].iter().enumerate() {
                idx[o * n * inner + j * inner + i] = src as i32;
            }
        }
    }
    one(kernels::from_vec(idx, x.dims())?)
}

// ---- fill_like / one_hot / non_zero ----

fn value_dtype(cx: &InferCx, name: &str, default: DType) -> Result<DType> {
    Ok(match cx.opt_t(name)? {
        Some(t) => t.dtype,
        None => default,
    })
}

fn infer_fill_like(cx: &InferCx) -> Result<Vec<ValueType>> {
    let r = cx.t("ref_tensor")?;
    Ok(vec![tensor(
        value_dtype(cx, "value", DType::F32)?,
        r.shape.clone(),
    )])
}

fn eval_fill_like(cx: &EvalCx) -> Result<Vec<RValue>> {
    let r = cx.t("ref_tensor")?;
    let val = cx.f64_or_default("value")?;
    one(kernels::index::full(r.dims(), val, cx.out_dtype(0)?)?)
}

fn infer_one_hot(cx: &InferCx) -> Result<Vec<ValueType>> {
    let i = cx.t("indices")?;
    ensure!(
        i.dtype.is_int(),
        "`indices` must be integers, is {}",
        i.dtype
    );
    let on = value_dtype(cx, "on_value", DType::I32)?;
    let off = value_dtype(cx, "off_value", DType::I32)?;
    ensure!(
        on == off || !cx.has("on_value") || !cx.has("off_value"),
        "on_value is {on} but off_value is {off}"
    );
    let dt = if cx.has("on_value") { on } else { off };
    let depth = match cx.opt_int("one_hot_vector_size")? {
        Some(d) => Dim::Fixed(d as usize),
        None => Dim::Unknown,
    };
    let a = axis(cx.int_or_default("axis")?, i.rank() + 1)?;
    let mut s = i.shape.clone();
    s.insert(a, depth);
    Ok(vec![tensor(dt, s)])
}

fn eval_one_hot(cx: &EvalCx) -> Result<Vec<RValue>> {
    let it = cx.t("indices")?;
    let idx = cx.ints("indices")?;
    let depth = cx.int("one_hot_vector_size")?;
    ensure!(depth >= 0, "one_hot_vector_size {depth}");
    let depth = depth as usize;
    let on = cx.f64_or_default("on_value")?;
    let off = cx.f64_or_default("off_value")?;
    let a = axis(cx.int_or_default("axis")?, it.rank() + 1)?;
    let mut shape = it.dims().to_vec();
    shape.insert(a, depth);
    let (outer, inner) = (
        it.dims()[..a].iter().product::<usize>(),
        it.dims()[a..].iter().product::<usize>(),
    );
    let mut out = vec![off; outer * depth * inner];
    for o in 0..outer {
        for i in 0..inner {
            let k = idx[o * inner + i];
            // An index outside [0, depth) gives a row of off_value (as tf.one_hot).
            if k >= 0 && (k as usize) < depth {
                out[o * depth * inner + k as usize * inner + i] = on;
            }
        }
    }
    one(kernels::data::from_f64(out, &shape, cx.out_dtype(0)?)?)
}

fn infer_non_zero(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    Ok(vec![tensor(
        DType::I32,
        vec![Dim::Unknown, Dim::Fixed(x.rank())],
    )])
}

fn eval_non_zero(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let v = kernels::to_vec::<f64>(x)?;
    let st = strides(x.dims());
    let mut out = Vec::new();
    let mut n = 0;
    for (i, &e) in v.iter().enumerate() {
        if e != 0.0 {
            n += 1;
            for (d, s) in st.iter().enumerate() {
                out.push(((i / s) % x.dims()[d]) as i32);
            }
        }
    }
    one(kernels::from_vec(out, &[n, x.rank()])?)
}

// ---- reverse / reverse_sequence ----

fn eval_reverse(cx: &EvalCx) -> Result<Vec<RValue>> {
    let mut x = cx.t("x")?.clone();
    let axes: Vec<usize> = match cx.opt_ints("axes")? {
        Some(a) => a
            .iter()
            .map(|&a| axis(a, x.rank()))
            .collect::<Result<_>>()?,
        None => (0..x.rank()).collect(),
    };
    for a in axes {
        let n = x.dims()[a];
        let idx: Vec<i64> = (0..n as i64).rev().collect();
        x = kernels::take(&x, &idx, &[n], a)?;
    }
    one(x)
}

fn eval_reverse_sequence(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let s = x.dims().to_vec();
    let sa = axis(cx.int_or_default("seq_axis")?, s.len())?;
    let ba = axis(cx.int_or_default("batch_axis")?, s.len())?;
    let lens = cx.ints("lengths")?;
    ensure!(
        lens.len() == s[ba],
        "reverse_sequence: {} lengths for a batch of {}",
        lens.len(),
        s[ba]
    );
    let v = kernels::to_vec::<f64>(x)?;
    let st = strides(&s);
    let mut out = v.clone();
    for (i, o) in out.iter_mut().enumerate() {
        let b = (i / st[ba]) % s[ba];
        let t = (i / st[sa]) % s[sa];
        let l = lens[b].clamp(0, s[sa] as i64) as usize;
        if t < l {
            let src = i - t * st[sa] + (l - 1 - t) * st[sa];
            *o = v[src];
        }
    }
    one(kernels::data::from_f64(out, &s, x.dtype())?)
}

// ---- flatten2d / reshape_like / sliding_windows ----

/// flatten2d's split point: `axis` in [−rank, rank], a negative one counted from the end
/// as Python slices count (−1 keeps the last dimension apart).
fn flatten2d_axis(a: i64, rank: usize) -> Result<usize> {
    let r = rank as i64;
    ensure!(
        (-r..=r).contains(&a),
        "flatten2d: axis {a} is outside [-{r}, {r}]"
    );
    Ok(if a < 0 { a + r } else { a } as usize)
}

fn infer_flatten2d(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    let a = flatten2d_axis(cx.int_or_default("axis")?, x.rank())?;
    let prod = |d: &[Dim]| -> Dim {
        d.iter()
            .try_fold(1usize, |p, d| match d {
                Dim::Fixed(n) => Some(p * n),
                _ => None,
            })
            .map_or(Dim::Unknown, Dim::Fixed)
    };
    Ok(vec![tensor(
        x.dtype,
        vec![prod(&x.shape[..a]), prod(&x.shape[a..])],
    )])
}

fn eval_flatten2d(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let a = flatten2d_axis(cx.int_or_default("axis")?, x.rank())?;
    let (o, i): (usize, usize) = (
        x.dims()[..a].iter().product(),
        x.dims()[a..].iter().product(),
    );
    one(x.reshape((o, i))?)
}

fn infer_reshape_like(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    let refs = cx.all("ref_tensors");
    let (b, e, m) = (cx.all("begins"), cx.all("ends"), cx.all("end_masks"));
    ensure!(
        b.len() == refs.len() && e.len() == refs.len() && m.len() == refs.len(),
        "reshape_like: ref_tensors, begins, ends and end_masks must have the same length"
    );
    let scalar = |a: &super::ArgInfo, what: &str| -> Result<i64> {
        let t = a
            .val
            .and_then(|v| v.as_tensor())
            .ok_or_else(|| anyhow!("reshape_like: `{what}` must be constant scalars"))?;
        let v = t.to_i64_vec()?;
        ensure!(v.len() == 1, "reshape_like: `{what}` must be scalars");
        Ok(v[0])
    };
    let mut shape = Vec::new();
    for k in 0..refs.len() {
        let r = refs[k]
            .ty
            .as_tensor()
            .ok_or_else(|| anyhow!("reshape_like: ref_tensors must be tensors"))?;
        let (bb, ee, mm) = (
            scalar(&b[k], "begins")?,
            scalar(&e[k], "ends")?,
            scalar(&m[k], "end_masks")? != 0,
        );
        let rank = r.rank() as i64;
        let nb = if bb < 0 { bb + rank } else { bb }.clamp(0, rank) as usize;
        let ne = if mm {
            rank as usize
        } else {
            (if ee < 0 { ee + rank } else { ee }).clamp(0, rank) as usize
        };
        ensure!(nb <= ne, "reshape_like: begin {bb} after end {ee}");
        shape.extend_from_slice(&r.shape[nb..ne]);
    }
    ensure!(
        shape.iter().all(|d| matches!(d, Dim::Fixed(_))),
        "reshape_like: the output shape must be known at compile time"
    );
    if let Some(xs) = x.fixed_shape() {
        let n: usize = shape
            .iter()
            .map(|d| if let Dim::Fixed(n) = d { *n } else { 0 })
            .product();
        ensure!(
            xs.iter().product::<usize>() == n,
            "reshape_like: {xs:?} has not the {n} elements of the output shape"
        );
    }
    Ok(vec![tensor(x.dtype, shape)])
}

fn eval_to_out_shape(cx: &EvalCx) -> Result<Vec<RValue>> {
    let s = cx
        .out_shape(0)
        .ok_or_else(|| anyhow!("`{}`: output shape unknown", cx.op_type))?;
    one(cx.t("x")?.reshape(s)?)
}

fn infer_sliding_windows(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    let a = axis(cx.int("axis")?, x.rank())?;
    let size = cx.int("size")?;
    let stride = cx.int_or_default("stride")?;
    ensure!(
        size > 0 && stride > 0,
        "sliding_windows: size {size}, stride {stride}"
    );
    let mut s = x.shape.clone();
    s[a] = match x.shape[a] {
        Dim::Fixed(n) => {
            ensure!(
                n as i64 >= size,
                "sliding_windows: size {size} exceeds the axis length {n}"
            );
            Dim::Fixed(((n as i64 - size) / stride + 1) as usize)
        }
        _ => Dim::Unknown,
    };
    s.insert(a + 1, Dim::Fixed(size as usize));
    Ok(vec![tensor(x.dtype, s)])
}

fn eval_sliding_windows(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let a = axis(cx.int("axis")?, x.rank())?;
    let size = cx.int("size")? as usize;
    let stride = cx.int_or_default("stride")? as usize;
    let n = x.dims()[a];
    ensure!(
        size <= n,
        "sliding_windows: size {size} exceeds the axis length {n}"
    );
    let w = (n - size) / stride + 1;
    let parts: Vec<_> = (0..w)
        .map(|k| x.narrow(a, k * stride, size))
        .collect::<candle_core::Result<_>>()?;
    one(candle_core::Tensor::stack(&parts, a)?.contiguous()?)
}

// ---- depth / space / pixel shuffles ----

fn nchw(cx: &InferCx) -> Result<(DType, [Dim; 4])> {
    let x = cx.t("x")?;
    ensure!(x.rank() == 4, "`{}` needs a rank-4 x", cx.op_type);
    Ok((
        x.dtype,
        [
            x.shape[0].clone(),
            x.shape[1].clone(),
            x.shape[2].clone(),
            x.shape[3].clone(),
        ],
    ))
}

fn factor_name(op: &str) -> &'static str {
    match op {
        "pixel_shuffle" => "upscale_factor",
        "pixel_unshuffle" => "downscale_factor",
        _ => "block_size",
    }
}

/// Whether the op moves channels into space (true) or space into channels.
fn to_space(op: &str) -> bool {
    matches!(op, "depth_to_space" | "pixel_shuffle")
}

fn infer_shuffle(cx: &InferCx) -> Result<Vec<ValueType>> {
    let (dt, [n, c, h, w]) = nchw(cx)?;
    let f = cx.int(factor_name(cx.op_type))?;
    ensure!(f > 0, "`{}` = {f}", factor_name(cx.op_type));
    let f = f as usize;
    let map = |d: &Dim, g: &dyn Fn(usize) -> Result<usize>| -> Result<Dim> {
        Ok(match d {
            Dim::Fixed(v) => Dim::Fixed(g(*v)?),
            _ => Dim::Unknown,
        })
    };
    let div = |v: usize, by: usize| -> Result<usize> {
        ensure!(
            v.is_multiple_of(by),
            "dimension {v} is not divisible by {by}"
        );
        Ok(v / by)
    };
    let s = if to_space(cx.op_type) {
        vec![
            n,
            map(&c, &|v| div(v, f * f))?,
            map(&h, &|v| Ok(v * f))?,
            map(&w, &|v| Ok(v * f))?,
        ]
    } else {
        vec![
            n,
            map(&c, &|v| Ok(v * f * f))?,
            map(&h, &|v| div(v, f))?,
            map(&w, &|v| div(v, f))?,
        ]
    };
    Ok(vec![tensor(dt, s)])
}

fn eval_shuffle(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let f = cx.int(factor_name(cx.op_type))? as usize;
    let d = x.dims();
    ensure!(d.len() == 4, "`{}` needs a rank-4 x", cx.op_type);
    let (n, c, h, w) = (d[0], d[1], d[2], d[3]);
    let y = match cx.op_type {
        // DCR: channel (i·f + j)·C' + c goes to (h·f + i, w·f + j).
        "depth_to_space" => x
            .reshape(vec![n, f, f, c / (f * f), h, w])?
            .permute(vec![0, 3, 4, 1, 5, 2])?
            .contiguous()?
            .reshape(vec![n, c / (f * f), h * f, w * f])?,
        // CRD: channel c·f² + i·f + j goes to (h·f + i, w·f + j).
        "pixel_shuffle" => x
            .reshape(vec![n, c / (f * f), f, f, h, w])?
            .permute(vec![0, 1, 4, 2, 5, 3])?
            .contiguous()?
            .reshape(vec![n, c / (f * f), h * f, w * f])?,
        "space_to_depth" => x
            .reshape(vec![n, c, h / f, f, w / f, f])?
            .permute(vec![0, 3, 5, 1, 2, 4])?
            .contiguous()?
            .reshape(vec![n, c * f * f, h / f, w / f])?,
        "pixel_unshuffle" => x
            .reshape(vec![n, c, h / f, f, w / f, f])?
            .permute(vec![0, 1, 3, 5, 2, 4])?
            .contiguous()?
            .reshape(vec![n, c * f * f, h / f, w / f])?,
        o => bail!("`{o}` is not a shuffle"),
    };
    one(y)
}

// ---- space_to_batch / batch_to_space (TensorFlow's order: batch (i·b1 + j)·n + b) ----

/// (block [b0, b1], pads or crops [[t, b], [l, r]]) of a rank-4 op.
fn blocks(block: Vec<i64>, pads: Vec<i64>) -> Result<([usize; 2], [usize; 4])> {
    ensure!(
        block.len() == 2 && block.iter().all(|&b| b > 0),
        "block_shape {block:?} must be two positive sizes"
    );
    ensure!(
        pads.len() == 4 && pads.iter().all(|&p| p >= 0),
        "paddings / crops {pads:?} must be [2, 2] non-negative"
    );
    Ok((
        [block[0] as usize, block[1] as usize],
        [
            pads[0] as usize,
            pads[1] as usize,
            pads[2] as usize,
            pads[3] as usize,
        ],
    ))
}

fn infer_space_batch(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    ensure!(x.rank() == 4, "`{}` needs a rank-4 x", cx.op_type);
    let s = x
        .fixed_shape()
        .ok_or_else(|| anyhow!("`{}` needs a fixed shape", cx.op_type))?;
    let to_batch = cx.op_type == "space_to_batch";
    let (b, p) = blocks(
        cx.ints("block_shape")?,
        cx.ints(if to_batch { "paddings" } else { "crops" })?,
    )?;
    let out = if to_batch {
        let (h, w) = (s[2] + p[0] + p[1], s[3] + p[2] + p[3]);
        ensure!(
            h.is_multiple_of(b[0]) && w.is_multiple_of(b[1]),
            "padded spatial size {h}x{w} is not divisible by the block {b:?}"
        );
        [s[0] * b[0] * b[1], s[1], h / b[0], w / b[1]]
    } else {
        ensure!(
            s[0].is_multiple_of(b[0] * b[1]),
            "batch {} is not divisible by the block {b:?}",
            s[0]
        );
        let (h, w) = (s[2] * b[0], s[3] * b[1]);
        ensure!(
            p[0] + p[1] <= h && p[2] + p[3] <= w,
            "crops {p:?} exceed {h}x{w}"
        );
        [s[0] / (b[0] * b[1]), s[1], h - p[0] - p[1], w - p[2] - p[3]]
    };
    Ok(vec![tensor(
        x.dtype,
        out.iter().map(|&d| Dim::Fixed(d)).collect(),
    )])
}

fn eval_space_batch(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let s = x.dims().to_vec();
    let to_batch = cx.op_type == "space_to_batch";
    let (b, p) = blocks(
        cx.ints("block_shape")?,
        cx.ints(if to_batch { "paddings" } else { "crops" })?,
    )?;
    let o = cx
        .out_shape(0)
        .ok_or_else(|| anyhow!("`{}`: output shape unknown", cx.op_type))?;
    let v = kernels::to_vec::<f64>(x)?;
    let mut out = vec![0f64; o.iter().product()];
    // The batch-side tensor [N·b0·b1, C, h, w] and the space-side [N, C, H, W] (H, W
    // padded): element (k = (i·b1 + j)·N + n, c, y, x) ↔ (n, c, y·b0 + i − top, x·b1 + j − left).
    let (bs, ss) = if to_batch { (&o, &s) } else { (&s, &o) };
    let n = ss[0];
    for k in 0..bs[0] {
        let (ij, nn) = (k / n, k % n);
        let (i, j) = (ij / b[1], ij % b[1]);
        for c in 0..bs[1] {
            for y in 0..bs[2] {
                for xx in 0..bs[3] {
                    let sy = (y * b[0] + i) as i64 - p[0] as i64;
                    let sx = (xx * b[1] + j) as i64 - p[2] as i64;
                    let inside =
                        sy >= 0 && sx >= 0 && (sy as usize) < ss[2] && (sx as usize) < ss[3];
                    let bo = ((k * bs[1] + c) * bs[2] + y) * bs[3] + xx;
                    if !inside {
                        continue;
                    }
                    let so = ((nn * ss[1] + c) * ss[2] + sy as usize) * ss[3] + sx as usize;
                    if to_batch {
                        out[bo] = v[so];
                    } else {
                        out[so] = v[bo];
                    }
                }
            }
        }
    }
    one(kernels::data::from_f64(out, &o, x.dtype())?)
}

use Opset::{Ios15 as I15, Ios16 as I16, Ios17 as I17};

const CUMSUM: &[InputSpec] = &[
    req("x"),
    opt_c("axis").or(DefaultValue::Int(0)),
    opt_c("exclusive").or(DefaultValue::Bool(false)),
    opt_c("reverse").or(DefaultValue::Bool(false)),
];
const TOPK15: &[InputSpec] = &[
    req("x"),
    opt_c("k").or(DefaultValue::Int(1)),
    opt_c("axis").or(DefaultValue::Int(-1)),
    opt_c("ascending").or(DefaultValue::Bool(false)),
];
const TOPK16: &[InputSpec] = &[
    req("x"),
    opt_c("k").or(DefaultValue::Int(1)),
    opt_c("axis").or(DefaultValue::Int(-1)),
    opt_c("ascending").or(DefaultValue::Bool(false)),
    opt_c("sort"),
    opt_c("return_indices").or(DefaultValue::Bool(true)),
];
const TOPK17: &[InputSpec] = &[
    req("x"),
    opt_c("k").or(DefaultValue::Int(1)),
    opt_c("axis").or(DefaultValue::Int(-1)),
    opt_c("ascending").or(DefaultValue::Bool(false)),
    opt_c("sort"),
    opt_c("return_indices").or(DefaultValue::Bool(true)),
    opt_c("output_indices_dtype"),
];
const REVERSE: &[InputSpec] = &[req("x"), opt_c("axes")];
const REVSEQ: &[InputSpec] = &[
    req("x"),
    req("lengths"),
    opt_c("seq_axis").or(DefaultValue::Int(0)),
    opt_c("batch_axis").or(DefaultValue::Int(0)),
];
const RESHAPE_LIKE: &[InputSpec] = &[
    req("x"),
    var("ref_tensors"),
    var("begins"),
    var("ends"),
    var("end_masks"),
];
const SLIDING: &[InputSpec] = &[
    req("x"),
    req_c("axis"),
    req_c("size"),
    opt_c("stride").or(DefaultValue::Int(1)),
];

pub static DEFS: &[OpDef] = &[
    v("cumsum", I15, None, CUMSUM, infer_same, eval_cumsum),
    v("topk", I15, Some(I16), TOPK15, infer_topk, eval_topk),
    v("topk", I16, Some(I17), TOPK16, infer_topk, eval_topk),
    v("topk", I17, None, TOPK17, infer_topk, eval_topk),
    v(
        "argsort",
        I15,
        None,
        &[
            req("x"),
            opt_c("axis").or(DefaultValue::Int(-1)),
            opt_c("ascending").or(DefaultValue::Bool(false)),
        ],
        infer_argsort,
        eval_argsort,
    ),
    v(
        "fill_like",
        I16,
        None,
        &[
            req("ref_tensor"),
            opt_c("value").or(DefaultValue::Float(0.0)),
        ],
        infer_fill_like,
        eval_fill_like,
    ),
    v(
        "one_hot",
        I15,
        None,
        &[
            req("indices"),
            req("one_hot_vector_size"),
            opt_c("axis").or(DefaultValue::Int(-1)),
            opt_c("on_value").or(DefaultValue::Float(1.0)),
            opt_c("off_value").or(DefaultValue::Float(0.0)),
        ],
        infer_one_hot,
        eval_one_hot,
    ),
    v(
        "non_zero",
        I15,
        None,
        &[req("x")],
        infer_non_zero,
        eval_non_zero,
    ),
    v("reverse", I15, Some(I17), REVERSE, infer_same, eval_reverse),
    v("reverse", I17, None, REVERSE, infer_same, eval_reverse),
    v(
        "reverse_sequence",
        I15,
        Some(I17),
        REVSEQ,
        infer_same,
        eval_reverse_sequence,
    ),
    v(
        "reverse_sequence",
        I17,
        None,
        REVSEQ,
        infer_same,
        eval_reverse_sequence,
    ),
    v(
        "flatten2d",
        I15,
        None,
        &[req("x"), opt_c("axis").or(DefaultValue::Int(1))],
        infer_flatten2d,
        eval_flatten2d,
    ),
    v(
        "reshape_like",
        I16,
        Some(I17),
        RESHAPE_LIKE,
        infer_reshape_like,
        eval_to_out_shape,
    ),
    v(
        "reshape_like",
        I17,
        None,
        RESHAPE_LIKE,
        infer_reshape_like,
        eval_to_out_shape,
    ),
    v(
        "sliding_windows",
        I15,
        Some(I17),
        SLIDING,
        infer_sliding_windows,
        eval_sliding_windows,
    ),
    v(
        "sliding_windows",
        I17,
        None,
        SLIDING,
        infer_sliding_windows,
        eval_sliding_windows,
    ),
    v(
        "depth_to_space",
        I15,
        None,
        &[req("x"), req_c("block_size")],
        infer_shuffle,
        eval_shuffle,
    ),
    v(
        "space_to_depth",
        I15,
        None,
        &[req("x"), req_c("block_size")],
        infer_shuffle,
        eval_shuffle,
    ),
    v(
        "pixel_shuffle",
        I15,
        None,
        &[req("x"), req_c("upscale_factor")],
        infer_shuffle,
        eval_shuffle,
    ),
    v(
        "space_to_batch",
        I15,
        None,
        &[req("x"), req_c("block_shape"), req_c("paddings")],
        infer_space_batch,
        eval_space_batch,
    ),
    v(
        "batch_to_space",
        I15,
        None,
        &[req("x"), req_c("block_shape"), req_c("crops")],
        infer_space_batch,
        eval_space_batch,
    ),
    v(
        "pixel_unshuffle",
        I16,
        None,
        &[req("x"), req_c("downscale_factor")],
        infer_shuffle,
        eval_shuffle,
    ),
];
