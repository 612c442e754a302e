//! Inner loops of the GEMV kernels: one weight row against one activation row, for each
//! storage form. AVX2 + FMA + F16C versions on x86_64 when the CPU has them (checked at run
//! time), plain loops otherwise; both sum in f32.

use half::f16;

/// Whether the AVX2/FMA/F16C loops may run on this CPU.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[inline]
fn code(row: &[u8], j: usize) -> usize {
    ((row[j / 2] >> ((j & 1) * 4)) & 15) as usize
}

pub fn dot_f32(w: &[f32], x: &[f32], simd: bool) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if simd {
            // SAFETY: `simd` is only true when `available()` confirmed the CPU features.
            return unsafe { avx::dot_f32(w, x) };
        }
    }
    let _ = simd;
    w.iter().zip(x).map(|(a, b)| a * b).sum()
}

pub fn dot_f16(w: &[f16], x: &[f32], simd: bool) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if simd {
            // SAFETY: as above.
            return unsafe { avx::dot_f16(w, x) };
        }
    }
    let _ = simd;
    w.iter().zip(x).map(|(a, b)| a.to_f32() * b).sum()
}

/// Four fp16 rows (each `x.len()` long, consecutive in `w`) dotted with one `x`: one pass
/// over `x` for four rows, and one call and horizontal sum per four rows instead of per row
/// (Whisper's rows are short: 384 elements for tiny).
pub fn dot4_f16(w: &[f16], x: &[f32], simd: bool) -> [f32; 4] {
    let k = x.len();
    #[cfg(target_arch = "x86_64")]
    {
        if simd && w.len() >= 4 * k {
            // SAFETY: as above; `w` holds four rows of `k`.
            return unsafe { avx::dot4_f16(w, x) };
        }
    }
    let _ = simd;
    std::array::from_fn(|r| dot_f16(&w[r * k..(r + 1) * k], x, false))
}

/// `row`: `x.len()/2` bytes of nibble codes into `pal`.
pub fn dot_lut4(row: &[u8], pal: &[f32; 16], x: &[f32], simd: bool) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if simd {
            // SAFETY: as above.
            return unsafe { avx::dot_lut4(row, pal, x) };
        }
    }
    let _ = simd;
    x.iter()
        .enumerate()
        .map(|(j, v)| pal[code(row, j)] * v)
        .sum()
}

/// `Σ_b scale[b] · Σ_{j ∈ block b} code_j · x_j` (the zero-point term is the caller's).
pub fn dot_int4_blocks(row: &[u8], scale: &[f32], block: usize, x: &[f32], simd: bool) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if simd && block % 8 == 0 {
            // SAFETY: as above.
            return unsafe { avx::dot_int4_blocks(row, scale, block, x) };
        }
    }
    let _ = simd;
    let mut acc = 0f32;
    for (b, s) in scale.iter().enumerate() {
        let (j0, j1) = (b * block, ((b + 1) * block).min(x.len()));
        let p: f32 = x[j0..j1]
            .iter()
            .enumerate()
            .map(|(i, v)| code(row, j0 + i) as f32 * v)
            .sum();
        acc += s * p;
    }
    acc
}

#[cfg(target_arch = "x86_64")]
mod avx {
    use super::code;
    use half::f16;
    use std::arch::x86_64::*;

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_f32(w: &[f32], x: &[f32]) -> f32 {
        let n = w.len().min(x.len());
        let (wp, xp) = (w.as_ptr(), x.as_ptr());
        unsafe {
            let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let mut i = 0;
            while i + 16 <= n {
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(wp.add(i)), _mm256_loadu_ps(xp.add(i)), a0);
                a1 = _mm256_fmadd_ps(
                    _mm256_loadu_ps(wp.add(i + 8)),
                    _mm256_loadu_ps(xp.add(i + 8)),
                    a1,
                );
                i += 16;
            }
            let mut s = hsum(_mm256_add_ps(a0, a1));
            for j in i..n {
                s += w[j] * x[j];
            }
            s
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_f16(w: &[f16], x: &[f32]) -> f32 {
        let n = w.len().min(x.len());
        let (wp, xp) = (w.as_ptr() as *const u8, x.as_ptr());
        unsafe {
            macro_rules! ld {
                ($i:expr) => {
                    _mm256_cvtph_ps(_mm_loadu_si128(wp.add(2 * ($i)) as *const __m128i))
                };
            }
            let mut a = [_mm256_setzero_ps(); 4];
            let mut i = 0;
            while i + 32 <= n {
                a[0] = _mm256_fmadd_ps(ld!(i), _mm256_loadu_ps(xp.add(i)), a[0]);
                a[1] = _mm256_fmadd_ps(ld!(i + 8), _mm256_loadu_ps(xp.add(i + 8)), a[1]);
                a[2] = _mm256_fmadd_ps(ld!(i + 16), _mm256_loadu_ps(xp.add(i + 16)), a[2]);
                a[3] = _mm256_fmadd_ps(ld!(i + 24), _mm256_loadu_ps(xp.add(i + 24)), a[3]);
                i += 32;
            }
            while i + 8 <= n {
                a[0] = _mm256_fmadd_ps(ld!(i), _mm256_loadu_ps(xp.add(i)), a[0]);
                i += 8;
            }
            let mut s = hsum(_mm256_add_ps(
                _mm256_add_ps(a[0], a[1]),
                _mm256_add_ps(a[2], a[3]),
            ));
            for j in i..n {
                s += w[j].to_f32() * x[j];
            }
            s
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot4_f16(w: &[f16], x: &[f32]) -> [f32; 4] {
        let k = x.len();
        let (wp, xp) = (w.as_ptr() as *const u8, x.as_ptr());
        unsafe {
            macro_rules! ld {
                ($r:expr, $i:expr) => {
                    _mm256_cvtph_ps(_mm_loadu_si128(wp.add(2 * ($r * k + $i)) as *const __m128i))
                };
            }
            let mut a = [_mm256_setzero_ps(); 4];
            let mut i = 0;
            while i + 8 <= k {
                let xv = _mm256_loadu_ps(xp.add(i));
                a[0] = _mm256_fmadd_ps(ld!(0, i), xv, a[0]);
                a[1] = _mm256_fmadd_ps(ld!(1, i), xv, a[1]);
                a[2] = _mm256_fmadd_ps(ld!(2, i), xv, a[2]);
                a[3] = _mm256_fmadd_ps(ld!(3, i), xv, a[3]);
                i += 8;
            }
            let mut out = [hsum(a[0]), hsum(a[1]), hsum(a[2]), hsum(a[3])];
            for (r, o) in out.iter_mut().enumerate() {
                for j in i..k {
                    *o += w[r * k + j].to_f32() * x[j];
                }
            }
            out
        }
    }

    /// Eight codes (four bytes at `p`) as i32 lanes in element order.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn codes8(p: *const u8) -> __m256i {
        unsafe {
            let word = (p as *const u32).read_unaligned() as i32;
            let sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
            _mm256_and_si256(
                _mm256_srlv_epi32(_mm256_set1_epi32(word), sh),
                _mm256_set1_epi32(15),
            )
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_lut4(row: &[u8], pal: &[f32; 16], x: &[f32]) -> f32 {
        let n = x.len().min(row.len() * 2);
        let (rp, xp) = (row.as_ptr(), x.as_ptr());
        unsafe {
            let lo = _mm256_loadu_ps(pal.as_ptr());
            let hi = _mm256_loadu_ps(pal.as_ptr().add(8));
            // Codes 0-7 pick from `lo`, 8-15 from `hi`: bit 3 moved to the sign selects.
            macro_rules! look {
                ($c:expr) => {{
                    let c = $c;
                    let sel = _mm256_castsi256_ps(_mm256_slli_epi32(c, 28));
                    _mm256_blendv_ps(
                        _mm256_permutevar8x32_ps(lo, c),
                        _mm256_permutevar8x32_ps(hi, c),
                        sel,
                    )
                }};
            }
            let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let mut i = 0;
            while i + 16 <= n {
                a0 = _mm256_fmadd_ps(look!(codes8(rp.add(i / 2))), _mm256_loadu_ps(xp.add(i)), a0);
                a1 = _mm256_fmadd_ps(
                    look!(codes8(rp.add(i / 2 + 4))),
                    _mm256_loadu_ps(xp.add(i + 8)),
                    a1,
                );
                i += 16;
            }
            let mut s = hsum(_mm256_add_ps(a0, a1));
            for j in i..n {
                s += pal[code(row, j)] * x[j];
            }
            s
        }
    }

    /// `block` is a multiple of 8.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_int4_blocks(row: &[u8], scale: &[f32], block: usize, x: &[f32]) -> f32 {
        let (rp, xp) = (row.as_ptr(), x.as_ptr());
        let nb = scale.len().min(x.len() / block).min(row.len() * 2 / block);
        unsafe {
            let mut tot = _mm256_setzero_ps();
            for (b, &sc) in scale.iter().enumerate().take(nb) {
                let mut acc = _mm256_setzero_ps();
                let mut i = b * block;
                while i < (b + 1) * block {
                    let w = _mm256_cvtepi32_ps(codes8(rp.add(i / 2)));
                    acc = _mm256_fmadd_ps(w, _mm256_loadu_ps(xp.add(i)), acc);
                    i += 8;
                }
                tot = _mm256_fmadd_ps(_mm256_set1_ps(sc), acc, tot);
            }
            hsum(tot)
        }
    }
}
