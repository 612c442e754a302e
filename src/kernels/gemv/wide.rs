//! AVX-512 inner loops of the decode GEMVs, four output rows a pass (the activation loads
//! are shared by the four rows; eight accumulators hide the FMA latency):
//! - fp16 rows converted in registers (`vcvtph2ps`, 16 a step);
//! - 4-bit codes (LUT4 palettes, int4 codes) looked up with one `vpermps` per 16 codes in a
//!   16-entry **f32** table held in one register. The table is the palette itself, so any
//!   palette takes this path (the AVX2 `pshufb` path needs every entry to be an fp16 value)
//!   and each code costs a fraction of an instruction instead of the byte shuffles,
//!   unpacks and conversions of the AVX2 form, which made LUT4 compute-bound.
//!
//! The code kernels read 16 code bytes (32 elements) a step, zero-extended to 16 dword
//! lanes: `vpermps` reads each lane's low four bits, so the low nibbles (even elements)
//! need no mask and the high nibbles (odd elements) one shift. The activations are
//! permuted once per call to that order ([`permute_pairs`]). Every kernel has a portable
//! form computing the same products, used where the CPU lacks AVX-512 (and by the tests).

use super::simd::code;
use half::f16;

/// Elements per step of the code kernels: 16 code bytes.
pub const STEP: usize = 32;

/// Whether the AVX-512 loops may run on this CPU (checked once).
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *ON.get_or_init(|| {
            is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("f16c")
                && is_x86_feature_detected!("fma")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Where, within one [`STEP`] of a row, the element that slot `s` of the permuted
/// activations multiplies sits: slots 0-15 are the even elements (low nibbles of bytes
/// 0-15), slots 16-31 the odd ones (high nibbles).
fn pair_source(s: usize) -> usize {
    2 * (s % 16) + s / 16
}

/// `x` with each whole [`STEP`] permuted to the code kernels' order (the tail as is).
pub fn permute_pairs(x: &[f32]) -> Vec<f32> {
    let mut out = x.to_vec();
    for (o, c) in out.chunks_exact_mut(STEP).zip(x.chunks_exact(STEP)) {
        for (s, v) in o.iter_mut().enumerate() {
            *v = c[pair_source(s)];
        }
    }
    out
}

/// One column of a block of consecutive rows read with another value in its place: row
/// `r`'s element at `col` is taken as `vals[r]` (a decode step reads its cache rows in
/// place, the token's column standing in for what the cache holds there).
#[derive(Clone, Copy)]
pub struct Patch<'a> {
    pub col: usize,
    pub vals: &'a [f16],
}

impl Patch<'_> {
    /// Row `r`'s element `j` of `w` (rows of `n`), with the patch applied.
    fn at(p: Option<Patch>, w: &[f16], r: usize, n: usize, j: usize) -> f16 {
        match p {
            Some(p) if p.col == j => p.vals[r],
            _ => w[r * n + j],
        }
    }

    fn check(p: Option<Patch>, rows: usize, n: usize, what: &str) {
        if let Some(p) = p {
            assert!(
                p.col < n && p.vals.len() >= rows,
                "{what}: patch at column {} of {n} with {} values for {rows} rows",
                p.col,
                p.vals.len()
            );
        }
    }
}

/// `out[i] = row i · x` for `out.len()` consecutive fp16 rows of `k = x.len()`.
pub fn f16_rows(w: &[f16], x: &[f32], out: &mut [f32], on: bool) {
    f16_rows_patched(w, x, out, None, on)
}

/// [`f16_rows`] with one column of the rows replaced ([`Patch`]); the sums are formed in
/// the same order, so the result has the bits of `f16_rows` over the patched rows.
pub fn f16_rows_patched(w: &[f16], x: &[f32], out: &mut [f32], patch: Option<Patch>, on: bool) {
    let k = x.len();
    assert!(
        w.len() >= out.len() * k,
        "f16_rows: {} rows of {k} need {} weights, have {}",
        out.len(),
        out.len() * k,
        w.len()
    );
    Patch::check(patch, out.len(), k, "f16_rows");
    #[cfg(target_arch = "x86_64")]
    {
        if on {
            // SAFETY: `on` is only true when `available()` confirmed the CPU features; the
            // asserts above bound every read.
            unsafe { avx512::f16_rows(w, x, out, patch) };
            return;
        }
    }
    let _ = on;
    if patch.is_none() {
        for (i, o) in out.iter_mut().enumerate() {
            *o = super::simd::dot_f16(&w[i * k..(i + 1) * k], x, false);
        }
        return;
    }
    let mut row = vec![f16::ZERO; k];
    for (i, o) in out.iter_mut().enumerate() {
        for (j, e) in row.iter_mut().enumerate() {
            *e = Patch::at(patch, w, i, k, j);
        }
        *o = super::simd::dot_f16(&row, x, false);
    }
}

/// The wrapping sum of `words`: a plain read of their bytes at the rate this module's row
/// kernels can reach, for measuring a weight-stream floor. The AVX-512 loop reads the two
/// halves of `words` side by side (two streams, as [`f16_rows`] reads its rows), 128 bytes
/// of each a step into four accumulators, and prefetches where `f16_rows` does: a scalar
/// fold read the same 68 MB 30 % slower than `f16_rows` on an Emerald Rapids Xeon, so a
/// floor taken with it was no floor.
pub fn read_sum(words: &[u64], on: bool) -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        if on {
            // SAFETY: `on` is only true when `available()` confirmed the CPU features; the
            // loop reads within `words`.
            return unsafe { avx512::read_sum(words) };
        }
    }
    let _ = on;
    words.iter().fold(0u64, |a, &x| a.wrapping_add(x))
}

/// `s += Σ_r q[r]·w_r` over the `q.len()` consecutive fp16 rows `w` of `s.len()` (the
/// decode-step attention scores `qᵀK` with Whisper's `[64, N]` keys), row after row.
pub fn axpy_rows_f16(w: &[f16], q: &[f32], s: &mut [f32], on: bool) {
    axpy_rows_f16_patched(w, q, s, None, on)
}

/// [`axpy_rows_f16`] with one column of the rows replaced ([`Patch`]): each element's
/// products are added in the same order, so the result has the bits of `axpy_rows_f16`
/// over the patched rows.
pub fn axpy_rows_f16_patched(w: &[f16], q: &[f32], s: &mut [f32], patch: Option<Patch>, on: bool) {
    axpy_rows_swept(w, q, s, patch, on, None)
}

/// [`axpy_rows_f16`] on AVX-512 (`available()` must be true) with four rows a sweep
/// (`in_step`) or row after row, whichever this CPU would take (see `rows_in_step`): the
/// tests check that both give the same bits.
#[cfg(test)]
pub(super) fn axpy_rows_f16_sweep(w: &[f16], q: &[f32], s: &mut [f32], in_step: bool) {
    assert!(available(), "axpy_rows_f16_sweep on a CPU without AVX-512");
    axpy_rows_swept(w, q, s, None, true, Some(in_step))
}

/// [`axpy_rows_f16_patched`] with the AVX-512 sweep given (`None`: this CPU's choice).
fn axpy_rows_swept(
    w: &[f16],
    q: &[f32],
    s: &mut [f32],
    patch: Option<Patch>,
    on: bool,
    in_step: Option<bool>,
) {
    let n = s.len();
    assert!(
        w.len() >= q.len() * n,
        "axpy_rows_f16: {} weights for {} rows of {n}",
        w.len(),
        q.len()
    );
    Patch::check(patch, q.len(), n, "axpy_rows_f16");
    #[cfg(target_arch = "x86_64")]
    {
        if on {
            let in_step = in_step.unwrap_or_else(avx512::rows_in_step);
            // SAFETY: as in `f16_rows`; `w` holds `q.len()` rows of `n`.
            unsafe { avx512::axpy_rows_f16(w, q, s, patch, in_step) };
            return;
        }
    }
    let _ = (on, in_step);
    for (r, &qr) in q.iter().enumerate() {
        for (j, s) in s.iter_mut().enumerate() {
            *s += qr * Patch::at(patch, w, r, n, j).to_f32();
        }
    }
}

/// Consecutive rows of 4-bit codes (`codes`: `out.len()` rows of `k/2` bytes) against `x`,
/// each code standing for `table[code]` scaled per block: `out[i] = Σ_b scale[i·nb + b] ·
/// Σ_{j ∈ block b} table[code_ij] · x_j`, `nb = k / block`. LUT4 rows sharing one palette
/// pass the palette and `block = k` with unit scales (`scale: None`); int4 rows the codes'
/// values (`code − zero` when the zero point is uniform) and their block scales. `xp` is
/// `x` after [`permute_pairs`]; `block` is a multiple of [`STEP`] or `k` itself; elements
/// past the last whole step use `x` directly.
#[allow(clippy::too_many_arguments)]
pub fn code_rows(
    codes: &[u8],
    k: usize,
    table: &[f32; 16],
    scale: Option<&[f32]>,
    block: usize,
    xp: &[f32],
    x: &[f32],
    out: &mut [f32],
    on: bool,
) {
    let (rows, half) = (out.len(), k / 2);
    let nb = k / block.max(1);
    assert!(
        k.is_multiple_of(2)
            && block > 0
            && k.is_multiple_of(block)
            && (block.is_multiple_of(STEP) || block == k)
            && codes.len() >= rows * half
            && scale.is_none_or(|s| s.len() >= rows * nb)
            && x.len() >= k
            && xp.len() >= k,
        "code_rows: {rows} rows of {k} in blocks of {block} do not match the buffers"
    );
    let whole = k / STEP * STEP;
    // A block that is the whole row but no multiple of STEP (LUT4 rows, per-channel int4):
    // every step lies in it, and the tail below takes the same scale.
    #[cfg(target_arch = "x86_64")]
    {
        if on {
            // SAFETY: as in `f16_rows`; `whole ≤ k` bounds every code and activation read,
            // and the scales read are `rows · nb` (asserted).
            unsafe { avx512::code_rows(codes, half, table, scale, block, xp, whole, out) };
        }
    }
    let portable = !on || cfg!(not(target_arch = "x86_64"));
    for (i, o) in out.iter_mut().enumerate() {
        let row = &codes[i * half..(i + 1) * half];
        let sc = |j: usize| scale.map_or(1.0, |s| s[i * nb + j / block]);
        if portable {
            *o = (0..whole)
                .map(|s| {
                    let j = s / STEP * STEP + pair_source(s % STEP);
                    sc(j) * (table[code(row, j)] * xp[s])
                })
                .sum();
        }
        for j in whole..k {
            *o += sc(j) * (table[code(row, j)] * x[j]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::Patch;
    use half::f16;
    use std::arch::x86_64::*;

    /// Bytes ahead of the current group of rows that the loops prefetch: rows are short
    /// (a tiny decoder's are 768 bytes of fp16, 192 of codes) and read back to back, and
    /// the hardware prefetchers stop at every 4 KiB page.
    const AHEAD: usize = 4096;

    /// Prefetches, during step `c` of `steps` over a group of rows spanning `span` bytes
    /// from `base`, that step's share of the lines `AHEAD` bytes further on.
    #[inline(always)]
    unsafe fn prefetch_share(base: *const u8, span: usize, c: usize, steps: usize) {
        let per = span.div_ceil(64 * steps.max(1));
        for l in c * per..(c + 1) * per {
            // Prefetches never fault: past the end they are dropped.
            _mm_prefetch(base.wrapping_add(AHEAD + 64 * l) as *const i8, _MM_HINT_T0);
        }
    }

    /// The sums of four vectors' lanes, into `out[0..4]`: one transpose-and-add across
    /// the four (six lane-block shuffles, two in-lane permutes) instead of four separate
    /// reductions, which took a tenth of a LUT4 pass over a palette group's 8 short rows.
    #[inline(always)]
    unsafe fn hsum4(v: [__m512; 4], out: &mut [f32]) {
        unsafe {
            // [a0 a1 b0 b1] + [a2 a3 b2 b3] (128-bit blocks), likewise for c, d.
            let ab = _mm512_add_ps(
                _mm512_shuffle_f32x4(v[0], v[1], 0x44),
                _mm512_shuffle_f32x4(v[0], v[1], 0xEE),
            );
            let cd = _mm512_add_ps(
                _mm512_shuffle_f32x4(v[2], v[3], 0x44),
                _mm512_shuffle_f32x4(v[2], v[3], 0xEE),
            );
            // Block r: row r's four partial sums.
            let u = _mm512_add_ps(
                _mm512_shuffle_f32x4(ab, cd, 0x88),
                _mm512_shuffle_f32x4(ab, cd, 0xDD),
            );
            let u = _mm512_add_ps(u, _mm512_permute_ps(u, 0b1011_0001));
            let u = _mm512_add_ps(u, _mm512_permute_ps(u, 0b0100_1110));
            let mut t = [0f32; 16];
            _mm512_storeu_ps(t.as_mut_ptr(), u);
            out[..4].copy_from_slice(&[t[0], t[4], t[8], t[12]]);
        }
    }

    /// Two rows at a time, row `r` of the first half of the range with row `r + h` of the
    /// second: two sequential streams, each row summed in its own two chains in the order of
    /// a lone row (so the bits do not depend on the pairing). One row at a time, each row's
    /// two chains of dependent FMAs (12 for a 384-element row) bound the loop: 64 cycles a
    /// row on a Zen 4 core with the weights in cache; on an Emerald Rapids Xeon (2 cores of a
    /// VM), the pairs took a 40 MB head in cache from a median 1.90–2.18 to 1.65–1.72 ms on
    /// one thread, 1.04–1.24 to 0.96–1.05 ms on two (same bits). Four *adjacent* rows at a
    /// time made four streams 768 bytes apart, which Zen 4's prefetchers followed badly (a
    /// cross-attention over keys and values read from memory took 1.4–1.7× as long);
    /// software prefetches 4 KiB ahead only slowed a single stream down there (1.2× as
    /// long, measured alternating).
    #[target_feature(enable = "avx512f,f16c,fma")]
    pub unsafe fn f16_rows(w: &[f16], x: &[f32], out: &mut [f32], patch: Option<Patch>) {
        let n = out.len();
        let h = n / 2;
        let ctx = RowsCx {
            wp: w.as_ptr() as *const u8,
            xp: x.as_ptr(),
            k: x.len(),
            pj: patch.map_or(usize::MAX, |p| p.col / 32 * 32),
            patch,
        };
        unsafe {
            match prefetch_rows() {
                true => {
                    for r in 0..h {
                        [out[r], out[r + h]] = rows_sums::<2, true>(&ctx, [r, r + h]);
                    }
                }
                false => {
                    for r in 0..h {
                        [out[r], out[r + h]] = rows_sums::<2, false>(&ctx, [r, r + h]);
                    }
                }
            }
            if n % 2 == 1 {
                [out[n - 1]] = rows_sums::<1, false>(&ctx, [n - 1]);
            }
        }
    }

    /// How far ahead of each stream [`f16_rows`] prefetches, where it does.
    const ROWS_AHEAD: usize = 2048;

    /// Whether [`f16_rows`] prefetches [`ROWS_AHEAD`] bytes ahead of its two streams: on
    /// Intel cores. On an Emerald Rapids Xeon (2 cores of a VM), a 40 MB head after a 28 MB
    /// read of other data (what a decode step does between two heads) took a median
    /// 1.84–2.22 ms with the prefetches against 2.47–2.98 ms without (alternating, 40 calls
    /// each, two threads); on Zen 4, software prefetches slowed a single row stream (1.2× as
    /// long) or changed nothing, so they stay off there.
    fn prefetch_rows() -> bool {
        static INTEL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *INTEL.get_or_init(|| {
            let id = __cpuid(0);
            [id.ebx, id.edx, id.ecx] == [0x756e_6547, 0x4965_6e69, 0x6c65_746e] // "GenuineIntel"
        })
    }

    /// Whether [`axpy_rows_f16`] takes four rows a sweep: on Intel cores. 6 heads of
    /// 64 × 1,500 fp16 keys (1.15 MB), one thread, 200 calls of each alternating, median µs:
    /// on Zen 4 (32 MB L3) after a 64 MB read of other data (a decode step's keys are read
    /// once a token, after the rest of the token's 68 MB), four rows a sweep 98–101, row after
    /// row 57–74; with the keys in cache 26–31 against 36–40. On an Emerald Rapids Xeon VM
    /// (260 MB of L3 holds a token's bytes) four rows a sweep took the cross-attention from
    /// 48–52 to 37–44 µs.
    pub fn rows_in_step() -> bool {
        prefetch_rows()
    }

    /// See `super::read_sum`: the two halves read side by side (two streams, as
    /// `f16_rows` reads its rows), 128 bytes of each a step.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn read_sum(words: &[u64]) -> u64 {
        let steps = words.len() / 32;
        let p = words.as_ptr() as *const u8;
        let half = 128 * steps;
        let pf = prefetch_rows();
        unsafe {
            let mut a = [_mm512_setzero_si512(); 4];
            for i in 0..steps {
                for (s, q) in [p.add(128 * i), p.add(half + 128 * i)]
                    .into_iter()
                    .enumerate()
                {
                    if pf {
                        for l in 0..2 {
                            let ahead = q.wrapping_add(ROWS_AHEAD + 64 * l);
                            _mm_prefetch(ahead as *const i8, _MM_HINT_T0);
                        }
                    }
                    for l in 0..2 {
                        let v = _mm512_loadu_si512(q.add(64 * l) as *const __m512i);
                        a[2 * s + l] = _mm512_add_epi64(a[2 * s + l], v);
                    }
                }
            }
            let t = _mm512_add_epi64(_mm512_add_epi64(a[0], a[1]), _mm512_add_epi64(a[2], a[3]));
            let rest = words[32 * steps..]
                .iter()
                .fold(0u64, |s, &x| s.wrapping_add(x));
            (_mm512_reduce_add_epi64(t) as u64).wrapping_add(rest)
        }
    }

    /// What [`rows_sums`] reads: the rows' first byte, the activations, the row length,
    /// and the patch with the start of the step that holds its column.
    struct RowsCx<'a> {
        wp: *const u8,
        xp: *const f32,
        k: usize,
        pj: usize,
        patch: Option<Patch<'a>>,
    }

    /// The sums of the `S` rows `rows` (indices from `cx.wp`), their steps interleaved:
    /// each row in two chains (even and odd 16-lane steps), then the last part step, then
    /// one reduction of the two chains' sum.
    #[inline(always)]
    unsafe fn rows_sums<const S: usize, const PF: bool>(cx: &RowsCx, rows: [usize; S]) -> [f32; S] {
        let (k, xp) = (cx.k, cx.xp);
        let whole = k / 32 * 32;
        unsafe {
            let base = rows.map(|r| cx.wp.add(2 * r * k));
            let (mut a0, mut a1) = ([_mm512_setzero_ps(); S], [_mm512_setzero_ps(); S]);
            let mut j = 0;
            while j < whole {
                let (x0, x1) = (_mm512_loadu_ps(xp.add(j)), _mm512_loadu_ps(xp.add(j + 16)));
                for s in 0..S {
                    if PF {
                        // Past the end the prefetch is dropped: prefetches never fault.
                        let ahead = base[s].wrapping_add(2 * j + ROWS_AHEAD);
                        _mm_prefetch(ahead as *const i8, _MM_HINT_T0);
                    }
                    let h0 = _mm256_loadu_si256(base[s].add(2 * j) as *const __m256i);
                    let h1 = _mm256_loadu_si256(base[s].add(2 * j + 32) as *const __m256i);
                    let (mut w0, mut w1) = (_mm512_cvtph_ps(h0), _mm512_cvtph_ps(h1));
                    if j == cx.pj {
                        (w0, w1) = patched(w0, w1, cx.patch, rows[s]);
                    }
                    a0[s] = _mm512_fmadd_ps(w0, x0, a0[s]);
                    a1[s] = _mm512_fmadd_ps(w1, x1, a1[s]);
                }
                j += 32;
            }
            let mut sums = [0f32; S];
            for s in 0..S {
                if whole < k {
                    // The last part step: the rest of the row through the same lanes, the
                    // missing elements zero (a scalar tail cost 3-5 ns an element in
                    // half's conversion: 28 of Whisper's 1500 positions a row, a third of
                    // a decode step's cross-attention).
                    let p = base[s].add(2 * whole);
                    let (w0, w1) = tail(p, k - whole, cx.pj == whole, cx.patch, rows[s]);
                    let (m0, m1) = tail_masks(k - whole);
                    a0[s] = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(m0, xp.add(whole)), a0[s]);
                    a1[s] =
                        _mm512_fmadd_ps(w1, _mm512_maskz_loadu_ps(m1, xp.add(whole + 16)), a1[s]);
                }
                sums[s] = _mm512_reduce_add_ps(_mm512_add_ps(a0[s], a1[s]));
            }
            sums
        }
    }

    /// See `super::axpy_rows_f16`: with `in_step`, four rows a sweep over the sums, each
    /// element's products added in row order (the bits of row after row).
    #[target_feature(enable = "avx512f,f16c,fma")]
    pub unsafe fn axpy_rows_f16(
        w: &[f16],
        q: &[f32],
        s: &mut [f32],
        patch: Option<Patch>,
        in_step: bool,
    ) {
        let cx = AxpyCx {
            wp: w.as_ptr() as *const u8,
            sp: s.as_mut_ptr(),
            n: s.len(),
            pj: patch.map_or(usize::MAX, |p| p.col / 32 * 32),
            patch,
        };
        // Four rows a sweep loads and stores the sums once for four rows' products: with
        // the keys in cache, one row a sweep spends as long moving the sums as reading the
        // keys. Read from memory, a sweep's four rows (3 KB each for 1,500 frames) are four
        // short streams the prefetchers do not follow, and row after row (one stream) is
        // the faster: see `rows_in_step`.
        let mut r = 0;
        unsafe {
            while in_step && r + 4 <= q.len() {
                axpy_block::<4>(&cx, q, r);
                r += 4;
            }
            while r < q.len() {
                axpy_block::<1>(&cx, q, r);
                r += 1;
            }
        }
    }

    /// What each sweep of `axpy_rows_f16` reads: the rows, the sums and their length, and
    /// the patched column's step (`usize::MAX` for none).
    struct AxpyCx<'a> {
        wp: *const u8,
        sp: *mut f32,
        n: usize,
        pj: usize,
        patch: Option<Patch<'a>>,
    }

    /// Rows `r0..r0 + S` added into the sums in one sweep, each element's products in row
    /// order (the bits of row after row).
    #[inline(always)]
    unsafe fn axpy_block<const S: usize>(cx: &AxpyCx, q: &[f32], r0: usize) {
        let (n, sp, pj, patch) = (cx.n, cx.sp, cx.pj, cx.patch);
        let whole = n / 32 * 32;
        unsafe {
            let rowp: [*const u8; S] = std::array::from_fn(|i| cx.wp.add(2 * (r0 + i) * n));
            let qv: [__m512; S] = std::array::from_fn(|i| _mm512_set1_ps(q[r0 + i]));
            let mut j = 0;
            while j < whole {
                let mut s0 = _mm512_loadu_ps(sp.add(j));
                let mut s1 = _mm512_loadu_ps(sp.add(j + 16));
                for i in 0..S {
                    let h0 = _mm256_loadu_si256(rowp[i].add(2 * j) as *const __m256i);
                    let h1 = _mm256_loadu_si256(rowp[i].add(2 * j + 32) as *const __m256i);
                    let (mut w0, mut w1) = (_mm512_cvtph_ps(h0), _mm512_cvtph_ps(h1));
                    if j == pj {
                        (w0, w1) = patched(w0, w1, patch, r0 + i);
                    }
                    s0 = _mm512_fmadd_ps(w0, qv[i], s0);
                    s1 = _mm512_fmadd_ps(w1, qv[i], s1);
                }
                _mm512_storeu_ps(sp.add(j), s0);
                _mm512_storeu_ps(sp.add(j + 16), s1);
                j += 32;
            }
            if whole < n {
                // The last part step, masked (see `f16_rows`).
                let (m0, m1) = tail_masks(n - whole);
                let (p0, p1) = (sp.add(whole), sp.add(whole + 16));
                let mut s0 = _mm512_maskz_loadu_ps(m0, p0);
                let mut s1 = _mm512_maskz_loadu_ps(m1, p1);
                for i in 0..S {
                    let (w0, w1) = tail(
                        rowp[i].add(2 * whole),
                        n - whole,
                        pj == whole,
                        patch,
                        r0 + i,
                    );
                    s0 = _mm512_fmadd_ps(w0, qv[i], s0);
                    s1 = _mm512_fmadd_ps(w1, qv[i], s1);
                }
                _mm512_mask_storeu_ps(p0, m0, s0);
                _mm512_mask_storeu_ps(p1, m1, s1);
            }
        }
    }

    /// The `rem` (< 32) fp16 values at `p` widened into a step's two halves, the lanes past
    /// `rem` zero, and row `r`'s patched element put in when `patched` (the patch's column
    /// lies in this part step).
    #[inline(always)]
    unsafe fn tail(
        p: *const u8,
        rem: usize,
        patched_here: bool,
        patch: Option<Patch>,
        r: usize,
    ) -> (__m512, __m512) {
        let mut buf = [0u16; 32];
        unsafe {
            std::ptr::copy_nonoverlapping(p as *const u16, buf.as_mut_ptr(), rem);
            let b = buf.as_ptr() as *const __m256i;
            let w = (
                _mm512_cvtph_ps(_mm256_loadu_si256(b)),
                _mm512_cvtph_ps(_mm256_loadu_si256(b.add(1))),
            );
            match patched_here {
                true => patched(w.0, w.1, patch, r),
                false => w,
            }
        }
    }

    /// Lane masks of a part step of `rem` (< 32) elements: its two halves.
    #[inline(always)]
    fn tail_masks(rem: usize) -> (__mmask16, __mmask16) {
        let lanes = |n: usize| ((1u32 << n.min(16)) - 1) as __mmask16;
        (lanes(rem), lanes(rem.saturating_sub(16)))
    }

    /// A step's two halves with row `r`'s patched element (its column within the step)
    /// put in place of the loaded one.
    #[inline(always)]
    unsafe fn patched(w0: __m512, w1: __m512, patch: Option<Patch>, r: usize) -> (__m512, __m512) {
        let Some(p) = patch else { return (w0, w1) };
        let (lane, v) = (p.col % 32, _mm512_set1_ps(p.vals[r].to_f32()));
        if lane < 16 {
            (_mm512_mask_mov_ps(w0, 1 << lane, v), w1)
        } else {
            (w0, _mm512_mask_mov_ps(w1, 1 << (lane - 16), v))
        }
    }

    /// The 32 elements of one step (16 code bytes at `p`) looked up in `t`: (even
    /// elements, odd elements).
    #[inline(always)]
    unsafe fn look(p: *const u8, t: __m512) -> (__m512, __m512) {
        unsafe {
            let b = _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i));
            (
                _mm512_permutexvar_ps(b, t),
                _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), t),
            )
        }
    }

    /// See `super::code_rows`; writes `out` from the `whole` elements of each row.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn code_rows(
        codes: &[u8],
        half: usize,
        table: &[f32; 16],
        scale: Option<&[f32]>,
        block: usize,
        xp: &[f32],
        whole: usize,
        out: &mut [f32],
    ) {
        let k = 2 * half;
        let nb = k / block;
        // Steps per scale block; a block of the whole row covers every step.
        let per = if block == k { usize::MAX } else { block / 32 };
        let steps = whole / 32;
        let (cp, xq) = (codes.as_ptr(), xp.as_ptr());
        unsafe {
            let t = _mm512_loadu_ps(table.as_ptr());
            // A macro, not a closure: the intrinsics stay inlined in this target context.
            macro_rules! sc {
                ($row:expr, $b:expr) => {
                    match scale {
                        Some(s) => _mm512_set1_ps(*s.get_unchecked($row * nb + $b)),
                        None => _mm512_set1_ps(1.0),
                    }
                };
            }
            let mut i = 0;
            while i + 4 <= out.len() {
                let base = cp.add(i * half);
                // Per row: the running total and the current block's (even, odd) sums.
                let mut tot = [_mm512_setzero_ps(); 4];
                let mut acc = [_mm512_setzero_ps(); 8];
                let (mut b, mut left) = (0, per);
                let mut c = 0;
                while c < steps {
                    prefetch_share(base, 4 * half, c, steps);
                    let j = 32 * c;
                    let (xe, xo) = (_mm512_loadu_ps(xq.add(j)), _mm512_loadu_ps(xq.add(j + 16)));
                    for r in 0..4 {
                        let (lo, hi) = look(base.add(r * half + j / 2), t);
                        acc[2 * r] = _mm512_fmadd_ps(lo, xe, acc[2 * r]);
                        acc[2 * r + 1] = _mm512_fmadd_ps(hi, xo, acc[2 * r + 1]);
                    }
                    c += 1;
                    left -= 1;
                    if left == 0 || c == steps {
                        for r in 0..4 {
                            let s = _mm512_add_ps(acc[2 * r], acc[2 * r + 1]);
                            tot[r] = _mm512_fmadd_ps(sc!(i + r, b), s, tot[r]);
                            acc[2 * r] = _mm512_setzero_ps();
                            acc[2 * r + 1] = _mm512_setzero_ps();
                        }
                        (b, left) = (b + 1, per);
                    }
                }
                hsum4(tot, &mut out[i..i + 4]);
                i += 4;
            }
            for (r, o) in out.iter_mut().enumerate().skip(i) {
                let row = cp.add(r * half);
                let mut tot = _mm512_setzero_ps();
                let (mut ae, mut ao) = (_mm512_setzero_ps(), _mm512_setzero_ps());
                let (mut b, mut left) = (0, per);
                for c in 0..steps {
                    let j = 32 * c;
                    let (lo, hi) = look(row.add(j / 2), t);
                    ae = _mm512_fmadd_ps(lo, _mm512_loadu_ps(xq.add(j)), ae);
                    ao = _mm512_fmadd_ps(hi, _mm512_loadu_ps(xq.add(j + 16)), ao);
                    left -= 1;
                    if left == 0 || c + 1 == steps {
                        tot = _mm512_fmadd_ps(sc!(r, b), _mm512_add_ps(ae, ao), tot);
                        (ae, ao) = (_mm512_setzero_ps(), _mm512_setzero_ps());
                        (b, left) = (b + 1, per);
                    }
                }
                *o = _mm512_reduce_add_ps(tot);
            }
        }
    }
}
