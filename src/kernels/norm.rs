//! Row-wise maths over chosen axes: softmax, layer normalisation, per-channel affine maps and
//! reductions. The chosen axes are brought to the end (a copy only when they are not already
//! there), every row is processed in f32 (reductions accumulate in f64) on its own rayon
//! task, and results are rounded once to the output dtype.

use super::data::{from_f32, from_f64, from_vec, is_float, map_rows, to_f32_vec, to_vec};
use super::fastmath;
use anyhow::{ensure, Result};
use candle_core::{DType, Tensor};
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

/// Reduces `axes` (sorted) of `t`; the result has the reduced axes removed, or kept as 1
/// with `keep_dims`. Its dtype is `t`'s, or i32 for ArgMax/ArgMin.
pub fn reduce(t: &Tensor, axes: &[usize], keep_dims: bool, how: Reduce) -> Result<Tensor> {
    let (x, _, n) = rows_last(t, axes)?;
    let out: Vec<f64> = if n == 0 {
        vec![0.0; x.elem_count()]
    } else if is_float(t.dtype()) && t.dtype() != DType::F64 {
        let v = to_f32_vec(&x)?;
        v.par_chunks(n).map(|r| reduce_row(r, how)).collect()
    } else {
        let v = to_vec::<f64>(&x)?;
        v.par_chunks(n).map(|r| reduce_row(r, how)).collect()
    };
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
}
