//! Encoder-sized contractions `C = W · X` with the epilogue fused into the store: W an
//! `[n, k]` weight kept in its packed form (fp16, f32, LUT4, int4: `gemv::PackedWeight`),
//! X `[k, m]` activations (fp16 or f32, k rows of m with a row stride: a BC1S 1x1 conv's
//! input `[C, S]` as it lies), C `[n, m]` written once: the f32 sums plus the bias, rounded
//! to fp16 (or kept f32) in the same store, with no separate convert, transpose or bias pass.
//!
//! Blocking: X is converted to f32 once a call into panels of [`NR`] columns (`[k][NR]`,
//! zero past `m`); the rows of W are split into tasks of [`MC`] rows (rayon), each converting
//! its rows to f32 once into a buffer that stays in L2; k is split into passes of at most
//! [`KC`] so that the slabs in use (W's `MC × KC`, one panel's `KC × NR`) stay in L2, partial
//! sums of a multi-pass product waiting in an f32 tile. The micro-kernel holds an
//! [`MR`] × [`NR`] tile of C in registers: 24 zmm accumulators with AVX-512 (X's row of 48
//! in three loads, W's eight values broadcast); elsewhere plain Rust over 4 × 16 sub-tiles
//! (compiled with FMA where the CPU has AVX2). Every path sums in f32. The portable
//! micro-kernel is the correct fallback, not a fast one (LLVM keeps its sums scalar: about
//! 2 GFLOP/s here), so the runtime only takes this GEMM where AVX-512 runs it.

use super::fastmath::Gelu;
use super::gemv::{Isa, PackedWeight};
use anyhow::{ensure, Result};
use candle_core::{DType, Tensor};
use half::f16;
use rayon::prelude::*;

/// Rows of W (output channels) in one micro-kernel tile.
pub const MR: usize = 8;
/// Columns of X (frames) in one micro-kernel tile and one packed panel.
pub const NR: usize = 48;
/// Most of k summed in one pass over a tile.
pub const KC: usize = 512;
/// Rows of W in one task (a multiple of [`MR`]).
pub const MC: usize = 48;

/// The right operand's elements.
#[derive(Clone, Copy)]
pub enum Act<'a> {
    F16(&'a [f16]),
    F32(&'a [f32]),
}

/// The output, `[n, m]` row-major.
pub enum Out<'a> {
    F16(&'a mut [f16]),
    F32(&'a mut [f32]),
}

impl Out<'_> {
    fn len(&self) -> usize {
        match self {
            Out::F16(o) => o.len(),
            Out::F32(o) => o.len(),
        }
    }
}

/// X(c, j) = `x[c·ldx + j]` (c < k, j < m) as f32 panels: panel p holds columns p·NR.. as
/// k rows of NR values, zero past m.
fn pack_x(x: Act, k: usize, m: usize, ldx: usize) -> Vec<f32> {
    let np = m.div_ceil(NR);
    let mut xp = vec![0f32; np * k * NR];
    if k == 0 {
        return xp;
    }
    xp.par_chunks_mut(k * NR)
        .enumerate()
        .for_each(|(p, panel)| {
            let (j0, w) = (p * NR, NR.min(m - p * NR));
            for (c, row) in panel.chunks_exact_mut(NR).enumerate() {
                let s = c * ldx + j0;
                match x {
                    Act::F16(v) => super::convert::f16_to_f32(&v[s..s + w], &mut row[..w]),
                    Act::F32(v) => row[..w].copy_from_slice(&v[s..s + w]),
                }
            }
        });
    xp
}

/// `out = W · X (+ bias)`: `w` `[n, k]`, X(c, j) = `x[c·ldx + j]` for c < k, j < m, `out`
/// `[n, m]` row-major, `bias` one value per row of W. Sums in f32; an fp16 output is
/// rounded once (nearest, ties to even). `isa` picks the micro-kernel (narrowed to what the
/// CPU runs).
pub fn gemm(
    w: &PackedWeight,
    x: Act,
    ldx: usize,
    m: usize,
    bias: Option<&[f32]>,
    out: Out,
    isa: Isa,
) -> Result<()> {
    gemm_then(w, x, ldx, m, bias, None, out, isa)
}

/// [`gemm`] with a GELU after the bias in the same store: the sum plus the bias rounded to
/// the output dtype (fp16), widened, GELU in f32 ([`Gelu::apply`]), rounded again — the
/// bits of the product stored and then `gelu` run on it as a separate op.
#[allow(clippy::too_many_arguments)]
pub fn gemm_then(
    w: &PackedWeight,
    x: Act,
    ldx: usize,
    m: usize,
    bias: Option<&[f32]>,
    post: Option<Gelu>,
    out: Out,
    isa: Isa,
) -> Result<()> {
    let (n, k) = (w.n, w.k);
    let xlen = match x {
        Act::F16(v) => v.len(),
        Act::F32(v) => v.len(),
    };
    ensure!(
        k == 0 || m == 0 || (ldx >= m && xlen >= (k - 1) * ldx + m),
        "gemm: {xlen} activations for {k} rows of {m} at stride {ldx}"
    );
    ensure!(
        out.len() == n * m,
        "gemm: an output of {} for [{n}, {m}]",
        out.len()
    );
    if let Some(b) = bias {
        ensure!(b.len() == n, "gemm: {} bias values for {n} rows", b.len());
    }
    if n == 0 || m == 0 {
        return Ok(());
    }
    let xp = pack_x(x, k, m, ldx);
    let level = match isa.min(Isa::cpu()) {
        Isa::Avx512 => Level::Avx512,
        Isa::Avx2 => Level::Fma,
        Isa::Portable => Level::Plain,
    };
    let task = |t: usize, rows: OutRows| {
        let r0 = t * MC;
        let b = bias.map(|b| &b[r0..]);
        block(w, &xp, m, r0, b, post, rows, level);
    };
    match out {
        Out::F16(o) => o
            .par_chunks_mut(MC * m)
            .enumerate()
            .for_each(|(t, o)| task(t, OutRows::F16(o))),
        Out::F32(o) => o
            .par_chunks_mut(MC * m)
            .enumerate()
            .for_each(|(t, o)| task(t, OutRows::F32(o))),
    }
    Ok(())
}

/// Which micro-kernel runs.
#[derive(Clone, Copy, PartialEq)]
enum Level {
    Plain,
    Fma,
    Avx512,
}

/// One task's rows of the output.
enum OutRows<'a> {
    F16(&'a mut [f16]),
    F32(&'a mut [f32]),
}

/// Where a tile's results go.
#[derive(Clone, Copy)]
enum OutPtr {
    F16(*mut f16),
    F32(*mut f32),
}

/// One micro-kernel call: `kc` steps over W rows at `w` (row stride `ldw`, [`MR`] rows all
/// readable) and one X panel slab at `x` (`kc × NR`). `load`: start from the partial sums
/// at `acc` (row stride `lda`); `store`: leave the sums there (not the last pass); else the
/// epilogue writes `rows × cols` results (plus `bias`, one per row) to `out` (stride `ldc`).
struct Tile {
    kc: usize,
    w: *const f32,
    ldw: usize,
    x: *const f32,
    acc: *mut f32,
    lda: usize,
    load: bool,
    store: bool,
    rows: usize,
    cols: usize,
    bias: Option<*const f32>,
    post: Option<Gelu>,
    out: OutPtr,
    ldc: usize,
}

/// Rows `r0..` of the product (as many as `out` holds) over all of k.
#[allow(clippy::too_many_arguments)]
fn block(
    w: &PackedWeight,
    xp: &[f32],
    m: usize,
    r0: usize,
    bias: Option<&[f32]>,
    post: Option<Gelu>,
    mut out: OutRows,
    level: Level,
) {
    let k = w.k;
    let rows = match &out {
        OutRows::F16(o) => o.len() / m,
        OutRows::F32(o) => o.len() / m,
    };
    let rpad = rows.div_ceil(MR) * MR;
    // W's rows in f32, zero rows up to a whole tile.
    let mut wb = vec![0f32; rpad * k];
    w.rows_f32(r0, &mut wb[..rows * k]);
    let passes = k.div_ceil(KC).max(1);
    let kc = k.div_ceil(passes);
    let np = m.div_ceil(NR);
    let lda = np * NR;
    let mut acc = vec![0f32; if passes > 1 { rpad * lda } else { 0 }];
    let outp = match &mut out {
        OutRows::F16(o) => OutPtr::F16(o.as_mut_ptr()),
        OutRows::F32(o) => OutPtr::F32(o.as_mut_ptr()),
    };
    for pass in 0..passes {
        let k0 = (pass * kc).min(k);
        let kl = kc.min(k - k0);
        for p in 0..np {
            let j0 = p * NR;
            for ir in (0..rows).step_by(MR) {
                let tile = Tile {
                    kc: kl,
                    // In bounds: rows ir..ir + MR ≤ rpad of k, columns k0..k0 + kl ≤ k.
                    w: wb[ir * k + k0..].as_ptr(),
                    ldw: k,
                    x: xp[p * k * NR + k0 * NR..].as_ptr(),
                    acc: if passes > 1 {
                        acc[ir * lda + j0..].as_mut_ptr()
                    } else {
                        std::ptr::null_mut()
                    },
                    lda,
                    load: pass > 0,
                    store: pass + 1 < passes,
                    rows: MR.min(rows - ir),
                    cols: NR.min(m - j0),
                    bias: bias.map(|b| b[ir..].as_ptr()),
                    post,
                    out: match outp {
                        // SAFETY (here and in the kernels): row ir, column j0 of this
                        // task's rows; the kernel writes only `rows × cols` from there.
                        OutPtr::F16(o) => OutPtr::F16(unsafe { o.add(ir * m + j0) }),
                        OutPtr::F32(o) => OutPtr::F32(unsafe { o.add(ir * m + j0) }),
                    },
                    ldc: m,
                };
                // SAFETY: the tile's pointers cover what it reads and writes (see above),
                // and the AVX-512 level is only chosen where the CPU has it.
                unsafe {
                    match level {
                        #[cfg(target_arch = "x86_64")]
                        Level::Avx512 => avx512::tile(&tile),
                        #[cfg(target_arch = "x86_64")]
                        Level::Fma => tile_fma(&tile),
                        _ => tile_plain::<false>(&tile),
                    }
                }
            }
        }
    }
}

/// Sub-tile of the portable kernel: 4 rows × 16 columns (8 ymm / 16 xmm accumulators).
const SR: usize = 4;
const SC: usize = 16;

/// The portable micro-kernel: the tile as [`SR`] × [`SC`] sub-tiles, each summed over all
/// of `kc` in a small accumulator array; `FUSED` uses `mul_add` (only where the CPU has
/// FMA, else it is a library call).
#[inline(always)]
unsafe fn tile_plain<const FUSED: bool>(t: &Tile) {
    for i0 in (0..MR).step_by(SR) {
        for j0 in (0..NR).step_by(SC) {
            let mut acc = [[0f32; SC]; SR];
            if t.load {
                for (i, a) in acc.iter_mut().enumerate() {
                    let src = std::slice::from_raw_parts(t.acc.add((i0 + i) * t.lda + j0), SC);
                    a.copy_from_slice(src);
                }
            }
            for c in 0..t.kc {
                let xr = &*(t.x.add(c * NR + j0) as *const [f32; SC]);
                for (i, a) in acc.iter_mut().enumerate() {
                    let wv = *t.w.add((i0 + i) * t.ldw + c);
                    for (s, xv) in a.iter_mut().zip(xr) {
                        *s = if FUSED {
                            wv.mul_add(*xv, *s)
                        } else {
                            *s + wv * *xv
                        };
                    }
                }
            }
            if t.store {
                for (i, a) in acc.iter().enumerate() {
                    let dst = std::slice::from_raw_parts_mut(t.acc.add((i0 + i) * t.lda + j0), SC);
                    dst.copy_from_slice(a);
                }
                continue;
            }
            for (i, a) in acc.iter().enumerate().take(t.rows.saturating_sub(i0)) {
                let r = i0 + i;
                let b = t.bias.map(|b| *b.add(r));
                for (j, &v) in a.iter().enumerate().take(t.cols.saturating_sub(j0)) {
                    let y = match b {
                        Some(b) => v + b,
                        None => v,
                    };
                    let y = match (t.post, t.out) {
                        (None, _) => y,
                        (Some(g), OutPtr::F16(_)) => g.apply(f16::from_f32(y).to_f32()),
                        (Some(g), OutPtr::F32(_)) => g.apply(y),
                    };
                    match t.out {
                        OutPtr::F16(o) => *o.add(r * t.ldc + j0 + j) = f16::from_f32(y),
                        OutPtr::F32(o) => *o.add(r * t.ldc + j0 + j) = y,
                    }
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_fma(t: &Tile) {
    tile_plain::<true>(t)
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{Gelu, OutPtr, Tile, MR, NR};
    use std::arch::x86_64::*;

    /// The [`MR`] × [`NR`] tile in 24 zmm accumulators: per step of k, three loads of X's
    /// panel row and eight broadcasts of W's values, 24 FMAs.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c,fma")]
    pub(super) unsafe fn tile(t: &Tile) {
        let mut acc = [[_mm512_setzero_ps(); 3]; MR];
        if t.load {
            for (i, a) in acc.iter_mut().enumerate() {
                for (v, s) in a.iter_mut().enumerate() {
                    *s = _mm512_loadu_ps(t.acc.add(i * t.lda + 16 * v));
                }
            }
        }
        let mut wp = [t.w; MR];
        for (i, p) in wp.iter_mut().enumerate() {
            *p = t.w.add(i * t.ldw);
        }
        let mut xp = t.x;
        for c in 0..t.kc {
            let x0 = _mm512_loadu_ps(xp);
            let x1 = _mm512_loadu_ps(xp.add(16));
            let x2 = _mm512_loadu_ps(xp.add(32));
            for i in 0..MR {
                let a = _mm512_set1_ps(*wp[i].add(c));
                acc[i][0] = _mm512_fmadd_ps(a, x0, acc[i][0]);
                acc[i][1] = _mm512_fmadd_ps(a, x1, acc[i][1]);
                acc[i][2] = _mm512_fmadd_ps(a, x2, acc[i][2]);
            }
            xp = xp.add(NR);
        }
        // The accumulators leave by value, row by row with constant indices (a loop over
        // them is not unrolled, and any variable index would keep the whole array in
        // memory, stored at every step of the loop above).
        let [a0, a1, a2, a3, a4, a5, a6, a7] = acc;
        for (i, a) in [
            (0, a0),
            (1, a1),
            (2, a2),
            (3, a3),
            (4, a4),
            (5, a5),
            (6, a6),
            (7, a7),
        ] {
            emit(t, i, a);
        }
    }

    /// GELU of 16 results (first rounded to fp16 when that is what is stored), the lanes
    /// through [`Gelu::apply_each`], vectorised here at AVX-512.
    #[inline(always)]
    unsafe fn post(g: Gelu, y: __m512, f16_out: bool) -> __m512 {
        let y = if f16_out {
            let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(y);
            _mm512_cvtph_ps(h)
        } else {
            y
        };
        let mut lanes = [0f32; 16];
        _mm512_storeu_ps(lanes.as_mut_ptr(), y);
        g.apply_each(&mut lanes);
        _mm512_loadu_ps(lanes.as_ptr())
    }

    /// Row `i` of the tile: to the partial sums, or (plus the bias) to the output.
    #[inline(always)]
    unsafe fn emit(t: &Tile, i: usize, a: [__m512; 3]) {
        if t.store {
            for (v, s) in a.iter().enumerate() {
                _mm512_storeu_ps(t.acc.add(i * t.lda + 16 * v), *s);
            }
            return;
        }
        if i >= t.rows {
            return;
        }
        let b = t.bias.map(|b| _mm512_set1_ps(*b.add(i)));
        for (v, s) in a.iter().enumerate() {
            let c0 = 16 * v;
            if c0 >= t.cols {
                return;
            }
            let left = t.cols - c0;
            let mask: u16 = if left >= 16 { !0 } else { (1u16 << left) - 1 };
            let y = match b {
                Some(b) => _mm512_add_ps(*s, b),
                None => *s,
            };
            let y = match t.post {
                Some(g) => post(g, y, matches!(t.out, OutPtr::F16(_))),
                None => y,
            };
            let at = i * t.ldc + c0;
            match t.out {
                OutPtr::F16(o) => {
                    let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(y);
                    _mm256_mask_storeu_epi16(o.add(at) as *mut i16, mask, h);
                }
                OutPtr::F32(o) => _mm512_mask_storeu_ps(o.add(at), mask, y),
            }
        }
    }
}

/// A 1x1, stride-1, unpadded, ungrouped convolution of `x [N, C, *S]` with the packed
/// `W [O, C, 1..]`, plus `bias` (one per output channel): one [`gemm`] per batch item on
/// `x` as it lies (`[C, ΠS]` rows), the result `[N, O, *S]` of `dtype` (fp16 and f32
/// written by the kernel's epilogue; other dtypes converted from f32).
pub fn conv1x1(
    x: &Tensor,
    p: &PackedWeight,
    bias: Option<&[f32]>,
    dtype: DType,
    isa: Isa,
) -> Result<Tensor> {
    conv1x1_then(x, p, bias, None, dtype, isa)
}

/// [`conv1x1`] with `post` (a GELU) in the store (see [`gemm_then`]); other dtypes than
/// fp16 and f32 get the GELU after their conversion.
pub fn conv1x1_then(
    x: &Tensor,
    p: &PackedWeight,
    bias: Option<&[f32]>,
    post: Option<Gelu>,
    dtype: DType,
    isa: Isa,
) -> Result<Tensor> {
    let d = x.dims();
    ensure!(
        d.len() >= 2 && d[1] == p.k,
        "conv input {d:?} for a 1x1 kernel of {} input channels",
        p.k
    );
    let (nb, s): (usize, usize) = (d[0], d[2..].iter().product());
    let (k, n) = (p.k, p.n);
    let mut shape = d.to_vec();
    shape[1] = n;
    let run = |xs: Act, out: Out, post: Option<Gelu>| -> Result<()> {
        let mut out = out;
        for b in 0..nb {
            let xb = match xs {
                Act::F16(v) => Act::F16(&v[b * k * s..(b + 1) * k * s]),
                Act::F32(v) => Act::F32(&v[b * k * s..(b + 1) * k * s]),
            };
            let ob = match &mut out {
                Out::F16(o) => Out::F16(&mut o[b * n * s..(b + 1) * n * s]),
                Out::F32(o) => Out::F32(&mut o[b * n * s..(b + 1) * n * s]),
            };
            gemm_then(p, xb, s, s, bias, post, ob, isa)?;
        }
        Ok(())
    };
    let with_x = |out: Out, post: Option<Gelu>| -> Result<()> {
        match x.dtype() {
            DType::F16 => super::data::with_slice(x, |v: &[f16]| run(Act::F16(v), out, post))?,
            DType::F32 => super::data::with_slice(x, |v: &[f32]| run(Act::F32(v), out, post))?,
            _ => {
                let v = super::to_f32_vec(x)?;
                run(Act::F32(&v), out, post)
            }
        }
    };
    if dtype == DType::F16 {
        let mut y = vec![f16::ZERO; nb * n * s];
        with_x(Out::F16(&mut y), post)?;
        return super::from_vec(y, &shape);
    }
    if dtype == DType::F32 {
        let mut y = vec![0f32; nb * n * s];
        with_x(Out::F32(&mut y), post)?;
        return super::from_vec(y, &shape);
    }
    let mut y = vec![0f32; nb * n * s];
    // Other dtypes: the product rounded to them, then the GELU, as two ops would.
    with_x(Out::F32(&mut y), None)?;
    let y = super::from_f32(y, &shape, dtype)?;
    match post {
        Some(g) => super::map_gelu(&y, g),
        None => Ok(y),
    }
}
