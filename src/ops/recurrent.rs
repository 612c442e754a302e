//! Recurrent ops `rnn`, `gru` and `lstm` (iOS15: fp32; iOS17: fp16 or fp32; iOS18 `gru` adds
//! `reset_after` and `input_bias`), as coremltools 9 defines them and as its numpy references
//! (`ops/tests/iOS14/test_recurrent.py`) compute them: x `[s, b, I]`, states `[b, H]`
//! (`[b, 2H]` forward | backward for a bidirectional `lstm`); gate order `rnn` —,
//! `gru` `[r, o, z]`, `lstm` `[i, f, o, z]` (peephole `[i, f, o]`; `o`'s peephole reads the
//! new cell); `gru`'s candidate `act(W_o·x + R_o·(r ∘ h) + b_o)` (`reset_after`:
//! `r ∘ (R_o·h + b_ho)`); `lstm`'s `clip` bounds the cell state. A `reverse` sequence is
//! emitted in processing order; a bidirectional one aligned with the input's time (PyTorch's
//! layout), its last-step output `[forward's last | backward's last]`. One matrix-vector
//! product per gate and step, in f64, rounded once to x's dtype. Weights, biases and
//! peepholes (const in coremltools) are accepted from any binding, as `conv`'s weight is, so
//! that weights a constexpr op decompresses load.

use super::eval::{EvalCx, RValue};
use super::infer::{tensor, InferCx};
use super::DefaultValue;
use super::{opt, opt_c, req, ver as v, InputSpec, OpDef};
use crate::ir::{DType, Dim, Opset, ValueType};
use crate::kernels;
use anyhow::{anyhow, bail, ensure, Result};

/// A named activation of the recurrent ops.
fn activation(op: &str, name: &str) -> Result<fn(f64) -> f64> {
    Ok(match name.to_ascii_lowercase().as_str() {
        "sigmoid" => |x| 1.0 / (1.0 + (-x).exp()),
        "tanh" | "scaled_tanh" => f64::tanh,
        "relu" => |x| x.max(0.0),
        "linear" => |x| x,
        "hard_sigmoid" | "sigmoid_hard" => |x| (0.2 * x + 0.5).clamp(0.0, 1.0),
        other => bail!(
            "`{op}`: unknown activation `{other}` (sigmoid, tanh, scaled_tanh, relu, linear, \
             hard_sigmoid)"
        ),
    })
}

/// Gates per direction of each op.
fn gates(op: &str) -> usize {
    match op {
        "gru" => 3,
        "lstm" => 4,
        _ => 1,
    }
}

fn infer_recurrent(cx: &InferCx) -> Result<Vec<ValueType>> {
    let op = cx.op_type;
    let x = cx.t("x")?;
    let allowed = if cx.opset >= Opset::Ios17 {
        matches!(x.dtype, DType::F16 | DType::F32)
    } else {
        x.dtype == DType::F32
    };
    ensure!(
        allowed,
        "`{op}` in {}: x must be {}, is {x}",
        cx.opset.opset_name(),
        if cx.opset >= Opset::Ios17 {
            "fp16 or fp32"
        } else {
            "fp32"
        }
    );
    ensure!(x.rank() == 3, "`{op}`: x must be [s, b, I], is {x}");
    let (wi, wh) = (cx.shape("weight_ih")?, cx.shape("weight_hh")?);
    let g = gates(op);
    ensure!(
        wi.len() == 2 && wh.len() == 2 && wh[1] > 0,
        "`{op}`: weights must be rank 2, are {wi:?} and {wh:?}"
    );
    let h = wh[1];
    ensure!(
        wh[0] == g * h && wi[0] == g * h,
        "`{op}`: weight_ih {wi:?} and weight_hh {wh:?} must be [{g}·H, I] and [{g}·H, H]"
    );
    if let Dim::Fixed(i) = x.shape[2] {
        ensure!(
            wi[1] == i,
            "`{op}`: weight_ih {wi:?} takes inputs of {}, x {x} has {i}",
            wi[1]
        );
    }
    let dir = cx.str_or_default("direction")?;
    let dirs = match (dir, op) {
        ("forward" | "reverse", _) => 1,
        ("bidirectional", "lstm") => {
            for p in ["weight_ih_back", "weight_hh_back"] {
                ensure!(cx.has(p), "`lstm`: a bidirectional lstm needs `{p}`");
                let s = cx.shape(p)?;
                let want = if p == "weight_ih_back" { &wi } else { &wh };
                ensure!(&s == want, "`lstm`: `{p}` {s:?} must be {want:?}");
            }
            2
        }
        _ => bail!("`{op}`: unknown direction `{dir}`"),
    };
    let n = |p: &str| -> Result<Option<usize>> {
        Ok(cx
            .opt_t(p)?
            .map(|t| t.fixed_shape().unwrap_or_default().iter().product()))
    };
    for (p, len) in [
        ("bias", g * h),
        ("input_bias", g * h),
        ("bias_back", g * h),
        ("peephole", 3 * h),
        ("peephole_back", 3 * h),
    ] {
        if let Some(k) = n(p)? {
            ensure!(k == len, "`{op}`: `{p}` has {k} values, must be {len}");
        }
    }
    for p in ["activation", "recurrent_activation", "cell_activation"] {
        if let Some(a) = cx.opt_str(p)? {
            activation(op, a)?;
        }
    }
    let seq = cx.bool_or_default("output_sequence")?;
    let (s, b) = (x.shape[0].clone(), x.shape[1].clone());
    let hs = Dim::Fixed(dirs * h);
    for p in ["initial_h", "initial_c"] {
        if let Some(t) = cx.opt_t(p)? {
            ensure!(
                t.rank() == 2 && t.shape[1] == hs,
                "`{op}`: `{p}` {t} must be [b, {}]",
                dirs * h
            );
        }
    }
    let mut out = vec![
        tensor(
            x.dtype,
            vec![if seq { s } else { Dim::Fixed(1) }, b.clone(), hs.clone()],
        ),
        tensor(x.dtype, vec![b.clone(), hs.clone()]),
    ];
    if op == "lstm" {
        out.push(tensor(x.dtype, vec![b, hs]));
    }
    Ok(out)
}

/// `w · v` for a row-major `[rows, v.len()]` matrix.
fn matvec(w: &[f64], v: &[f64]) -> Vec<f64> {
    w.chunks(v.len().max(1))
        .map(|r| r.iter().zip(v).map(|(a, b)| a * b).sum())
        .collect()
}

/// One direction's parameters.
struct Dir {
    wi: Vec<f64>,
    wh: Vec<f64>,
    bias: Vec<f64>,
    /// iOS18 `gru`: the input-side bias (the hidden-side one is `bias`).
    in_bias: Vec<f64>,
    peep: Vec<f64>,
}

/// The activations and options of one op.
struct Acts {
    act: fn(f64) -> f64,
    rec: fn(f64) -> f64,
    cell: fn(f64) -> f64,
    clip: Option<f64>,
    reset_after: bool,
}

/// One step of `op` from state (h, c) on input `x`; returns the new (h, c).
fn step(
    op: &str,
    d: &Dir,
    a: &Acts,
    hsz: usize,
    x: &[f64],
    h: &[f64],
    c: &[f64],
) -> (Vec<f64>, Vec<f64>) {
    let gi = matvec(&d.wi, x);
    match op {
        "rnn" => {
            let gh = matvec(&d.wh, h);
            let h = (0..hsz)
                .map(|k| (a.act)(gi[k] + gh[k] + d.bias[k]))
                .collect();
            (h, vec![])
        }
        "gru" => {
            let gh = matvec(&d.wh, h);
            let ib = |k: usize| d.in_bias[k] + gi[k];
            let gate = |g: usize| -> Vec<f64> {
                (0..hsz)
                    .map(|k| (a.rec)(ib(g * hsz + k) + gh[g * hsz + k] + d.bias[g * hsz + k]))
                    .collect()
            };
            let (r, z) = (gate(0), gate(2));
            let wo = &d.wh[hsz * hsz..2 * hsz * hsz];
            let cand: Vec<f64> = if a.reset_after {
                (0..hsz)
                    .map(|k| (a.act)(ib(hsz + k) + r[k] * (gh[hsz + k] + d.bias[hsz + k])))
                    .collect()
            } else {
                let rh: Vec<f64> = h.iter().zip(&r).map(|(h, r)| h * r).collect();
                let oh = matvec(wo, &rh);
                (0..hsz)
                    .map(|k| (a.act)(ib(hsz + k) + oh[k] + d.bias[hsz + k]))
                    .collect()
            };
            let h = (0..hsz)
                .map(|k| (1.0 - z[k]) * cand[k] + z[k] * h[k])
                .collect();
            (h, vec![])
        }
        _ => {
            let gh = matvec(&d.wh, h);
            let pre = |g: usize, k: usize| gi[g * hsz + k] + gh[g * hsz + k] + d.bias[g * hsz + k];
            let mut nh = vec![0.0; hsz];
            let mut nc = vec![0.0; hsz];
            for k in 0..hsz {
                let i = (a.rec)(pre(0, k) + c[k] * d.peep[k]);
                let f = (a.rec)(pre(1, k) + c[k] * d.peep[hsz + k]);
                let z = (a.cell)(pre(3, k));
                let mut cc = f * c[k] + i * z;
                if let Some(t) = a.clip {
                    cc = cc.clamp(-t, t);
                }
                let o = (a.rec)(pre(2, k) + cc * d.peep[2 * hsz + k]);
                nh[k] = o * (a.act)(cc);
                nc[k] = cc;
            }
            (nh, nc)
        }
    }
}

fn eval_recurrent(cx: &EvalCx) -> Result<Vec<RValue>> {
    let op = cx.op_type;
    let x = cx.t("x")?;
    let [s, b, isz] = x.dims() else {
        bail!("`{op}`: x must be rank 3");
    };
    let (s, b, isz) = (*s, *b, *isz);
    let hsz = cx.t("weight_hh")?.dims()[1];
    let g = gates(op);
    let vals = |n: &str| -> Result<Option<Vec<f64>>> {
        cx.opt_t(n)?.map(kernels::to_vec::<f64>).transpose()
    };
    let dir_of = |suffix: &str| -> Result<Dir> {
        let req = |n: &str| -> Result<Vec<f64>> {
            vals(&format!("{n}{suffix}"))?.ok_or_else(|| anyhow!("`{op}` needs `{n}{suffix}`"))
        };
        Ok(Dir {
            wi: req("weight_ih")?,
            wh: req("weight_hh")?,
            bias: vals(&format!("bias{suffix}"))?.unwrap_or(vec![0.0; g * hsz]),
            in_bias: vals("input_bias")?.unwrap_or(vec![0.0; g * hsz]),
            peep: vals(&format!("peephole{suffix}"))?.unwrap_or(vec![0.0; 3 * hsz]),
        })
    };
    let act_of = |n: &str, d: &str| activation(op, cx.opt_str(n)?.unwrap_or(d));
    let acts = Acts {
        act: act_of("activation", "tanh")?,
        rec: act_of("recurrent_activation", "sigmoid")?,
        cell: act_of("cell_activation", "tanh")?,
        clip: cx.opt_f64("clip")?,
        reset_after: cx.opt_bool("reset_after")?.unwrap_or(false),
    };
    let dir = cx.str_or_default("direction")?;
    let seq = cx.bool_or_default("output_sequence")?;
    let dirs: Vec<(Dir, bool)> = match dir {
        "forward" => vec![(dir_of("")?, false)],
        "reverse" => vec![(dir_of("")?, true)],
        _ => vec![(dir_of("")?, false), (dir_of("_back")?, true)],
    };
    let nd = dirs.len();
    let xv = kernels::to_vec::<f64>(x)?;
    let h0 = vals("initial_h")?.ok_or_else(|| anyhow!("`{op}` needs `initial_h`"))?;
    let c0 = vals("initial_c")?.unwrap_or(vec![0.0; b * nd * hsz]);
    let width = nd * hsz;
    let os = if seq { s } else { 1 };
    let mut y = vec![0.0; os * b * width];
    let mut hn = vec![0.0; b * width];
    let mut cn = vec![0.0; b * width];
    for (di, (d, rev)) in dirs.iter().enumerate() {
        for bi in 0..b {
            let off = bi * width + di * hsz;
            let mut h = h0[off..off + hsz].to_vec();
            let mut c = c0[off..off + hsz].to_vec();
            for k in 0..s {
                let t = if *rev { s - 1 - k } else { k };
                let xt = &xv[(t * b + bi) * isz..][..isz];
                (h, c) = step(op, d, &acts, hsz, xt, &h, &c);
                // Bidirectional: aligned with input time; reverse alone: processing order.
                let at = if nd == 2 { t } else { k };
                if seq {
                    y[(at * b + bi) * width + di * hsz..][..hsz].copy_from_slice(&h);
                }
            }
            if !seq {
                y[bi * width + di * hsz..][..hsz].copy_from_slice(&h);
            }
            hn[off..off + hsz].copy_from_slice(&h);
            if op == "lstm" {
                cn[off..off + hsz].copy_from_slice(&c);
            }
        }
    }
    let dt = x.dtype();
    let mut out = vec![
        RValue::T(kernels::data::from_f64(y, &[os, b, width], dt)?),
        RValue::T(kernels::data::from_f64(hn, &[b, width], dt)?),
    ];
    if op == "lstm" {
        out.push(RValue::T(kernels::data::from_f64(cn, &[b, width], dt)?));
    }
    Ok(out)
}

use Opset::{Ios15 as I15, Ios17 as I17, Ios18 as I18};

const RNN: &[InputSpec] = &[
    req("x"),
    req("initial_h"),
    req("weight_ih"),
    req("weight_hh"),
    opt("bias"),
    opt_c("direction").or(DefaultValue::Str("forward")),
    opt_c("output_sequence").or(DefaultValue::Bool(false)),
    opt_c("activation"),
];
const GRU: &[InputSpec] = &[
    req("x"),
    req("initial_h"),
    req("weight_ih"),
    req("weight_hh"),
    opt("bias"),
    opt_c("direction").or(DefaultValue::Str("forward")),
    opt_c("output_sequence").or(DefaultValue::Bool(false)),
    opt_c("recurrent_activation"),
    opt_c("activation"),
];
const GRU18: &[InputSpec] = &[
    req("x"),
    req("initial_h"),
    req("weight_ih"),
    req("weight_hh"),
    opt("bias"),
    opt_c("direction").or(DefaultValue::Str("forward")),
    opt_c("output_sequence").or(DefaultValue::Bool(false)),
    opt_c("recurrent_activation"),
    opt_c("activation"),
    opt_c("reset_after"),
    opt("input_bias"),
];
const LSTM: &[InputSpec] = &[
    req("x"),
    req("initial_h"),
    req("initial_c"),
    req("weight_ih"),
    req("weight_hh"),
    opt("bias"),
    opt("peephole"),
    opt("weight_ih_back"),
    opt("weight_hh_back"),
    opt("bias_back"),
    opt("peephole_back"),
    opt_c("direction").or(DefaultValue::Str("forward")),
    opt_c("output_sequence").or(DefaultValue::Bool(false)),
    opt_c("recurrent_activation"),
    opt_c("cell_activation"),
    opt_c("activation"),
    opt_c("clip"),
];

pub static DEFS: &[OpDef] = &[
    v("rnn", I15, Some(I17), RNN, infer_recurrent, eval_recurrent),
    v("rnn", I17, None, RNN, infer_recurrent, eval_recurrent),
    v("gru", I15, Some(I17), GRU, infer_recurrent, eval_recurrent),
    v("gru", I17, Some(I18), GRU, infer_recurrent, eval_recurrent),
    v("gru", I18, None, GRU18, infer_recurrent, eval_recurrent),
    v(
        "lstm",
        I15,
        Some(I17),
        LSTM,
        infer_recurrent,
        eval_recurrent,
    ),
    v("lstm", I17, None, LSTM, infer_recurrent, eval_recurrent),
];
