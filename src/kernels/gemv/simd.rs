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

/// Code `j` of a nibble-packed row (low nibble first).
#[inline]
pub(super) fn code(row: &[u8], j: usize) -> usize {
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

/// `s += q[0]·w₀ + … + q[3]·w₃` for four consecutive fp16 rows `w` of `s.len()` (the
/// decode-step attention scores `qᵀK` over a `[head_dim, N]` key block, four key rows a
/// pass over `s`).
pub fn axpy4_f16(w: &[f16], q: [f32; 4], s: &mut [f32], simd: bool) {
    let n = s.len();
    assert!(
        w.len() >= 4 * n,
        "axpy4_f16: {} weights for 4 rows of {n}",
        w.len()
    );
    #[cfg(target_arch = "x86_64")]
    {
        if simd {
            // SAFETY: as above; `w` holds four rows of `n`.
            return unsafe { avx::axpy4_f16(w, q, s) };
        }
    }
    let _ = simd;
    for (j, v) in s.iter_mut().enumerate() {
        for (r, qr) in q.iter().enumerate() {
            *v += qr * w[r * n + j].to_f32();
        }
    }
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
        if simd && block.is_multiple_of(8) {
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

/// Elements per step of the shuffle-lookup kernels ([`dot_lut4_f16`], [`dot_int4_f16`]):
/// 32 code bytes.
pub const CHUNK: usize = 64;

/// A 16-entry palette as `pshufb` tables: the low bytes of the 16 fp16 values, then their
/// high bytes. Only built when every entry is exactly an fp16 value (an fp16 palette, or
/// the integers 0..15 of int4 codes), so looking up through it changes no weight.
pub type F16Table = [u8; 32];

pub fn f16_table(vals: &[f32]) -> Option<F16Table> {
    if vals.len() > 16 {
        return None;
    }
    let mut t = [0u8; 32];
    for (i, &v) in vals.iter().enumerate() {
        let h = f16::from_f32(v);
        if h.to_f32().to_bits() != v.to_bits() {
            return None;
        }
        let [lo, hi] = h.to_bits().to_le_bytes();
        (t[i], t[16 + i]) = (lo, hi);
    }
    Some(t)
}

/// Where, within one [`CHUNK`] of a row, the element the shuffle kernels multiply by slot
/// `s` of the permuted activations sits. A 32-byte code load splits into the low nibbles
/// (even elements) and high nibbles (odd elements); the byte unpacks then hand out, per
/// 128-bit lane, eight fp16 values at a time: even elements 0-14, 32-46, 16-30, 48-62, then
/// the same for odd ones. Permuting `x` once per call to that order costs nothing per row.
fn chunk_source(s: usize) -> usize {
    let (part, lane) = (s / 8, s % 8);
    [0, 32, 16, 48][part % 4] + 2 * lane + part / 4
}

/// `x` with each whole [`CHUNK`] permuted to the shuffle kernels' order (the tail as is).
pub fn permute_chunks(x: &[f32]) -> Vec<f32> {
    let mut out = x.to_vec();
    for (o, c) in out.chunks_exact_mut(CHUNK).zip(x.chunks_exact(CHUNK)) {
        for (s, v) in o.iter_mut().enumerate() {
            *v = c[chunk_source(s)];
        }
    }
    out
}

/// Consecutive LUT4 rows sharing one palette (`idx`: `out.len()` rows of `k/2` bytes)
/// through its `pshufb` tables, into `out`: `xp` is `x` after [`permute_chunks`]; the
/// elements past the last whole chunk use `pal` and `x`. One call per run of rows keeps the
/// per-call work (tables, sums) off each 384-element row.
#[allow(clippy::too_many_arguments)]
pub fn lut4_f16_rows(
    idx: &[u8],
    k: usize,
    tab: &F16Table,
    pal: &[f32; 16],
    xp: &[f32],
    x: &[f32],
    out: &mut [f32],
    simd: bool,
) {
    let (rows, half) = (out.len(), k / 2);
    assert!(
        k.is_multiple_of(2) && idx.len() >= rows * half && x.len() >= k && xp.len() >= k,
        "lut4_f16_rows: {rows} rows of {k} need {} code bytes and {k} activations",
        rows * half
    );
    let whole = k / CHUNK * CHUNK;
    #[cfg(target_arch = "x86_64")]
    {
        if simd {
            // SAFETY: `simd` is only true when `available()` confirmed the CPU features;
            // the assert above bounds every read (`whole ≤ k`).
            unsafe { avx::lut4_f16_rows(idx, half, tab, xp, whole, out) };
        }
    }
    let portable = !simd || cfg!(not(target_arch = "x86_64"));
    for (i, o) in out.iter_mut().enumerate() {
        let row = &idx[i * half..(i + 1) * half];
        if portable {
            // The same products, one at a time, in the kernel's order.
            *o = (0..whole)
                .map(|s| {
                    let j = s / CHUNK * CHUNK + chunk_source(s % CHUNK);
                    pal[code(row, j)] * xp[s]
                })
                .sum();
        }
        for j in whole..k {
            *o += pal[code(row, j)] * x[j];
        }
    }
}

/// int4 rows (`q`: `out.len()` rows of `k/2` bytes, `scale`: their `k/block` scales a row):
/// `Σ_b scale[b] · Σ_{j ∈ block b} code_j · x_j` through the `pshufb` lookup of the codes
/// 0..15 as fp16 (`tab` = `f16_table` of them). `block` is a multiple of 32, so every half
/// chunk lies in one block. `xp`/`x` as for [`lut4_f16_rows`].
#[allow(clippy::too_many_arguments)]
pub fn int4_f16_rows(
    q: &[u8],
    k: usize,
    scale: &[f32],
    block: usize,
    tab: &F16Table,
    xp: &[f32],
    x: &[f32],
    out: &mut [f32],
    simd: bool,
) {
    let (rows, half) = (out.len(), k / 2);
    assert!(
        k.is_multiple_of(2)
            && block.is_multiple_of(32)
            && k.is_multiple_of(block)
            && q.len() >= rows * half
            && scale.len() >= rows * (k / block)
            && x.len() >= k
            && xp.len() >= k,
        "int4_f16_rows: {rows} rows of {k} in blocks of {block} do not match the buffers"
    );
    let (whole, nb) = (k / CHUNK * CHUNK, k / block);
    #[cfg(target_arch = "x86_64")]
    {
        if simd {
            // SAFETY: as above.
            unsafe { avx::int4_f16_rows(q, half, scale, block, tab, xp, whole, out) };
        }
    }
    let portable = !simd || cfg!(not(target_arch = "x86_64"));
    for (i, o) in out.iter_mut().enumerate() {
        let (row, sc) = (&q[i * half..(i + 1) * half], &scale[i * nb..(i + 1) * nb]);
        if portable {
            *o = (0..whole)
                .map(|s| {
                    let j = s / CHUNK * CHUNK + chunk_source(s % CHUNK);
                    sc[j / block] * code(row, j) as f32 * xp[s]
                })
                .sum();
        }
        for j in whole..k {
            *o += sc[j / block] * code(row, j) as f32 * x[j];
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx {
    use super::code;
    use half::f16;
    use std::arch::x86_64::*;

    /// Bytes ahead of the current position that the fp16 loop prefetches.
    const PREFETCH: usize = 2048;

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
                // Rows are short (384 fp16 for tiny) and read back to back: fetching 2 KiB
                // ahead keeps the next rows' lines in flight across the row switches, which
                // the hardware prefetcher alone does not (measured ~1.5× on the vocab head).
                _mm_prefetch(wp.wrapping_add(2 * i + PREFETCH) as *const i8, _MM_HINT_T0);
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
    pub unsafe fn axpy4_f16(w: &[f16], q: [f32; 4], s: &mut [f32]) {
        let n = s.len();
        let (wp, sp) = (w.as_ptr() as *const u8, s.as_mut_ptr());
        unsafe {
            macro_rules! ld {
                ($r:expr, $j:expr) => {
                    _mm256_cvtph_ps(_mm_loadu_si128(wp.add(2 * ($r * n + $j)) as *const __m128i))
                };
            }
            let qv = q.map(|v| _mm256_set1_ps(v));
            let mut j = 0;
            while j + 8 <= n {
                let mut a = _mm256_loadu_ps(sp.add(j));
                a = _mm256_fmadd_ps(ld!(0, j), qv[0], a);
                a = _mm256_fmadd_ps(ld!(1, j), qv[1], a);
                a = _mm256_fmadd_ps(ld!(2, j), qv[2], a);
                a = _mm256_fmadd_ps(ld!(3, j), qv[3], a);
                _mm256_storeu_ps(sp.add(j), a);
                j += 8;
            }
            for j in j..n {
                for (r, qr) in q.iter().enumerate() {
                    s[j] += qr * w[r * n + j].to_f32();
                }
            }
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

    /// The tables of one palette in both 128-bit lanes (`pshufb` looks up per lane).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load_table(tab: &super::F16Table) -> (__m256i, __m256i) {
        unsafe {
            let lo = _mm_loadu_si128(tab.as_ptr() as *const __m128i);
            let hi = _mm_loadu_si128(tab.as_ptr().add(16) as *const __m128i);
            (
                _mm256_broadcastsi128_si256(lo),
                _mm256_broadcastsi128_si256(hi),
            )
        }
    }

    /// The 64 weights of one chunk (32 code bytes at `p`) as eight f32 vectors in the
    /// permuted slot order (see `chunk_source`): vectors 0, 2, 4, 6 are the chunk's first
    /// 32 elements, 1, 3, 5, 7 its last 32.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn lookup(p: *const u8, tl: __m256i, th: __m256i) -> [__m256; 8] {
        unsafe {
            let c = _mm256_loadu_si256(p as *const __m256i);
            let m = _mm256_set1_epi8(15);
            let even = _mm256_and_si256(c, m);
            let odd = _mm256_and_si256(_mm256_srli_epi16(c, 4), m);
            let (el, eh) = (_mm256_shuffle_epi8(tl, even), _mm256_shuffle_epi8(th, even));
            let (ol, oh) = (_mm256_shuffle_epi8(tl, odd), _mm256_shuffle_epi8(th, odd));
            let h = [
                _mm256_unpacklo_epi8(el, eh),
                _mm256_unpackhi_epi8(el, eh),
                _mm256_unpacklo_epi8(ol, oh),
                _mm256_unpackhi_epi8(ol, oh),
            ];
            // Macros, not closures: a closure does not inherit the target features, and the
            // intrinsics in it would become calls.
            macro_rules! lo {
                ($v:expr) => {
                    _mm256_cvtph_ps(_mm256_castsi256_si128($v))
                };
            }
            macro_rules! hi {
                ($v:expr) => {
                    _mm256_cvtph_ps(_mm256_extracti128_si256($v, 1))
                };
            }
            [
                lo!(h[0]),
                hi!(h[0]),
                lo!(h[1]),
                hi!(h[1]),
                lo!(h[2]),
                hi!(h[2]),
                lo!(h[3]),
                hi!(h[3]),
            ]
        }
    }

    /// `out.len()` rows of `half` code bytes; `whole` (a multiple of 64, ≤ 2·half) elements
    /// of each against `xp`. Eight accumulators, one per slot group: two FMAs a chunk on one
    /// accumulator would make the FMA latency the limit.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn lut4_f16_rows(
        idx: &[u8],
        half: usize,
        tab: &super::F16Table,
        xp: &[f32],
        whole: usize,
        out: &mut [f32],
    ) {
        unsafe {
            let (tl, th) = load_table(tab);
            for (i, o) in out.iter_mut().enumerate() {
                let row = idx.as_ptr().add(i * half);
                let mut acc = [_mm256_setzero_ps(); 8];
                let mut j = 0;
                while j + 64 <= whole {
                    let w = lookup(row.add(j / 2), tl, th);
                    for (s, a) in acc.iter_mut().enumerate() {
                        *a = _mm256_fmadd_ps(w[s], _mm256_loadu_ps(xp.as_ptr().add(j + 8 * s)), *a);
                    }
                    j += 64;
                }
                let a = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
                let b = _mm256_add_ps(_mm256_add_ps(acc[4], acc[5]), _mm256_add_ps(acc[6], acc[7]));
                *o = hsum(_mm256_add_ps(a, b));
            }
        }
    }

    /// As [`lut4_f16_rows`] with the codes' table, each half chunk's products summed and
    /// then scaled by its block's scale (`block`: a multiple of 32; `k / block` scales a
    /// row, `k = 2·half`).
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn int4_f16_rows(
        q: &[u8],
        half: usize,
        scale: &[f32],
        block: usize,
        tab: &super::F16Table,
        xp: &[f32],
        whole: usize,
        out: &mut [f32],
    ) {
        unsafe {
            let (tl, th) = load_table(tab);
            let nb = 2 * half / block;
            // Half chunks a block spans: a counter instead of a division per chunk.
            let per = block / 32;
            for (i, o) in out.iter_mut().enumerate() {
                let row = q.as_ptr().add(i * half);
                let sc = scale.as_ptr().add(i * nb);
                let (mut first, mut second) = (_mm256_setzero_ps(), _mm256_setzero_ps());
                let (mut b, mut left) = (0, per);
                let mut j = 0;
                while j + 64 <= whole {
                    let w = lookup(row.add(j / 2), tl, th);
                    macro_rules! x {
                        ($s:expr) => {
                            _mm256_loadu_ps(xp.as_ptr().add(j + 8 * $s))
                        };
                    }
                    let mut pa = _mm256_mul_ps(w[0], x!(0));
                    let mut pb = _mm256_mul_ps(w[1], x!(1));
                    for s in [2, 4, 6] {
                        pa = _mm256_fmadd_ps(w[s], x!(s), pa);
                        pb = _mm256_fmadd_ps(w[s + 1], x!(s + 1), pb);
                    }
                    first = _mm256_fmadd_ps(_mm256_set1_ps(*sc.add(b)), pa, first);
                    (b, left) = if left == 1 {
                        (b + 1, per)
                    } else {
                        (b, left - 1)
                    };
                    second = _mm256_fmadd_ps(_mm256_set1_ps(*sc.add(b)), pb, second);
                    (b, left) = if left == 1 {
                        (b + 1, per)
                    } else {
                        (b, left - 1)
                    };
                    j += 64;
                }
                *o = hsum(_mm256_add_ps(first, second));
            }
        }
    }
}
