//! Error feedback while rounding (the GPTQ scheme): the weight's input columns are rounded
//! one at a time, in order, and each column's rounding error is pushed onto the columns not
//! yet rounded so that the layer's output on the calibration inputs, X·Wᵀ, moves as little as
//! possible. This module owns the maths only: [`feedback_factor`] turns an input Gram matrix
//! H = XᵀX / n into the factor the update needs, and [`round_rows`] runs the column sweep with
//! any per-element rounding rule (a palette's nearest entry, an integer grid). The compression
//! pass ([`super::compress`]) decides when to use it.
//!
//! Why it works: for one output row w and inputs with Gram H, the output error of a change
//! δ is δᵀHδ. After rounding column j with error e, the best correction of the remaining
//! columns is −e·H⁻¹[j, j+1..] / H⁻¹[j, j] (then column j is dropped from the inverse). With
//! U the upper Cholesky factor of H⁻¹ (UᵀU = H⁻¹), every such step reads row j of U:
//! w[k] −= (e / U[j, j]) · U[j, k] for k > j, so one factorization serves all rows.

use super::lut::{palettize, LutConfig, Palettized};
use super::quant::{
    quantize, relative_rms_error, PackedQuantized, QuantConfig, QuantValues, Quantized,
};
use anyhow::{ensure, Result};
use half::f16;
use rayon::prelude::*;

/// Default damping: this share of the mean diagonal of H is added to its diagonal, so that
/// H is safely positive definite (GPTQ's `percdamp` = 0.01).
pub const DEFAULT_DAMPING: f64 = 0.01;

/// In-place lower Cholesky factor of the symmetric positive definite `a` (n × n, row-major):
/// on return the lower triangle holds L with L·Lᵀ = a, the upper triangle is zeroed.
fn cholesky_lower(a: &mut [f64], n: usize) -> Result<()> {
    for j in 0..n {
        let mut d = a[j * n + j];
        for k in 0..j {
            d -= a[j * n + k] * a[j * n + k];
        }
        ensure!(
            d > 0.0 && d.is_finite(),
            "error feedback: the damped Gram matrix is not positive definite at column {j}"
        );
        let d = d.sqrt();
        a[j * n + j] = d;
        let (head, tail) = a.split_at_mut((j + 1) * n);
        let row_j = &head[j * n..j * n + j];
        tail.par_chunks_mut(n).for_each(|row_i| {
            let s: f64 = row_i[..j].iter().zip(row_j).map(|(x, y)| x * y).sum();
            row_i[j] = (row_i[j] - s) / d;
        });
    }
    for i in 0..n {
        for k in i + 1..n {
            a[i * n + k] = 0.0;
        }
    }
    Ok(())
}

/// The upper-triangular U (n × n, row-major) with UᵀU = (H + λI)⁻¹, λ = `damping` × the mean
/// of H's diagonal. `h` is the input Gram matrix (fp32 as the statistics store it). A
/// channel that never carried signal (zero diagonal) gets a unit diagonal, as GPTQ does, so
/// its column is rounded plainly and passes no error on.
pub fn feedback_factor(h: &[f32], n: usize, damping: f64) -> Result<Vec<f64>> {
    ensure!(
        n > 0 && h.len() == n * n,
        "error feedback: a Gram matrix of {} values is not {n} × {n}",
        h.len()
    );
    ensure!(
        damping.is_finite() && damping >= 0.0,
        "error feedback: damping {damping} must be a finite number ≥ 0"
    );
    let mut a: Vec<f64> = h.iter().map(|&v| f64::from(v)).collect();
    ensure!(
        a.iter().all(|v| v.is_finite()),
        "error feedback: the Gram matrix holds non-finite values"
    );
    for i in 0..n {
        if a[i * n + i] <= 0.0 {
            a[i * n + i] = 1.0;
        }
    }
    let mean = (0..n).map(|i| a[i * n + i]).sum::<f64>() / n as f64;
    for i in 0..n {
        a[i * n + i] += damping * mean;
    }
    // H = L Lᵀ ⇒ H⁻¹ = L⁻ᵀ L⁻¹, formed explicitly; then H⁻¹ = M Mᵀ (M lower) and U = Mᵀ.
    cholesky_lower(&mut a, n)?;
    // Linv = L⁻¹ (lower), by forward substitution on the columns of I (in parallel).
    let cols: Vec<Vec<f64>> = (0..n)
        .into_par_iter()
        .map(|c| {
            let mut x = vec![0.0f64; n];
            for i in c..n {
                let mut s = if i == c { 1.0 } else { 0.0 };
                for (k, xk) in x.iter().enumerate().take(i).skip(c) {
                    s -= a[i * n + k] * xk;
                }
                x[i] = s / a[i * n + i];
            }
            x
        })
        .collect();
    // H⁻¹ = Linvᵀ Linv: entry (i, k) = Σ_m Linv[m, i] Linv[m, k], m ≥ max(i, k).
    let mut hinv = vec![0.0f64; n * n];
    hinv.par_chunks_mut(n).enumerate().for_each(|(i, row)| {
        let ci = &cols[i];
        for (k, out) in row.iter_mut().enumerate() {
            let ck = &cols[k];
            let start = i.max(k);
            *out = ci[start..]
                .iter()
                .zip(&ck[start..])
                .map(|(x, y)| x * y)
                .sum();
        }
    });
    cholesky_lower(&mut hinv, n)?;
    Ok((0..n * n)
        .map(|idx| hinv[(idx % n) * n + idx / n])
        .collect())
}

/// Rounds every row of `w` (rows × n, row-major, f64 working copy; modified) column by
/// column with error feedback through `u` (from [`feedback_factor`]). `round(row, col, v)`
/// returns the code chosen for value `v` and the value that code decodes to; the codes
/// come back row-major.
pub fn round_rows<C, F>(w: &mut [f64], n: usize, u: &[f64], round: F) -> Result<Vec<C>>
where
    C: Copy + Default + Send,
    F: Fn(usize, usize, f64) -> (C, f64) + Sync,
{
    ensure!(
        n > 0 && w.len().is_multiple_of(n) && u.len() == n * n,
        "error feedback: {} weights and a {}-value factor do not fit {n} columns",
        w.len(),
        u.len()
    );
    let mut codes = vec![C::default(); w.len()];
    w.par_chunks_mut(n)
        .zip(codes.par_chunks_mut(n))
        .enumerate()
        .for_each(|(r, (row, out))| {
            for j in 0..n {
                let (c, q) = round(r, j, row[j]);
                out[j] = c;
                let e = (row[j] - q) / u[j * n + j];
                let uj = &u[j * n..(j + 1) * n];
                for (x, uk) in row[j + 1..].iter_mut().zip(&uj[j + 1..]) {
                    *x -= e * uk;
                }
                row[j] = q;
            }
        });
    Ok(codes)
}

/// The index of the entry of `table` nearest to `v` (the first of equals).
pub fn nearest(table: &[f64], v: f64) -> usize {
    let mut best = 0;
    let mut d = f64::INFINITY;
    for (i, &t) in table.iter().enumerate() {
        let e = (t - v).abs();
        if e < d {
            d = e;
            best = i;
        }
    }
    best
}

/// Palettization with error feedback: the tables are fitted as [`palettize`] fits them
/// (importance-weighted k-means when `importance` is given), then the indices are chosen by
/// the column sweep of [`round_rows`] with factor `u` ([`feedback_factor`] of the input's
/// Gram matrix; its size is the elements per output row). With per-channel scales the sweep
/// runs on the weight divided by the row scales (rows are independent, so this is the same
/// sweep on rescaled rows).
pub fn palettize_with_feedback(
    weight: &[f16],
    shape: &[usize],
    cfg: &LutConfig,
    importance: Option<&[f32]>,
    u: &[f64],
) -> Result<Palettized> {
    let mut p = palettize(weight, shape, cfg, importance)?;
    let rows = shape[0];
    let n = weight.len() / rows;
    ensure!(
        u.len() == n * n,
        "error feedback: the Gram matrix is for {} inputs but the weight {shape:?} has {n} per output channel",
        (u.len() as f64).sqrt() as usize
    );
    let entries = 1usize << p.nbits;
    let groups = p.lut_shape[0];
    let per_group = rows / groups;
    let tables: Vec<Vec<f64>> = p
        .lut
        .chunks(entries)
        .map(|t| t.iter().map(|e| e.to_f64()).collect())
        .collect();
    let mut w: Vec<f64> = match &p.row_scale {
        Some(s) => weight
            .iter()
            .enumerate()
            .map(|(i, v)| v.to_f64() / s[i / n].to_f64())
            .collect(),
        None => weight.iter().map(|v| v.to_f64()).collect(),
    };
    p.indices = round_rows(&mut w, n, u, |r, _, v| {
        let t = &tables[r / per_group];
        let i = nearest(t, v);
        (i as u8, t[i])
    })?;
    Ok(p)
}

/// Linear quantization with error feedback: scales (and offsets) as [`quantize`] sets them
/// from the weight, then each element's code is `clamp(round(v / s) + offset)` of the value
/// the column sweep has carried to it, decoding as Core ML does, `fp16(s · (code − offset))`.
/// Returns the result and the relative RMS error of its decode.
pub fn quantize_with_feedback(
    weight: &[f16],
    shape: &[usize],
    cfg: &QuantConfig,
    u: &[f64],
) -> Result<(Quantized, f64)> {
    let q = quantize(weight, shape, cfg)?;
    let rows = shape[0];
    let n = weight.len() / rows;
    ensure!(
        u.len() == n * n,
        "error feedback: the Gram matrix is for {} inputs but the weight {shape:?} has {n} per output channel",
        (u.len() as f64).sqrt() as usize
    );
    // Every scale covers a contiguous run of `chunk` elements (row-major).
    let chunk = weight.len() / q.scale.len();
    let (lo, hi) = cfg.dtype.range(cfg.symmetric);
    let mut w: Vec<f64> = weight.iter().map(|v| v.to_f64()).collect();
    let codes: Vec<i32> = round_rows(&mut w, n, u, |r, j, v| {
        let si = (r * n + j) / chunk;
        let s = q.scale[si].to_f32();
        let off = q.offset.as_ref().map_or(0, |o| o.get(si));
        if s == 0.0 {
            return (off, 0.0);
        }
        // As the plain path rounds: the f32 quotient rounded to fp16, then to an integer.
        let t = f16::from_f32(v as f32 / s).to_f32().round_ties_even();
        let code = (t as i64 + i64::from(off)).clamp(i64::from(lo), i64::from(hi)) as i32;
        let dec = f16::from_f32(s * (code - off) as f32).to_f64();
        (code, dec)
    })?;
    let data = if cfg.dtype.is_signed() {
        QuantValues::Signed(codes.iter().map(|&c| c as i8).collect())
    } else {
        QuantValues::Unsigned(codes.iter().map(|&c| c as u8).collect())
    };
    let out = Quantized { data, ..q };
    let rel_rms_error = relative_rms_error(weight, &out.decode()?)?;
    Ok((out, rel_rms_error))
}

/// [`quantize_with_feedback`] in the storage form the compression pass writes.
pub fn quantize_packed_with_feedback(
    weight: &[f16],
    shape: &[usize],
    cfg: &QuantConfig,
    u: &[f64],
) -> Result<PackedQuantized> {
    let (q, rel_rms_error) = quantize_with_feedback(weight, shape, cfg, u)?;
    Ok(PackedQuantized {
        dtype: q.dtype,
        data: q.data.to_storage_bytes(q.dtype)?,
        offset: q
            .offset
            .as_ref()
            .map(|o| o.to_storage_bytes(q.dtype))
            .transpose()?,
        shape: q.shape,
        scale: q.scale,
        scale_shape: q.scale_shape,
        rel_rms_error,
    })
}
