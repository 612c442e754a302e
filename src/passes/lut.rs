//! Palettization of fp16 weights into the inputs of the iOS18 `constexpr_lut_to_dense` op
//! (a look-up table plus one index per element), and that op's decode.
//!
//! Layout, as coremltools 9 builds it (`palettize_weights.grouped_channelwise_compress`):
//! output channels are axis 0; `group_size` consecutive output channels share one table.
//! `indices` has the weight's shape (dtype `uint<nbits>`); `lut` has rank = weight rank + 2:
//! `[num_groups, 1, …, 1, 2^nbits, 1]` (per-tensor: `num_groups` = 1). Within a group the
//! entries are the group's rows flattened in row-major order.
//! - k-means: exact 1-D k-means ([`super::kmeans`]); entries ascending, each the weighted mean
//!   of its cluster rounded once from f64 to fp16; unused entries (fewer distinct values than
//!   entries) are 0, as coremltools pads them.
//! - uniform (coremltools' `compress_uniform`, in numpy fp16 arithmetic): with `lo`/`hi` the
//!   group's min/max and `L = 2^nbits − 1`, `index = round_half_even(fp16(fp16(fp16(w − lo) /
//!   fp16(hi − lo)) · L))` and `entry[i] = fp16(i · fp16(fp16(hi − lo) / L) + lo)` (the entry is
//!   computed in f64 and rounded once). Note the index is not always the nearest entry.
//!
//! Decode is a plain table look-up, so it is exact by construction.
//!
//! Per-channel scales (opt-in, [`LutConfig::per_channel_scale`]): each output channel is
//! divided by `s = max |row|` (1 for a zero row) before the tables are fitted, and the decode
//! is `fp16(entry · s)`, an iOS18 `constexpr_blockwise_shift_scale` with fp16 data (the table
//! op's output) and an fp16 scale of shape `[out, 1, …, 1]`. With importance weights an error
//! `e` of the normalized value costs `s²e²` in the original weight, so the k-means weights
//! each row by `s²`. (coremltools 9 takes its maximum over axis 0 instead, one scale per input
//! position; the row form here is what lets rows of different size share a grouped table.)

use super::kmeans::kmeans_1d_f16;
use super::kmeans_vec::{assign_nearest, kmeans_vectors, Points};
use anyhow::{bail, ensure, Result};
use half::f16;
use rayon::prelude::*;

/// How table entries are chosen (`--palettize`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LutMode {
    /// Least (optionally importance-weighted) squared error: exact k-means.
    Kmeans,
    /// Evenly spaced over each group's [min, max], as coremltools' `uniform` mode.
    Uniform,
}

/// Which elements share one table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LutGranularity {
    PerTensor,
    /// `group_size` consecutive output channels (axis 0) per table.
    PerGroupedChannel(usize),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LutConfig {
    pub mode: LutMode,
    /// 1, 2, 3, 4, 6 or 8.
    pub nbits: u32,
    pub granularity: LutGranularity,
    /// Divide each output channel by its largest magnitude before palettizing, and undo it
    /// with an fp16 scale per output channel at load time (iOS18
    /// `constexpr_blockwise_shift_scale` after the LUT op; coremltools'
    /// `enable_per_channel_scale`). Lets rows of very different magnitudes share a table.
    pub per_channel_scale: bool,
    /// Components per table entry (coremltools' `cluster_dim`): 1 = scalar palettization; 2
    /// or 4 = vector palettization, where `cluster_dim` consecutive output channels at one
    /// input position share one index into a table of vectors (k-means only; the group
    /// size, or the output channels per tensor, must be a multiple of it).
    pub cluster_dim: usize,
}

/// Vector sizes accepted for vector palettization (besides 1, scalar).
pub const CLUSTER_DIMS: [usize; 2] = [2, 4];

/// Seed of the vector k-means of table `g` of a weight (fixed, so runs reproduce).
fn vector_seed(g: usize) -> u64 {
    0x6d69_6c6b_6974_0000 ^ g as u64
}

/// Bit widths `constexpr_lut_to_dense` accepts for its indices.
pub const LUT_NBITS: [u32; 6] = [1, 2, 3, 4, 6, 8];

/// A list of widths to measure, sorted and without repeats; `Err` holds the first width
/// [`LUT_NBITS`] does not allow.
pub fn lut_widths(widths: &[u32]) -> Result<Vec<u32>, u32> {
    let mut w = widths.to_vec();
    w.sort_unstable();
    w.dedup();
    match w.iter().find(|b| !LUT_NBITS.contains(b)) {
        Some(&b) => Err(b),
        None => Ok(w),
    }
}

/// Inputs of one iOS18 `constexpr_lut_to_dense`: scalar palettization (`cluster_dim` 1, no
/// `vector_axis`), or vector palettization with `vector_axis` 0.
#[derive(Debug, Clone, PartialEq)]
pub struct Palettized {
    pub nbits: u32,
    /// The weight's shape; also the shape of `indices`, except that with vectors axis 0 is
    /// divided by `cluster_dim` ([`Self::indices_shape`]).
    pub shape: Vec<usize>,
    /// fp16 entries, row-major in `lut_shape` (`[groups, 1, …, 1, 2^nbits, cluster_dim]`).
    pub lut: Vec<f16>,
    pub lut_shape: Vec<usize>,
    /// One index (< 2^nbits) per element (per vector with `cluster_dim` > 1), row-major in
    /// [`Self::indices_shape`].
    pub indices: Vec<u8>,
    /// Components per table entry: 1 (scalar) or the vector size along axis 0.
    pub cluster_dim: usize,
    /// With per-channel scales: one fp16 factor per output channel (axis 0) that multiplies
    /// the table's decode (the `scale` of the following `constexpr_blockwise_shift_scale`,
    /// shape `[shape[0], 1, …, 1]`).
    pub row_scale: Option<Vec<f16>>,
}

impl Palettized {
    /// The fp16 weight Core ML materializes from this op.
    pub fn decode(&self) -> Result<Vec<f16>> {
        let (dense, shape) = crate::ops::decode_lut_vector(
            &self.indices,
            &self.indices_shape(),
            &self.lut,
            &self.lut_shape,
            0,
        )?;
        ensure!(
            shape == self.shape,
            "palettized decode has shape {shape:?}, not the weight's {:?}",
            self.shape
        );
        match &self.row_scale {
            Some(s) => apply_row_scale(dense, s),
            None => Ok(dense),
        }
    }
    /// The shape of `indices`: the weight's, with axis 0 divided by `cluster_dim`.
    pub fn indices_shape(&self) -> Vec<usize> {
        let mut s = self.shape.clone();
        s[0] /= self.cluster_dim.max(1);
        s
    }
    /// The shape of the per-channel scale tensor: `[shape[0], 1, …, 1]`.
    pub fn row_scale_shape(&self) -> Vec<usize> {
        let mut s = vec![1usize; self.shape.len()];
        s[0] = self.shape[0];
        s
    }
    /// rms(weight − decode) / rms(weight) of this palettization of `weight`, straight from the
    /// table (equal to [`super::quant::relative_rms_error`] of [`Self::decode`], without the
    /// decoded copy).
    pub fn rel_rms_error(&self, weight: &[f16]) -> Result<f64> {
        use super::quant_kernel::{rel_from_sums, sq_sums, ERR_PIECE};
        use half::slice::HalfFloatSliceExt;
        if self.row_scale.is_some() || self.cluster_dim > 1 {
            // Not a per-element table look-up; measure it on the decode.
            return super::quant::relative_rms_error(weight, &self.decode()?);
        }
        let entries = 1usize << self.nbits;
        let groups = self.lut_shape.first().copied().unwrap_or(0);
        ensure!(
            weight.len() == self.indices.len()
                && groups > 0
                && weight.len().is_multiple_of(groups)
                && self.lut.len() == groups * entries
                && self.lut_shape.iter().product::<usize>() == self.lut.len(),
            "palettized error: {} weights, {} indices, lut shape {:?} do not belong together",
            weight.len(),
            self.indices.len(),
            self.lut_shape
        );
        if let Some(bad) = self.indices.iter().find(|&&i| usize::from(i) >= entries) {
            bail!("palettized error: index {bad} outside a palette of {entries} entries");
        }
        // Groups are contiguous runs of `chunk` elements (axis-0 grouping).
        let chunk = weight.len() / groups;
        let sums: Vec<[f64; 2]> = weight
            .par_chunks(ERR_PIECE)
            .zip(self.indices.par_chunks(ERR_PIECE))
            .enumerate()
            .map_init(
                || (vec![0.0f32; ERR_PIECE], vec![0.0f32; ERR_PIECE]),
                |(fw, fd), (k, (w, idx))| {
                    let n = w.len();
                    w.convert_to_f32_slice(&mut fw[..n]);
                    // The piece in runs of one group each (a division per run, not per
                    // element).
                    let (start, mut j) = (k * ERR_PIECE, 0);
                    while j < n {
                        let g = (start + j) / chunk;
                        let end = ((g + 1) * chunk - start).min(n);
                        let table = &self.lut[g * entries..(g + 1) * entries];
                        for (d, &i) in fd[j..end].iter_mut().zip(&idx[j..end]) {
                            *d = table[usize::from(i)].to_f32();
                        }
                        j = end;
                    }
                    sq_sums(&fw[..n], &fd[..n])
                },
            )
            .collect();
        Ok(rel_from_sums(&sums))
    }
    /// Indices packed as `uint<nbits>` storage (LSB-first; raw bytes for 8 bits).
    pub fn packed_indices(&self) -> Result<Vec<u8>> {
        super::subbyte::pack_bits(&self.indices, self.nbits)
    }
}

/// Rounds an f64 to the nearest fp16 (ties to even) in one step, as numpy's `astype`
/// does. (`f16::from_f64` may round via f32 or truncate low bits first.)
pub fn f64_to_f16_nearest(x: f64) -> f16 {
    if x.is_nan() {
        return f16::NAN;
    }
    // 65520 is the midpoint between fp16 MAX and the next power of two: ties go to infinity.
    if x.abs() >= 65520.0 {
        return if x > 0.0 {
            f16::INFINITY
        } else {
            f16::NEG_INFINITY
        };
    }
    let mut h = f16::from_f32(x as f32);
    if h.is_infinite() {
        h = if x > 0.0 { f16::MAX } else { f16::MIN };
    }
    // The candidate is within one step of the answer; compare its neighbours exactly
    // (fp16 values and their differences from x are exact in f64 at this distance).
    let step = |b: u16, up: bool| -> u16 {
        // Walk the fp16 number line by bit patterns (sign-magnitude).
        match (b & 0x8000 != 0, up) {
            (false, true) => b + 1,
            (false, false) if b == 0 => 0x8001,
            (false, false) => b - 1,
            (true, true) if b == 0x8000 => 0x0001,
            (true, true) => b - 1,
            (true, false) => b + 1,
        }
    };
    let bits = h.to_bits();
    let mut best = h;
    let mut best_d = (x - h.to_f64()).abs();
    for cand_bits in [step(bits, false), step(bits, true)] {
        let c = f16::from_bits(cand_bits);
        if !c.is_finite() {
            continue;
        }
        let d = (x - c.to_f64()).abs();
        if d < best_d || (d == best_d && cand_bits & 1 == 0 && best.to_bits() & 1 == 1) {
            best = c;
            best_d = d;
        }
    }
    best
}

#[inline(always)]
fn r16(x: f32) -> f32 {
    // One fp16 rounding of an f32 result of fp16 operands = numpy's fp16 arithmetic.
    f16::from_f32(x).to_f32()
}

/// coremltools' uniform palettization of one group.
fn uniform_group(w: &[f16], nbits: u32, lut: &mut [f16], idx: &mut [u8]) {
    let (mut lo, mut hi) = (f32::INFINITY, f32::NEG_INFINITY);
    for x in w {
        lo = lo.min(x.to_f32());
        hi = hi.max(x.to_f32());
    }
    let levels = ((1u32 << nbits) - 1) as f32;
    let width = r16(hi - lo);
    let scale = r16(width / levels);
    for (i, e) in lut.iter_mut().enumerate() {
        *e = f64_to_f16_nearest(i as f64 * f64::from(scale) + f64::from(lo));
    }
    for (x, o) in w.iter().zip(idx.iter_mut()) {
        let t = r16(r16(r16(x.to_f32() - lo) / width) * levels).round_ties_even();
        // A constant group gives 0/0 = NaN, which numpy casts to 0.
        *o = t as u8;
    }
}

/// Largest divisor of `dim` not above `want` (for error messages suggesting a fix).
fn divisor_at_most(dim: usize, want: usize) -> usize {
    (1..=want.min(dim))
        .rev()
        .find(|d| dim.is_multiple_of(*d))
        .unwrap_or(1)
}

/// Palettizes an fp16 weight whose output channels are axis 0.
///
/// `importance` (k-means only) weights each element's squared error by a per-input-position
/// factor: its length is the product of all dims but axis 0, and it is broadcast over the
/// output channels. Factors must be finite and ≥ 0.
pub fn palettize(
    weight: &[f16],
    shape: &[usize],
    cfg: &LutConfig,
    importance: Option<&[f32]>,
) -> Result<Palettized> {
    let numel: usize = shape.iter().product();
    ensure!(
        !shape.is_empty() && numel == weight.len() && numel > 0,
        "palettize: weight has {} elements but shape {shape:?} holds {numel}",
        weight.len()
    );
    ensure!(
        LUT_NBITS.contains(&cfg.nbits),
        "palettize: nbits {} is not one of {LUT_NBITS:?}",
        cfg.nbits
    );
    // Checked in parallel (this runs over whole models); the serial search only on failure.
    let all_finite = weight
        .par_chunks(64 * 1024)
        .all(|c| c.iter().all(|v| v.to_bits() & 0x7c00 != 0x7c00));
    if let Some((i, v)) = (!all_finite)
        .then(|| weight.iter().enumerate().find(|(_, v)| !v.is_finite()))
        .flatten()
    {
        bail!("palettize: weight of shape {shape:?} has non-finite element {i} ({v})");
    }
    let rest = numel / shape[0];
    if let Some(imp) = importance {
        ensure!(
            cfg.mode == LutMode::Kmeans,
            "palettize: importance weighting only applies to k-means mode, not uniform"
        );
        ensure!(
            imp.len() == rest,
            "palettize: importance has {} entries, but the weight of shape {shape:?} has {rest} \
             per output channel",
            imp.len()
        );
    }
    let groups = match cfg.granularity {
        LutGranularity::PerTensor => 1,
        LutGranularity::PerGroupedChannel(gs) => {
            let out = shape[0];
            if gs == 0 || !out.is_multiple_of(gs) {
                bail!(
                    "palettize: group_size {gs} does not divide the output channels (axis 0 = \
                     {out}) of the weight with shape {shape:?}; use a group size that divides \
                     {out} (e.g. {}) or per-tensor granularity for this weight",
                    divisor_at_most(out, gs.max(1))
                );
            }
            out / gs
        }
    };
    if cfg.cluster_dim != 1 {
        return palettize_vectors(weight, shape, cfg, importance, groups);
    }
    let chunk = numel / groups;
    let entries = 1usize << cfg.nbits;
    let mut lut = vec![f16::ZERO; groups * entries];
    let mut indices = vec![0u8; numel];
    // Per-element weights of a group: the importance row repeated for each output channel.
    let group_weights: Option<Vec<f32>> =
        importance.map(|imp| imp.iter().copied().cycle().take(chunk).collect());
    // With per-channel scales the table is fitted to the normalized weight.
    let (row_scale, normalized) = if cfg.per_channel_scale {
        let (s, n) = normalize_rows(weight, shape[0]);
        (Some(s), Some(n))
    } else {
        (None, None)
    };
    let fit: &[f16] = normalized.as_deref().unwrap_or(weight);
    let rows_per_group = shape[0] / groups;

    lut.par_chunks_mut(entries)
        .zip(indices.par_chunks_mut(chunk))
        .zip(fit.par_chunks(chunk))
        .enumerate()
        .try_for_each(|(g, ((lut, idx), w))| -> Result<()> {
            match cfg.mode {
                LutMode::Uniform => uniform_group(w, cfg.nbits, lut, idx),
                LutMode::Kmeans => {
                    // An error e in normalized space is s·e in the original weight, so the
                    // calibrated importance of a row is scaled by s² to keep minimizing the
                    // original weight's (input-weighted) error.
                    let scaled: Option<Vec<f32>> = match (&group_weights, &row_scale) {
                        (Some(gw), Some(s)) => {
                            let rows = &s[g * rows_per_group..(g + 1) * rows_per_group];
                            Some(
                                gw.chunks(rest)
                                    .zip(rows)
                                    .flat_map(|(imp, s)| {
                                        let s2 = s.to_f32() * s.to_f32();
                                        imp.iter().map(move |&v| v * s2)
                                    })
                                    .collect(),
                            )
                        }
                        _ => None,
                    };
                    let weights = scaled.as_deref().or(group_weights.as_deref());
                    let km = kmeans_1d_f16(w, weights, entries)?;
                    for (e, &c) in lut.iter_mut().zip(&km.centroids) {
                        *e = f64_to_f16_nearest(c);
                    }
                    idx.copy_from_slice(&km.assign);
                }
            }
            Ok(())
        })?;

    let mut lut_shape = vec![1usize; shape.len() + 2];
    lut_shape[0] = groups;
    lut_shape[shape.len()] = entries;
    Ok(Palettized {
        nbits: cfg.nbits,
        shape: shape.to_vec(),
        lut,
        lut_shape,
        indices,
        cluster_dim: 1,
        row_scale,
    })
}

/// Vector palettization (`cfg.cluster_dim` > 1) of a checked, finite weight into `groups`
/// tables along axis 0: in each table's rows, the `cluster_dim` consecutive rows `r·cd + c`
/// at input position `j` form vector `(r, j)` (coremltools' layout with `vector_axis` 0),
/// clustered by [`kmeans_vectors`] seeded per table; the centres are rounded once to fp16
/// and every vector then takes its nearest rounded entry.
fn palettize_vectors(
    weight: &[f16],
    shape: &[usize],
    cfg: &LutConfig,
    importance: Option<&[f32]>,
    groups: usize,
) -> Result<Palettized> {
    let cd = cfg.cluster_dim;
    ensure!(
        CLUSTER_DIMS.contains(&cd),
        "palettize: cluster_dim {cd} is not 1, 2 or 4"
    );
    ensure!(
        cfg.mode == LutMode::Kmeans,
        "palettize: vector palettization (cluster_dim {cd}) takes k-means tables, not uniform"
    );
    let rows = shape[0] / groups;
    if !rows.is_multiple_of(cd) {
        bail!(
            "palettize: cluster_dim {cd} does not divide the {rows} output channels (axis 0) that \
             share a table of the weight with shape {shape:?}; use a group size that is a \
             multiple of {cd}, or cluster_dim 1 for this weight"
        );
    }
    let numel = weight.len();
    let rest = numel / shape[0];
    let (row_scale, normalized) = if cfg.per_channel_scale {
        let (s, n) = normalize_rows(weight, shape[0]);
        (Some(s), Some(n))
    } else {
        (None, None)
    };
    let fit: &[f16] = normalized.as_deref().unwrap_or(weight);
    let entries = 1usize << cfg.nbits;
    let chunk = numel / groups;
    let vecs = chunk / cd;
    let mut lut = vec![f16::ZERO; groups * entries * cd];
    let mut indices = vec![0u8; numel / cd];
    lut.par_chunks_mut(entries * cd)
        .zip(indices.par_chunks_mut(vecs))
        .enumerate()
        .try_for_each(|(g, (lut, idx))| -> Result<()> {
            // Vector (r, j) of this table: rows g·rows + r·cd + c at input position j.
            let row0 = g * rows;
            let at = |r: usize, c: usize, j: usize| (row0 + r * cd + c) * rest + j;
            let mut points = Vec::with_capacity(vecs * cd);
            let mut weights = importance.map(|_| Vec::with_capacity(vecs * cd));
            for r in 0..rows / cd {
                for j in 0..rest {
                    for c in 0..cd {
                        points.push(fit[at(r, c, j)].to_f32());
                        if let (Some(w), Some(imp)) = (weights.as_mut(), importance) {
                            // As the scalar path: an error e of the normalized value costs
                            // s²e² in the weight.
                            let s2 = row_scale
                                .as_ref()
                                .map_or(1.0, |s| s[row0 + r * cd + c].to_f32().powi(2));
                            w.push(imp[j] * s2);
                        }
                    }
                }
            }
            let p = Points {
                values: &points,
                weights: weights.as_deref(),
                dim: cd,
            };
            let km = kmeans_vectors(p, entries, vector_seed(g))?;
            for (e, &c) in lut.iter_mut().zip(&km.centroids) {
                *e = f64_to_f16_nearest(c);
            }
            let table: Vec<f64> = lut.iter().map(|e| e.to_f64()).collect();
            idx.copy_from_slice(&assign_nearest(p, &table));
            Ok(())
        })?;
    let mut lut_shape = vec![1usize; shape.len() + 2];
    lut_shape[0] = groups;
    lut_shape[shape.len()] = entries;
    lut_shape[shape.len() + 1] = cd;
    Ok(Palettized {
        nbits: cfg.nbits,
        shape: shape.to_vec(),
        lut,
        lut_shape,
        indices,
        cluster_dim: cd,
        row_scale,
    })
}

/// Per-output-channel scales `s = max |row|` (1 for an all-zero row, as coremltools sets it)
/// and the weight divided by them, each quotient rounded once to fp16 (as numpy's fp16
/// division). Every `s` is an fp16 value of the weight, so it is stored exactly.
pub fn normalize_rows(weight: &[f16], rows: usize) -> (Vec<f16>, Vec<f16>) {
    let rest = weight.len() / rows.max(1);
    let scale: Vec<f16> = weight
        .par_chunks(rest.max(1))
        .map(|r| {
            // Magnitudes of finite fp16 values order like their bit patterns without the sign.
            let m = r.iter().map(|v| v.to_bits() & 0x7fff).max().unwrap_or(0);
            if m == 0 {
                f16::ONE
            } else {
                f16::from_bits(m)
            }
        })
        .collect();
    let mut out = vec![f16::ZERO; weight.len()];
    out.par_chunks_mut(rest.max(1))
        .zip(weight.par_chunks(rest.max(1)))
        .zip(&scale)
        .for_each(|((o, w), s)| {
            let s = s.to_f32();
            for (o, w) in o.iter_mut().zip(w) {
                // An f32 quotient of fp16 operands rounds to the same fp16 as the exact one.
                *o = f16::from_f32(w.to_f32() / s);
            }
        });
    (scale, out)
}

/// `fp16(x · s_row)` for every element: `constexpr_blockwise_shift_scale` with fp16 data and
/// one scale per output channel (the product of two fp16 values is exact in f32, so this is
/// one rounding, as numpy's fp16 multiply).
pub fn apply_row_scale(mut dense: Vec<f16>, scale: &[f16]) -> Result<Vec<f16>> {
    ensure!(
        !scale.is_empty() && dense.len().is_multiple_of(scale.len()),
        "per-channel scale: {} scales for {} elements",
        scale.len(),
        dense.len()
    );
    let rest = dense.len() / scale.len();
    if rest > 0 {
        dense.par_chunks_mut(rest).zip(scale).for_each(|(row, s)| {
            let s = s.to_f32();
            for v in row {
                *v = f16::from_f32(v.to_f32() * s);
            }
        });
    }
    Ok(dense)
}

/// Core ML's materialization of `constexpr_lut_to_dense` for scalar palettization
/// (`lut` of shape `[b_0, …, b_{K-1}, 2^nbits, 1]`, each `b_a` dividing `shape[a]`): the
/// op's own decode ([`crate::ops::decode_lut`]), which the interpreter runs too.
pub fn decode_lut(
    indices: &[u8],
    shape: &[usize],
    lut: &[f16],
    lut_shape: &[usize],
) -> Result<Vec<f16>> {
    crate::ops::decode_lut(indices, shape, lut, lut_shape)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_error_equals_the_error_of_the_decode() {
        // Groups of 3 rows × 1500 do not tile the 4096-element error pieces.
        let shape = [12usize, 1500];
        let w: Vec<f16> = (0..12 * 1500)
            .map(|i| f16::from_f32(((i * 7919) % 1000) as f32 / 700.0 - 0.6))
            .collect();
        for mode in [LutMode::Kmeans, LutMode::Uniform] {
            let cfg = LutConfig {
                mode,
                nbits: 3,
                granularity: LutGranularity::PerGroupedChannel(3),
                per_channel_scale: false,
                cluster_dim: 1,
            };
            let p = palettize(&w, &shape, &cfg, None).unwrap();
            let want = super::super::quant::relative_rms_error(&w, &p.decode().unwrap()).unwrap();
            assert!(want > 0.0);
            assert_eq!(p.rel_rms_error(&w).unwrap(), want, "{mode:?}");
        }
    }

    #[test]
    fn nearest_rounding_is_exact() {
        // 1 + 2^-11 is the tie between 1 and 1 + 2^-10: even (1.0) wins; a hair above goes up.
        let tie = 1.0 + 2f64.powi(-11);
        assert_eq!(f64_to_f16_nearest(tie), f16::ONE);
        let above = tie + 2f64.powi(-40); // lost if rounded through f32 first
        assert_eq!(f64_to_f16_nearest(above).to_f64(), 1.0 + 2f64.powi(-10));
        assert_eq!(f64_to_f16_nearest(65519.99), f16::MAX);
        assert_eq!(f64_to_f16_nearest(65520.0), f16::INFINITY);
        assert_eq!(f64_to_f16_nearest(-3e-8).to_bits(), 0x8001); // past the tie at -2^-25
    }

    #[test]
    fn grouped_layout_and_refusal() {
        let w: Vec<f16> = (0..32 * 6)
            .map(|i| f16::from_f32(((i * 37) % 101) as f32 / 50.0 - 1.0))
            .collect();
        let cfg = LutConfig {
            mode: LutMode::Kmeans,
            nbits: 2,
            granularity: LutGranularity::PerGroupedChannel(16),
            per_channel_scale: false,
            cluster_dim: 1,
        };
        let p = palettize(&w, &[32, 2, 3], &cfg, None).unwrap();
        assert_eq!(p.lut_shape, vec![2, 1, 1, 4, 1]);
        assert_eq!(p.decode().unwrap().len(), w.len());
        let cfg12 = LutConfig {
            granularity: LutGranularity::PerGroupedChannel(12),
            ..cfg
        };
        let msg = palettize(&w, &[32, 6], &cfg12, None)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("[32, 6]") && msg.contains("e.g. 8"), "{msg}");
    }
}
