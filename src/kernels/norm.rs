//! Row-wise maths over chosen axes: softmax, layer normalisation, per-channel affine maps and
//! reductions. The chosen axes are brought to the end (a copy only when they are not already
//! there), every row is processed in f32 (reductions accumulate in f64) on its own rayon
//! task, and results are rounded once to the output dtype. Layer normalisation over axes
//! followed by others (a BC1S `[B, C, 1, S]` over its channels) instead runs down the
//! columns as they lie (`ColumnNorm`): the same f32 operations in the same order, no copy.

use super::data::with_slice;
use super::data::{from_f32, from_f64, from_vec, is_float, map_rows, to_f32_vec, to_vec};
use super::fastmath;
use super::gemv::Isa;
use anyhow::{ensure, Result};
use candle_core::{DType, Tensor};
use half::f16;
use rayon::prelude::*;

/// `t` with `axes` (sorted, distinct) moved last and made contiguous, plus the permutation
/// applied (None when the axes already were last) and the row length.
fn rows_last(t: &Tensor, axes: &[usize]) -> Result<(Tensor, Option<Vec<usize>>, usize)> {
    let r = t.rank();
    for w in axes.windows(2) {
        ensure!(w[0] < w[1], "axes {axes:?} must be sorted and distinct");
    }
    ensure!(
        axes.iter().all(|&a| a < r),
        "axes {axes:?} out of range for rank {r}"
    );
    let n: usize = axes.iter().map(|&a| t.dims()[a]).product();
    // The rows are already contiguous when every axis after the first normalised one is
    // normalised or of size 1 (BC1S `[1, C, 1, 1]` over axis 1): no permutation then.
    let first = axes.first().copied().unwrap_or(r);
    let trailing = (first..r).all(|a| axes.contains(&a) || t.dims()[a] == 1);
    if trailing {
        return Ok((t.clone(), None, n));
    }
    let mut perm: Vec<usize> = (0..r).filter(|a| !axes.contains(a)).collect();
    perm.extend_from_slice(axes);
    Ok((t.permute(perm.as_slice())?.contiguous()?, Some(perm), n))
}

/// Undoes [`rows_last`] on a result of the permuted shape.
fn restore(v: Tensor, perm: Option<Vec<usize>>) -> Result<Tensor> {
    match perm {
        None => Ok(v),
        Some(p) => {
            let mut inv = vec![0; p.len()];
            for (i, &a) in p.iter().enumerate() {
                inv[a] = i;
            }
            Ok(v.permute(inv.as_slice())?.contiguous()?)
        }
    }
}

/// Softmax over `axis`, computed in f32 with the row maximum subtracted; keeps the dtype.
pub fn softmax(t: &Tensor, axis: usize) -> Result<Tensor> {
    ensure!(is_float(t.dtype()), "softmax of a {:?} tensor", t.dtype());
    let (x, perm, n) = rows_last(t, &[axis])?;
    if n == 0 {
        return Ok(t.clone());
    }
    let y = map_rows(&x, n, |row| {
        let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        row.iter_mut().for_each(|e| *e = fastmath::exp(*e - m));
        let inv = 1.0 / row.iter().sum::<f32>();
        row.iter_mut().for_each(|e| *e *= inv);
    })?;
    restore(y, perm)
}

/// `(x − mean) / sqrt(var + eps) · gamma + beta` over `axes` (sorted); `gamma`/`beta` hold
/// one value per normalised element, in row-major order of the normalised axes.
pub fn layer_norm(
    t: &Tensor,
    axes: &[usize],
    gamma: Option<&[f32]>,
    beta: Option<&[f32]>,
    eps: f32,
) -> Result<Tensor> {
    layer_norm_on(t, axes, gamma, beta, eps, Isa::best())
}

/// [`layer_norm`] with its column kernel's instruction set capped at `isa` (the result is
/// the same bits whatever the level: every level does the same f32 operations in the same
/// order; tests and benchmarks time or check the narrower ones).
pub fn layer_norm_on(
    t: &Tensor,
    axes: &[usize],
    gamma: Option<&[f32]>,
    beta: Option<&[f32]>,
    eps: f32,
    isa: Isa,
) -> Result<Tensor> {
    ensure!(
        is_float(t.dtype()),
        "layer_norm of a {:?} tensor",
        t.dtype()
    );
    if let Some((outer, n, inner)) = columns(t.dims(), axes) {
        for p in [gamma, beta].into_iter().flatten() {
            ensure!(
                p.len() == n,
                "layer_norm parameter has {} values for rows of {n}",
                p.len()
            );
        }
        let shape = Shape3 { outer, n, inner };
        let norm = ColumnNorm { gamma, beta, eps };
        return match t.dtype() {
            DType::F16 => {
                let y = with_slice(t, |x: &[f16]| norm.run(x, shape, isa))?;
                from_vec(y, t.dims())
            }
            DType::F32 => {
                let y = with_slice(t, |x: &[f32]| norm.run(x, shape, isa))?;
                from_vec(y, t.dims())
            }
            d => {
                let x = to_f32_vec(t)?;
                from_f32(norm.run(&x, shape, isa), t.dims(), d)
            }
        };
    }
    layer_norm_rows(t, axes, gamma, beta, eps)
}

/// [`layer_norm`] by rows: the normalised axes moved last (a permuted copy when they are
/// not), each row on its own. What every shape the column kernel does not take runs, and
/// the reference the column kernel is checked and timed against.
pub fn layer_norm_rows(
    t: &Tensor,
    axes: &[usize],
    gamma: Option<&[f32]>,
    beta: Option<&[f32]>,
    eps: f32,
) -> Result<Tensor> {
    ensure!(
        is_float(t.dtype()),
        "layer_norm of a {:?} tensor",
        t.dtype()
    );
    let (x, perm, n) = rows_last(t, axes)?;
    for p in [gamma, beta].into_iter().flatten() {
        ensure!(
            p.len() == n,
            "layer_norm parameter has {} values for rows of {n}",
            p.len()
        );
    }
    if n == 0 {
        return Ok(t.clone());
    }
    let y = map_rows(&x, n, |row| {
        let mean = row.iter().sum::<f32>() / n as f32;
        let var = row.iter().map(|e| (e - mean) * (e - mean)).sum::<f32>() / n as f32;
        let inv = 1.0 / (var + eps).sqrt();
        for (i, e) in row.iter_mut().enumerate() {
            let y = (*e - mean) * inv;
            *e = y * gamma.map_or(1.0, |g| g[i]) + beta.map_or(0.0, |b| b[i]);
        }
    })?;
    restore(y, perm)
}

/// `[outer, n, inner]` when `axes` (sorted) are consecutive and followed by axes whose
/// product `inner` is above 1: every normalised row then lies across `n` rows of `inner`
/// contiguous values (a BC1S `[B, C, 1, S]` over axis 1), which the column kernel reads as
/// they lie. None otherwise (no axes, gaps, or rows already contiguous).
fn columns(dims: &[usize], axes: &[usize]) -> Option<(usize, usize, usize)> {
    let (&first, &last) = (axes.first()?, axes.last()?);
    if last >= dims.len() || last - first + 1 != axes.len() {
        return None;
    }
    let inner: usize = dims[last + 1..].iter().product();
    let n: usize = dims[first..=last].iter().product();
    let outer: usize = dims[..first].iter().product();
    (inner > 1 && n > 0 && outer > 0).then_some((outer, n, inner))
}

/// A tensor seen as `outer` blocks of `n` rows of `inner` values, normalised down the `n`.
#[derive(Clone, Copy)]
struct Shape3 {
    outer: usize,
    n: usize,
    inner: usize,
}

/// Frames (columns) one task of the column kernel holds: its f32 sums and a row's slice
/// stay in L1 while it streams the `n` rows.
const FRAMES: usize = 128;

/// Elements the column kernel reads and writes: widened to f32 a row slice at a time, the
/// results rounded once.
trait ColElem: Copy + Send + Sync + Default {
    fn widen(src: &[Self], dst: &mut [f32]);
    fn narrow(src: &[f32], dst: &mut [Self]);
}

impl ColElem for f16 {
    fn widen(src: &[f16], dst: &mut [f32]) {
        super::convert::f16_to_f32(src, dst)
    }
    fn narrow(src: &[f32], dst: &mut [f16]) {
        super::convert::f32_to_f16(src, dst)
    }
}

impl ColElem for f32 {
    fn widen(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src)
    }
    fn narrow(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src)
    }
}

/// A raw output pointer shared by the column tasks, each writing its own columns.
#[derive(Clone, Copy)]
struct OutPtr<T>(*mut T);
// SAFETY: the tasks write disjoint elements (distinct column ranges or blocks).
unsafe impl<T> Send for OutPtr<T> {}
unsafe impl<T> Sync for OutPtr<T> {}

/// Layer normalisation down columns: the row-wise maths of [`layer_norm`] (mean, then the
/// mean of squared deviations, each summed in f32 from −0 in row order; `1 / sqrt(var +
/// eps)`; `(x − mean) · inv · gamma + beta`), done for [`FRAMES`] columns at once, so
/// every pass streams whole row slices, the loops run across columns in vector lanes, and
/// the results are the bits the rows-last path gives.
struct ColumnNorm<'a> {
    gamma: Option<&'a [f32]>,
    beta: Option<&'a [f32]>,
    eps: f32,
}

impl ColumnNorm<'_> {
    fn run<T: ColElem>(&self, x: &[T], s: Shape3, isa: Isa) -> Vec<T> {
        let mut out = vec![T::default(); x.len()];
        // Enough tasks for every thread, columns in whole vectors where the rows allow.
        let threads = rayon::current_num_threads().max(1);
        let per = s.inner.div_ceil(2 * threads).div_ceil(16) * 16;
        let width = per.clamp(16, FRAMES).min(s.inner);
        let blocks = s.inner.div_ceil(width);
        let o = OutPtr(out.as_mut_ptr());
        (0..s.outer * blocks).into_par_iter().for_each(|task| {
            let (b, blk) = (task / blocks, task % blocks);
            let j0 = blk * width;
            let w = width.min(s.inner - j0);
            let base = b * s.n * s.inner + j0;
            // SAFETY: rows base + c·inner .. + w lie inside `x` and `out` (same length); no
            // other task writes these columns of block b. The vector levels are only
            // chosen where the CPU has them.
            unsafe {
                match isa.min(Isa::cpu()) {
                    #[cfg(target_arch = "x86_64")]
                    Isa::Avx512 => self.cols_avx512(x, o, base, w, s),
                    #[cfg(target_arch = "x86_64")]
                    Isa::Avx2 => self.cols_avx2(x, o, base, w, s),
                    _ => self.cols(x, o, base, w, s),
                }
            }
        });
        out
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn cols_avx512<T: ColElem>(
        &self,
        x: &[T],
        o: OutPtr<T>,
        base: usize,
        w: usize,
        s: Shape3,
    ) {
        self.cols(x, o, base, w, s)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn cols_avx2<T: ColElem>(
        &self,
        x: &[T],
        o: OutPtr<T>,
        base: usize,
        w: usize,
        s: Shape3,
    ) {
        self.cols(x, o, base, w, s)
    }

    /// Columns `base .. base + w` (w ≤ [`FRAMES`]) of one block, all three passes.
    #[inline(always)]
    unsafe fn cols<T: ColElem>(&self, x: &[T], o: OutPtr<T>, base: usize, w: usize, s: Shape3) {
        let mut buf = [0f32; FRAMES];
        let mut acc = [-0f32; FRAMES];
        let (buf, acc) = (&mut buf[..w], &mut acc[..w]);
        let row = |c: usize| &x[base + c * s.inner..base + c * s.inner + w];
        for c in 0..s.n {
            T::widen(row(c), buf);
            for (a, v) in acc.iter_mut().zip(buf.iter()) {
                *a += *v;
            }
        }
        let nf = s.n as f32;
        let mut mean = [0f32; FRAMES];
        let mean = &mut mean[..w];
        for (m, a) in mean.iter_mut().zip(acc.iter_mut()) {
            *m = *a / nf;
            *a = -0.0;
        }
        for c in 0..s.n {
            T::widen(row(c), buf);
            for ((a, v), m) in acc.iter_mut().zip(buf.iter()).zip(mean.iter()) {
                let d = *v - *m;
                *a += d * d;
            }
        }
        // acc becomes 1 / sqrt(var + eps).
        for a in acc.iter_mut() {
            *a = 1.0 / (*a / nf + self.eps).sqrt();
        }
        let mut res = [T::default(); FRAMES];
        let res = &mut res[..w];
        for c in 0..s.n {
            T::widen(row(c), buf);
            let g = self.gamma.map_or(1.0, |g| g[c]);
            let b = self.beta.map_or(0.0, |b| b[c]);
            for ((v, m), inv) in buf.iter_mut().zip(mean.iter()).zip(acc.iter()) {
                let y = (*v - *m) * *inv;
                *v = y * g + b;
            }
            T::narrow(buf, res);
            // SAFETY: see `run`.
            std::ptr::copy_nonoverlapping(res.as_ptr(), o.0.add(base + c * s.inner), w);
        }
    }
}

/// `x · scale[c] + shift[c]` where `c` indexes `axis` (batch norm folded to an affine map).
pub fn channel_affine(t: &Tensor, axis: usize, scale: &[f32], shift: &[f32]) -> Result<Tensor> {
    ensure!(
        axis < t.rank(),
        "axis {axis} out of range for rank {}",
        t.rank()
    );
    let c = t.dims()[axis];
    ensure!(
        scale.len() == c && shift.len() == c,
        "per-channel parameters need {c} values"
    );
    let inner: usize = t.dims()[axis + 1..].iter().product();
    let mut v = to_f32_vec(t)?;
    if inner > 0 {
        v.par_chunks_mut(inner).enumerate().for_each(|(k, row)| {
            let ch = k % c;
            row.iter_mut().for_each(|e| *e = *e * scale[ch] + shift[ch]);
        });
    }
    from_f32(v, t.dims(), t.dtype())
}

/// What a reduction computes over each row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduce {
    Sum,
    Mean,
    Max,
    Min,
    Prod,
    /// sqrt(Σ x²)
    L2,
    /// Σ |x|
    L1,
    /// Σ x²
    SumSquare,
    /// log Σ exp(x), with the maximum subtracted first
    LogSumExp,
    /// log Σ x
    LogSum,
    /// index of the first maximum (i32 result)
    ArgMax,
    /// index of the first minimum (i32 result)
    ArgMin,
}

fn reduce_row<T: Copy + Into<f64>>(row: &[T], how: Reduce) -> f64 {
    let it = row.iter().map(|&x| x.into());
    match how {
        Reduce::Sum => it.sum(),
        Reduce::Mean => it.sum::<f64>() / row.len() as f64,
        Reduce::Max => it.fold(f64::NEG_INFINITY, f64::max),
        Reduce::Min => it.fold(f64::INFINITY, f64::min),
        Reduce::Prod => it.product(),
        Reduce::L2 => it.map(|x| x * x).sum::<f64>().sqrt(),
        Reduce::L1 => it.map(f64::abs).sum(),
        Reduce::SumSquare => it.map(|x| x * x).sum(),
        Reduce::LogSum => it.sum::<f64>().ln(),
        Reduce::LogSumExp => {
            let m = row
                .iter()
                .map(|&x| x.into())
                .fold(f64::NEG_INFINITY, f64::max);
            if m.is_infinite() {
                return m;
            }
            m + it.map(|x| (x - m).exp()).sum::<f64>().ln()
        }
        Reduce::ArgMax | Reduce::ArgMin => {
            let mut best = 0usize;
            for (i, x) in it.enumerate() {
                let b: f64 = row[best].into();
                let better = if how == Reduce::ArgMax { x > b } else { x < b };
                if better {
                    best = i;
                }
            }
            best as f64
        }
    }
}

/// Elements below which [`reduce`] runs on the calling thread.
const PAR_MIN: usize = 1 << 15;

/// Reduces `axes` (sorted) of `t`; the result has the reduced axes removed, or kept as 1
/// with `keep_dims`. Its dtype is `t`'s, or i32 for ArgMax/ArgMin.
pub fn reduce(t: &Tensor, axes: &[usize], keep_dims: bool, how: Reduce) -> Result<Tensor> {
    // A small tensor reduced over one run of consecutive axes is read in place, each row
    // gathered in the order the permuted copy would hold it (same bits, no strided copy:
    // that copy was most of a decode step's 40 µs mean over its alignment heads).
    let run = axes.windows(2).all(|w| w[1] == w[0] + 1);
    if run && !axes.is_empty() && t.elem_count() < PAR_MIN && is_float(t.dtype()) {
        if let Some(out) = reduce_in_place(t, axes, how)? {
            return reduced(t, axes, keep_dims, how, out);
        }
    }
    let (x, _, n) = rows_last(t, axes)?;
    // Rows reduced on their own, in parallel only where there is enough work to share: a
    // decode step's [1, 6, 1, 1500] mean over heads is 1500 rows of 6, where a task per
    // row cost ~40× the arithmetic.
    fn rows<T: Copy + Into<f64> + Sync>(v: &[T], n: usize, how: Reduce) -> Vec<f64> {
        if v.len() < PAR_MIN {
            v.chunks(n).map(|r| reduce_row(r, how)).collect()
        } else {
            let per = (PAR_MIN / n).max(1) * n;
            v.par_chunks(per)
                .flat_map_iter(|c| c.chunks(n).map(|r| reduce_row(r, how)))
                .collect()
        }
    }
    let out: Vec<f64> = if n == 0 {
        vec![0.0; x.elem_count()]
    } else if is_float(t.dtype()) && t.dtype() != DType::F64 {
        rows(&to_f32_vec(&x)?, n, how)
    } else {
        rows(&to_vec::<f64>(&x)?, n, how)
    };
    reduced(t, axes, keep_dims, how, out)
}

/// [`reduce`] of a float tensor over the consecutive `axes` without moving them: the
/// values seen as `[outer, n, inner]`, each of the `outer · inner` rows gathered in `n`
/// order. None for f64 (the general path reads it as f64).
fn reduce_in_place(t: &Tensor, axes: &[usize], how: Reduce) -> Result<Option<Vec<f64>>> {
    if t.dtype() == DType::F64 {
        return Ok(None);
    }
    let d = t.dims();
    let (a0, a1) = (axes[0], axes[axes.len() - 1]);
    let outer: usize = d[..a0].iter().product();
    let n: usize = d[a0..=a1].iter().product();
    let inner: usize = d[a1 + 1..].iter().product();
    if n == 0 {
        return Ok(Some(vec![0.0; outer * inner]));
    }
    let v = to_f32_vec(t)?;
    // Sums and extrema run down the columns, `inner` rows at once: per row the same f64
    // operations in the same order as `reduce_row` (sums start where `Iterator::sum`
    // starts), so the same bits.
    fn down(
        v: &[f32],
        (outer, n, inner): (usize, usize, usize),
        init: f64,
        f: impl Fn(f64, f64) -> f64,
    ) -> Vec<f64> {
        let mut out = vec![init; outer * inner];
        for (o, acc) in out.chunks_mut(inner).enumerate() {
            for c in 0..n {
                let col = &v[(o * n + c) * inner..][..inner];
                acc.iter_mut()
                    .zip(col)
                    .for_each(|(a, &x)| *a = f(*a, x as f64));
            }
        }
        out
    }
    let dims = (outer, n, inner);
    match how {
        Reduce::Sum | Reduce::Mean => {
            let mut out = down(&v, dims, std::iter::empty::<f64>().sum(), |a, x| a + x);
            if how == Reduce::Mean {
                out.iter_mut().for_each(|a| *a /= n as f64);
            }
            return Ok(Some(out));
        }
        Reduce::Max => return Ok(Some(down(&v, dims, f64::NEG_INFINITY, f64::max))),
        Reduce::Min => return Ok(Some(down(&v, dims, f64::INFINITY, f64::min))),
        _ => {}
    }
    let mut row = vec![0f32; n];
    let mut out = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for i in 0..inner {
            for (c, r) in row.iter_mut().enumerate() {
                *r = v[(o * n + c) * inner + i];
            }
            out.push(reduce_row(&row, how));
        }
    }
    Ok(Some(out))
}

/// The reduced values `out` in `reduce`'s result shape and dtype.
fn reduced(
    t: &Tensor,
    axes: &[usize],
    keep_dims: bool,
    how: Reduce,
    out: Vec<f64>,
) -> Result<Tensor> {
    let shape: Vec<usize> = t
        .dims()
        .iter()
        .enumerate()
        .filter_map(|(i, &d)| {
            if axes.contains(&i) {
                keep_dims.then_some(1)
            } else {
                Some(d)
            }
        })
        .collect();
    if matches!(how, Reduce::ArgMax | Reduce::ArgMin) {
        return from_vec(
            out.into_iter().map(|i| i as i32).collect::<Vec<i32>>(),
            &shape,
        );
    }
    from_f64(out, &shape, t.dtype())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_over_middle_axis() {
        let v: Vec<f32> = (0..24).map(|i| (i as f32 * 0.37).sin() * 4.0).collect();
        let t = from_vec(v.clone(), &[2, 3, 4]).unwrap();
        let s = to_vec::<f32>(&softmax(&t, 1).unwrap()).unwrap();
        for a in 0..2 {
            for c in 0..4 {
                let z: f32 = (0..3).map(|b| v[a * 12 + b * 4 + c].exp()).sum();
                for b in 0..3 {
                    let i = a * 12 + b * 4 + c;
                    assert!((s[i] - v[i].exp() / z).abs() < 1e-6);
                }
            }
        }
    }

    /// Layer norm of `v` seen as `[outer, n, inner]` down the `n`, in f64.
    fn layer_norm_f64(
        v: &[f64],
        (outer, n, inner): (usize, usize, usize),
        g: &[f64],
        b: &[f64],
        eps: f64,
    ) -> Vec<f64> {
        let mut out = vec![0.0; v.len()];
        for o in 0..outer {
            for j in 0..inner {
                let at = |c: usize| o * n * inner + c * inner + j;
                let mean = (0..n).map(|c| v[at(c)]).sum::<f64>() / n as f64;
                let var = (0..n).map(|c| (v[at(c)] - mean).powi(2)).sum::<f64>() / n as f64;
                for c in 0..n {
                    out[at(c)] = (v[at(c)] - mean) / (var + eps).sqrt() * g[c] + b[c];
                }
            }
        }
        out
    }

    #[test]
    fn channel_layer_norm_of_an_odd_bc1s_tensor_matches_f64_and_the_row_path_bit_for_bit() {
        let (b, c, s) = (2, 37, 203);
        let v: Vec<f32> = (0..b * c * s)
            .map(|i| (i as f32 * 0.731).sin() * 3.0 + (i % 7) as f32 * 0.25)
            .collect();
        let g: Vec<f32> = (0..c).map(|i| 0.5 + i as f32 * 0.03).collect();
        let be: Vec<f32> = (0..c).map(|i| (i as f32 * 0.4).cos() * 0.2).collect();
        let eps = 1e-5;
        for dtype in [DType::F16, DType::F32] {
            let t = from_f32(v.clone(), &[b, c, 1, s], dtype).unwrap();
            let xv: Vec<f64> = to_f32_vec(&t).unwrap().iter().map(|&x| x as f64).collect();
            let g64: Vec<f64> = g.iter().map(|&x| x as f64).collect();
            let b64: Vec<f64> = be.iter().map(|&x| x as f64).collect();
            let want = layer_norm_f64(&xv, (b, c, s), &g64, &b64, eps as f64);
            let rows = layer_norm_rows(&t, &[1], Some(&g), Some(&be), eps).unwrap();
            let rows = to_f32_vec(&rows).unwrap();
            for isa in [Isa::Avx512, Isa::Avx2, Isa::Portable] {
                let y = layer_norm_on(&t, &[1], Some(&g), Some(&be), eps, isa).unwrap();
                assert_eq!(y.dtype(), dtype);
                assert_eq!(y.dims(), &[b, c, 1, s]);
                let y = to_f32_vec(&y).unwrap();
                // f32 maths, then one rounding: within an fp16 half-ulp (plus f32 noise).
                let tol = |w: f64| match dtype {
                    DType::F16 => w.abs() * 4.9e-4 + 1e-6,
                    _ => w.abs() * 1e-5 + 1e-5,
                };
                for (i, (&a, &w)) in y.iter().zip(&want).enumerate() {
                    assert!(
                        (a as f64 - w).abs() <= tol(w),
                        "{dtype:?} {isa:?} [{i}]: {a} vs {w}"
                    );
                }
                let same = y.iter().zip(&rows).all(|(a, r)| a.to_bits() == r.to_bits());
                assert!(same, "{dtype:?} {isa:?}: not the row path's bits");
            }
        }
    }

    #[test]
    fn layer_norm_over_two_middle_axes_without_parameters_matches_f64() {
        let dims = [3, 4, 5, 7];
        let v: Vec<f32> = (0..420)
            .map(|i| (i as f32 * 1.37).cos() * 2.0 - 0.3)
            .collect();
        let t = from_vec(v.clone(), &dims).unwrap();
        let y = to_f32_vec(&layer_norm(&t, &[1, 2], None, None, 1e-3).unwrap()).unwrap();
        let xv: Vec<f64> = v.iter().map(|&x| x as f64).collect();
        let want = layer_norm_f64(&xv, (3, 20, 7), &[1.0; 20], &[0.0; 20], 1e-3);
        for (a, w) in y.iter().zip(&want) {
            assert!((*a as f64 - w).abs() < 2e-5 * (1.0 + w.abs()), "{a} vs {w}");
        }
        // Not consecutive: the permuting path, same numbers.
        let z = layer_norm(&t, &[1, 3], None, None, 1e-3).unwrap();
        assert_eq!(z.dims(), &dims);
    }

    #[test]
    fn reduce_two_axes_keep_dims() {
        let v: Vec<f32> = (0..24).map(|i| i as f32).collect();
        let t = from_vec(v, &[2, 3, 4]).unwrap();
        let r = reduce(&t, &[0, 2], true, Reduce::Sum).unwrap();
        assert_eq!(r.dims(), &[1, 3, 1]);
        let want: Vec<f32> = (0..3)
            .map(|b| {
                (0..2)
                    .flat_map(|a| (0..4).map(move |c| (a * 12 + b * 4 + c) as f32))
                    .sum()
            })
            .collect();
        assert_eq!(to_vec::<f32>(&r).unwrap(), want);
        let am = reduce(&t, &[1], false, Reduce::ArgMax).unwrap();
        assert_eq!(to_vec::<i32>(&am).unwrap(), vec![2; 8]);
    }

    /// The in-place path (small tensors, consecutive axes) against sums and extrema done
    /// in f64 in the test, row by row in axis order, and against the permuting path: a
    /// column of −0 keeps its sign, and every reduction gives the same bits both ways.
    #[test]
    fn small_reductions_over_middle_axes_match_float64_rows_bit_for_bit() {
        let dims = [2usize, 6, 3, 5];
        let mut v: Vec<f32> = (0..180)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.173)
            .collect();
        // Column (o = 0, i = 4) of axes [1, 2] all −0: its sum and mean stay −0.
        for c in 0..18 {
            v[c * 5 + 4] = -0.0;
        }
        let t = from_vec(v.clone(), &dims).unwrap();
        for axes in [&[1usize][..], &[1, 2], &[2, 3]] {
            let a0 = axes[0];
            let a1 = axes[axes.len() - 1];
            let outer: usize = dims[..a0].iter().product();
            let n: usize = dims[a0..=a1].iter().product();
            let inner: usize = dims[a1 + 1..].iter().product();
            for how in [
                Reduce::Sum,
                Reduce::Mean,
                Reduce::Max,
                Reduce::Min,
                Reduce::L2,
            ] {
                let got = to_vec::<f32>(&reduce(&t, axes, false, how).unwrap()).unwrap();
                let mut want = vec![];
                for o in 0..outer {
                    for i in 0..inner {
                        let row: Vec<f64> =
                            (0..n).map(|c| v[(o * n + c) * inner + i] as f64).collect();
                        let sum = row.iter().fold(-0.0f64, |a, &x| a + x);
                        want.push(match how {
                            Reduce::Sum => sum,
                            Reduce::Mean => sum / n as f64,
                            Reduce::Max => row.iter().fold(f64::NEG_INFINITY, |a, &x| a.max(x)),
                            Reduce::Min => row.iter().fold(f64::INFINITY, |a, &x| a.min(x)),
                            _ => row.iter().map(|x| x * x).sum::<f64>().sqrt(),
                        } as f32);
                    }
                }
                let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{how:?} over {axes:?}");
                // The permuting path (as a larger tensor takes it) gives the same bits.
                let (x, _, rn) = rows_last(&t, axes).unwrap();
                let rows: Vec<f32> = to_f32_vec(&x)
                    .unwrap()
                    .chunks(rn)
                    .map(|r| reduce_row(r, how) as f32)
                    .collect();
                assert_eq!(bits(&got), bits(&rows), "{how:?} over {axes:?}, permuted");
            }
        }
        let z = reduce(&t, &[1, 2], false, Reduce::Sum).unwrap();
        assert_eq!(to_vec::<f32>(&z).unwrap()[4].to_bits(), (-0.0f32).to_bits());
    }
}
