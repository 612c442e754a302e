//! `conv_transpose` (iOS15: constant weight and bias; iOS17: any binding) over 1–3 spatial
//! axes of `[N, C_in, *D]`: pad types valid / same / custom, `output_shape`, strides,
//! dilations and groups, as coremltools 9 defines them (weight `[C_in, C_out/groups, *K]`;
//! output length `(D−1)·s + (K−1)·d + 1` less the pads, `D·s` for same, or `output_shape`,
//! with TF's placement of same padding: the smaller half before). Evaluation scatters each
//! input element over its kernel once (linear in input × kernel × output channels), in f64,
//! rounded once to x's dtype.

use super::eval::{one, EvalCx, RValue};
use super::infer::{float_only, tensor, InferCx};
use super::DefaultValue;
use super::{opt, opt_c, req, ver as v, Axis, InputSpec, OpDef, Weight, WeightLayout};
use crate::ir::{Dim, Opset, ValueType};
use crate::kernels;
use anyhow::{anyhow, bail, ensure, Result};

/// Strides, dilations, pad type and custom pads of one `conv_transpose`, checked.
struct Geometry {
    strides: Vec<usize>,
    dilations: Vec<usize>,
    pad_type: String,
    pad: Vec<usize>,
}

fn positive(v: Option<Vec<i64>>, n: usize, what: &str) -> Result<Vec<usize>> {
    match v {
        None => Ok(vec![1; n]),
        Some(v) => {
            ensure!(
                v.len() == n && v.iter().all(|&x| x > 0),
                "`conv_transpose`: {what} {v:?} must be {n} positive values"
            );
            Ok(v.into_iter().map(|x| x as usize).collect())
        }
    }
}

fn geometry(
    nsp: usize,
    strides: Option<Vec<i64>>,
    dilations: Option<Vec<i64>>,
    pad_type: Option<&str>,
    pad: Option<Vec<i64>>,
) -> Result<Geometry> {
    let pad_type = pad_type.unwrap_or("valid").to_string();
    ensure!(
        matches!(pad_type.as_str(), "valid" | "same" | "custom"),
        "`conv_transpose`: unknown pad_type `{pad_type}` (valid, same or custom)"
    );
    let pad = match pad {
        None => vec![0; 2 * nsp],
        Some(p) => {
            ensure!(
                p.len() == 2 * nsp && p.iter().all(|&x| x >= 0),
                "`conv_transpose`: pad {p:?} must be {} non-negative values",
                2 * nsp
            );
            p.into_iter().map(|x| x as usize).collect()
        }
    };
    Ok(Geometry {
        strides: positive(strides, nsp, "strides")?,
        dilations: positive(dilations, nsp, "dilations")?,
        pad_type,
        pad,
    })
}

impl Geometry {
    /// Length of the unpadded transposed convolution along axis `i`.
    fn full(&self, i: usize, input: usize, k: usize) -> usize {
        (input.max(1) - 1) * self.strides[i] + (k - 1) * self.dilations[i] + 1
    }
    /// Output length along axis `i` without an `output_shape`.
    fn out_len(&self, i: usize, input: usize, k: usize) -> Result<usize> {
        let full = self.full(i, input, k);
        Ok(match self.pad_type.as_str() {
            "same" => input * self.strides[i],
            "custom" => {
                let p = self.pad[2 * i] + self.pad[2 * i + 1];
                ensure!(
                    full > p,
                    "`conv_transpose`: pads {p} swallow the output length {full}"
                );
                full - p
            }
            _ => full,
        })
    }
    /// Padding cut before the output along axis `i`, for an output of length `out`.
    fn before(&self, i: usize, input: usize, k: usize, out: usize) -> usize {
        match self.pad_type.as_str() {
            "custom" => self.pad[2 * i],
            "same" => self.full(i, input, k).saturating_sub(out) / 2,
            _ => 0,
        }
    }
}

/// The spatial part of `output_shape` (given as `[N, C_out, *D]` or as `*D`).
fn output_spatial(os: &[i64], nsp: usize) -> Result<Vec<usize>> {
    let sp = match os.len() {
        n if n == nsp + 2 => &os[2..],
        n if n == nsp => os,
        n => bail!(
            "`conv_transpose`: output_shape {os:?} has {n} values, expected {nsp} or {}",
            nsp + 2
        ),
    };
    ensure!(
        sp.iter().all(|&d| d > 0),
        "`conv_transpose`: output_shape {os:?} must be positive"
    );
    Ok(sp.iter().map(|&d| d as usize).collect())
}

fn infer_conv_transpose(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    let w = cx.t("weight")?;
    float_only(x, "x")?;
    float_only(w, "weight")?;
    ensure!(
        (3..=5).contains(&x.rank()),
        "`conv_transpose` needs x of rank 3..5, is {x}"
    );
    ensure!(
        w.rank() == x.rank(),
        "`conv_transpose` weight {w} and input {x} differ in rank"
    );
    let ws = w
        .fixed_shape()
        .ok_or_else(|| anyhow!("`conv_transpose` weight needs a fixed shape"))?;
    let nsp = x.rank() - 2;
    let groups = cx.int_or_default("groups")?;
    ensure!(groups >= 1, "`conv_transpose`: groups {groups} must be ≥ 1");
    let groups = groups as usize;
    ensure!(
        ws[0] % groups == 0 && ws.iter().all(|&d| d > 0),
        "`conv_transpose`: weight {w} ([C_in, C_out/groups, *K]) with groups={groups}"
    );
    if let Dim::Fixed(cin) = x.shape[1] {
        ensure!(
            ws[0] == cin,
            "`conv_transpose`: weight {w} takes {} input channels, x {x} has {cin}",
            ws[0]
        );
    }
    let cout = ws[1] * groups;
    if let Some(b) = cx.opt_t("bias")? {
        ensure!(
            b.fixed_shape() == Some(vec![cout]),
            "`conv_transpose`: bias {b} must be [{cout}]"
        );
    }
    let g = geometry(
        nsp,
        cx.opt_ints("strides")?,
        cx.opt_ints("dilations")?,
        cx.opt_str("pad_type")?,
        cx.opt_ints("pad")?,
    )?;
    let mut out = vec![x.shape[0].clone(), Dim::Fixed(cout)];
    if let Some(os) = cx.opt_ints("output_shape")? {
        if os.len() == nsp + 2 {
            ensure!(
                os[1] as usize == cout,
                "`conv_transpose`: output_shape {os:?} has {} channels, the weight makes {cout}",
                os[1]
            );
        }
        out.extend(output_spatial(&os, nsp)?.into_iter().map(Dim::Fixed));
    } else {
        for i in 0..nsp {
            out.push(match x.shape[2 + i] {
                Dim::Fixed(d) => Dim::Fixed(g.out_len(i, d, ws[2 + i])?),
                Dim::Unknown => Dim::Unknown,
            });
        }
    }
    Ok(vec![tensor(x.dtype, out)])
}

fn eval_conv_transpose(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let w = cx.t("weight")?;
    let (xs, ws) = (x.dims().to_vec(), w.dims().to_vec());
    let nsp = xs.len() - 2;
    let groups = cx.int_or_default("groups")?.max(1) as usize;
    let g = geometry(
        nsp,
        cx.opt_ints("strides")?,
        cx.opt_ints("dilations")?,
        cx.opt_str("pad_type")?,
        cx.opt_ints("pad")?,
    )?;
    let out_sp: Vec<usize> = match cx.opt_ints("output_shape")? {
        Some(os) => output_spatial(&os, nsp)?,
        None => (0..nsp)
            .map(|i| g.out_len(i, xs[2 + i], ws[2 + i]))
            .collect::<Result<_>>()?,
    };
    // Everything as three spatial axes (leading ones of length 1).
    let lift = |v: &[usize], fill: usize| {
        let mut o = vec![fill; 3 - nsp];
        o.extend_from_slice(v);
        o
    };
    let din = lift(&xs[2..], 1);
    let k = lift(&ws[2..], 1);
    let dout = lift(&out_sp, 1);
    let s = lift(&g.strides, 1);
    let d = lift(&g.dilations, 1);
    let before: Vec<i64> = lift(
        &(0..nsp)
            .map(|i| g.before(i, xs[2 + i], ws[2 + i], out_sp[i]))
            .collect::<Vec<_>>(),
        0,
    )
    .into_iter()
    .map(|b| b as i64)
    .collect();
    let (n, cin, cog) = (xs[0], xs[1], ws[1]);
    let cig = cin / groups;
    let cout = cog * groups;
    let (nin, nk, nout) = (
        din.iter().product::<usize>(),
        k.iter().product::<usize>(),
        dout.iter().product::<usize>(),
    );
    let xv = kernels::to_vec::<f64>(x)?;
    let wv = kernels::to_vec::<f64>(w)?;
    let bias = cx.opt_t("bias")?.map(kernels::to_vec::<f64>).transpose()?;
    let mut y = vec![0f64; n * cout * nout];
    if let Some(b) = &bias {
        for (pl, chunk) in y.chunks_mut(nout.max(1)).enumerate() {
            chunk.fill(b[pl % cout]);
        }
    }
    // For each kernel tap, the output offset of every input position (or none).
    let mut taps: Vec<Vec<Option<usize>>> = Vec::with_capacity(nk);
    for kk in 0..nk {
        let kc = [kk / (k[1] * k[2]), (kk / k[2]) % k[1], kk % k[2]];
        let mut t = Vec::with_capacity(nin);
        for ii in 0..nin {
            let ic = [ii / (din[1] * din[2]), (ii / din[2]) % din[1], ii % din[2]];
            let mut off = 0usize;
            let mut inside = true;
            for a in 0..3 {
                let o = (ic[a] * s[a] + kc[a] * d[a]) as i64 - before[a];
                if o < 0 || o as usize >= dout[a] {
                    inside = false;
                    break;
                }
                off = off * dout[a] + o as usize;
            }
            t.push(inside.then_some(off));
        }
        taps.push(t);
    }
    for b in 0..n {
        for ci in 0..cin {
            let grp = ci / cig;
            let xin = &xv[(b * cin + ci) * nin..][..nin];
            for oc in 0..cog {
                let co = grp * cog + oc;
                let wk = &wv[(ci * cog + oc) * nk..][..nk];
                let yo = &mut y[(b * cout + co) * nout..][..nout];
                for (kk, t) in taps.iter().enumerate() {
                    let wt = wk[kk];
                    for (xi, off) in xin.iter().zip(t) {
                        if let Some(o) = off {
                            yo[*o] += xi * wt;
                        }
                    }
                }
            }
        }
    }
    let mut shape = vec![n, cout];
    shape.extend_from_slice(&out_sp);
    one(kernels::data::from_f64(y, &shape, x.dtype())?)
}

use Opset::{Ios15 as I15, Ios17 as I17};

// coremltools declares iOS15's weight and bias const; like `conv`'s they are accepted from
// any binding, so that a weight a constexpr op decompresses (iOS16+) loads.
const CT15: &[InputSpec] = &[
    req("x"),
    req("weight"),
    opt("bias"),
    opt_c("pad"),
    opt_c("output_shape"),
    opt_c("pad_type"),
    opt_c("strides"),
    opt_c("dilations"),
    opt_c("groups").or(DefaultValue::Int(1)),
];
const CT17: &[InputSpec] = CT15;

/// The weight `[C_in, C_out / groups, k…]` on `x` `[N, C_in, …]`.
const WEIGHT: Weight = Weight {
    input: "weight",
    layout: WeightLayout::InOut,
    x_channel_axis: Axis::At(1),
    out_channel_axis: Axis::At(1),
    packed: false,
};

pub static DEFS: &[OpDef] = &[
    v(
        "conv_transpose",
        I15,
        Some(I17),
        CT15,
        infer_conv_transpose,
        eval_conv_transpose,
    )
    .with_weight(WEIGHT),
    v(
        "conv_transpose",
        I17,
        None,
        CT17,
        infer_conv_transpose,
        eval_conv_transpose,
    )
    .with_weight(WEIGHT),
];
