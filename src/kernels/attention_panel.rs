//! The fused attention's fast form for many query rows (an encoder's self-attention): panels
//! of [`NR`] queries at a time on `kernels::gemm`'s micro-kernels, every step laid out so
//! that the softmax runs down the columns of one panel with no transpose in between.
//!
//! Per head, once: the keys as `Kᵀ` (`[N][k]` f32, rows padded to a whole tile) and the
//! values as `V` (`[D][N]` f32), both in the layout the micro-kernel broadcasts from. Per
//! panel of queries (one task): the queries `[k][NR]` (an activation panel, as a 1x1 conv's
//! input), then
//! 1. the scores transposed, `Sᵀ = Kᵀ · Q` (`[N][NR]`: row j holds key j's score for each
//!    of the panel's queries), written by the micro-kernel's store;
//! 2. the softmax of each column, in place: round the scores to their stored dtype, add the
//!    mask and round again, column maxima, `exp` and column sums, normalise and round the
//!    probabilities — all vertical (one lane a query; AVX-512: three zmm a row);
//! 3. the panel's output `O = V · P` (`[D][NR]`), the probabilities already being the
//!    micro-kernel's right-hand panel (`[N][NR]`).
//!
//! A panel of probabilities (1500 keys × 48 queries, 288 KB) stays in L2 between the steps;
//! nothing of `[M, N]` is ever allocated (unless the probabilities are asked for). Each
//! score, masked score and probability is rounded to the dtype the caller states exactly
//! as the op-by-op program rounds it, each softmax sum runs in the same order as the general
//! path's (keys in order), and `exp` is `fastmath::exp`'s arithmetic lane by lane, so the
//! result differs from the op-by-op one only by the order of the f32 sums of the two
//! products. Rounding: none (f32) or fp16; other dtypes take the general path.
//!
//! bf16 products ([`Inputs::Bf16`]; `--compute bf16`, an evaluation mode): the same panels
//! and softmax, the two products on `kernels::gemm`'s bf16 micro-kernel (`vdpbf16ps`, f32
//! sums): the keys packed once per head as `Kᵀ` rows of bf16 pairs along k (`[N][⌈k/2⌉]`
//! words), the values as `V` rows of pairs along N (`[D][⌈N/2⌉]`), the panel's queries as
//! pairs of rows (`[⌈k/2⌉][NR]`), and after the softmax the panel's probabilities, as
//! stored (rounded to their dtype), packed as pairs of key rows (`[⌈N/2⌉][NR]`). Each
//! operand is rounded to bfloat16 (nearest, ties to even) once; the scores, their
//! roundings, the softmax and the probabilities handed out are as above.

use super::fastmath;
pub use super::gemm::NR;
use super::gemm::{bf16_pairs, bf16_panel_pairs, Inputs, Level, OutPtr, Tile, MR};
use super::gemv::Isa;
use anyhow::Result;
use half::f16;
use rayon::prelude::*;

/// How an intermediate value is stored by the unfused program.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Round {
    /// f32: kept as computed.
    None,
    /// fp16: rounded to nearest, ties to even.
    F16,
}

/// A batch of logical matrices in f32: element (b, r, c) at `data[b·step + r·rs + c·cs]`
/// (`step` 0 when one matrix serves every batch entry).
#[derive(Clone, Copy)]
pub struct Mat<'a> {
    pub data: &'a [f32],
    pub step: usize,
    pub rs: usize,
    pub cs: usize,
}

impl Mat<'_> {
    /// `dst[r·ld + c] = self(b, r0 + r, c0 + c)` for r < rows, c < cols, reading the source
    /// along its contiguous axis.
    #[allow(clippy::too_many_arguments)]
    fn gather(
        &self,
        b: usize,
        (r0, rows): (usize, usize),
        (c0, cols): (usize, usize),
        dst: &mut [f32],
        ld: usize,
    ) {
        let base = b * self.step + r0 * self.rs + c0 * self.cs;
        let s = &self.data[base..];
        if self.cs <= self.rs {
            for r in 0..rows {
                let d = &mut dst[r * ld..r * ld + cols];
                d.iter_mut()
                    .enumerate()
                    .for_each(|(c, d)| *d = s[r * self.rs + c * self.cs]);
            }
        } else {
            for c in 0..cols {
                for r in 0..rows {
                    dst[r * ld + c] = s[r * self.rs + c * self.cs];
                }
            }
        }
    }
}

/// One batched attention core: `softmax(Q · K [+ mask]) · Vᵀ` per batch entry, Q `[M, k]`,
/// K `[k, N]`, V `[D, N]`, mask `[M, N]` (all logical shapes of [`Mat`]s).
pub struct Problem<'a> {
    pub nb: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub d: usize,
    pub q: Mat<'a>,
    pub keys: Mat<'a>,
    pub v: Mat<'a>,
    pub mask: Option<Mat<'a>>,
    /// The scores, masked scores and probabilities as stored.
    pub round: [Round; 3],
    /// true: the result is `[nb, M, D]`; false: `[nb, D, M]`.
    pub probs_left: bool,
}

/// A head's keys or values in the micro-kernel's left-operand layout: f32 rows, or rows of
/// bf16 pairs (whose words the bf16 micro-kernel reads through the tile's `*const f32`).
enum Rows {
    F32(Vec<f32>),
    Bf16(Vec<u32>),
}

impl Rows {
    /// `src` (`rows × len` f32, zero rows up to a whole tile included) in `level`'s layout:
    /// as it is, or each row as bf16 pairs along it.
    fn new(src: Vec<f32>, len: usize, level: Level) -> Rows {
        if level != Level::Bf16 {
            return Rows::F32(src);
        }
        let l2 = len.div_ceil(2);
        let mut words = vec![0u32; src.len() / len.max(1) * l2];
        if len > 0 {
            for (r, w) in src.chunks_exact(len).zip(words.chunks_exact_mut(l2)) {
                bf16_pairs(r, w);
            }
        }
        Rows::Bf16(words)
    }

    /// Row `r` of rows of `len` (counted in the layout's units: values or pairs).
    fn row(&self, r: usize, len: usize) -> *const f32 {
        match self {
            Rows::F32(v) => v[r * len..].as_ptr(),
            Rows::Bf16(v) => v[r * len..].as_ptr().cast(),
        }
    }
}

/// Computes the attention of `p` on `isa`'s micro-kernels (narrowed to what the CPU runs),
/// or with `inputs` = [`Inputs::Bf16`] on the bf16 one (an error where the CPU lacks
/// AVX512-BF16): the result (layout as `p.probs_left` says) and, with `want_probs`, the
/// probabilities `[nb, M, N]` (else empty).
pub fn attention(
    p: &Problem,
    want_probs: bool,
    isa: Isa,
    inputs: Inputs,
) -> Result<(Vec<f32>, Vec<f32>)> {
    let (nb, m, n, k, d) = (p.nb, p.m, p.n, p.k, p.d);
    let level = match inputs {
        Inputs::F32 => Level::of(isa),
        Inputs::Bf16 => {
            super::gemm::require_bf16(super::gemm::bf16_cpu())?;
            Level::Bf16
        }
    };
    // Keys and values per head in the micro-kernel's layout, zero rows up to a whole tile.
    let (npad, dpad) = (n.div_ceil(MR) * MR, d.div_ceil(MR) * MR);
    let heads = |step: usize| if step == 0 { 1 } else { nb };
    let kt: Vec<Rows> = (0..heads(p.keys.step))
        .into_par_iter()
        .map(|b| {
            let mut t = vec![0f32; npad * k];
            // Kᵀ(j, c) = K(c, j): the source transposed (rs ↔ cs).
            let kt = Mat {
                rs: p.keys.cs,
                cs: p.keys.rs,
                ..p.keys
            };
            kt.gather(b, (0, n), (0, k), &mut t, k);
            Rows::new(t, k, level)
        })
        .collect();
    let vw: Vec<Rows> = (0..heads(p.v.step))
        .into_par_iter()
        .map(|b| {
            let mut t = vec![0f32; dpad * n];
            p.v.gather(b, (0, d), (0, n), &mut t, n);
            Rows::new(t, n, level)
        })
        .collect();
    let np = m.div_ceil(NR);
    let bf16 = level == Level::Bf16;
    let tasks: Vec<(Vec<f32>, Vec<f32>)> = (0..nb * np)
        .into_par_iter()
        .map_init(
            || Scratch {
                q: vec![0f32; k * NR],
                s: vec![0f32; n * NR],
                mask: vec![0f32; if p.mask.is_some() { n * NR } else { 0 }],
                qb: vec![0u32; if bf16 { k.div_ceil(2) * NR } else { 0 }],
                pb: vec![0u32; if bf16 { n.div_ceil(2) * NR } else { 0 }],
            },
            |sc, t| {
                let (b, i0) = (t / np, (t % np) * NR);
                let w = NR.min(m - i0);
                let kt = &kt[if p.keys.step == 0 { 0 } else { b }];
                let vw = &vw[if p.v.step == 0 { 0 } else { b }];
                panel(p, sc, (b, i0, w), (kt, vw), level, want_probs)
            },
        )
        .collect();
    // Each batch entry's panels into its part of the output (and probabilities).
    let mut out = vec![0f32; nb * m * d];
    out.par_chunks_mut(m * d).enumerate().for_each(|(b, ob)| {
        for (pi, (o, _)) in tasks[b * np..(b + 1) * np].iter().enumerate() {
            let i0 = pi * NR;
            let w = NR.min(m - i0);
            for c in 0..d {
                let row = &o[c * NR..c * NR + w];
                match p.probs_left {
                    true => row
                        .iter()
                        .enumerate()
                        .for_each(|(i, &v)| ob[(i0 + i) * d + c] = v),
                    false => ob[c * m + i0..c * m + i0 + w].copy_from_slice(row),
                }
            }
        }
    });
    let mut probs = vec![0f32; if want_probs { nb * m * n } else { 0 }];
    if want_probs {
        probs.par_chunks_mut(m * n).enumerate().for_each(|(b, pb)| {
            for (pi, (_, pr)) in tasks[b * np..(b + 1) * np].iter().enumerate() {
                pb[pi * NR * n..pi * NR * n + pr.len()].copy_from_slice(pr);
            }
        });
    }
    Ok((out, probs))
}

/// A task's buffers, reused from task to task on a thread.
struct Scratch {
    /// The panel's queries, `[k][NR]`.
    q: Vec<f32>,
    /// Scores, then probabilities, `[N][NR]`.
    s: Vec<f32>,
    /// The panel's mask, `[N][NR]` (empty without one).
    mask: Vec<f32>,
    /// bf16 products only: the queries as pairs of rows, `[⌈k/2⌉][NR]` words.
    qb: Vec<u32>,
    /// bf16 products only: the probabilities as pairs of rows, `[⌈N/2⌉][NR]` words.
    pb: Vec<u32>,
}

/// One panel: queries `i0..i0 + w` of batch entry `b`; returns its output `[D][NR]` and, with
/// `want_probs`, its probabilities `[w][N]`.
fn panel(
    p: &Problem,
    sc: &mut Scratch,
    (b, i0, w): (usize, usize, usize),
    (kt, vw): (&Rows, &Rows),
    level: Level,
    want_probs: bool,
) -> (Vec<f32>, Vec<f32>) {
    let (n, k, d) = (p.n, p.k, p.d);
    let bf16 = level == Level::Bf16;
    // The products' depths in the operands' units: values, or bf16 pairs.
    let (kw, nw) = match bf16 {
        true => (k.div_ceil(2), n.div_ceil(2)),
        false => (k, n),
    };
    // Q(i0 + i, c) → q[c][i]: the source transposed; columns past w stay zero.
    if w < NR {
        sc.q.fill(0.0);
    }
    let qt = Mat {
        rs: p.q.cs,
        cs: p.q.rs,
        ..p.q
    };
    qt.gather(b, (0, k), (i0, w), &mut sc.q, NR);
    let qp: *const f32 = match bf16 {
        true => {
            bf16_panel_pairs(&sc.q, &mut sc.qb);
            sc.qb.as_ptr().cast()
        }
        false => sc.q.as_ptr(),
    };
    // The columns the tiles compute: on bf16 products only the panel's queries (the bf16
    // micro-kernel then runs on fewer vectors a row: the last panel of 1500 holds 12), the
    // columns past them left as they are and never read out; else the whole panel.
    let cols = if bf16 { w } else { NR };
    // 1. Sᵀ = Kᵀ · Q, eight keys a tile.
    for j in (0..n).step_by(MR) {
        let mut t = Tile::once(kw, kt.row(j, kw), kw, qp);
        t.rows = MR.min(n - j);
        t.cols = cols;
        t.out = OutPtr::F32(sc.s[j * NR..].as_mut_ptr());
        // SAFETY: Kᵀ has `MR` rows of kw from row j (padded to a whole tile), the query
        // panel kw × NR (values or pairs); rows × NR results land in rows j.. of the n × NR
        // scores; the bf16 level only where the CPU has it (`attention`).
        unsafe { t.run(level) };
    }
    // 2. The softmax down each column.
    let mask = match p.mask {
        Some(mk) => {
            if w < NR {
                sc.mask.fill(0.0);
            }
            // mask(i0 + i, j) → mask[j][i].
            let mt = Mat {
                rs: mk.cs,
                cs: mk.rs,
                ..mk
            };
            mt.gather(b, (0, n), (i0, w), &mut sc.mask, NR);
            Some(&sc.mask[..])
        }
        None => None,
    };
    // bf16 products on x86: the softmax hands out the paired probabilities itself.
    let paired = bf16 && cfg!(target_arch = "x86_64");
    match paired {
        true => softmax_columns_paired(&mut sc.s, mask, p.round, &mut sc.pb),
        false => softmax_columns(&mut sc.s, mask, p.round, level),
    }
    let probs = match want_probs {
        true => {
            let mut pr = vec![0f32; w * n];
            for (j, row) in sc.s.chunks_exact(NR).enumerate() {
                for (i, &v) in row[..w].iter().enumerate() {
                    pr[i * n + j] = v;
                }
            }
            pr
        }
        false => vec![],
    };
    // 3. O = V · P, eight value rows a tile (on bf16 products, the probabilities as
    // stored, paired).
    let pp: *const f32 = match bf16 {
        true => {
            if !paired {
                bf16_panel_pairs(&sc.s, &mut sc.pb);
            }
            sc.pb.as_ptr().cast()
        }
        false => sc.s.as_ptr(),
    };
    let mut o = vec![0f32; d.div_ceil(MR) * MR * NR];
    for c in (0..d).step_by(MR) {
        let mut t = Tile::once(nw, vw.row(c, nw), nw, pp);
        t.rows = MR.min(d - c);
        t.cols = cols;
        t.out = OutPtr::F32(o[c * NR..].as_mut_ptr());
        // SAFETY: V has `MR` rows of nw from row c (padded), the probabilities nw × NR;
        // the tile's rows × NR results land in rows c.. of o.
        unsafe { t.run(level) };
    }
    (o, probs)
}

/// The bf16 products' softmax (x86 only, where the bf16 level runs): [`softmax_columns`]'
/// roundings and passes, with `exp` on fused multiply-adds ([`avx512::exp_fma`], not the
/// op-by-op program's bits: this is the opt-in bf16 evaluation mode), and the last pass
/// also writing the probabilities as stored, rounded to bf16 and paired along the keys,
/// into `pairs` (`[⌈N/2⌉][NR]` words, as [`bf16_panel_pairs`] lays them).
fn softmax_columns_paired(
    s: &mut [f32],
    mask: Option<&[f32]>,
    round: [Round; 3],
    pairs: &mut [u32],
) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: only called on the bf16 level, chosen where the CPU has AVX512-BF16 with the
    // foundation (`gemm::bf16_cpu`); `mask`, when given, is as long as `s`, a whole number
    // of rows of NR; `pairs` holds ⌈rows/2⌉ rows of NR words.
    unsafe {
        avx512::softmax_columns_paired(s, mask, round, pairs)
    };
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (s, mask, round, pairs);
        unreachable!("the bf16 level runs on x86 only");
    }
}

/// The softmax of each of the [`NR`] columns of `s` (`[N][NR]`), in place, with the
/// roundings of `round` (the masked one only with a mask).
fn softmax_columns(s: &mut [f32], mask: Option<&[f32]>, round: [Round; 3], level: Level) {
    #[cfg(target_arch = "x86_64")]
    if matches!(level, Level::Avx512 | Level::Bf16) {
        // SAFETY: chosen only where the CPU has AVX-512 (`Level::of`; the bf16 level needs
        // AVX512-BF16 with the foundation, `gemm::bf16_cpu`); `mask`, when given, is as
        // long as `s`, a whole number of rows of NR.
        unsafe { avx512::softmax_columns(s, mask, round) };
        return;
    }
    let _ = level;
    let r = |v: f32, how: Round| match how {
        Round::None => v,
        Round::F16 => f16::from_f32(v).to_f32(),
    };
    let mut mx = [f32::NEG_INFINITY; NR];
    for (j, row) in s.chunks_exact_mut(NR).enumerate() {
        for (i, e) in row.iter_mut().enumerate() {
            let mut v = r(*e, round[0]);
            if let Some(mk) = mask {
                v = r(v + mk[j * NR + i], round[1]);
            }
            *e = v;
            mx[i] = mx[i].max(v);
        }
    }
    let mut sum = [0f32; NR];
    for row in s.chunks_exact_mut(NR) {
        for (i, e) in row.iter_mut().enumerate() {
            *e = fastmath::exp(*e - mx[i]);
            sum[i] += *e;
        }
    }
    let inv = sum.map(|v| 1.0 / v);
    for row in s.chunks_exact_mut(NR) {
        for (i, e) in row.iter_mut().enumerate() {
            *e = r(*e * inv[i], round[2]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{Round, NR};
    use std::arch::x86_64::*;

    /// Lanes of one zmm; a row of the panel is `NR / L` of them.
    const L: usize = 16;
    const V: usize = NR / L;

    #[inline(always)]
    unsafe fn rnd(x: __m512, how: Round) -> __m512 {
        match how {
            Round::None => x,
            Round::F16 => _mm512_cvtph_ps(_mm512_cvtps_ph::<
                { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
            >(x)),
        }
    }

    /// `fastmath::exp` lane by lane: the same operations in the same order (separate
    /// multiplies and adds, no FMA), so the same bits.
    #[inline(always)]
    unsafe fn exp(xin: __m512) -> __m512 {
        let c = _mm512_set1_ps;
        let (mul, add, sub) = (_mm512_mul_ps, _mm512_add_ps, _mm512_sub_ps);
        const SHIFT: f32 = 12_582_912.0;
        let x = _mm512_min_ps(_mm512_max_ps(xin, c(-87.3)), c(88.7));
        let t = add(mul(x, c(std::f32::consts::LOG2_E)), c(SHIFT));
        let n = sub(t, c(SHIFT));
        let r = sub(sub(x, mul(n, c(0.693_359_4))), mul(n, c(-2.121_944_4e-4)));
        let mut p = c(1.987_569_1e-4);
        p = add(mul(p, r), c(1.398_2e-3));
        p = add(mul(p, r), c(8.333_452e-3));
        p = add(mul(p, r), c(4.166_579_6e-2));
        p = add(mul(p, r), c(1.666_666_5e-1));
        p = add(mul(p, r), c(0.5));
        let e = add(add(mul(mul(p, r), r), r), c(1.0));
        scale_by_2n(e, t, xin)
    }

    /// e^x as [`exp`], its polynomial and reduction on fused multiply-adds (fewer
    /// operations, not the same bits): relative error within 5e-7 (tested against f64).
    #[inline(always)]
    pub(super) unsafe fn exp_fma(xin: __m512) -> __m512 {
        let c = _mm512_set1_ps;
        const SHIFT: f32 = 12_582_912.0;
        let x = _mm512_min_ps(_mm512_max_ps(xin, c(-87.3)), c(88.7));
        let t = _mm512_fmadd_ps(x, c(std::f32::consts::LOG2_E), c(SHIFT));
        let n = _mm512_sub_ps(t, c(SHIFT));
        let r = _mm512_fnmadd_ps(n, c(0.693_359_4), x);
        let r = _mm512_fnmadd_ps(n, c(-2.121_944_4e-4), r);
        let mut p = c(1.987_569_1e-4);
        p = _mm512_fmadd_ps(p, r, c(1.398_2e-3));
        p = _mm512_fmadd_ps(p, r, c(8.333_452e-3));
        p = _mm512_fmadd_ps(p, r, c(4.166_579_6e-2));
        p = _mm512_fmadd_ps(p, r, c(1.666_666_5e-1));
        p = _mm512_fmadd_ps(p, r, c(0.5));
        let e = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, c(1.0)));
        scale_by_2n(e, t, xin)
    }

    /// The last step of [`exp`] and [`exp_fma`]: `e · 2^n`, with `n` in the low mantissa
    /// bits of `t = x·log2(e) + 1.5·2^23`, and NaN inputs passed through.
    #[inline(always)]
    unsafe fn scale_by_2n(e: __m512, t: __m512, xin: __m512) -> __m512 {
        const SHIFT: f32 = 12_582_912.0;
        let nb = _mm512_sub_epi32(
            _mm512_castps_si512(t),
            _mm512_set1_epi32(SHIFT.to_bits() as i32),
        );
        let two_n = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(
            nb,
            _mm512_set1_epi32(127),
        )));
        let y = _mm512_mul_ps(e, two_n);
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(xin, xin);
        _mm512_mask_blend_ps(nan, y, xin)
    }

    /// `exp_fma` of each of `x` (tests).
    #[cfg(test)]
    #[target_feature(enable = "avx512f,fma")]
    pub(super) unsafe fn exp_fma_each(x: &mut [f32; 16]) {
        let v = exp_fma(_mm512_loadu_ps(x.as_ptr()));
        _mm512_storeu_ps(x.as_mut_ptr(), v);
    }

    /// See `super::softmax_columns_paired`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,f16c,fma")]
    pub(super) unsafe fn softmax_columns_paired(
        s: &mut [f32],
        mask: Option<&[f32]>,
        round: [Round; 3],
        pairs: &mut [u32],
    ) {
        let rows = s.len() / NR;
        let inv = max_and_exp::<true>(s, mask, round);
        let sp = s.as_mut_ptr();
        let mut idx = [0i16; 32];
        for (i, v) in idx.iter_mut().enumerate() {
            *v = (i / 2 + 16 * (i % 2)) as i16;
        }
        let idx = _mm512_loadu_si512(idx.as_ptr() as *const __m512i);
        for j2 in 0..rows.div_ceil(2) {
            for (v, iv) in inv.iter().enumerate() {
                let at = sp.add(2 * j2 * NR + v * L);
                let lo = rnd(_mm512_mul_ps(_mm512_loadu_ps(at), *iv), round[2]);
                _mm512_storeu_ps(at, lo);
                let hi = match 2 * j2 + 1 < rows {
                    true => {
                        let h = rnd(_mm512_mul_ps(_mm512_loadu_ps(at.add(NR)), *iv), round[2]);
                        _mm512_storeu_ps(at.add(NR), h);
                        h
                    }
                    false => _mm512_setzero_ps(),
                };
                let h: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
                let wv = _mm512_permutexvar_epi16(idx, h);
                _mm512_storeu_si512(pairs.as_mut_ptr().add(j2 * NR + v * L) as *mut __m512i, wv);
            }
        }
    }

    /// The first two passes of the column softmax: scores rounded (and masked), column
    /// maxima; `exp` (`FMA`: [`exp_fma`], else [`exp`]) and column sums. Returns the sums'
    /// reciprocals.
    #[inline(always)]
    unsafe fn max_and_exp<const FMA: bool>(
        s: &mut [f32],
        mask: Option<&[f32]>,
        round: [Round; 3],
    ) -> [__m512; V] {
        let rows = s.len() / NR;
        let sp = s.as_mut_ptr();
        let mut mx = [_mm512_set1_ps(f32::NEG_INFINITY); V];
        for j in 0..rows {
            for (v, m) in mx.iter_mut().enumerate() {
                let at = sp.add(j * NR + v * L);
                let mut x = rnd(_mm512_loadu_ps(at), round[0]);
                if let Some(mk) = mask {
                    let a = _mm512_loadu_ps(mk.as_ptr().add(j * NR + v * L));
                    x = rnd(_mm512_add_ps(x, a), round[1]);
                }
                _mm512_storeu_ps(at, x);
                // max(x, m) keeps m where x is NaN, as `f32::max` does.
                *m = _mm512_max_ps(x, *m);
            }
        }
        let mut sum = [_mm512_setzero_ps(); V];
        for j in 0..rows {
            for v in 0..V {
                let at = sp.add(j * NR + v * L);
                let d = _mm512_sub_ps(_mm512_loadu_ps(at), mx[v]);
                let e = if FMA { exp_fma(d) } else { exp(d) };
                _mm512_storeu_ps(at, e);
                sum[v] = _mm512_add_ps(sum[v], e);
            }
        }
        sum.map(|v| _mm512_div_ps(_mm512_set1_ps(1.0), v))
    }

    /// See `super::softmax_columns`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c,fma")]
    pub(super) unsafe fn softmax_columns(s: &mut [f32], mask: Option<&[f32]>, round: [Round; 3]) {
        let rows = s.len() / NR;
        let inv = max_and_exp::<false>(s, mask, round);
        let sp = s.as_mut_ptr();
        for j in 0..rows {
            for (v, iv) in inv.iter().enumerate() {
                let at = sp.add(j * NR + v * L);
                _mm512_storeu_ps(at, rnd(_mm512_mul_ps(_mm512_loadu_ps(at), *iv), round[2]));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    /// The bf16 softmax's `exp` on fused multiply-adds against f64's `exp`: relative error
    /// within 5e-7 over −87..88 (the range it does not clamp), exactly 1 at 0, below −87.3
    /// a tiny non-negative value, far above 88 a huge one, NaN passed through.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn fma_exp_is_within_5e7_of_float64_exp() {
        if !(is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("fma")) {
            eprintln!("no AVX-512 here: the FMA exp does not run");
            return;
        }
        let mut worst = 0f64;
        for i in -21_750..=22_000 {
            let mut lanes: [f32; 16] = std::array::from_fn(|l| (i * 16 + l as i32) as f32 / 4000.0);
            let x = lanes;
            // SAFETY: the CPU has AVX-512F and FMA (checked above).
            unsafe { super::avx512::exp_fma_each(&mut lanes) };
            for (got, x) in lanes.iter().zip(x) {
                let want = f64::from(x).exp();
                worst = worst.max((f64::from(*got) - want).abs() / want);
            }
        }
        assert!(worst < 5e-7, "relative error {worst:e}");
        let mut ends = [0f32; 16];
        ends[..4].copy_from_slice(&[0.0, -1e9, 1e9, f32::NAN]);
        // SAFETY: as above.
        unsafe { super::avx512::exp_fma_each(&mut ends) };
        assert_eq!(ends[0], 1.0);
        assert!(ends[1] >= 0.0 && ends[1] < 1e-37 && ends[2] > 1e38);
        assert!(ends[3].is_nan());
    }
}
