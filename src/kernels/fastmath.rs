//! Branch-free f32 transcendental functions that the compiler vectorises (libm's scalar
//! `expf`/`erff` calls cost 10–40 ns an element and dominate softmax and GELU otherwise).
//! Accuracy (tested): `exp` within 5e-7 relative; `erf` within 5e-7 absolute (Abramowitz &
//! Stegun 7.1.26); `tanh` within a few 1e-7 absolute. All far below fp16 resolution and
//! below the f32 rounding noise of the ops that use them.

/// Defines `fn NAME(ARG) -> RET` as `EACH(ARG)` compiled for the widest vector unit the
/// CPU has: an AVX-512F clone, else an AVX2 clone, else the plain build. `EACH` is
/// `#[inline(always)]`, so each clone vectorises its loops at its own width; the operations
/// and their order stay the same, so the result does not depend on the width.
macro_rules! widest {
    ($(#[$doc:meta])* $vis:vis fn $name:ident($arg:ident: $ty:ty) $(-> $ret:ty)? = $each:ident) => {
        $(#[$doc])*
        $vis fn $name($arg: $ty) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                unsafe fn avx512($arg: $ty) $(-> $ret)? {
                    $each($arg)
                }
                #[target_feature(enable = "avx2")]
                unsafe fn avx2($arg: $ty) $(-> $ret)? {
                    $each($arg)
                }
                if is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU has AVX-512F (checked above).
                    return unsafe { avx512($arg) };
                }
                if is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU has AVX2 (checked above).
                    return unsafe { avx2($arg) };
                }
            }
            $each($arg)
        }
    };
}

/// e^x. Inputs below −87.3 give ~1e-38 (not a subnormal), above 88.7 saturate near f32::MAX.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    // exp(x) = 2^n · e^r with n = round(x / ln 2), |r| ≤ ln2 / 2; ln 2 split in two parts so
    // r is exact. Rounding by adding 1.5·2^23 works with plain SSE2 (no roundps).
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const SHIFT: f32 = 12_582_912.0;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // max/min (not clamp, whose NaN rules block vectorisation) drop NaN, so NaN is passed
    // through explicitly at the end, as a select.
    let xin = x;
    #[allow(clippy::manual_clamp)]
    let x = x.max(-87.3).min(88.7);
    let t = x * LOG2E + SHIFT;
    let n = t - SHIFT;
    let r = x - n * LN2_HI - n * LN2_LO;
    // Cephes' minimax polynomial for e^r on [-ln2/2, ln2/2].
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_2e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    // n sits in the low mantissa bits of t: 2^n without a float → int conversion.
    let n_bits = t.to_bits().wrapping_sub(SHIFT.to_bits());
    let y = e * f32::from_bits(n_bits.wrapping_add(127) << 23);
    if xin.is_nan() {
        xin
    } else {
        y
    }
}

/// erf(x): its Maclaurin series below |x| = 0.5 (keeps small values relatively accurate),
/// Abramowitz & Stegun 7.1.26 above. Both are computed and one selected, so it vectorises.
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    let a = x.abs();
    let t = 1.0 / (1.0 + 0.327_591_1 * a);
    let poly = ((((1.061_405_4 * t - 1.453_152_1) * t + 1.421_413_7) * t - 0.284_496_72) * t
        + 0.254_829_6)
        * t;
    let big = (1.0 - poly * exp(-a * a)).copysign(x);
    // 2/sqrt(pi) · (x − x³/3 + x⁵/10 − x⁷/42 + x⁹/216 − x¹¹/1320); next term < 1.3e-8 at 0.5.
    let z = x * x;
    let series = ((((-1.0 / 1320.0 * z + 1.0 / 216.0) * z - 1.0 / 42.0) * z + 0.1) * z - 1.0 / 3.0)
        * z
        + 1.0;
    let small = std::f32::consts::FRAC_2_SQRT_PI * x * series;
    if a < 0.5 {
        small
    } else {
        big
    }
}

/// tanh(x) = 1 − 2 / (e^{2x} + 1), odd-symmetric.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    let a = x.abs().min(20.0);
    let e = exp(2.0 * a);
    (1.0 - 2.0 / (e + 1.0)).copysign(x)
}

/// 1 / (1 + e^−x).
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// GELU, exact form: x/2 · (1 + erf(x/√2)).
#[inline(always)]
pub fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// GELU, tanh approximation.
#[inline(always)]
pub fn gelu_tanh(x: f32) -> f32 {
    const C: f32 = 0.797_884_6; // sqrt(2/pi)
    0.5 * x * (1.0 + tanh(C * (x + 0.044_715 * x * x * x)))
}

/// Which GELU: the exact form, the tanh approximation, or `x · σ(1.702 x)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gelu {
    Exact,
    Tanh,
    Sigmoid,
}

impl Gelu {
    /// GELU of one value in this form.
    #[inline(always)]
    pub fn apply(self, x: f32) -> f32 {
        match self {
            Gelu::Exact => gelu(x),
            Gelu::Tanh => gelu_tanh(x),
            Gelu::Sigmoid => x * sigmoid(1.702 * x),
        }
    }

    /// Every value of `v` replaced by its GELU, in vector lanes as wide as the CPU has (the
    /// same IEEE operations at any width, so the same bits).
    pub fn apply_slice(self, v: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU has AVX-512F (checked above).
                return unsafe { self.slice_avx512(v) };
            }
            if is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2 (checked above).
                return unsafe { self.slice_avx2(v) };
            }
        }
        self.apply_each(v)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn slice_avx512(self, v: &mut [f32]) {
        self.apply_each(v)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn slice_avx2(self, v: &mut [f32]) {
        self.apply_each(v)
    }

    /// The loop, inlined where it is called (so vectorised for the caller's target
    /// features), one per form so that no branch stays inside it.
    #[inline(always)]
    pub fn apply_each(self, v: &mut [f32]) {
        match self {
            Gelu::Exact => v.iter_mut().for_each(|x| *x = gelu(*x)),
            Gelu::Tanh => v.iter_mut().for_each(|x| *x = gelu_tanh(*x)),
            Gelu::Sigmoid => v.iter_mut().for_each(|x| *x = *x * sigmoid(1.702 * *x)),
        }
    }
}

widest! {
    /// log Σ e^x over the non-NaN elements of `x`; −∞ for an empty or all −∞ slice (a
    /// vocabulary's log-softmax normaliser: three per decoded token with timestamps, one per
    /// token and clip in the fidelity metrics). The terms e^(x − max) ≤ 1 are computed in f32
    /// ([`exp`]) and summed in f64 in eight lanes, so the result is within about 1e-6 of the
    /// f64 sum (tested). Compiled for the widest vector unit the CPU has — the same operations
    /// in the same order at every width, so the same bits: the portable loop, vectorised for
    /// plain x86-64 (SSE2), took about 0.2 ms over a 51,864-token vocabulary.
    pub fn log_sum_exp(x: &[f32]) -> f64 = log_sum_exp_each
}

/// [`log_sum_exp`]'s loops, inlined into each width's function.
#[inline(always)]
pub fn log_sum_exp_each(x: &[f32]) -> f64 {
    let max = max_each(x);
    if max == f32::NEG_INFINITY {
        return f64::NEG_INFINITY;
    }
    // Eight f64 partial sums; NaN and −∞ add nothing.
    let term = |v: f32| {
        let e = f64::from(exp(v - max));
        if v.is_nan() || v == f32::NEG_INFINITY {
            0.0
        } else {
            e
        }
    };
    let mut acc = [0f64; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += term(v);
        }
    }
    let tail: f64 = chunks.remainder().iter().map(|&v| term(v)).sum();
    f64::from(max) + (acc.iter().sum::<f64>() + tail).ln()
}

widest! {
    /// The largest non-NaN value of `x`; −∞ for an empty or all-NaN slice. Vectorised as
    /// [`log_sum_exp`] (the lanes' maximum is the same whatever the order, so the same value at
    /// every width).
    pub fn max(x: &[f32]) -> f32 = max_each
}

/// [`max`]'s loop: sixteen lanes, each replaced only by a larger value (a comparison with
/// NaN is false, so NaN never enters).
#[inline(always)]
fn max_each(x: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 16];
    let chunks = x.chunks_exact(16);
    let rest = chunks.remainder();
    for c in chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            *m = if v > *m { v } else { *m };
        }
    }
    lanes
        .iter()
        .chain(rest)
        .fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m })
}

widest! {
    /// `row` replaced by its softmax: `e^(x − max)` ([`exp`], [`max`]) divided by their
    /// [`sum`]. Compiled for the widest vector unit the CPU has, the same operations in the
    /// same order at every width, so the same bits (a decode step's attention runs it on every
    /// head's scores; as part of the plain x86-64 build, 128-bit lanes and a serial maximum,
    /// it took about as long as reading the head's keys).
    pub fn softmax(row: &mut [f32]) = softmax_each
}

#[inline(always)]
fn softmax_each(row: &mut [f32]) {
    let m = max_each(row);
    row.iter_mut().for_each(|e| *e = exp(*e - m));
    let inv = 1.0 / sum(row);
    row.iter_mut().for_each(|e| *e *= inv);
}

/// Whether no element of `x` is infinite or NaN (one vectorised pass, no early exit).
pub fn all_finite(x: &[f32]) -> bool {
    x.iter().fold(true, |all, v| all & v.is_finite())
}

/// The first index of the largest value of `x` that is neither NaN nor −∞ (+∞ included);
/// None when there is none. Two vectorised passes: [`max`], then the first sixteen-element
/// chunk that holds it.
pub fn argmax(x: &[f32]) -> Option<usize> {
    let m = max(x);
    if m == f32::NEG_INFINITY {
        return None;
    }
    let (c, chunk) = x
        .chunks(16)
        .enumerate()
        .find(|(_, c)| c.iter().fold(false, |any, &v| any | (v == m)))?;
    Some(c * 16 + chunk.iter().position(|&v| v == m)?)
}

/// `Σ a·b` with eight independent partial sums, so the loop vectorises (a plain iterator
/// sum is one serial add chain: f32 addition is not reassociated by the compiler).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let tail: f32 = ra.iter().zip(rb).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + tail
}

/// `Σ a` with eight independent partial sums (see [`dot`]).
#[inline(always)]
pub fn sum(a: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let c = a.chunks_exact(8);
    let r = c.remainder();
    for x in c {
        for i in 0..8 {
            acc[i] += x[i];
        }
    }
    acc.iter().sum::<f32>() + r.iter().sum::<f32>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_to_libm_over_the_useful_range() {
        let mut worst = (0f64, 0f64, 0f64, 0f64);
        for i in -20_000..=20_000 {
            let x = i as f32 * 0.004; // −80 .. 80
            let e = exp(x) as f64;
            let want = (x as f64).exp();
            worst.0 = worst.0.max(((e - want) / want).abs());
            let xs = x / 27.0; // −2.96 .. 2.96, where the series below is exact in f64
            let (e, w) = (erf(xs) as f64, libm_erf(xs as f64));
            worst.1 = worst.1.max((e - w).abs());
            if xs != 0.0 {
                worst.3 = worst.3.max(((e - w) / w).abs());
            }
            worst.2 = worst.2.max((tanh(xs) as f64 - (xs as f64).tanh()).abs());
        }
        assert!(worst.0 < 5e-7, "exp rel error {}", worst.0);
        assert!(worst.1 < 5e-7, "erf abs error {}", worst.1);
        assert!(worst.3 < 1e-5, "erf rel error {}", worst.3);
        assert!(worst.2 < 5e-7, "tanh abs error {}", worst.2);
        assert_eq!(exp(f32::NEG_INFINITY), exp(-87.3));
        assert!(exp(f32::NAN).is_nan());
        assert!((erf(5.0) - 1.0).abs() < 2e-7 && (erf(-9.0) + 1.0).abs() < 2e-7);
    }

    /// A vocabulary-sized row of logits (spread as a decoder's are; 51,867: a tail that is
    /// not a whole chunk of eight or sixteen).
    fn logits() -> Vec<f32> {
        (0..51_867)
            .map(|i| ((i * 7919 % 1000) as f32 - 700.0) * 0.03)
            .collect()
    }

    #[test]
    fn log_sum_exp_matches_the_f64_sum_within_1e_6() {
        // With suppressed tokens (−∞) and a NaN.
        let mut x = logits();
        x[3] = f32::NEG_INFINITY;
        x[100] = f32::NAN;
        x[51_866] = f32::NEG_INFINITY;
        let want = |x: &[f32]| {
            let v: Vec<f64> = x
                .iter()
                .filter(|v| !v.is_nan())
                .map(|&v| v as f64)
                .collect();
            let m = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            m + v.iter().map(|&v| (v - m).exp()).sum::<f64>().ln()
        };
        for part in [&x[..], &x[..5], &x[50_363..]] {
            let (got, want) = (log_sum_exp(part), want(part));
            assert!((got - want).abs() < 1e-6, "{got} vs {want}");
        }
        assert_eq!(
            log_sum_exp(&[f32::NEG_INFINITY, f32::NAN]),
            f64::NEG_INFINITY
        );
        assert_eq!(log_sum_exp(&[]), f64::NEG_INFINITY);
    }

    #[test]
    fn log_sum_exp_gives_the_same_bits_at_every_vector_width() {
        // Suppressed tokens, a NaN, a maximum in the tail that is not a whole chunk, and
        // slices starting at odd offsets.
        let mut x = logits();
        x[3] = f32::NEG_INFINITY;
        x[100] = f32::NAN;
        x[51_866] = 40.0;
        for part in [&x[..], &x[1..], &x[5..], &x[50_363..], &x[..7]] {
            let (got, each) = (log_sum_exp(part), log_sum_exp_each(part));
            assert_eq!(got.to_bits(), each.to_bits(), "{got} vs {each}");
            assert!(got.is_finite());
        }
        assert_eq!(log_sum_exp(&[f32::NAN]), f64::NEG_INFINITY);
    }

    #[test]
    fn softmax_matches_f64_within_2e_6_relative_and_gives_the_same_bits_at_every_vector_width() {
        // Rows as a decode step's attention scores are (1,500 frames, a causal mask's −∞,
        // lengths that are not whole chunks), against the softmax in f64 written here.
        let mut x = logits();
        x[7] = f32::NEG_INFINITY;
        for part in [&x[..1500], &x[3..40], &x[..5], &x[50_000..]] {
            let mut got = part.to_vec();
            softmax(&mut got);
            let mut each = part.to_vec();
            softmax_each(&mut each);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&each), "{} elements", part.len());
            let m = part.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
            let e: Vec<f64> = part.iter().map(|&v| (v as f64 - m).exp()).collect();
            let total: f64 = e.iter().sum();
            for (g, w) in got.iter().zip(&e) {
                let w = w / total;
                // (A masked score's e^−∞ is `exp`'s floor e^−87.3, not 0.)
                assert!((*g as f64 - w).abs() <= 2e-6 * w + 1e-37, "{g} vs {w}");
            }
        }
        let mut y = [f32::NEG_INFINITY; 3];
        softmax(&mut y);
        assert!(
            y.iter().all(|v| v.is_nan()),
            "a row with no finite score: {y:?}"
        );
    }

    #[test]
    fn all_finite_is_false_for_any_infinity_or_nan_anywhere() {
        let x = logits();
        assert!(all_finite(&x) && all_finite(&[]));
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            for at in [0, 15, 16, 51_866] {
                let mut y = x.clone();
                y[at] = bad;
                assert!(!all_finite(&y), "{bad} at {at}");
            }
        }
    }

    #[test]
    fn argmax_takes_the_first_largest_and_skips_nan_and_minus_infinity() {
        // Against a plain scan written here, on vocabulary-sized rows with ties, NaN, −∞
        // and +∞ at chunk edges and inside the tail.
        let plain = |x: &[f32]| {
            let mut best: Option<(usize, f32)> = None;
            for (i, &v) in x.iter().enumerate() {
                if v.is_nan() || v == f32::NEG_INFINITY {
                    continue;
                }
                if best.is_none_or(|(_, b)| v > b) {
                    best = Some((i, v));
                }
            }
            best.map(|(i, _)| i)
        };
        let mut x = logits();
        assert_eq!(argmax(&x), plain(&x));
        x[15] = f32::NAN;
        x[16] = 100.0;
        x[40_000] = 100.0;
        assert_eq!(argmax(&x), Some(16));
        x[51_866] = f32::INFINITY;
        assert_eq!(argmax(&x), Some(51_866));
        x[0] = f32::NAN;
        assert_eq!(argmax(&x), plain(&x));
        for v in [f32::NAN, f32::NEG_INFINITY] {
            let y = vec![v; 37];
            assert_eq!((argmax(&y), max(&y)), (None, f32::NEG_INFINITY));
        }
        let y = [f32::NEG_INFINITY, f32::NAN, -3.0, -3.0];
        assert_eq!(argmax(&y), Some(2));
        assert_eq!(argmax(&[]), None);
        assert_eq!(max(&x[1..17]), 100.0);
    }

    /// erf by its Maclaurin series (cancellation stays below 1e-12 for |x| ≤ 3).
    fn libm_erf(x: f64) -> f64 {
        let (mut term, mut sum, mut n) = (x, x, 0.0);
        while term.abs() > 1e-18 && n < 200.0 {
            n += 1.0;
            term *= -x * x / n;
            sum += term / (2.0 * n + 1.0);
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    }
}
