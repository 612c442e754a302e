//! Contractions in f32: batched matmul with transpose flags and numpy batch broadcasting
//! (candle's gemm, multi-threaded), 1-D/2-D convolution as im2col + matmul, and two-operand
//! einsum reduced to one batched matmul. Inputs of any float dtype are converted to f32;
//! results are f32 for the caller to round once. Under bf16 products (`--compute bf16`), a
//! convolution with a packed weight runs its im2col columns through `kernels::gemm`'s bf16
//! GEMM instead ([`conv_bf16`]), rounded and activated in that GEMM's store.

use super::data::{to_f32, to_f32_vec};
use super::elementwise::broadcast_shape;
use anyhow::{bail, ensure, Result};
use candle_core::Tensor;
use rayon::prelude::*;
use std::collections::BTreeMap;

/// `op(a) @ op(b)` where `op` transposes the last two axes when its flag is set. Rank-1
/// operands act as a row (`a`) or column (`b`) vector whose unit axis is dropped from the
/// result, as in numpy. Batch axes broadcast. Returns f32.
pub fn matmul(a: &Tensor, b: &Tensor, ta: bool, tb: bool) -> Result<Tensor> {
    ensure!(a.rank() >= 1 && b.rank() >= 1, "matmul of a scalar");
    let (a1, b1) = (a.rank() == 1, b.rank() == 1);
    let a = if a1 {
        to_f32(a)?.unsqueeze(0)?
    } else {
        to_f32(a)?
    };
    let b = if b1 {
        to_f32(b)?.unsqueeze(1)?
    } else {
        to_f32(b)?
    };
    let (ta, tb) = (ta && !a1, tb && !b1);
    let (ar, br) = (a.rank(), b.rank());
    let (a_rows, a_cols) = (a.dims()[ar - 2], a.dims()[ar - 1]);
    let (b_rows, b_cols) = (b.dims()[br - 2], b.dims()[br - 1]);
    let (m, k) = if ta {
        (a_cols, a_rows)
    } else {
        (a_rows, a_cols)
    };
    let (k2, n) = if tb {
        (b_cols, b_rows)
    } else {
        (b_rows, b_cols)
    };
    ensure!(
        k == k2,
        "matmul inner dimensions differ: {:?} × {:?} (transpose {ta}/{tb})",
        a.dims(),
        b.dims()
    );
    let (abatch, bbatch) = (&a.dims()[..ar - 2], &b.dims()[..br - 2]);
    let batch = broadcast_shape(abatch, bbatch)?;
    let nb: usize = batch.iter().product();
    let (na, nbb) = (
        abatch.iter().product::<usize>(),
        bbatch.iter().product::<usize>(),
    );
    let out = if nbb == 1 && !ta && na == nb {
        // A batch-free rhs: fold every batch of lhs into the rows of one gemm.
        let a2 = a.contiguous()?.reshape((na * m, k))?;
        let b2 = b.contiguous()?.reshape((b_rows, b_cols))?;
        let b2 = if tb { b2.t()? } else { b2 };
        a2.matmul(&b2)?
    } else {
        let a3 = batched(&a, na, nb, &batch)?;
        let b3 = batched(&b, nbb, nb, &batch)?;
        let a3 = if ta { a3.transpose(1, 2)? } else { a3 };
        let b3 = if tb { b3.transpose(1, 2)? } else { b3 };
        a3.matmul(&b3)?
    };
    let mut shape = batch;
    if !a1 {
        shape.push(m);
    }
    if !b1 {
        shape.push(n);
    }
    Ok(out.reshape(shape)?)
}

/// `t` [..batch, r, c] as [nb, r, c]: batch axes flattened, broadcast to `batch` (a zero
/// stride when `t` has a single batch, a copy for partial broadcasts).
fn batched(t: &Tensor, own: usize, nb: usize, batch: &[usize]) -> Result<Tensor> {
    let r = t.rank();
    let (rows, cols) = (t.dims()[r - 2], t.dims()[r - 1]);
    if own == nb && t.dims()[..r - 2] == *batch {
        return Ok(t.contiguous()?.reshape((nb, rows, cols))?);
    }
    if own == 1 {
        return Ok(t
            .contiguous()?
            .reshape((1, rows, cols))?
            .broadcast_as((nb, rows, cols))?);
    }
    let mut full = batch.to_vec();
    full.extend([rows, cols]);
    let lead = vec![1; full.len() - r];
    let t = t.reshape([lead, t.dims().to_vec()].concat())?;
    Ok(t.broadcast_as(full)?
        .contiguous()?
        .reshape((nb, rows, cols))?)
}

/// Geometry of a convolution over 1, 2 or 3 spatial axes.
#[derive(Clone, Debug)]
pub struct ConvParams {
    pub strides: Vec<usize>,
    pub dilations: Vec<usize>,
    /// (before, after) padding per spatial axis.
    pub pads: Vec<(usize, usize)>,
    pub groups: usize,
}

/// A convolution's sizes, as 3-D (2-D with a unit depth, 1-D with unit depth and height).
struct Geometry {
    nsp: usize,
    n: usize,
    c: usize,
    d: usize,
    h: usize,
    wi: usize,
    o: usize,
    kd: usize,
    kh: usize,
    kw: usize,
    sd: usize,
    sh: usize,
    sw: usize,
    dd: usize,
    dh: usize,
    dw: usize,
    pf: usize,
    pt: usize,
    pl: usize,
    od: usize,
    ho: usize,
    wo: usize,
}

impl Geometry {
    /// Checks `x`'s and `w`'s dims against `p` (1, 2 or 3 spatial axes).
    fn of(xd: &[usize], wd: &[usize], p: &ConvParams) -> Result<Geometry> {
        let nsp = xd.len().saturating_sub(2);
        ensure!(
            (1..=3).contains(&nsp),
            "convolution over {nsp} spatial axes is not supported (1, 2 or 3)"
        );
        ensure!(
            wd.len() == xd.len(),
            "conv weight {wd:?} and input {xd:?} differ in rank"
        );
        ensure!(
            p.strides.len() == nsp && p.dilations.len() == nsp && p.pads.len() == nsp,
            "conv geometry needs {nsp} values per parameter"
        );
        // Every per-axis list as three values (depth, height, width), the missing leading
        // axes of size 1.
        let lead = 3 - nsp;
        let three = |v: &[usize], unit: usize| -> [usize; 3] {
            let mut out = [unit; 3];
            out[lead..].copy_from_slice(v);
            out
        };
        let [d, h, wi] = three(&xd[2..], 1);
        let [kd, kh, kw] = three(&wd[2..], 1);
        let [sd, sh, sw] = three(&p.strides, 1);
        let [dd, dh, dw] = three(&p.dilations, 1);
        let mut pads = [(0, 0); 3];
        pads[lead..].copy_from_slice(&p.pads);
        let [(pf, pk), (pt, pb), (pl, pr)] = pads;
        let (n, c, o, cg) = (xd[0], xd[1], wd[0], wd[1]);
        let g = p.groups;
        ensure!(
            g >= 1 && c == cg * g && o % g == 0,
            "conv: {c} input channels, weight {wd:?}, groups {g}"
        );
        ensure!(
            [sd, sh, sw, dd, dh, dw].iter().all(|&v| v > 0),
            "conv strides and dilations must be positive"
        );
        ensure!(
            kd > 0 && kh > 0 && kw > 0,
            "conv kernel {wd:?} has an empty axis"
        );
        let (ed, eh, ew) = (dd * (kd - 1) + 1, dh * (kh - 1) + 1, dw * (kw - 1) + 1);
        ensure!(
            d + pf + pk >= ed && h + pt + pb >= eh && wi + pl + pr >= ew,
            "conv kernel {wd:?} larger than padded input {xd:?}"
        );
        let od = (d + pf + pk - ed) / sd + 1;
        let (ho, wo) = ((h + pt + pb - eh) / sh + 1, (wi + pl + pr - ew) / sw + 1);
        Ok(Geometry {
            nsp,
            n,
            c,
            d,
            h,
            wi,
            o,
            kd,
            kh,
            kw,
            sd,
            sh,
            sw,
            dd,
            dh,
            dw,
            pf,
            pt,
            pl,
            od,
            ho,
            wo,
        })
    }

    /// Kernel taps per input channel.
    fn taps(&self) -> usize {
        self.kd * self.kh * self.kw
    }

    /// Output positions.
    fn positions(&self) -> usize {
        self.od * self.ho * self.wo
    }

    /// The columns of one batch entry `xs` (`[C, D, H, W]` f32): row (ch, kz, ki, kj) of
    /// `[C·KD·KH·KW][OD·HO·WO]` holds input channel ch at kernel offset (kz, ki, kj) for
    /// every output position, zero in the padding — the right operand of
    /// `W [O, C·KD·KH·KW] · cols`.
    fn im2col(&self, xs: &[f32]) -> Vec<f32> {
        let (d, h, wi, kh, kw, ho, wo) =
            (self.d, self.h, self.wi, self.kh, self.kw, self.ho, self.wo);
        let taps = self.taps();
        let mut cols = vec![0f32; self.c * taps * self.positions()];
        cols.par_chunks_mut(self.positions())
            .enumerate()
            .for_each(|(row, dst)| {
                let (ch, tap) = (row / taps, row % taps);
                let (kz, ki, kj) = (tap / (kh * kw), (tap / kw) % kh, tap % kw);
                let volume = &xs[ch * d * h * wi..(ch + 1) * d * h * wi];
                for oz in 0..self.od {
                    let iz = (oz * self.sd + kz * self.dd) as isize - self.pf as isize;
                    if iz < 0 || iz >= d as isize {
                        continue;
                    }
                    let plane = &volume[iz as usize * h * wi..(iz as usize + 1) * h * wi];
                    let out = &mut dst[oz * ho * wo..(oz + 1) * ho * wo];
                    for oy in 0..ho {
                        let iy = (oy * self.sh + ki * self.dh) as isize - self.pt as isize;
                        let line = &mut out[oy * wo..(oy + 1) * wo];
                        if iy < 0 || iy >= h as isize {
                            continue;
                        }
                        let src = &plane[iy as usize * wi..(iy as usize + 1) * wi];
                        for (ox, d) in line.iter_mut().enumerate() {
                            let ix = (ox * self.sw + kj * self.dw) as isize - self.pl as isize;
                            if ix >= 0 && (ix as usize) < wi {
                                *d = src[ix as usize];
                            }
                        }
                    }
                }
            });
        cols
    }

    /// The output's dims: `[N, O, *S_out]`.
    fn out_dims(&self) -> Vec<usize> {
        let all = [self.od, self.ho, self.wo];
        let mut dims = vec![self.n, self.o];
        dims.extend(&all[3 - self.nsp..]);
        dims
    }
}

/// Cross-correlation of `x` [N, C, *S] with `w` [O, C/groups, *K] (1, 2 or 3 spatial
/// axes), plus `bias` [O]; returns f32 [N, O, *S_out].
pub fn conv(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, p: &ConvParams) -> Result<Tensor> {
    let geo = Geometry::of(x.dims(), w.dims(), p)?;
    let (n, c, o, g) = (geo.n, geo.c, geo.o, p.groups);
    let (space, positions) = (geo.d * geo.h * geo.wi, geo.positions());
    let kk = (c / g) * geo.taps();
    let wt = to_f32(w)?.contiguous()?.reshape((g, o / g, kk))?;
    let pointwise = geo.taps() == 1
        && p.strides.iter().all(|&s| s == 1)
        && p.pads.iter().all(|&(a, b)| a + b == 0);
    let x32 = to_f32(x)?.contiguous()?;
    let mut outs = Vec::with_capacity(n);
    for b in 0..n {
        let xb = x32.get(b)?;
        let cols = if pointwise {
            xb.reshape((g, c / g, space))?
        } else {
            let cols = geo.im2col(&to_f32_vec(&xb)?);
            Tensor::from_vec(cols, (g, kk, positions), x.device())?
        };
        outs.push(wt.matmul(&cols)?.reshape((o, positions))?);
    }
    let mut y = Tensor::stack(&outs, 0)?;
    if let Some(bias) = bias {
        ensure!(
            bias.elem_count() == o,
            "conv bias has {} values for {o} channels",
            bias.elem_count()
        );
        y = y.broadcast_add(&to_f32(bias)?.reshape((1, o, 1))?)?;
    }
    Ok(y.reshape(geo.out_dims())?)
}

/// [`conv`] of an ungrouped `x` with a packed weight `w` `[O, C, *K]` on bf16 products
/// (`--compute bf16`): each batch entry's columns ([`Geometry::im2col`], f32) times `w` by
/// `gemm::gemm_bf16_then` — both operands rounded to bfloat16, f32 sums, plus `bias`,
/// rounded once to `dtype` (fp16 or f32) with `post` (a GELU) in the same store, as
/// [`gemm::conv1x1_then`](super::gemm::conv1x1_then) does. `None` for other dtypes or
/// groups (the caller's general path takes those); an error where the CPU lacks
/// AVX512-BF16.
pub fn conv_bf16(
    x: &Tensor,
    w: &super::gemv::PackedWeight,
    bias: Option<&[f32]>,
    post: Option<super::fastmath::Gelu>,
    dtype: candle_core::DType,
    p: &ConvParams,
) -> Result<Option<Tensor>> {
    use super::gemm::{gemm_bf16_then, Act, Out};
    use candle_core::DType;
    if p.groups != 1 || !matches!(dtype, DType::F16 | DType::F32) {
        return Ok(None);
    }
    let geo = Geometry::of(x.dims(), &w.shape, p)?;
    let (n, o, m) = (geo.n, geo.o, geo.positions());
    ensure!(
        w.n == o && w.k == geo.c * geo.taps(),
        "conv weight [{}, {}] packed for {:?}",
        w.n,
        w.k,
        w.shape
    );
    let mut y32 = vec![0f32; if dtype == DType::F32 { n * o * m } else { 0 }];
    let mut y16 = vec![half::f16::ZERO; if dtype == DType::F16 { n * o * m } else { 0 }];
    for b in 0..n {
        let cols = geo.im2col(&to_f32_vec(&x.get(b)?)?);
        let out = match dtype {
            DType::F32 => Out::F32(&mut y32[b * o * m..(b + 1) * o * m]),
            _ => Out::F16(&mut y16[b * o * m..(b + 1) * o * m]),
        };
        gemm_bf16_then(w, Act::F32(&cols), m, m, bias, post, out)?;
    }
    let dims = geo.out_dims();
    Ok(Some(match dtype {
        DType::F32 => super::data::from_vec(y32, &dims)?,
        _ => super::data::from_vec(y16, &dims)?,
    }))
}

/// Parses `"ab,bc->ac"` into operand subscripts and output subscripts (implicit output: the
/// letters used once, alphabetically).
fn parse_einsum(eq: &str) -> Result<(Vec<Vec<char>>, Vec<char>)> {
    let eq: String = eq.chars().filter(|c| !c.is_whitespace()).collect();
    ensure!(
        !eq.contains("..."),
        "einsum ellipsis is not supported: `{eq}`"
    );
    let (lhs, out) = match eq.split_once("->") {
        Some((l, o)) => (l.to_string(), Some(o.chars().collect::<Vec<_>>())),
        None => (eq.clone(), None),
    };
    let terms: Vec<Vec<char>> = lhs.split(',').map(|t| t.chars().collect()).collect();
    for t in terms.iter().chain(out.iter()) {
        ensure!(
            t.iter().all(|c| c.is_ascii_alphabetic()),
            "einsum subscripts must be letters: `{eq}`"
        );
        let mut s = t.clone();
        s.sort();
        s.dedup();
        ensure!(
            s.len() == t.len(),
            "einsum `{eq}`: repeated subscripts within one term are not supported"
        );
    }
    let out = out.unwrap_or_else(|| {
        let mut count = BTreeMap::new();
        terms
            .iter()
            .flatten()
            .for_each(|c| *count.entry(*c).or_insert(0) += 1);
        count
            .into_iter()
            .filter(|(_, n)| *n == 1)
            .map(|(c, _)| c)
            .collect()
    });
    Ok((terms, out))
}

/// Einstein summation over one or two operands (any contraction without repeated
/// subscripts in a term). Returns f32.
pub fn einsum(eq: &str, operands: &[&Tensor]) -> Result<Tensor> {
    let (terms, out) = parse_einsum(eq)?;
    ensure!(
        terms.len() == operands.len(),
        "einsum `{eq}` has {} terms for {} operands",
        terms.len(),
        operands.len()
    );
    ensure!(
        matches!(terms.len(), 1 | 2),
        "einsum with {} operands is not supported",
        terms.len()
    );
    let mut size = BTreeMap::new();
    for (t, x) in terms.iter().zip(operands) {
        ensure!(
            t.len() == x.rank(),
            "einsum term `{}` for an operand of shape {:?}",
            t.iter().collect::<String>(),
            x.dims()
        );
        for (c, &d) in t.iter().zip(x.dims()) {
            match size.get(c) {
                Some(&e) if e != d && e != 1 && d != 1 => {
                    bail!("einsum `{eq}`: subscript {c} is {e} and {d}")
                }
                Some(&e) if e != 1 => {}
                _ => {
                    size.insert(*c, d);
                }
            }
        }
    }
    for c in &out {
        ensure!(
            size.contains_key(c),
            "einsum `{eq}`: output subscript {c} is not an input subscript"
        );
    }
    // Sum out letters that occur in only one operand and not in the output.
    let mut xs = Vec::new();
    let mut ts = Vec::new();
    for (i, (t, x)) in terms.iter().zip(operands).enumerate() {
        let others: Vec<char> = terms
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .flat_map(|(_, t)| t.clone())
            .collect();
        let drop: Vec<usize> = (0..t.len())
            .filter(|&k| !out.contains(&t[k]) && !others.contains(&t[k]))
            .collect();
        let x = to_f32(x)?;
        let x = if drop.is_empty() {
            x
        } else {
            super::norm::reduce(&x, &drop, false, super::norm::Reduce::Sum)?
        };
        ts.push(
            t.iter()
                .enumerate()
                .filter(|(k, _)| !drop.contains(k))
                .map(|(_, c)| *c)
                .collect::<Vec<_>>(),
        );
        xs.push(x);
    }
    let (y, letters) = if xs.len() == 1 {
        (xs.remove(0), ts.remove(0))
    } else {
        let (l, r) = (&ts[0], &ts[1]);
        let batch: Vec<char> = l
            .iter()
            .filter(|c| r.contains(c) && out.contains(c))
            .copied()
            .collect();
        let contract: Vec<char> = l
            .iter()
            .filter(|c| r.contains(c) && !out.contains(c))
            .copied()
            .collect();
        let lfree: Vec<char> = l.iter().filter(|c| !r.contains(c)).copied().collect();
        let rfree: Vec<char> = r.iter().filter(|c| !l.contains(c)).copied().collect();
        let dims = |cs: &[char]| cs.iter().map(|c| size[c]).collect::<Vec<usize>>();
        let arrange = |x: &Tensor,
                       t: &[char],
                       order: &[char],
                       shape3: (usize, usize, usize)|
         -> Result<Tensor> {
            let perm: Vec<usize> = order
                .iter()
                .map(|c| t.iter().position(|d| d == c).unwrap_or(0))
                .collect();
            let p = x.permute(perm.as_slice())?;
            Ok(p.broadcast_as(dims(order))?.contiguous()?.reshape(shape3)?)
        };
        let (nb, m, k, n) = (
            dims(&batch).iter().product(),
            dims(&lfree).iter().product(),
            dims(&contract).iter().product(),
            dims(&rfree).iter().product(),
        );
        let a = arrange(
            &xs[0],
            l,
            &[batch.clone(), lfree.clone(), contract.clone()].concat(),
            (nb, m, k),
        )?;
        let b = arrange(
            &xs[1],
            r,
            &[batch.clone(), contract, rfree.clone()].concat(),
            (nb, k, n),
        )?;
        let letters = [batch, lfree, rfree].concat();
        (a.matmul(&b)?.reshape(dims(&letters))?, letters)
    };
    let perm: Vec<usize> = out
        .iter()
        .map(|c| letters.iter().position(|d| d == c).unwrap_or(0))
        .collect();
    let want: Vec<usize> = out.iter().map(|c| size[c]).collect();
    let y = y.permute(perm.as_slice())?;
    Ok(if y.dims() == want.as_slice() {
        y.contiguous()?
    } else {
        y.broadcast_as(want)?.contiguous()?
    })
}
