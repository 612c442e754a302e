//! Optimal 1-D k-means (least weighted squared error) for weight palettization.
//!
//! coremltools palettizes fp16 groups of ≥ 10,000 values with its vendored `kmeans1d`, which
//! solves 1-D k-means exactly by dynamic programming over the sorted unique values; smaller
//! groups go to scikit-learn's Lloyd iterations (one k-means++ start, tol 1e-2). Here every
//! group gets the exact optimum, so the result is never worse than either.
//!
//! Method: sort the distinct values `x_0 < … < x_{n-1}` with weight sums `w_i` (counts when
//! unweighted). In an optimal 1-D clustering every cluster is a contiguous run of sorted values,
//! so with `D[m][i]` = best cost of covering `x_0..=x_i` with `m+1` clusters,
//! `D[m][i] = min_j D[m-1][j-1] + cost(j, i)`, where `cost` is the weighted SSE of a run,
//! evaluated in O(1) from prefix sums. `cost` satisfies the concave Monge condition, so each
//! layer's matrix of candidates is totally monotone and SMAWK finds all row minima with O(n)
//! evaluations: O(k·n) overall. fp16 input is sorted and de-duplicated by counting into the
//! 65,536 possible bit patterns, which is linear too.

use anyhow::{bail, ensure, Result};
use half::f16;
use std::cell::RefCell;

/// Result of a 1-D k-means.
#[derive(Debug, Clone, PartialEq)]
pub struct KMeans {
    /// Cluster centres (weighted means), strictly ascending; `min(k, distinct values)` of them.
    /// Kept in f64 so a caller can round once to its storage type, as coremltools does.
    pub centroids: Vec<f64>,
    /// Cluster index of each input value (indexes `centroids`).
    pub assign: Vec<u8>,
    /// Weighted sum of squared errors of this clustering (from the prefix sums).
    pub sse: f64,
}

/// Exact clustering of sorted distinct values: cluster `c` is `starts[c]..starts[c+1]`.
#[derive(Debug, Clone)]
struct Runs {
    starts: Vec<usize>,
    centroids: Vec<f64>,
    sse: f64,
}

/// Largest k accepted: assignments are `u8`, and Core ML LUTs have at most 256 entries.
pub const MAX_K: usize = 256;

fn check_k(k: usize) -> Result<()> {
    ensure!(
        (1..=MAX_K).contains(&k),
        "k-means: k must be in 1..={MAX_K}, got {k}"
    );
    Ok(())
}

fn check_weights(n: usize, weights: Option<&[f32]>) -> Result<()> {
    if let Some(w) = weights {
        ensure!(
            w.len() == n,
            "k-means: {} weights for {n} values (need one weight per value)",
            w.len()
        );
        if let Some((i, &bad)) = w
            .iter()
            .enumerate()
            .find(|(_, v)| !(v.is_finite() && **v >= 0.0))
        {
            bail!("k-means: weight {i} is {bad}; weights must be finite and ≥ 0");
        }
        ensure!(
            w.iter().any(|&v| v > 0.0),
            "k-means: all {n} weights are zero, so every clustering has zero error; \
             give at least one value a positive weight"
        );
    }
    Ok(())
}

/// Prefix sums of (w, w·x, w·x²) over values centred at `shift`, interleaved for locality.
fn prefix_sums(xs: &[f64], ws: &[f64], shift: f64, out: &mut Vec<[f64; 3]>) {
    out.clear();
    out.reserve(xs.len() + 1);
    let mut acc = [0.0f64; 3];
    out.push(acc);
    for (&x, &w) in xs.iter().zip(ws) {
        let d = x - shift;
        acc[0] += w;
        acc[1] += w * d;
        acc[2] += w * d * d;
        out.push(acc);
    }
}

/// Weighted SSE of the run `j..=i`.
#[inline(always)]
fn run_cost(p: &[[f64; 3]], j: usize, i: usize) -> f64 {
    let (a, b) = (p[j], p[i + 1]);
    let s0 = b[0] - a[0];
    if s0 <= 0.0 {
        return 0.0; // only zero-weight values: they cost nothing wherever they go
    }
    let s1 = b[1] - a[1];
    (b[2] - a[2] - s1 * s1 / s0).max(0.0)
}

/// SMAWK row minima of a totally monotone matrix given by `f(row, col)`.
/// Writes the (leftmost) argmin column of each row into `out[row]`.
fn smawk<F: Fn(usize, usize) -> f64>(rows: &[usize], cols: &[usize], f: &F, out: &mut [u32]) {
    if rows.is_empty() {
        return;
    }
    // REDUCE: keep at most rows.len() columns that can still hold a row minimum.
    let mut kept: Vec<usize> = Vec::with_capacity(rows.len().min(cols.len()));
    for &c in cols {
        while let Some(&top) = kept.last() {
            let r = rows[kept.len() - 1];
            if f(r, c) < f(r, top) {
                kept.pop();
            } else {
                break;
            }
        }
        if kept.len() < rows.len() {
            kept.push(c);
        }
    }
    // Recurse on the odd rows.
    let odd: Vec<usize> = rows.iter().skip(1).step_by(2).copied().collect();
    smawk(&odd, &kept, f, out);
    // INTERPOLATE: each even row's minimum lies between its neighbours' minima.
    let mut k = 0;
    for r_idx in (0..rows.len()).step_by(2) {
        let r = rows[r_idx];
        let stop = if r_idx + 1 < rows.len() {
            out[rows[r_idx + 1]] as usize
        } else {
            kept[kept.len() - 1]
        };
        let mut best = kept[k];
        let mut best_v = f(r, best);
        while kept[k] != stop {
            k += 1;
            let v = f(r, kept[k]);
            if v < best_v {
                best_v = v;
                best = kept[k];
            }
        }
        out[r] = best as u32;
    }
}

/// Reusable buffers for one thread's clustering work.
#[derive(Default)]
struct Scratch {
    prefix: Vec<[f64; 3]>,
    prev: Vec<f64>,
    cur: Vec<f64>,
    argmin: Vec<u32>,
    counts: Vec<u32>,
    wsum: Vec<f64>,
    table: Vec<u8>,
    xs: Vec<f64>,
    ws: Vec<f64>,
    keys: Vec<u16>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Optimal clustering of sorted, distinct `xs` with positive total weight into `min(k, n)` runs.
fn cluster_runs(xs: &[f64], ws: &[f64], k: usize, s: &mut Scratch) -> Runs {
    let n = xs.len();
    let k = k.min(n);
    let total: f64 = ws.iter().sum();
    let shift = if total > 0.0 {
        xs.iter().zip(ws).map(|(x, w)| x * w).sum::<f64>() / total
    } else {
        0.0
    };
    let mut prefix = std::mem::take(&mut s.prefix);
    prefix_sums(xs, ws, shift, &mut prefix);
    let p = &prefix[..];

    let mut starts = vec![0usize; k];
    let sse;
    if k == n {
        for (c, st) in starts.iter_mut().enumerate() {
            *st = c;
        }
        sse = 0.0;
    } else if k == 1 {
        sse = run_cost(p, 0, n - 1);
    } else {
        // prev[i]: best cost of x_0..=x_i with (m+1) clusters for the current layer m.
        let (prev, cur, argmin) = (&mut s.prev, &mut s.cur, &mut s.argmin);
        prev.clear();
        prev.extend((0..n).map(|i| run_cost(p, 0, i)));
        cur.clear();
        cur.resize(n, f64::INFINITY);
        argmin.clear();
        argmin.resize(k * n, 0);
        let mut rows: Vec<usize> = Vec::with_capacity(n);
        for m in 1..k - 1 {
            // Layer m only needs ends i that leave room for the k-1-m clusters after it.
            let (lo, hi) = (m, n - (k - 1 - m));
            rows.clear();
            rows.extend(lo..hi);
            let prev_ref = &prev[..];
            let f = |i: usize, j: usize| -> f64 {
                if j > i {
                    f64::INFINITY
                } else {
                    prev_ref[j - 1] + run_cost(p, j, i)
                }
            };
            let out = &mut argmin[m * n..(m + 1) * n];
            smawk(&rows, &rows, &f, out);
            for &i in &rows {
                let j = out[i] as usize;
                cur[i] = f(i, j);
            }
            std::mem::swap(prev, cur);
        }
        // Last layer: only the full range ends at n-1, so a plain scan suffices.
        let m = k - 1;
        let mut best_j = m;
        let mut best_v = f64::INFINITY;
        for j in m..n {
            let v = prev[j - 1] + run_cost(p, j, n - 1);
            if v < best_v {
                best_v = v;
                best_j = j;
            }
        }
        sse = best_v;
        // Backtrack the run starts.
        starts[m] = best_j;
        let mut i = best_j - 1;
        for m in (1..k - 1).rev() {
            let j = argmin[m * n + i] as usize;
            starts[m] = j;
            i = j - 1;
        }
        starts[0] = 0;
    }

    let centroids = (0..k)
        .map(|c| {
            let (a, b) = (starts[c], if c + 1 < k { starts[c + 1] } else { n });
            let (mut sw, mut swx) = (0.0f64, 0.0f64);
            for t in a..b {
                sw += ws[t];
                swx += ws[t] * xs[t];
            }
            if sw > 0.0 {
                // A weighted mean can round just outside its run; keep it inside so
                // centroids stay strictly ordered like the runs.
                (swx / sw).clamp(xs[a], xs[b - 1])
            } else {
                // A run of zero-weight values has no mean; any point of it is optimal.
                0.5 * (xs[a] + xs[b - 1])
            }
        })
        .collect();
    s.prefix = prefix;
    Runs {
        starts,
        centroids,
        sse,
    }
}

/// Optimal k-means of arbitrary finite f32 values, optionally weighted (weights finite, ≥ 0,
/// not all zero). Ties between equal values are merged before clustering.
pub fn kmeans_1d(values: &[f32], weights: Option<&[f32]>, k: usize) -> Result<KMeans> {
    check_k(k)?;
    check_weights(values.len(), weights)?;
    ensure!(!values.is_empty(), "k-means: no values to cluster");
    if let Some((i, v)) = values.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        bail!("k-means: value {i} is {v}; only finite values can be clustered");
    }
    let mut order: Vec<u32> = (0..values.len() as u32).collect();
    // -0.0 and 0.0 compare equal here, so they merge into one distinct value.
    order.sort_unstable_by(|&a, &b| values[a as usize].total_cmp(&values[b as usize]));
    let mut xs: Vec<f64> = Vec::new();
    let mut ws: Vec<f64> = Vec::new();
    let mut uid = vec![0u32; values.len()];
    for &o in &order {
        let v = f64::from(values[o as usize]);
        let w = weights.map_or(1.0, |w| f64::from(w[o as usize]));
        match (xs.last(), ws.last_mut()) {
            (Some(&last), Some(acc)) if last == v => *acc += w,
            _ => {
                xs.push(v);
                ws.push(w);
            }
        }
        uid[o as usize] = (xs.len() - 1) as u32;
    }
    let runs = SCRATCH.with(|s| cluster_runs(&xs, &ws, k, &mut s.borrow_mut()));
    let mut cluster_of = vec![0u8; xs.len()];
    for (c, w) in runs.starts.iter().enumerate() {
        let end = runs.starts.get(c + 1).copied().unwrap_or(xs.len());
        cluster_of[*w..end].fill(c as u8);
    }
    Ok(KMeans {
        centroids: runs.centroids,
        assign: uid.iter().map(|&u| cluster_of[u as usize]).collect(),
        sse: runs.sse,
    })
}

/// Maps fp16 bits to a key whose unsigned order is the numeric order (finite values).
#[inline(always)]
fn order_key(bits: u16) -> u16 {
    // Fold -0 into +0 so they are one distinct value, as `np.unique` treats them.
    let bits = if bits == 0x8000 { 0 } else { bits };
    if bits & 0x8000 != 0 {
        !bits
    } else {
        bits | 0x8000
    }
}

#[inline(always)]
fn key_value(key: u16) -> f64 {
    let bits = if key & 0x8000 != 0 {
        key & 0x7fff
    } else {
        !key
    };
    f16::from_bits(bits).to_f64()
}

/// Optimal k-means of fp16 values: like [`kmeans_1d`], but sorts and de-duplicates by counting
/// into the 65,536 bit patterns, which makes it linear in the number of values.
pub fn kmeans_1d_f16(values: &[f16], weights: Option<&[f32]>, k: usize) -> Result<KMeans> {
    check_k(k)?;
    check_weights(values.len(), weights)?;
    ensure!(!values.is_empty(), "k-means: no values to cluster");
    if let Some((i, v)) = values.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        bail!("k-means: value {i} is {v}; only finite values can be clustered");
    }
    SCRATCH.with(|cell| {
        let s = &mut *cell.borrow_mut();
        if s.counts.len() != 1 << 16 {
            s.counts = vec![0; 1 << 16];
            s.wsum = vec![0.0; 1 << 16];
            s.table = vec![0; 1 << 16];
        }
        let (mut lo, mut hi) = (u16::MAX, 0u16);
        for v in values {
            let key = order_key(v.to_bits());
            s.counts[key as usize] += 1;
            lo = lo.min(key);
            hi = hi.max(key);
        }
        if let Some(w) = weights {
            for (v, &wt) in values.iter().zip(w) {
                s.wsum[order_key(v.to_bits()) as usize] += f64::from(wt);
            }
        }
        let (mut xs, mut ws, mut keys) = (
            std::mem::take(&mut s.xs),
            std::mem::take(&mut s.ws),
            std::mem::take(&mut s.keys),
        );
        xs.clear();
        ws.clear();
        keys.clear();
        for key in lo..=hi {
            let c = s.counts[key as usize];
            if c > 0 {
                keys.push(key);
                xs.push(key_value(key));
                ws.push(if weights.is_some() {
                    s.wsum[key as usize]
                } else {
                    f64::from(c)
                });
                // Leave the histograms zeroed for the next call on this thread.
                s.counts[key as usize] = 0;
                s.wsum[key as usize] = 0.0;
            }
        }
        let runs = cluster_runs(&xs, &ws, k, s);
        for (c, &a) in runs.starts.iter().enumerate() {
            let end = runs.starts.get(c + 1).copied().unwrap_or(xs.len());
            for &key in &keys[a..end] {
                s.table[key as usize] = c as u8;
            }
        }
        let assign = values
            .iter()
            .map(|v| s.table[order_key(v.to_bits()) as usize])
            .collect();
        s.xs = xs;
        s.ws = ws;
        s.keys = keys;
        Ok(KMeans {
            centroids: runs.centroids,
            assign,
            sse: runs.sse,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_key_is_monotone() {
        let vals = [-65504.0f32, -1.5, -1e-7, -0.0, 0.0, 1e-7, 0.25, 65504.0];
        let keys: Vec<u16> = vals
            .iter()
            .map(|&v| order_key(f16::from_f32(v).to_bits()))
            .collect();
        for w in keys.windows(2) {
            assert!(w[0] <= w[1], "{keys:?}");
        }
        for &v in &vals {
            let h = f16::from_f32(v);
            // -0.0 folds into 0.0, which compares equal.
            assert_eq!(key_value(order_key(h.to_bits())), h.to_f64());
        }
    }

    #[test]
    fn few_distinct_values_get_one_cluster_each() {
        let km = kmeans_1d(&[3.0, 1.0, 3.0, 2.0], None, 16).unwrap();
        assert_eq!(km.centroids, vec![1.0, 2.0, 3.0]);
        assert_eq!(km.assign, vec![2, 0, 2, 1]);
        assert_eq!(km.sse, 0.0);
    }

    #[test]
    fn rejects_bad_input() {
        assert!(kmeans_1d(&[1.0], None, 0).is_err());
        assert!(kmeans_1d(&[f32::NAN], None, 2).is_err());
        assert!(kmeans_1d(&[1.0, 2.0], Some(&[1.0]), 2).is_err());
        assert!(kmeans_1d(&[1.0, 2.0], Some(&[0.0, 0.0]), 2).is_err());
        assert!(kmeans_1d_f16(&[f16::INFINITY], None, 2).is_err());
    }
}
