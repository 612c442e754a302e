//! k-means on short vectors (2 or 4 components) for vector palettization.
//!
//! Unlike 1-D k-means ([`super::kmeans`]), clustering in two or more dimensions has no
//! exact polynomial solution, so this is Lloyd's method from a k-means++ start, as
//! coremltools runs it for `cluster_dim` > 1 (scikit-learn's `KMeans(init="k-means++",
//! n_init=1)`): seeding draws each new centre with probability proportional to the
//! weighted squared distance to the nearest centre chosen so far; each Lloyd iteration
//! assigns every vector to its nearest centre and moves each centre to the (weighted) mean
//! of its vectors, until no assignment changes, the error stops falling (relative drop below
//! [`REL_TOL`]) or [`MAX_ITER`] iterations have run. A centre left without vectors moves to
//! the vector farthest from its own centre.
//!
//! Weights are per component (an importance per element): the distance of vector `x` to
//! centre `μ` is `Σ_c w_c (x_c − μ_c)²` and each centre component is the `w`-weighted mean
//! of its cluster's components, which is the exact minimizer of the assignment step's
//! objective. Determinism: the random draws come from one seed, and every parallel sum is
//! taken over fixed chunks combined in order, so the result does not depend on the
//! number of threads.

use crate::ops::random::Rng;
use anyhow::{bail, ensure, Result};
use rayon::prelude::*;

/// Lloyd iterations at most.
pub const MAX_ITER: usize = 60;
/// Stop when an iteration lowers the error by less than this share of it.
pub const REL_TOL: f64 = 1e-5;
/// Vectors per parallel chunk (fixed, so sums are combined the same way on any machine).
const CHUNK: usize = 4096;

/// Result of a vector k-means.
#[derive(Debug, Clone, PartialEq)]
pub struct KMeansVec {
    /// `k` centres of `dim` components each, row-major; entries no vector uses (fewer
    /// distinct vectors than `k`) are zero, as coremltools pads its tables.
    pub centroids: Vec<f64>,
    /// Centre index of each vector.
    pub assign: Vec<u8>,
    /// Weighted sum of squared errors of `assign` against `centroids`.
    pub sse: f64,
    /// Lloyd iterations run.
    pub iterations: usize,
}

/// Points of `dim` components (row-major), with optional per-component weights.
#[derive(Clone, Copy)]
pub struct Points<'a> {
    pub values: &'a [f32],
    pub weights: Option<&'a [f32]>,
    pub dim: usize,
}

impl Points<'_> {
    fn len(&self) -> usize {
        self.values.len() / self.dim
    }
    #[inline(always)]
    fn x(&self, i: usize) -> &[f32] {
        &self.values[i * self.dim..(i + 1) * self.dim]
    }
    #[inline(always)]
    fn w(&self, i: usize, c: usize) -> f32 {
        self.weights.map_or(1.0, |w| w[i * self.dim + c])
    }
    /// Weighted squared distance of point `i` to `centre`.
    #[inline(always)]
    fn dist(&self, i: usize, centre: &[f64]) -> f64 {
        let x = self.x(i);
        (0..self.dim)
            .map(|c| {
                let d = f64::from(x[c]) - centre[c];
                f64::from(self.w(i, c)) * d * d
            })
            .sum()
    }
}

/// Centres in structure-of-arrays form (component-major, f32) for the nearest-centre scan.
struct Soa {
    comp: Vec<Vec<f32>>,
    k: usize,
}

impl Soa {
    fn new(centroids: &[f64], dim: usize) -> Soa {
        let k = centroids.len() / dim;
        Soa {
            comp: (0..dim)
                .map(|c| (0..k).map(|j| centroids[j * dim + c] as f32).collect())
                .collect(),
            k,
        }
    }
}

/// Index of the nearest centre of point `i` (lowest index on ties), scored in f32 into
/// `buf` in a loop over centres that vectorizes.
#[inline]
fn nearest(p: &Points, i: usize, soa: &Soa, buf: &mut [f32]) -> usize {
    let buf = &mut buf[..soa.k];
    buf.fill(0.0);
    let x = p.x(i);
    for (c, comp) in soa.comp.iter().enumerate() {
        let (xc, wc) = (x[c], p.w(i, c));
        for (b, &m) in buf.iter_mut().zip(comp) {
            let d = xc - m;
            *b += wc * d * d;
        }
    }
    let (mut best, mut bv) = (0usize, f32::INFINITY);
    for (j, &v) in buf.iter().enumerate() {
        if v < bv {
            bv = v;
            best = j;
        }
    }
    best
}

/// Assigns every point to its nearest centre (`centroids` row-major, `dim` per entry).
pub fn assign_nearest(p: Points, centroids: &[f64]) -> Vec<u8> {
    let soa = Soa::new(centroids, p.dim);
    let mut out = vec![0u8; p.len()];
    out.par_chunks_mut(CHUNK).enumerate().for_each_init(
        || vec![0f32; soa.k],
        |buf, (ci, dst)| {
            for (t, o) in dst.iter_mut().enumerate() {
                *o = nearest(&p, ci * CHUNK + t, &soa, buf) as u8;
            }
        },
    );
    out
}

fn check(p: &Points, k: usize) -> Result<()> {
    ensure!(
        p.dim >= 1 && p.values.len().is_multiple_of(p.dim) && !p.values.is_empty(),
        "vector k-means: {} values do not form vectors of {} components",
        p.values.len(),
        p.dim
    );
    ensure!(
        (1..=super::kmeans::MAX_K).contains(&k),
        "vector k-means: k must be in 1..={}, got {k}",
        super::kmeans::MAX_K
    );
    if let Some((i, v)) = p.values.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        bail!("vector k-means: value {i} is {v}; only finite values can be clustered");
    }
    if let Some(w) = p.weights {
        ensure!(
            w.len() == p.values.len(),
            "vector k-means: {} weights for {} values (need one per component)",
            w.len(),
            p.values.len()
        );
        if let Some((i, &bad)) = w
            .iter()
            .enumerate()
            .find(|(_, v)| !(v.is_finite() && **v >= 0.0))
        {
            bail!("vector k-means: weight {i} is {bad}; weights must be finite and ≥ 0");
        }
        ensure!(
            w.iter().any(|&v| v > 0.0),
            "vector k-means: all weights are zero; give at least one value a positive weight"
        );
    }
    Ok(())
}

/// k-means++ seeding: up to `k` centres (fewer when the points have fewer distinct
/// positions at positive distance), row-major.
fn seed(p: &Points, k: usize, rng: &mut Rng) -> Vec<f64> {
    let (n, dim) = (p.len(), p.dim);
    let mass: Vec<f64> = (0..n)
        .map(|i| (0..dim).map(|c| f64::from(p.w(i, c))).sum())
        .collect();
    let first = draw(&mass, rng).unwrap_or(0);
    let mut centres: Vec<f64> = p.x(first).iter().map(|&v| f64::from(v)).collect();
    let mut d2: Vec<f64> = (0..n).map(|i| p.dist(i, &centres[..dim])).collect();
    while centres.len() / dim < k {
        let Some(next) = draw(&d2, rng) else { break };
        let c: Vec<f64> = p.x(next).iter().map(|&v| f64::from(v)).collect();
        d2.par_chunks_mut(CHUNK).enumerate().for_each(|(ci, dst)| {
            for (t, d) in dst.iter_mut().enumerate() {
                *d = d.min(p.dist(ci * CHUNK + t, &c));
            }
        });
        centres.extend(c);
    }
    centres
}

/// Index drawn with probability proportional to `mass` (None when all mass is zero).
fn draw(mass: &[f64], rng: &mut Rng) -> Option<usize> {
    let sums: Vec<f64> = mass.par_chunks(CHUNK).map(|c| c.iter().sum()).collect();
    let total: f64 = sums.iter().sum();
    if total.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
        return None;
    }
    let mut u = rng.uniform() * total;
    for (ci, &s) in sums.iter().enumerate() {
        if u < s || ci + 1 == sums.len() {
            let chunk = &mass[ci * CHUNK..((ci + 1) * CHUNK).min(mass.len())];
            let mut last_positive = None;
            for (t, &m) in chunk.iter().enumerate() {
                if m > 0.0 {
                    last_positive = Some(ci * CHUNK + t);
                    if u < m {
                        return last_positive;
                    }
                }
                u -= m;
            }
            // Rounding left u just past the chunk's end: its last positive point.
            if last_positive.is_some() {
                return last_positive;
            }
        }
        u -= s;
    }
    mass.iter().rposition(|&m| m > 0.0)
}

/// Per-chunk sums of one assignment pass: Σw·x and Σw per centre component, the error, the
/// number of changed assignments, and the farthest point (distance, index).
struct Sums {
    wx: Vec<f64>,
    w: Vec<f64>,
    count: Vec<u64>,
    sse: f64,
    changed: usize,
    far: (f64, usize),
}

impl Sums {
    /// Nothing summed yet, for `used` centres of `dim` components.
    fn zero(used: usize, dim: usize) -> Self {
        Sums {
            wx: vec![0.0; used * dim],
            w: vec![0.0; used * dim],
            count: vec![0; used],
            sse: 0.0,
            changed: 0,
            far: (-1.0, 0),
        }
    }
}

/// k-means of `p` into `k` clusters, seeded deterministically by `seed`.
pub fn kmeans_vectors(p: Points, k: usize, seed_value: u64) -> Result<KMeansVec> {
    check(&p, k)?;
    let (n, dim) = (p.len(), p.dim);
    let mut rng = Rng::new(seed_value);
    let mut centroids = seed(&p, k, &mut rng);
    let used = centroids.len() / dim;
    let mut assign = vec![u8::MAX; n];
    let mut prev_sse = f64::INFINITY;
    let mut iterations = 0;
    let mut sse;
    loop {
        let soa = Soa::new(&centroids, dim);
        let parts: Vec<Sums> = assign
            .par_chunks_mut(CHUNK)
            .enumerate()
            .map_init(
                || vec![0f32; used],
                |buf, (ci, dst)| {
                    let mut s = Sums::zero(used, dim);
                    for (t, a) in dst.iter_mut().enumerate() {
                        let i = ci * CHUNK + t;
                        let j = nearest(&p, i, &soa, buf);
                        if usize::from(*a) != j {
                            s.changed += 1;
                            *a = j as u8;
                        }
                        let d = p.dist(i, &centroids[j * dim..(j + 1) * dim]);
                        s.sse += d;
                        if d > s.far.0 {
                            s.far = (d, i);
                        }
                        s.count[j] += 1;
                        for (c, &x) in p.x(i).iter().enumerate() {
                            let w = f64::from(p.w(i, c));
                            s.wx[j * dim + c] += w * f64::from(x);
                            s.w[j * dim + c] += w;
                        }
                    }
                    s
                },
            )
            .collect();
        let mut total = Sums::zero(used, dim);
        for s in &parts {
            for (a, b) in total.wx.iter_mut().zip(&s.wx) {
                *a += b;
            }
            for (a, b) in total.w.iter_mut().zip(&s.w) {
                *a += b;
            }
            for (a, b) in total.count.iter_mut().zip(&s.count) {
                *a += b;
            }
            total.sse += s.sse;
            total.changed += s.changed;
            if s.far.0 > total.far.0 {
                total.far = s.far;
            }
        }
        sse = total.sse;
        let converged = total.changed == 0
            || iterations >= MAX_ITER
            || (prev_sse.is_finite() && prev_sse - sse <= REL_TOL * prev_sse);
        if converged {
            break;
        }
        prev_sse = sse;
        iterations += 1;
        // Move every centre to the weighted mean of its points; an empty one to the point
        // farthest from its centre (one per iteration, so two empties do not collide).
        let mut reseeded = false;
        for j in 0..used {
            if total.count[j] == 0 {
                if !reseeded && total.far.0 > 0.0 {
                    for (c, &x) in p.x(total.far.1).iter().enumerate() {
                        centroids[j * dim + c] = f64::from(x);
                    }
                    reseeded = true;
                }
                continue;
            }
            for c in 0..dim {
                let w = total.w[j * dim + c];
                // A component whose weights are all zero has no mean; it stays where it is.
                if w > 0.0 {
                    centroids[j * dim + c] = total.wx[j * dim + c] / w;
                }
            }
        }
    }
    centroids.resize(k * dim, 0.0);
    Ok(KMeansVec {
        centroids,
        assign,
        sse,
        iterations,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn separated_clusters_are_found_exactly() {
        // Four tight clouds in 2-D: k = 4 must put each cloud in its own cluster.
        let centres = [(-3.0f32, 1.0f32), (2.0, 2.0), (0.5, -4.0), (5.0, -1.0)];
        let mut v = Vec::new();
        for i in 0..400 {
            let (x, y) = centres[i % 4];
            let e = ((i * 37 % 11) as f32 - 5.0) * 0.01;
            v.extend([x + e, y - e]);
        }
        let p = Points {
            values: &v,
            weights: None,
            dim: 2,
        };
        let km = kmeans_vectors(p, 4, 7).unwrap();
        for i in 0..400 {
            assert_eq!(km.assign[i], km.assign[i % 4], "point {i}");
        }
        for (j, &(x, y)) in centres.iter().enumerate() {
            let a = usize::from(km.assign[j]);
            assert!((km.centroids[2 * a] - f64::from(x)).abs() < 0.02);
            assert!((km.centroids[2 * a + 1] - f64::from(y)).abs() < 0.02);
        }
        // Same seed, same answer.
        assert_eq!(kmeans_vectors(p, 4, 7).unwrap(), km);
    }

    #[test]
    fn the_result_does_not_depend_on_the_thread_count() {
        // Several chunks of points, weighted, so the chunked sums matter.
        let n = 3 * CHUNK + 123;
        let mut z = 0x1234_5678u64;
        let mut next = || {
            z = z
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        };
        let v: Vec<f32> = (0..2 * n).map(|_| next()).collect();
        let w: Vec<f32> = (0..2 * n).map(|_| next().abs() + 0.1).collect();
        let p = Points {
            values: &v,
            weights: Some(&w),
            dim: 2,
        };
        let run = |threads: usize| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(|| kmeans_vectors(p, 32, 3).unwrap())
        };
        let one = run(1);
        assert!(one.iterations > 1);
        assert_eq!(run(3), one);
    }

    #[test]
    fn fewer_distinct_vectors_than_entries_pad_with_zeros() {
        let v = [1.0f32, 2.0, 1.0, 2.0, 3.0, 4.0];
        let p = Points {
            values: &v,
            weights: None,
            dim: 2,
        };
        let km = kmeans_vectors(p, 4, 0).unwrap();
        assert_eq!(km.sse, 0.0);
        assert_eq!(km.centroids[4..], [0.0; 4]);
        assert_eq!(km.assign[0], km.assign[1]);
        assert_ne!(km.assign[0], km.assign[2]);
    }

    #[test]
    fn rejects_bad_input() {
        let p = |v: &'static [f32], w: Option<&'static [f32]>| Points {
            values: v,
            weights: w,
            dim: 2,
        };
        assert!(kmeans_vectors(p(&[1.0, 2.0, 3.0], None), 2, 0).is_err());
        assert!(kmeans_vectors(p(&[1.0, f32::NAN], None), 2, 0).is_err());
        assert!(kmeans_vectors(p(&[1.0, 2.0], Some(&[0.0, 0.0])), 2, 0).is_err());
        assert!(kmeans_vectors(p(&[1.0, 2.0], None), 0, 0).is_err());
    }
}
