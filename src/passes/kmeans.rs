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

/// Validates the weights and returns their maximum, by which they are divided before
/// clustering (None when unweighted).
///
/// Scaling every weight by one factor does not move the optimum, and dividing by the maximum
/// keeps the prefix sums near 1 whatever the calibration's magnitudes. It also makes equal
/// weights exactly 1.0 (x / x == 1 in IEEE arithmetic), so a weighted run with all-equal
/// weights does bit for bit what the unweighted one does.
fn check_weights(n: usize, weights: Option<&[f32]>) -> Result<Option<f64>> {
    let Some(w) = weights else { return Ok(None) };
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
    let max = w.iter().fold(0.0f32, |a, &b| a.max(b));
    ensure!(
        max > 0.0,
        "k-means: all {n} weights are zero, so every clustering has zero error; \
         give at least one value a positive weight"
    );
    Ok(Some(f64::from(max)))
}

/// Prefix sums of w, w·x and w·x² over values centred at `shift` (centring keeps the
/// `Σwx² − (Σwx)²/Σw` cancellation small), one array each so the scan loops vectorize.
#[derive(Default)]
struct Prefix {
    w: Vec<f64>,
    wx: Vec<f64>,
    wxx: Vec<f64>,
}

impl Prefix {
    fn build(&mut self, xs: &[f64], ws: &[f64], shift: f64) {
        for v in [&mut self.w, &mut self.wx, &mut self.wxx] {
            v.clear();
            v.reserve(xs.len() + 1);
            v.push(0.0);
        }
        let (mut a, mut b, mut c) = (0.0f64, 0.0f64, 0.0f64);
        for (&x, &w) in xs.iter().zip(ws) {
            let d = x - shift;
            a += w;
            b += w * d;
            c += w * d * d;
            self.w.push(a);
            self.wx.push(b);
            self.wxx.push(c);
        }
    }

    /// Weighted SSE of the run `j..=i`.
    #[inline(always)]
    fn cost(&self, j: usize, i: usize) -> f64 {
        let s0 = self.w[i + 1] - self.w[j];
        let s1 = self.wx[i + 1] - self.wx[j];
        let s2 = self.wxx[i + 1] - self.wxx[j];
        // A run of only zero-weight values costs nothing wherever it goes.
        let c = if s0 > 0.0 { s2 - s1 * s1 / s0 } else { 0.0 };
        c.max(0.0)
    }
}

/// One DP layer: `cur[i] = min_{j ≥ lb[i]} prev[j-1] + cost(j, i)` for rows `lo..=hi`, with the
/// argmin (leftmost) in `arg[i]`.
///
/// The argmin is non-decreasing in `i` (concave Monge costs), so divide and conquer on rows
/// narrows each row's candidates to those between its neighbours' argmins; the previous
/// layer's argmin is a further lower bound (an extra cluster never moves the last cluster's
/// start left). Each row's candidates are scored in a branch-free loop into `buf` (which
/// vectorizes and keeps the divisions pipelined) and then scanned for the minimum.
struct Layer<'a> {
    p: &'a Prefix,
    prev: &'a [f64],
    lb: &'a [u32],
    cur: &'a mut [f64],
    arg: &'a mut [u32],
    buf: &'a mut Vec<f64>,
}

impl Layer<'_> {
    fn solve(&mut self, lo: usize, hi: usize, opt_lo: usize, opt_hi: usize) {
        if lo > hi {
            return;
        }
        if opt_lo == opt_hi {
            // Monotone argmins pinned at both ends: every row in between shares them.
            for i in lo..=hi {
                let j = opt_lo.min(i);
                self.cur[i] = self.prev[j - 1] + self.p.cost(j, i);
                self.arg[i] = j as u32;
            }
            return;
        }
        let i = lo + (hi - lo) / 2;
        let b = opt_hi.min(i);
        // Rounding in near-ties could in principle cross the bounds; never search an empty range.
        let a = opt_lo.max(self.lb[i] as usize).min(b);
        let (j, v) = self.best(i, a, b);
        self.cur[i] = v;
        self.arg[i] = j as u32;
        if i > lo {
            self.solve(lo, i - 1, opt_lo, j);
        }
        self.solve(i + 1, hi, j, opt_hi);
    }

    /// Leftmost minimum of `prev[j-1] + cost(j, i)` over `a..=b` (requires 1 ≤ a ≤ b).
    #[inline]
    fn best(&mut self, i: usize, a: usize, b: usize) -> (usize, f64) {
        let p = self.p;
        let (t0, t1, t2) = (p.w[i + 1], p.wx[i + 1], p.wxx[i + 1]);
        let len = b + 1 - a;
        // Equal-length slices let the compiler drop bounds checks and vectorize.
        let (w, wx, wxx) = (&p.w[a..=b], &p.wx[a..=b], &p.wxx[a..=b]);
        let prev = &self.prev[a - 1..b];
        // Prefix sums of non-negative weights never decrease, so s0 ≥ 0; when it is 0 the run
        // has only zero-weight values, s1 = s2 = 0 exactly, and the cost is 0.
        let score = |t: usize| {
            let (s0, s1, s2) = (t0 - w[t], t1 - wx[t], t2 - wxx[t]);
            prev[t] + (s2 - s1 * s1 / s0.max(f64::MIN_POSITIVE)).max(0.0)
        };
        if len <= 16 {
            // Most rows of the recursion have a handful of candidates: keep them cheap.
            let (mut bj, mut bv) = (0, f64::INFINITY);
            for t in 0..len {
                let v = score(t);
                if v < bv {
                    bv = v;
                    bj = t;
                }
            }
            return (a + bj, bv);
        }
        if self.buf.len() < len {
            self.buf.resize(len, 0.0);
        }
        let buf = &mut self.buf[..len];
        let bv = score_and_min(
            buf,
            Run {
                w,
                wx,
                wxx,
                prev,
                t0,
                t1,
                t2,
            },
        );
        let bj = buf.iter().position(|&v| v == bv).unwrap_or(0);
        (a + bj, bv)
    }
}

/// Candidate runs of one DP row: equal-length slices plus the row's prefix totals.
#[derive(Clone, Copy)]
struct Run<'a> {
    w: &'a [f64],
    wx: &'a [f64],
    wxx: &'a [f64],
    prev: &'a [f64],
    t0: f64,
    t1: f64,
    t2: f64,
}

/// Scores every candidate into `buf` and returns the minimum score. Written as two simple
/// loops so they vectorize; the divisions of independent candidates then overlap.
#[inline(always)]
fn score_and_min_body(buf: &mut [f64], r: Run) -> f64 {
    let n = buf.len();
    let (w, wx, wxx, prev) = (&r.w[..n], &r.wx[..n], &r.wxx[..n], &r.prev[..n]);
    for t in 0..n {
        let (s0, s1, s2) = (r.t0 - w[t], r.t1 - wx[t], r.t2 - wxx[t]);
        buf[t] = prev[t] + (s2 - s1 * s1 / s0.max(f64::MIN_POSITIVE)).max(0.0);
    }
    // Four independent lanes make the min reduction vectorizable (min is exact, so the
    // order of comparisons cannot change the result).
    let mut lanes = [f64::INFINITY; 4];
    let mut chunks = buf.chunks_exact(4);
    for c in &mut chunks {
        for l in 0..4 {
            lanes[l] = if c[l] < lanes[l] { c[l] } else { lanes[l] };
        }
    }
    let mut bv = f64::INFINITY;
    for &v in lanes.iter().chain(chunks.remainder()) {
        bv = if v < bv { v } else { bv };
    }
    bv
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn score_and_min_avx2(buf: &mut [f64], r: Run) -> f64 {
    // Same code compiled for 4-wide vectors; no FMA, so results are bit-identical.
    score_and_min_body(buf, r)
}

fn score_and_min(buf: &mut [f64], r: Run) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, checked just above.
        return unsafe { score_and_min_avx2(buf, r) };
    }
    score_and_min_body(buf, r)
}

/// Reusable buffers for one thread's clustering work.
#[derive(Default)]
struct Scratch {
    prefix: Prefix,
    prev: Vec<f64>,
    cur: Vec<f64>,
    argmin: Vec<u32>,
    buf: Vec<f64>,
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
    s.prefix.build(xs, ws, shift);
    let p = &s.prefix;

    let mut starts = vec![0usize; k];
    if k == n {
        for (c, st) in starts.iter_mut().enumerate() {
            *st = c;
        }
    } else if k > 1 {
        // Layer m: best cost of x_0..=x_i in m+1 runs (prev), argmin = start of the last run.
        let (prev, cur, argmin, buf) = (&mut s.prev, &mut s.cur, &mut s.argmin, &mut s.buf);
        prev.clear();
        prev.extend((0..n).map(|i| p.cost(0, i)));
        cur.clear();
        cur.resize(n, f64::INFINITY);
        argmin.clear();
        // Row m-1 of `argmin` is layer m-1's argmin; layer 0's (all 0) doubles as "no bound".
        argmin.resize(k * n, 0);
        for m in 1..k {
            // Ends i must leave room for m runs before and k-1-m runs after.
            let (lo, hi) = (m, n - (k - m));
            let (done, rest) = argmin.split_at_mut(m * n);
            let lb = &done[(m - 1) * n..];
            let mut layer = Layer {
                p,
                prev: &prev[..],
                lb,
                cur: &mut cur[..],
                arg: &mut rest[..n],
                buf,
            };
            if m == k - 1 {
                // The last layer only needs the full range, ending at n-1.
                let a = (layer.lb[n - 1] as usize).max(m);
                let (j, v) = layer.best(n - 1, a, n - 1);
                layer.arg[n - 1] = j as u32;
                layer.cur[n - 1] = v;
            } else {
                layer.solve(lo, hi, m, hi);
            }
            std::mem::swap(prev, cur);
        }
        // Backtrack the run starts.
        let mut i = n - 1;
        for m in (1..k).rev() {
            let j = argmin[m * n + i] as usize;
            starts[m] = j;
            i = j - 1;
        }
    }

    let mut sse = 0.0;
    let centroids = (0..k)
        .map(|c| {
            let (a, b) = (starts[c], if c + 1 < k { starts[c + 1] } else { n });
            let (mut sw, mut swx) = (0.0f64, 0.0f64);
            for t in a..b {
                sw += ws[t];
                swx += ws[t] * xs[t];
            }
            let centre = if sw > 0.0 {
                // A weighted mean can round just outside its run; keep it inside so
                // centroids stay strictly ordered like the runs.
                (swx / sw).clamp(xs[a], xs[b - 1])
            } else {
                // A run of zero-weight values has no mean; any point of it is optimal.
                0.5 * (xs[a] + xs[b - 1])
            };
            // Direct (not prefix-sum) error, so the reported value carries no cancellation.
            sse += (a..b)
                .map(|t| ws[t] * (xs[t] - centre).powi(2))
                .sum::<f64>();
            centre
        })
        .collect();
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
    let wmax = check_weights(values.len(), weights)?;
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
        let w = match (weights, wmax) {
            (Some(w), Some(m)) => f64::from(w[o as usize]) / m,
            _ => 1.0,
        };
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
        sse: runs.sse * wmax.unwrap_or(1.0),
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
    let wmax = check_weights(values.len(), weights)?;
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
        if let (Some(w), Some(m)) = (weights, wmax) {
            for (v, &wt) in values.iter().zip(w) {
                s.wsum[order_key(v.to_bits()) as usize] += f64::from(wt) / m;
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
            sse: runs.sse * wmax.unwrap_or(1.0),
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
