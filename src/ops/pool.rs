//! Pooling (`avg_pool`, `max_pool`, `l2_pool` over 1–3 spatial axes of `[N, C, *D]`, pad
//! types valid / same / same_lower / custom, `ceil_mode`, `exclude_padding_from_average`) and
//! the normalisations `instance_norm`, `l2_norm` and `local_response_norm`: type inference
//! and evaluation, each one pass over its windows in f64, rounded once to x's dtype.

use super::eval::{one, EvalCx, RValue};
use super::infer::{float_only, tensor, InferCx};
use super::nn::conv_pads;
use super::DefaultValue;
use super::{opt_c, req, req_c, ver as v, InputSpec, OpDef};
use crate::ir::{Dim, Opset, ValueType};
use crate::kernels::{self, data::strides};
use anyhow::{anyhow, ensure, Result};

/// Kernel, strides, (before, after) pads and output lengths of one pooling.
struct Window {
    k: Vec<usize>,
    s: Vec<usize>,
    pads: Vec<(usize, usize)>,
    out: Vec<usize>,
}

fn window(
    op: &str,
    input: &[usize],
    k: Vec<i64>,
    s: Option<Vec<i64>>,
    pad_type: &str,
    pad: Option<Vec<i64>>,
    ceil: bool,
) -> Result<Window> {
    let n = input.len();
    ensure!(
        k.len() == n && k.iter().all(|&x| x > 0),
        "`{op}`: kernel_sizes {k:?} for {n} spatial axes"
    );
    let k: Vec<usize> = k.into_iter().map(|x| x as usize).collect();
    let s: Vec<usize> = match s {
        Some(s) => {
            ensure!(
                s.len() == n && s.iter().all(|&x| x > 0),
                "`{op}`: strides {s:?}"
            );
            s.into_iter().map(|x| x as usize).collect()
        }
        None => vec![1; n],
    };
    let pads = conv_pads(
        pad_type,
        input,
        &k,
        &s,
        &vec![1; n],
        &pad.unwrap_or_default(),
    )?;
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let padded = input[i] + pads[i].0 + pads[i].1;
        ensure!(
            padded >= k[i],
            "`{op}`: kernel {} exceeds the padded length {padded}",
            k[i]
        );
        let o = match pad_type {
            "same" | "same_lower" => input[i].div_ceil(s[i]),
            _ if ceil => (padded - k[i]).div_ceil(s[i]) + 1,
            _ => (padded - k[i]) / s[i] + 1,
        };
        out.push(o);
    }
    Ok(Window { k, s, pads, out })
}

fn infer_pool(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    float_only(x, "x")?;
    ensure!(
        (3..=5).contains(&x.rank()),
        "`{}` needs x of rank 3..5, is {x}",
        cx.op_type
    );
    let Some(xs) = x.fixed_shape() else {
        let mut s = x.shape[..2].to_vec();
        s.extend(std::iter::repeat_n(Dim::Unknown, x.rank() - 2));
        return Ok(vec![tensor(x.dtype, s)]);
    };
    let pt = cx
        .opt_str("pad_type")?
        .ok_or_else(|| anyhow!("`{}` needs `pad_type`", cx.op_type))?;
    let w = window(
        cx.op_type,
        &xs[2..],
        cx.ints("kernel_sizes")?,
        cx.opt_ints("strides")?,
        pt,
        cx.opt_ints("pad")?,
        cx.bool_or_default("ceil_mode")?,
    )?;
    let mut s = x.shape[..2].to_vec();
    s.extend(w.out.iter().map(|&d| Dim::Fixed(d)));
    Ok(vec![tensor(x.dtype, s)])
}

fn eval_pool(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let xs = x.dims().to_vec();
    let sp = &xs[2..];
    let pt = cx
        .opt_str("pad_type")?
        .ok_or_else(|| anyhow!("`{}` needs `pad_type`", cx.op_type))?;
    let w = window(
        cx.op_type,
        sp,
        cx.ints("kernel_sizes")?,
        cx.opt_ints("strides")?,
        pt,
        cx.opt_ints("pad")?,
        cx.bool_or_default("ceil_mode")?,
    )?;
    // max_pool and l2_pool have no such parameter: absent means false for them too.
    let exclude = cx
        .opt_bool("exclude_padding_from_average")?
        .unwrap_or(false);
    let kind = cx.op_type;
    let xv = kernels::to_vec::<f64>(x)?;
    let planes = xs[0] * xs[1];
    let (in_n, out_n): (usize, usize) = (sp.iter().product(), w.out.iter().product());
    let (ist, ost, kst) = (strides(sp), strides(&w.out), strides(&w.k));
    let kn: usize = w.k.iter().product();
    let mut out = vec![0f64; planes * out_n];
    let nd = sp.len();
    let mut pos = vec![0i64; nd];
    for o in 0..out_n {
        for d in 0..nd {
            pos[d] = ((o / ost[d]) % w.out[d] * w.s[d]) as i64 - w.pads[d].0 as i64;
        }
        for p in 0..planes {
            let base = p * in_n;
            let (mut acc, mut cnt) = (
                if kind == "max_pool" {
                    f64::NEG_INFINITY
                } else {
                    0.0
                },
                0usize,
            );
            for kk in 0..kn {
                let mut off = 0usize;
                let mut inside = true;
                for d in 0..nd {
                    let c = pos[d] + ((kk / kst[d]) % w.k[d]) as i64;
                    if c < 0 || c as usize >= sp[d] {
                        inside = false;
                        break;
                    }
                    off += c as usize * ist[d];
                }
                if !inside {
                    continue;
                }
                let e = xv[base + off];
                cnt += 1;
                match kind {
                    "max_pool" => acc = acc.max(e),
                    "l2_pool" => acc += e * e,
                    _ => acc += e,
                }
            }
            out[p * out_n + o] = match kind {
                "max_pool" => acc,
                "l2_pool" => acc.sqrt(),
                _ if exclude => acc / cnt.max(1) as f64,
                _ => acc / kn as f64,
            };
        }
    }
    let mut shape = xs[..2].to_vec();
    shape.extend_from_slice(&w.out);
    one(kernels::data::from_f64(out, &shape, x.dtype())?)
}

fn infer_norm(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    float_only(x, "x")?;
    let min = match cx.op_type {
        "instance_norm" | "l2_norm" | "local_response_norm" => 3,
        _ => 1,
    };
    ensure!(
        x.rank() >= min,
        "`{}` needs x of rank ≥ {min}, is {x}",
        cx.op_type
    );
    Ok(vec![ValueType::Tensor(x.clone())])
}

fn eps(cx: &EvalCx, default: f64) -> Result<f64> {
    Ok(cx.opt_f64("epsilon")?.unwrap_or(default))
}

fn eval_instance_norm(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let d = x.dims();
    ensure!(d.len() >= 3, "instance_norm needs x of rank ≥ 3");
    let (c, inner): (usize, usize) = (d[1], d[2..].iter().product());
    let e = eps(cx, 1e-5)?;
    let gamma = cx.opt_t("gamma")?.map(kernels::to_vec::<f64>).transpose()?;
    let beta = cx.opt_t("beta")?.map(kernels::to_vec::<f64>).transpose()?;
    for (n, p) in [("gamma", &gamma), ("beta", &beta)] {
        if let Some(p) = p {
            ensure!(
                p.len() == c,
                "`{n}` has {} entries for {c} channels",
                p.len()
            );
        }
    }
    let mut v = kernels::to_vec::<f64>(x)?;
    for (pi, plane) in v.chunks_mut(inner.max(1)).enumerate() {
        let ch = pi % c;
        let mean = plane.iter().sum::<f64>() / inner as f64;
        let var = plane.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / inner as f64;
        let inv = 1.0 / (var + e).sqrt();
        let (g, b) = (
            gamma.as_ref().map_or(1.0, |g| g[ch]),
            beta.as_ref().map_or(0.0, |b| b[ch]),
        );
        plane
            .iter_mut()
            .for_each(|x| *x = (*x - mean) * inv * g + b);
    }
    one(kernels::data::from_f64(v, d, x.dtype())?)
}

fn eval_l2_norm(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let d = x.dims();
    ensure!(d.len() >= 3, "l2_norm needs x of rank ≥ 3");
    let inner: usize = d[d.len() - 3..].iter().product();
    let e = eps(cx, 1e-6)?;
    let mut v = kernels::to_vec::<f64>(x)?;
    for b in v.chunks_mut(inner.max(1)) {
        let inv = 1.0 / (b.iter().map(|x| x * x).sum::<f64>() + e).sqrt();
        b.iter_mut().for_each(|x| *x *= inv);
    }
    one(kernels::data::from_f64(v, d, x.dtype())?)
}

fn eval_lrn(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let d = x.dims();
    ensure!(d.len() >= 3, "local_response_norm needs x of rank ≥ 3");
    let size = cx.int("size")?;
    ensure!(size > 0, "local_response_norm: size {size}");
    let size = size as usize;
    let alpha = cx.f64_or_default("alpha")?;
    let beta = cx.f64_or_default("beta")?;
    let k = cx.f64_or_default("k")?;
    let (n, c, inner) = (d[0], d[1], d[2..].iter().product::<usize>());
    let v = kernels::to_vec::<f64>(x)?;
    let mut out = vec![0f64; v.len()];
    // Channels c - size/2 ..= c + (size-1)/2, as PyTorch's LocalResponseNorm; a running
    // sum over channels keeps it linear in size.
    let (lo, hi) = (size / 2, (size - 1) / 2);
    for b in 0..n {
        for i in 0..inner {
            let at = |ch: usize| (b * c + ch) * inner + i;
            let sq = |ch: usize| v[at(ch)] * v[at(ch)];
            let mut sum: f64 = (0..=hi.min(c - 1)).map(sq).sum();
            for ch in 0..c {
                if ch > 0 {
                    if ch + hi < c {
                        sum += sq(ch + hi);
                    }
                    if ch > lo {
                        sum -= sq(ch - lo - 1);
                    }
                }
                out[at(ch)] = v[at(ch)] / (k + alpha / size as f64 * sum.max(0.0)).powf(beta);
            }
        }
    }
    one(kernels::data::from_f64(out, d, x.dtype())?)
}

use Opset::{Ios15 as I15, Ios17 as I17};

const POOL: &[InputSpec] = &[
    req("x"),
    req_c("kernel_sizes"),
    opt_c("strides"),
    req_c("pad_type"),
    opt_c("pad"),
    opt_c("ceil_mode").or(DefaultValue::Bool(false)),
];
const AVG: &[InputSpec] = &[
    req("x"),
    req_c("kernel_sizes"),
    opt_c("strides"),
    req_c("pad_type"),
    opt_c("pad"),
    opt_c("ceil_mode").or(DefaultValue::Bool(false)),
    opt_c("exclude_padding_from_average").or(DefaultValue::Bool(false)),
];
const INST: &[InputSpec] = &[req("x"), opt_c("gamma"), opt_c("beta"), opt_c("epsilon")];
const L2N: &[InputSpec] = &[req("x"), opt_c("epsilon")];
const LRN: &[InputSpec] = &[
    req("x"),
    req_c("size"),
    opt_c("alpha").or(DefaultValue::Float(1e-4)),
    opt_c("beta").or(DefaultValue::Float(0.75)),
    opt_c("k").or(DefaultValue::Float(1.0)),
];

pub static DEFS: &[OpDef] = &[
    v("avg_pool", I15, None, AVG, infer_pool, eval_pool),
    v("max_pool", I15, None, POOL, infer_pool, eval_pool),
    v("l2_pool", I15, None, POOL, infer_pool, eval_pool),
    v(
        "instance_norm",
        I15,
        Some(I17),
        INST,
        infer_norm,
        eval_instance_norm,
    ),
    v(
        "instance_norm",
        I17,
        None,
        INST,
        infer_norm,
        eval_instance_norm,
    ),
    v("l2_norm", I15, Some(I17), L2N, infer_norm, eval_l2_norm),
    v("l2_norm", I17, None, L2N, infer_norm, eval_l2_norm),
    v(
        "local_response_norm",
        I15,
        Some(I17),
        LRN,
        infer_norm,
        eval_lrn,
    ),
    v("local_response_norm", I17, None, LRN, infer_norm, eval_lrn),
];
