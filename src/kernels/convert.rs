//! fp16 ↔ f32 conversion of whole slices with F16C (eight lanes per instruction, the loop in
//! one function). `half`'s slice conversions call a non-inlined helper per eight elements,
//! which made widening and narrowing cost more than the arithmetic between them in every
//! elementwise op and in the decode attention. Round-to-nearest-even either way, as IEEE
//! (and `half`) convert.

use half::f16;

fn f16c() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("f16c") && is_x86_feature_detected!("avx")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `dst[i] = src[i]` widened; the slices must have the same length.
pub fn f16_to_f32(src: &[f16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "f16_to_f32: length mismatch");
    #[cfg(target_arch = "x86_64")]
    {
        if f16c() {
            // SAFETY: the CPU has F16C and AVX (checked above); lengths are equal.
            unsafe { avx::widen(src, dst) };
            return;
        }
    }
    for (d, s) in dst.iter_mut().zip(src) {
        *d = s.to_f32();
    }
}

/// `dst[i] = src[i]` rounded to fp16 (nearest, ties to even).
pub fn f32_to_f16(src: &[f32], dst: &mut [f16]) {
    assert_eq!(src.len(), dst.len(), "f32_to_f16: length mismatch");
    #[cfg(target_arch = "x86_64")]
    {
        if f16c() {
            // SAFETY: as above.
            unsafe { avx::narrow(src, dst) };
            return;
        }
    }
    for (d, s) in dst.iter_mut().zip(src) {
        *d = f16::from_f32(*s);
    }
}

/// Rounds every value to the nearest fp16 and back, in place.
pub fn round_f16(buf: &mut [f32]) {
    let mut tmp = [f16::ZERO; 256];
    for c in buf.chunks_mut(256) {
        let t = &mut tmp[..c.len()];
        f32_to_f16(c, t);
        f16_to_f32(t, c);
    }
}

/// `out[i] = fp16(r(a[i]·b[i]) + r(c[i]·d[i]))` with `r` the rounding to fp16 and back: the
/// cache blend `a·b + c·d` of fp16 operands (given widened) rounded exactly as `mul`, `mul`
/// and `add` on fp16 tensors round, in one pass.
pub fn blend_to_f16(a: &[f32], b: &[f32], c: &[f32], d: &[f32], out: &mut [f16]) {
    let n = out.len();
    assert!(
        a.len() == n && b.len() == n && c.len() == n && d.len() == n,
        "blend_to_f16: length mismatch"
    );
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    {
        if f16c() {
            // SAFETY: the CPU has F16C and AVX (checked above); all lengths are `n`.
            done = unsafe { avx::blend(a, b, c, d, out) };
        }
    }
    // What the vector loop left (all of it without F16C).
    let r = |x: f32| f16::from_f32(x).to_f32();
    for i in done..n {
        out[i] = f16::from_f32(r(a[i] * b[i]) + r(c[i] * d[i]));
    }
}

#[cfg(target_arch = "x86_64")]
mod avx {
    use half::f16;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx,f16c")]
    pub unsafe fn widen(src: &[f16], dst: &mut [f32]) {
        let n = src.len();
        let mut i = 0;
        unsafe {
            while i + 8 <= n {
                let h = _mm_loadu_si128(src.as_ptr().add(i) as *const __m128i);
                _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
                i += 8;
            }
        }
        for j in i..n {
            dst[j] = src[j].to_f32();
        }
    }

    /// The whole groups of eight of `blend_to_f16`; returns how many elements it wrote.
    #[target_feature(enable = "avx,f16c")]
    pub unsafe fn blend(a: &[f32], b: &[f32], c: &[f32], d: &[f32], out: &mut [f16]) -> usize {
        let n = out.len();
        let mut i = 0;
        unsafe {
            macro_rules! r16 {
                ($v:expr) => {
                    _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>($v))
                };
            }
            macro_rules! ld {
                ($s:expr) => {
                    _mm256_loadu_ps($s.as_ptr().add(i))
                };
            }
            while i + 8 <= n {
                // Separate multiplies (no FMA): each product is rounded on its own.
                let p = r16!(_mm256_mul_ps(ld!(a), ld!(b)));
                let q = r16!(_mm256_mul_ps(ld!(c), ld!(d)));
                let y = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_add_ps(p, q));
                _mm_storeu_si128(out.as_mut_ptr().add(i) as *mut __m128i, y);
                i += 8;
            }
        }
        i
    }

    #[target_feature(enable = "avx,f16c")]
    pub unsafe fn narrow(src: &[f32], dst: &mut [f16]) {
        let n = src.len();
        let mut i = 0;
        unsafe {
            while i + 8 <= n {
                let v = _mm256_loadu_ps(src.as_ptr().add(i));
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
                _mm_storeu_si128(dst.as_mut_ptr().add(i) as *mut __m128i, h);
                i += 8;
            }
        }
        for j in i..n {
            dst[j] = f16::from_f32(src[j]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widening_is_exact_for_every_fp16_value() {
        let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
        let mut out = vec![0f32; all.len()];
        f16_to_f32(&all, &mut out);
        for (h, f) in all.iter().zip(&out) {
            if h.is_nan() {
                assert!(f.is_nan());
            } else {
                assert_eq!(f.to_bits(), h.to_f32().to_bits(), "{h:?}");
            }
        }
    }

    #[test]
    fn narrowing_rounds_to_nearest_even_like_half() {
        // Every fp16 value, the midpoints between neighbours (ties), and values just off
        // them, plus overflow and underflow.
        let mut v: Vec<f32> = vec![1e9, -1e9, 65520.0, 65519.0, 1e-9, -1e-9, 0.0, -0.0];
        for b in 0..0x7bffu16 {
            let (lo, hi) = (f16::from_bits(b).to_f32(), f16::from_bits(b + 1).to_f32());
            let mid = (lo as f64 + hi as f64) / 2.0;
            for x in [lo, mid as f32, f32::from_bits((mid as f32).to_bits() + 1)] {
                v.push(x);
                v.push(-x);
            }
        }
        let mut out = vec![f16::ZERO; v.len()];
        f32_to_f16(&v, &mut out);
        for (x, h) in v.iter().zip(&out) {
            assert_eq!(h.to_bits(), f16::from_f32(*x).to_bits(), "{x}");
        }
    }

    #[test]
    fn blend_rounds_like_three_fp16_ops() {
        // Operands that are fp16 values (as widened fp16 tensors are), products that need
        // rounding, and sums near ties; 37 elements: SIMD lanes and a tail.
        let v = |i: usize, k: u32| {
            let x = ((i as f32 * 0.37 + k as f32).sin() * 3.0) * (1.0 + (i % 7) as f32 * 0.11);
            f16::from_f32(x).to_f32()
        };
        let n = 37;
        let (a, b, c, d): (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) = (
            (0..n).map(|i| v(i, 1)).collect(),
            (0..n).map(|i| v(i, 2)).collect(),
            (0..n).map(|i| v(i, 3)).collect(),
            (0..n).map(|i| v(i, 4)).collect(),
        );
        let mut got = vec![f16::ZERO; n];
        blend_to_f16(&a, &b, &c, &d, &mut got);
        for i in 0..n {
            let p = f16::from_f32(a[i] * b[i]);
            let q = f16::from_f32(c[i] * d[i]);
            let want = f16::from_f32(p.to_f32() + q.to_f32());
            assert_eq!(got[i].to_bits(), want.to_bits(), "element {i}");
        }
    }
}
