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
//!
//! bf16 products ([`gemm_bf16`], [`Inputs::Bf16`]; an opt-in evaluation mode, not what a
//! device computes): the same blocking and epilogue with W and X rounded to bfloat16
//! (nearest, ties to even) and packed as pairs along k — one 32-bit word holds
//! `(v[2c], v[2c + 1])`, the even one in the low half — so that one `vdpbf16ps`
//! (AVX512-BF16) adds two products per lane to the f32 sums. Only where the CPU has
//! AVX512-BF16 ([`bf16_cpu`]); elsewhere an error naming the feature ([`require_bf16`]).
//!
//! `kernels::attention_panel` runs its two products on the same micro-kernels ([`Tile`]),
//! the f32 one or (bf16 products) the bf16 one on operands packed by [`bf16_pairs`] and
//! [`bf16_panel_pairs`].

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

/// What the products multiply: the data as it is (fp16 and f32 values, exact in f32), or
/// both operands rounded to bfloat16 first (sums in f32 either way).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Inputs {
    #[default]
    F32,
    Bf16,
}

/// Whether this CPU runs the bf16 micro-kernel: AVX512-BF16 (`vdpbf16ps`) with the
/// AVX-512 foundation, byte/word and vector-length extensions.
pub fn bf16_cpu() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vl")
            && std::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `Ok` where `has_bf16` ([`bf16_cpu`] on this machine; any value in a test) says the CPU
/// runs bf16 products; else an error naming the instructions it lacks. Never a fallback.
pub fn require_bf16(has_bf16: bool) -> Result<()> {
    ensure!(
        has_bf16,
        "bf16 products need a CPU with AVX512-BF16 (the `vdpbf16ps` instruction, flag \
         `avx512_bf16` in /proc/cpuinfo, with AVX512F/BW/VL); this CPU lacks it"
    );
    Ok(())
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
    product(w, x, ldx, m, bias, post, out, Level::of(isa))
}

/// [`gemm`] with W and X rounded to bfloat16 (nearest, ties to even) and multiplied in
/// pairs along k by `vdpbf16ps`, the sums in f32, the same epilogue. An error where the
/// CPU lacks AVX512-BF16 ([`require_bf16`]).
pub fn gemm_bf16(
    w: &PackedWeight,
    x: Act,
    ldx: usize,
    m: usize,
    bias: Option<&[f32]>,
    out: Out,
) -> Result<()> {
    gemm_bf16_then(w, x, ldx, m, bias, None, out)
}

/// [`gemm_bf16`] with [`gemm_then`]'s GELU in the store.
pub fn gemm_bf16_then(
    w: &PackedWeight,
    x: Act,
    ldx: usize,
    m: usize,
    bias: Option<&[f32]>,
    post: Option<Gelu>,
    out: Out,
) -> Result<()> {
    require_bf16(bf16_cpu())?;
    product(w, x, ldx, m, bias, post, out, Level::Bf16)
}

#[allow(clippy::too_many_arguments)]
fn product(
    w: &PackedWeight,
    x: Act,
    ldx: usize,
    m: usize,
    bias: Option<&[f32]>,
    post: Option<Gelu>,
    out: Out,
    level: Level,
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
    let xp = if level == Level::Bf16 {
        let mut buf = std::mem::take(&mut *X_PAIRS.lock().unwrap_or_else(|e| e.into_inner()));
        pack_x_bf16(x, k, m, ldx, &mut buf);
        Panels::Bf16(buf)
    } else {
        Panels::F32(pack_x(x, k, m, ldx))
    };
    // Tasks: MC rows of W against a group of X's panels (all of them unless X's bf16
    // panels outgrow the L3 share `panel_group` allows), group-major so that the tasks
    // running at once read the same panels.
    let np = m.div_ceil(NR);
    let gp = panel_group(&xp, np);
    let (groups, row_tasks) = (np.div_ceil(gp), n.div_ceil(MC));
    let outp = SharedOut(match out {
        Out::F16(o) => OutPtr::F16(o.as_mut_ptr()),
        Out::F32(o) => OutPtr::F32(o.as_mut_ptr()),
    });
    let outp = &outp;
    (0..groups * row_tasks).into_par_iter().for_each(|t| {
        let (g, r0) = (t / row_tasks, (t % row_tasks) * MC);
        let rows = MC.min(n - r0);
        let panels = g * gp..((g + 1) * gp).min(np);
        let b = bias.map(|b| &b[r0..]);
        // SAFETY: row r0 of the `n × m` output (checked above); this task writes only its
        // rows' columns of its panels, which no other task writes.
        let at = match outp.0 {
            OutPtr::F16(o) => OutPtr::F16(unsafe { o.add(r0 * m) }),
            OutPtr::F32(o) => OutPtr::F32(unsafe { o.add(r0 * m) }),
        };
        block(w, &xp, m, r0, rows, panels, b, post, at, level);
    });
    if let Panels::Bf16(buf) = xp {
        let mut kept = X_PAIRS.lock().unwrap_or_else(|e| e.into_inner());
        if buf.capacity() > kept.capacity() {
            *kept = buf;
        }
    }
    Ok(())
}

/// The bf16 input panels' buffer, kept from call to call: a fresh one is megabytes of new
/// pages each call (the kernel clears each), as many as an encoder window's weights. A
/// call that finds it taken (two products at once) makes its own; the larger is kept.
static X_PAIRS: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());

/// bf16 panels beyond this many bytes are split into column groups ([`panel_group`]).
const GROUP_FROM: usize = 4 << 20;
/// The bytes of X's bf16 panels one group of tasks reads ([`panel_group`]).
const GROUP_BYTES: usize = 2 << 20;
/// The fewest panels in a group (each group converts its tasks' W rows again).
const GROUP_MIN: usize = 4;

/// How many of X's `np` panels one task covers: all of them, or where X's bf16 panels
/// pass [`GROUP_FROM`] (turbo's fc2, k = 5120: 15.7 MB), as many as fit [`GROUP_BYTES`]
/// (at least [`GROUP_MIN`]). A task over all of X streams all of it from memory once per
/// [`MC`] rows; in groups, the tasks running at once share a group's panels in L3 (the
/// fc2 shape's products 190 → about 225 GFLOP per CPU-second here, one thread).
fn panel_group(xp: &Panels, np: usize) -> usize {
    match xp {
        Panels::Bf16(v) if 4 * v.len() > GROUP_FROM => {
            let panel = 4 * v.len() / np.max(1);
            (GROUP_BYTES / panel.max(1)).max(GROUP_MIN).min(np)
        }
        _ => np,
    }
    .max(1)
}

/// The output's base pointer, shared by the tasks, each writing its own rows and columns.
struct SharedOut(OutPtr);

// SAFETY: the tasks holding it write disjoint parts of the output (see `product`), which
// outlives them (borrowed mutably for the whole call).
unsafe impl Sync for SharedOut {}

/// X's panels: f32 values (`[k][NR]` each), or bf16 pairs along k (`[⌈k/2⌉][NR]` words).
enum Panels {
    F32(Vec<f32>),
    Bf16(Vec<u32>),
}

/// bf16 bits of `v`, rounded to nearest, ties to even (NaN stays NaN): the conversion
/// `vcvtne2ps2bf16` makes (the packers use it where they run; this where they cannot).
#[cfg(not(target_arch = "x86_64"))]
fn bf16_bits(v: f32) -> u32 {
    u32::from(half::bf16::from_f32(v).to_bits())
}

/// [`pack_x`] as bf16 pairs into `xp` (resized to `⌈m/NR⌉·⌈k/2⌉·NR` words, every one
/// written): word (c2, j) of panel p holds X(2·c2, j) in its low half and X(2·c2 + 1, j)
/// in its high half (zero past k and past m).
fn pack_x_bf16(x: Act, k: usize, m: usize, ldx: usize, xp: &mut Vec<u32>) {
    let (np, k2) = (m.div_ceil(NR), k.div_ceil(2));
    xp.resize(np * k2 * NR, 0);
    if k == 0 {
        return;
    }
    // fp16 inputs: a task per few pairs of rows, each pair read along its length once
    // (every panel's words for it), so X is read row after row, not panel by panel.
    #[cfg(target_arch = "x86_64")]
    if let Act::F16(v) = x {
        let (base, len) = (xp.as_mut_ptr() as usize, xp.len());
        (0..k2).into_par_iter().with_min_len(8).for_each(|c2| {
            let c = 2 * c2;
            for p in 0..np {
                let (j0, w) = (p * NR, NR.min(m - p * NR));
                let (s, at) = (c * ldx + j0, (p * k2 + c2) * NR);
                assert!(at + NR <= len);
                let hi = (c + 1 < k).then(|| v[s + ldx..s + ldx + w].as_ptr());
                // SAFETY: words at..at + NR of `xp` (in bounds, checked above) are row c2
                // of panel p, written by this (c2, p) alone; the CPU has AVX512-BF16 (only
                // reached from `gemm_bf16`); `w` values of row c (and of row c + 1 when it
                // exists) from column j0, bounds checked by the slices.
                unsafe {
                    let words = std::slice::from_raw_parts_mut((base as *mut u32).add(at), NR);
                    avx512::interleave_f16_bf16(v[s..s + w].as_ptr(), hi, w, words)
                };
            }
        });
        return;
    }
    xp.par_chunks_mut(k2 * NR)
        .enumerate()
        .for_each(|(p, panel)| {
            let (j0, w) = (p * NR, NR.min(m - p * NR));
            let mut rows = [[0f32; NR]; 2];
            for (c2, words) in panel.chunks_exact_mut(NR).enumerate() {
                for (h, row) in rows.iter_mut().enumerate() {
                    let c = 2 * c2 + h;
                    if c >= k {
                        row.fill(0.0);
                        continue;
                    }
                    let s = c * ldx + j0;
                    match x {
                        Act::F16(v) => super::convert::f16_to_f32(&v[s..s + w], &mut row[..w]),
                        Act::F32(v) => row[..w].copy_from_slice(&v[s..s + w]),
                    }
                }
                // SAFETY: only reached where the CPU has AVX512-BF16 (`gemm_bf16`).
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    avx512::interleave_bf16(&rows[0], &rows[1], words)
                };
                #[cfg(not(target_arch = "x86_64"))]
                for (j, word) in words.iter_mut().enumerate() {
                    *word = bf16_bits(rows[0][j]) | (bf16_bits(rows[1][j]) << 16);
                }
            }
        });
}

/// Rows `r0..r0 + rows` of W as bf16 pairs along k into `dst` (`⌈k/2⌉` words a row, the
/// high half of an odd tail zero): each weight rounded to bfloat16 (nearest, ties to
/// even) straight from its packed form where the CPU has AVX512-BF16 — fp16 widened in
/// registers, a LUT4 byte (two codes, a pair along k) looked up as one word in the group's
/// palette —, else decoded to f32 rows first. The bits equal [`bf16_pairs`] of
/// [`PackedWeight::rows_f32`]. Only called on the [`Level::Bf16`] paths.
pub fn w_rows_bf16(w: &PackedWeight, r0: usize, rows: usize, dst: &mut [u32]) {
    let (k, k2) = (w.k, w.k.div_ceil(2));
    if k == 0 || rows == 0 {
        return;
    }
    let dst = &mut dst[..rows * k2];
    #[cfg(target_arch = "x86_64")]
    if bf16_cpu() {
        match &w.data {
            super::Packed::F16(v) => {
                for (i, d) in dst.chunks_exact_mut(k2).enumerate() {
                    let row = &v[(r0 + i) * k..(r0 + i + 1) * k];
                    // SAFETY: the CPU has AVX512-BF16 (checked above).
                    unsafe { avx512::f16_to_bf16_pairs(row, d) };
                }
                return;
            }
            super::Packed::Lut4 {
                idx,
                lut,
                rows_per_group,
                ..
            } => {
                // k is even for LUT4 weights: a row is k/2 bytes, one word each.
                let mut g_at = usize::MAX;
                let mut pal = [0u32; 16];
                for (i, d) in dst.chunks_exact_mut(k2).enumerate() {
                    let r = r0 + i;
                    let g = r / rows_per_group;
                    if g != g_at {
                        g_at = g;
                        // SAFETY: as above.
                        unsafe { avx512::to_bf16_pairs(&lut[g * 16..g * 16 + 16], &mut pal[..8]) };
                        pal = std::array::from_fn(|e| (pal[e / 2] >> (16 * (e % 2))) & 0xffff);
                    }
                    let row = &idx[r * k2..(r + 1) * k2];
                    // SAFETY: as above.
                    unsafe { avx512::lut4_to_bf16_pairs(row, &pal, d) };
                }
                return;
            }
            _ => {}
        }
    }
    let mut wf = vec![0f32; rows * k];
    w.rows_f32(r0, &mut wf);
    for (src, d) in wf.chunks_exact(k).zip(dst.chunks_exact_mut(k2)) {
        bf16_pairs(src, d);
    }
}

/// `src` as bf16 pairs along its length (word c2 = bf16(`src[2·c2]`) | bf16(`src[2·c2 + 1]`)
/// << 16, the high half of an odd tail zero) into `dst` (`⌈len/2⌉` words): one row of a
/// left operand for the bf16 micro-kernel. Only called where the CPU has AVX512-BF16 (the
/// [`Level::Bf16`] paths, chosen after [`require_bf16`]).
pub(super) fn bf16_pairs(src: &[f32], dst: &mut [u32]) {
    // SAFETY: only reached where the CPU has AVX512-BF16 (see above).
    #[cfg(target_arch = "x86_64")]
    unsafe {
        avx512::to_bf16_pairs(src, dst)
    };
    #[cfg(not(target_arch = "x86_64"))]
    for (c2, word) in dst.iter_mut().enumerate() {
        let hi = src.get(2 * c2 + 1).map_or(0, |&v| bf16_bits(v));
        *word = bf16_bits(src[2 * c2]) | (hi << 16);
    }
}

/// A panel `[r][NR]` of f32 rows as bf16 pairs along its rows into `dst` (`[⌈r/2⌉][NR]`
/// words: word (c2, j) holds row 2·c2's value j in its low half and row 2·c2 + 1's in its
/// high half, an odd last row paired with zeros): a right operand for the bf16
/// micro-kernel, laid out as [`pack_x_bf16`] lays X. Only called where the CPU has
/// AVX512-BF16 (the [`Level::Bf16`] paths).
pub(super) fn bf16_panel_pairs(rows: &[f32], dst: &mut [u32]) {
    let zero = [0f32; NR];
    for (pair, words) in rows.chunks(2 * NR).zip(dst.chunks_exact_mut(NR)) {
        let lo: &[f32; NR] = pair[..NR].try_into().expect("whole rows of NR");
        let hi: &[f32; NR] = match pair.len() > NR {
            true => pair[NR..].try_into().expect("whole rows of NR"),
            false => &zero,
        };
        // SAFETY: only reached where the CPU has AVX512-BF16 (see above).
        #[cfg(target_arch = "x86_64")]
        unsafe {
            avx512::interleave_bf16(lo, hi, words)
        };
        #[cfg(not(target_arch = "x86_64"))]
        for (j, word) in words.iter_mut().enumerate() {
            *word = bf16_bits(lo[j]) | (bf16_bits(hi[j]) << 16);
        }
    }
}

/// Which micro-kernel runs.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Level {
    Plain,
    Fma,
    Avx512,
    /// bf16 pairs by `vdpbf16ps` (AVX512-BF16).
    Bf16,
}

impl Level {
    /// The micro-kernel for `isa`, narrowed to what this CPU runs.
    pub(super) fn of(isa: Isa) -> Level {
        match isa.min(Isa::cpu()) {
            Isa::Avx512 => Level::Avx512,
            Isa::Avx2 => Level::Fma,
            Isa::Portable => Level::Plain,
        }
    }
}

/// Where a tile's results go.
#[derive(Clone, Copy)]
pub(super) enum OutPtr {
    F16(*mut f16),
    F32(*mut f32),
}

/// One micro-kernel call: `kc` steps over W rows at `w` (row stride `ldw`, [`MR`] rows all
/// readable) and one X panel slab at `x` (`kc × NR`). `load`: start from the partial sums
/// at `acc` (row stride `lda`); `store`: leave the sums there (not the last pass); else the
/// epilogue writes `rows × cols` results (plus `bias`, one per row) to `out` (stride `ldc`).
/// For the bf16 kernel, `kc`, `ldw` and the offsets count pairs of k: each word at `w` and
/// `x` holds two bf16 values.
pub(super) struct Tile {
    pub kc: usize,
    pub w: *const f32,
    pub ldw: usize,
    pub x: *const f32,
    pub acc: *mut f32,
    pub lda: usize,
    pub load: bool,
    pub store: bool,
    pub rows: usize,
    pub cols: usize,
    pub bias: Option<*const f32>,
    pub post: Option<Gelu>,
    pub out: OutPtr,
    pub ldc: usize,
}

impl Tile {
    /// A single-pass tile (no partial sums): `kc` steps of W rows at `w` (stride `ldw`,
    /// [`MR`] rows readable) against the panel slab at `x`, `rows × cols` results to `out`
    /// (stride `ldc`), no bias.
    pub(super) fn once(kc: usize, w: *const f32, ldw: usize, x: *const f32) -> Tile {
        Tile {
            kc,
            w,
            ldw,
            x,
            acc: std::ptr::null_mut(),
            lda: 0,
            load: false,
            store: false,
            rows: MR,
            cols: NR,
            bias: None,
            post: None,
            out: OutPtr::F32(std::ptr::null_mut()),
            ldc: NR,
        }
    }

    /// Runs the tile on `level`'s micro-kernel.
    ///
    /// # Safety
    /// The pointers cover what the tile reads (`MR` rows of `kc` at `w`, `kc × NR` at `x`,
    /// the partial sums when `load`) and writes (`rows × cols` at `out`, the partial sums
    /// when `store`); [`Level::Avx512`] only where the CPU has it ([`Level::of`]), [`Level::Bf16`]
    /// only where it has AVX512-BF16 ([`bf16_cpu`]).
    pub(super) unsafe fn run(&self, level: Level) {
        match level {
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => avx512::tile(self),
            #[cfg(target_arch = "x86_64")]
            Level::Bf16 => avx512::tile_bf16(self),
            #[cfg(target_arch = "x86_64")]
            Level::Fma => tile_fma(self),
            _ => tile_plain::<false>(self),
        }
    }
}

/// Rows `r0..r0 + rows` of the product over all of k, the columns of X's `panels`; `out`
/// is row r0, column 0 of the output (row stride m).
#[allow(clippy::too_many_arguments)]
fn block(
    w: &PackedWeight,
    xp: &Panels,
    m: usize,
    r0: usize,
    rows: usize,
    panels: std::ops::Range<usize>,
    bias: Option<&[f32]>,
    post: Option<Gelu>,
    out: OutPtr,
    level: Level,
) {
    SCRATCH
        .with_borrow_mut(|sc| block_in(w, xp, m, (r0, rows), panels, bias, post, out, level, sc));
}

/// A thread's buffers for [`block`], kept from task to task (a task's W rows and partial
/// sums are a few hundred KB: fresh zeroed ones every task cost a memset each).
#[derive(Default)]
struct Scratch {
    wf: Vec<f32>,
    wq: Vec<u32>,
    acc: Vec<f32>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::default();
}

/// `v` at least `len` long (grown with zeros; what it held before is left in place: the
/// callers overwrite what they read, or never emit what they do not).
fn at_least<T: Copy + Default>(v: &mut Vec<T>, len: usize) -> &mut [T] {
    if v.len() < len {
        v.resize(len, T::default());
    }
    &mut v[..len]
}

/// [`block`]'s work on a thread's scratch buffers.
#[allow(clippy::too_many_arguments)]
fn block_in(
    w: &PackedWeight,
    xp: &Panels,
    m: usize,
    (r0, rows): (usize, usize),
    panels: std::ops::Range<usize>,
    bias: Option<&[f32]>,
    post: Option<Gelu>,
    outp: OutPtr,
    level: Level,
    sc: &mut Scratch,
) {
    let rpad = rows.div_ceil(MR) * MR;
    // W's rows up to a whole tile (the padding rows are read, their sums never emitted):
    // f32 values, or bf16 pairs (whose words the bf16 micro-kernel reads through the
    // tile's `*const f32`); k counted in those units.
    let k;
    let (wb, xb): (*const f32, *const f32) = match xp {
        Panels::F32(x) => {
            k = w.k;
            let v = at_least(&mut sc.wf, rpad * k);
            w.rows_f32(r0, &mut v[..rows * k]);
            (v.as_ptr(), x.as_ptr())
        }
        Panels::Bf16(x) => {
            k = w.k.div_ceil(2);
            let v = at_least(&mut sc.wq, rpad * k);
            w_rows_bf16(w, r0, rows, v);
            (v.as_ptr().cast(), x.as_ptr().cast())
        }
    };
    let passes = k.div_ceil(KC).max(1);
    let kc = k.div_ceil(passes);
    let np = m.div_ceil(NR);
    let lda = np * NR;
    // Partial sums: the first pass stores before any pass loads.
    let acc = at_least(&mut sc.acc, if passes > 1 { rpad * lda } else { 0 });
    for pass in 0..passes {
        let k0 = (pass * kc).min(k);
        let kl = kc.min(k - k0);
        for p in panels.clone() {
            let j0 = p * NR;
            for ir in (0..rows).step_by(MR) {
                let tile = Tile {
                    kc: kl,
                    // SAFETY: rows ir..ir + MR ≤ rpad of k, columns k0..k0 + kl ≤ k; panel
                    // p's rows k0..k0 + kl of NR.
                    w: unsafe { wb.add(ir * k + k0) },
                    ldw: k,
                    x: unsafe { xb.add(p * k * NR + k0 * NR) },
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
                // and the AVX-512 and bf16 levels are only chosen where the CPU has them.
                unsafe { tile.run(level) }
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

    /// [`tile`] on bf16 pairs: `kc` counts pairs of k, W's and X's words each hold two
    /// bf16 values (see [`super::Panels`]); per pair, three loads of X's panel row, eight
    /// broadcasts of W's words, 24 `vdpbf16ps` (each two products a lane, summed in f32).
    /// A tile of at most 16 or 32 columns (the last panel of 1500 frames holds 12) runs
    /// [`tile_bf16_n`] on one or two vectors a row: the lanes it leaves out are only ever
    /// padding, and each lane's sums are the same.
    pub(super) unsafe fn tile_bf16(t: &Tile) {
        match t.cols.div_ceil(16) {
            0 | 1 => tile_bf16_n::<1>(t),
            2 => tile_bf16_n::<2>(t),
            _ => tile_bf16_n::<3>(t),
        }
    }

    /// [`tile_bf16`] on the first `NV` (1 to 3) vectors of 16 columns: `NV` loads of X and
    /// `8·NV` `vdpbf16ps` a pair; partial sums and results for those columns only.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,f16c,fma")]
    unsafe fn tile_bf16_n<const NV: usize>(t: &Tile) {
        let mut acc = [[_mm512_setzero_ps(); NV]; MR];
        if t.load {
            for (i, a) in acc.iter_mut().enumerate() {
                for (v, s) in a.iter_mut().enumerate() {
                    *s = _mm512_loadu_ps(t.acc.add(i * t.lda + 16 * v));
                }
            }
        }
        let w = t.w as *const i32;
        let mut wp = [w; MR];
        for (i, p) in wp.iter_mut().enumerate() {
            *p = w.add(i * t.ldw);
        }
        let mut xp = t.x as *const __m512i;
        for c in 0..t.kc {
            let mut x = [std::mem::transmute::<__m512i, __m512bh>(_mm512_setzero_si512()); NV];
            for (v, xv) in x.iter_mut().enumerate() {
                *xv = std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(xp.add(v)));
            }
            for i in 0..MR {
                let a: __m512bh = std::mem::transmute(_mm512_set1_epi32(*wp[i].add(c)));
                for v in 0..NV {
                    acc[i][v] = _mm512_dpbf16_ps(acc[i][v], a, x[v]);
                }
            }
            xp = xp.add(NR / 16);
        }
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

    /// `src` rounded to bf16 (nearest, ties to even) into `dst` (`⌈len/2⌉` words): 32
    /// values a step by `vcvtne2ps2bf16`, consecutive values into consecutive halves, so a
    /// row of W becomes its pairs along k (the high half of an odd tail zero).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    pub(super) unsafe fn to_bf16_pairs(src: &[f32], dst: &mut [u32]) {
        let n = src.len().min(2 * dst.len());
        let mask16 = |left: usize| -> u16 {
            if left >= 16 {
                !0
            } else {
                (1u16 << left) - 1
            }
        };
        for i in (0..n).step_by(32) {
            let (la, lb) = ((n - i).min(16), (n - i).saturating_sub(16).min(16));
            let a = _mm512_maskz_loadu_ps(mask16(la), src.as_ptr().add(i));
            let b = if lb > 0 {
                _mm512_maskz_loadu_ps(mask16(lb), src.as_ptr().add(i + 16))
            } else {
                _mm512_setzero_ps()
            };
            let h: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(b, a));
            let words = (la + lb).div_ceil(2);
            _mm512_mask_storeu_epi32(dst.as_mut_ptr().add(i / 2) as *mut i32, mask16(words), h);
        }
    }

    /// `src` (fp16) as bf16 pairs into `dst` (`⌈len/2⌉` words), as [`to_bf16_pairs`] of
    /// its f32 values: 32 values a step widened in registers (`vcvtph2ps`), then rounded
    /// by `vcvtne2ps2bf16` (fp16 → f32 is exact, so the rounding is the same).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,f16c")]
    pub(super) unsafe fn f16_to_bf16_pairs(src: &[half::f16], dst: &mut [u32]) {
        let n = src.len().min(2 * dst.len());
        let mask16 = |left: usize| -> u16 {
            if left >= 16 {
                !0
            } else {
                (1u16 << left) - 1
            }
        };
        let p = src.as_ptr() as *const i16;
        for i in (0..n).step_by(32) {
            let (la, lb) = ((n - i).min(16), (n - i).saturating_sub(16).min(16));
            let a = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask16(la), p.wrapping_add(i)));
            let b = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask16(lb), p.wrapping_add(i + 16)));
            let h: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(b, a));
            let words = (la + lb).div_ceil(2);
            _mm512_mask_storeu_epi32(dst.as_mut_ptr().add(i / 2) as *mut i32, mask16(words), h);
        }
    }

    /// One LUT4 row (`bytes`: two codes a byte, low nibble first, so one byte is one pair
    /// along k) as bf16 pairs into `dst` (a word per byte): `pal` holds the palette's 16
    /// entries as bf16 bits; 16 bytes a step, each byte's nibbles looked up (`vpermd`) and
    /// joined into its word.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn lut4_to_bf16_pairs(bytes: &[u8], pal: &[u32; 16], dst: &mut [u32]) {
        let n = bytes.len().min(dst.len());
        let lo_t = _mm512_loadu_si512(pal.as_ptr() as *const __m512i);
        let hi_t = _mm512_slli_epi32::<16>(lo_t);
        let nib = _mm512_set1_epi32(15);
        for i in (0..n).step_by(16) {
            let left = n - i;
            let mask: u16 = if left >= 16 { !0 } else { (1u16 << left) - 1 };
            let b = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(
                mask,
                bytes.as_ptr().wrapping_add(i) as *const i8,
            ));
            let lo = _mm512_permutexvar_epi32(_mm512_and_si512(b, nib), lo_t);
            let hi = _mm512_permutexvar_epi32(_mm512_srli_epi32::<4>(b), hi_t);
            _mm512_mask_storeu_epi32(
                dst.as_mut_ptr().add(i) as *mut i32,
                mask,
                _mm512_or_si512(lo, hi),
            );
        }
    }

    /// Word j of `dst` (j < `w` ≤ [`NR`], zero up to NR) = bf16(`lo[j]`) | bf16(`hi[j]`)
    /// << 16 for two fp16 rows of X (`hi` absent: zeros): [`interleave_bf16`] of their f32
    /// values with the widening in registers.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,f16c")]
    pub(super) unsafe fn interleave_f16_bf16(
        lo: *const half::f16,
        hi: Option<*const half::f16>,
        w: usize,
        dst: &mut [u32],
    ) {
        debug_assert!(dst.len() >= NR && w <= NR);
        let mut idx = [0i16; 32];
        for (i, v) in idx.iter_mut().enumerate() {
            *v = (i / 2 + 16 * (i % 2)) as i16;
        }
        let idx = _mm512_loadu_si512(idx.as_ptr() as *const __m512i);
        for v in 0..NR / 16 {
            let c0 = 16 * v;
            let left = w.saturating_sub(c0);
            let mask: u16 = if left >= 16 { !0 } else { (1u16 << left) - 1 };
            let a = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(
                mask,
                lo.wrapping_add(c0) as *const i16,
            ));
            let b = match hi {
                Some(h) => _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(
                    mask,
                    h.wrapping_add(c0) as *const i16,
                )),
                None => _mm512_setzero_ps(),
            };
            let h: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(b, a));
            let x = _mm512_permutexvar_epi16(idx, h);
            _mm512_storeu_si512(dst.as_mut_ptr().add(c0) as *mut __m512i, x);
        }
    }

    /// Word j of `dst` (j < [`NR`]) = bf16(`lo[j]`) | bf16(`hi[j]`) << 16: two rows of an X
    /// panel as pairs along k, 16 words a step (`vcvtne2ps2bf16`, then `vpermw` to
    /// interleave the halves).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    pub(super) unsafe fn interleave_bf16(lo: &[f32; NR], hi: &[f32; NR], dst: &mut [u32]) {
        debug_assert!(dst.len() >= NR);
        let mut idx = [0i16; 32];
        for (i, v) in idx.iter_mut().enumerate() {
            *v = (i / 2 + 16 * (i % 2)) as i16;
        }
        let idx = _mm512_loadu_si512(idx.as_ptr() as *const __m512i);
        for v in 0..NR / 16 {
            let a = _mm512_loadu_ps(lo.as_ptr().add(16 * v));
            let b = _mm512_loadu_ps(hi.as_ptr().add(16 * v));
            let h: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(b, a));
            let w = _mm512_permutexvar_epi16(idx, h);
            _mm512_storeu_si512(dst.as_mut_ptr().add(16 * v) as *mut __m512i, w);
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
    unsafe fn emit<const NV: usize>(t: &Tile, i: usize, a: [__m512; NV]) {
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
/// `W [O, C, 1..]`, plus `bias` (one per output channel): one [`gemm`] ([`gemm_bf16`] for
/// [`Inputs::Bf16`]) per batch item on `x` as it lies (`[C, ΠS]` rows), the result
/// `[N, O, *S]` of `dtype` (fp16 and f32 written by the kernel's epilogue; other dtypes
/// converted from f32).
pub fn conv1x1(
    x: &Tensor,
    p: &PackedWeight,
    bias: Option<&[f32]>,
    dtype: DType,
    isa: Isa,
    inputs: Inputs,
) -> Result<Tensor> {
    conv1x1_then(x, p, bias, None, dtype, isa, inputs)
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
    inputs: Inputs,
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
            match inputs {
                Inputs::F32 => gemm_then(p, xb, s, s, bias, post, ob, isa)?,
                Inputs::Bf16 => gemm_bf16_then(p, xb, s, s, bias, post, ob)?,
            }
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
