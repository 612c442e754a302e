//! Decode-path contractions: `y = x · Wᵀ` for a few activation rows against a weight kept
//! in the form it is stored in — fp32, fp16 (converted in registers), 4-bit palette indices
//! with one 16-entry palette per group of output rows (LUT4, never expanded), or 4-bit
//! integers with one scale/zero per output row and block of input columns (int4). Batch-1
//! decoding reads every weight once per token, so these kernels are written to stream the
//! weight bytes once: AVX2/FMA/F16C inner loops (runtime-detected, scalar fallback) and
//! rayon over output rows in chunks large enough to amortise the fork/join. 4-bit codes are
//! looked up 64 at a time with `pshufb` in fp16 tables (exact palettes only) against
//! activations permuted once per call to the order the lookup produces. Where the CPU has
//! AVX-512 the one-row products run [`wide`]'s loops instead: four output rows a pass, codes
//! looked up in f32 palettes with `vpermps` (any palette), fp16 converted 16 at a time.

use anyhow::{ensure, Result};
use candle_core::Tensor;
use half::f16;
use rayon::prelude::*;

pub mod store;
pub mod wide;
pub use store::{share_arena, Store};

/// Which inner loops a product runs: plain Rust, AVX2 + FMA + F16C, or AVX-512 (which
/// falls back to the AVX2 loops where it has none of its own). Ordered narrowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    Portable,
    Avx2,
    Avx512,
}

/// The widest level the products may use, as `Isa as u8` (see [`Isa::set_cap`]).
static CAP: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(Isa::Avx512 as u8);

impl Isa {
    const ALL: [Isa; 3] = [Isa::Portable, Isa::Avx2, Isa::Avx512];

    /// The widest this CPU runs, within the cap set by [`Isa::set_cap`].
    pub fn best() -> Isa {
        let cap = Isa::ALL[CAP.load(std::sync::atomic::Ordering::Relaxed) as usize];
        Isa::cpu().min(cap)
    }

    /// The widest this CPU runs.
    pub fn cpu() -> Isa {
        match (simd::available(), wide::available()) {
            (true, true) => Isa::Avx512,
            (true, false) => Isa::Avx2,
            _ => Isa::Portable,
        }
    }

    /// Caps the level every later product of this process uses (`None`: the CPU's best),
    /// so that a benchmark can time the same program on narrower kernels (`milkit bench
    /// decode --isa`), or a user rule out a path.
    pub fn set_cap(cap: Option<Isa>) {
        let v = cap.unwrap_or(Isa::Avx512) as u8;
        CAP.store(v, std::sync::atomic::Ordering::Relaxed);
    }

    /// Lower-case name (`portable`, `avx2`, `avx512`).
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// Every level this CPU runs, narrowest first (for tests of each path).
    pub fn supported() -> Vec<Isa> {
        let cpu = Isa::cpu();
        Isa::ALL.into_iter().filter(|&i| i <= cpu).collect()
    }
}

/// How a packed weight's elements are stored.
#[derive(Clone, Debug)]
pub enum Packed {
    F32(Store<f32>),
    F16(Store<f16>),
    /// Two indices a byte (low nibble first), `n·k/2` bytes; `lut` holds 16 f32 entries per
    /// group of `rows_per_group` consecutive output rows; `tables` the same palettes as
    /// `pshufb` tables when every entry is an fp16 value (see `simd::F16Table`).
    Lut4 {
        idx: Store<u8>,
        lut: Vec<f32>,
        rows_per_group: usize,
        tables: Option<Vec<[u8; 32]>>,
    },
    /// Unsigned 4-bit codes two a byte (low nibble first); element = `scale·(code − zero)`
    /// with one scale/zero per output row and block of `block` input columns;
    /// `uniform_zero`: the zero point when every block has the same integer one (symmetric
    /// quantization: 8), which the shuffle kernel then folds into its code table.
    Int4 {
        q: Store<u8>,
        scale: Vec<f32>,
        zero: Vec<f32>,
        block: usize,
        uniform_zero: Option<f32>,
    },
}

/// An `[n, k]` weight (`n` output rows of `k` inputs) in one of the [`Packed`] forms; `shape`
/// is the tensor's own shape (e.g. `[n, k, 1, 1]` for a 1x1 conv kernel).
#[derive(Clone, Debug)]
pub struct PackedWeight {
    pub n: usize,
    pub k: usize,
    pub shape: Vec<usize>,
    pub data: Packed,
}

fn rows_cols(shape: &[usize]) -> Result<(usize, usize)> {
    ensure!(!shape.is_empty(), "a packed weight needs rank ≥ 1");
    Ok((shape[0], shape[1..].iter().product()))
}

/// Packs one code per byte (each < 16) into nibbles, low nibble first.
fn pack_nibbles(codes: &[u8]) -> Vec<u8> {
    // Into a sized buffer (a loop the compiler vectorises; a weight has millions of codes).
    let mut out = vec![0u8; codes.len().div_ceil(2)];
    for (o, c) in out.iter_mut().zip(codes.chunks_exact(2)) {
        *o = (c[0] & 15) | (c[1] & 15) << 4;
    }
    if let [.., last] = codes {
        if codes.len() % 2 == 1 {
            out[codes.len() / 2] = last & 15;
        }
    }
    out
}

/// The largest of `codes` (0 when empty): a range check that vectorises, where `any`/`all`
/// stop at the first hit and run a byte at a time.
pub fn max_code(codes: &[u8]) -> u8 {
    codes.iter().fold(0, |m, &c| m.max(c))
}

/// The largest 4-bit code in bytes holding two each (a range check that vectorises).
pub fn max_nibble(bytes: &[u8]) -> u8 {
    let (lo, hi) = bytes
        .iter()
        .fold((0u8, 0u8), |(l, h), &b| (l.max(b & 15), h.max(b >> 4)));
    lo.max(hi)
}

impl PackedWeight {
    pub fn from_f32(shape: &[usize], w: Vec<f32>) -> Result<PackedWeight> {
        let (n, k) = rows_cols(shape)?;
        ensure!(w.len() == n * k, "{} values for shape {shape:?}", w.len());
        Ok(PackedWeight {
            n,
            k,
            shape: shape.to_vec(),
            data: Packed::F32(Store::new(w)),
        })
    }

    pub fn from_f16(shape: &[usize], w: Vec<f16>) -> Result<PackedWeight> {
        let (n, k) = rows_cols(shape)?;
        ensure!(w.len() == n * k, "{} values for shape {shape:?}", w.len());
        Ok(PackedWeight {
            n,
            k,
            shape: shape.to_vec(),
            data: Packed::F16(Store::new(w)),
        })
    }

    /// `codes`: one palette index (< `palette`/16 entries) per element, row-major; `lut`:
    /// `groups × 16` entries (a shorter palette padded by the caller), groups dividing `n`.
    pub fn lut4(shape: &[usize], codes: &[u8], lut: Vec<f32>) -> Result<PackedWeight> {
        let (n, k) = rows_cols(shape)?;
        ensure!(codes.len() == n * k, "{} codes for {shape:?}", codes.len());
        ensure!(k % 2 == 0, "LUT4 packing needs an even row length, has {k}");
        ensure!(max_code(codes) < 16, "LUT4 code out of range");
        // Every packed code is below 16: the whole palette range.
        Self::lut4_nibbles(shape, pack_nibbles(codes), lut, 16)
    }

    /// [`PackedWeight::lut4`] from codes already two a byte, low nibble first (the layout
    /// of a stored `uint4` tensor and of [`Packed::Lut4`]'s `idx`): `nibbles` holds `n·k/2`
    /// bytes, every code below the palette's `palette` entries (checked here), `lut` as for
    /// [`PackedWeight::lut4`]. Nothing is unpacked: the bytes become the weight's store.
    pub fn lut4_nibbles(
        shape: &[usize],
        nibbles: Vec<u8>,
        lut: Vec<f32>,
        palette: usize,
    ) -> Result<PackedWeight> {
        let (n, k) = rows_cols(shape)?;
        ensure!(k % 2 == 0, "LUT4 packing needs an even row length, has {k}");
        ensure!(
            nibbles.len() == n * k / 2,
            "{} bytes of 4-bit codes for {shape:?}",
            nibbles.len()
        );
        ensure!(
            palette <= 16 && (palette == 16 || (max_nibble(&nibbles) as usize) < palette),
            "LUT4 code out of range of a {palette}-entry palette"
        );
        let groups = lut.len() / 16;
        ensure!(
            lut.len().is_multiple_of(16) && groups >= 1 && n % groups == 0,
            "{} palette entries for {n} rows",
            lut.len()
        );
        let tables = lut.chunks(16).map(simd::f16_table).collect();
        Ok(PackedWeight {
            n,
            k,
            shape: shape.to_vec(),
            data: Packed::Lut4 {
                idx: Store::new(nibbles),
                lut,
                rows_per_group: n / groups,
                tables,
            },
        })
    }

    /// `codes`: unsigned 4-bit values (< 16) row-major; `scale`/`zero`: `n × (k / block)`.
    pub fn int4(
        shape: &[usize],
        codes: &[u8],
        scale: Vec<f32>,
        zero: Vec<f32>,
        block: usize,
    ) -> Result<PackedWeight> {
        let (n, k) = rows_cols(shape)?;
        ensure!(codes.len() == n * k, "{} codes for {shape:?}", codes.len());
        ensure!(
            block >= 2 && block.is_multiple_of(2) && k % block == 0,
            "int4 block {block} must be even and divide the row length {k}"
        );
        ensure!(max_code(codes) < 16, "int4 code out of range");
        let nb = n * (k / block);
        ensure!(
            scale.len() == nb && zero.len() == nb,
            "int4 needs {nb} scales and zeros, has {} and {}",
            scale.len(),
            zero.len()
        );
        Ok(PackedWeight {
            n,
            k,
            shape: shape.to_vec(),
            data: Packed::Int4 {
                q: Store::new(pack_nibbles(codes)),
                uniform_zero: zero
                    .first()
                    .copied()
                    .filter(|&z| z.fract() == 0.0 && (0.0..=15.0).contains(&z))
                    .filter(|&z| zero.iter().all(|&v| v == z)),
                scale,
                zero,
                block,
            },
        })
    }

    /// Bytes one full product reads from the weight (what a decode step streams).
    pub fn bytes(&self) -> usize {
        match &self.data {
            Packed::F32(w) => w.len() * 4,
            Packed::F16(w) => w.len() * 2,
            Packed::Lut4 { idx, lut, .. } => idx.len() + lut.len() * 4,
            Packed::Int4 { q, scale, zero, .. } => q.len() + (scale.len() + zero.len()) * 4,
        }
    }

    /// The bulk of the stored weight as bytes (values, codes): what a product streams,
    /// less the small palettes and scales.
    pub fn stored(&self) -> &[u8] {
        match &self.data {
            Packed::F32(w) => bytemuck::cast_slice(w),
            Packed::F16(w) => bytemuck::cast_slice(w),
            Packed::Lut4 { idx, .. } => idx,
            Packed::Int4 { q, .. } => q,
        }
    }

    /// Short name of the storage form (for reports).
    pub fn form(&self) -> &'static str {
        match &self.data {
            Packed::F32(_) => "f32",
            Packed::F16(_) => "f16",
            Packed::Lut4 { .. } => "lut4",
            Packed::Int4 { .. } => "int4",
        }
    }

    /// Decodes output row `r` into `dst` (length `k`).
    fn decode_row(&self, r: usize, dst: &mut [f32]) {
        let k = self.k;
        match &self.data {
            Packed::F32(w) => dst.copy_from_slice(&w[r * k..(r + 1) * k]),
            Packed::F16(w) => {
                for (d, s) in dst.iter_mut().zip(&w[r * k..(r + 1) * k]) {
                    *d = s.to_f32();
                }
            }
            Packed::Lut4 {
                idx,
                lut,
                rows_per_group,
                ..
            } => {
                let pal = &lut[(r / rows_per_group) * 16..][..16];
                let row = &idx[r * k / 2..(r + 1) * k / 2];
                for (j, d) in dst.iter_mut().enumerate() {
                    *d = pal[simd::code(row, j)];
                }
            }
            Packed::Int4 {
                q,
                scale,
                zero,
                block,
                ..
            } => {
                let nb = k / block;
                let row = &q[r * k / 2..(r + 1) * k / 2];
                for (j, d) in dst.iter_mut().enumerate() {
                    let b = r * nb + j / block;
                    *d = scale[b] * (simd::code(row, j) as f32 - zero[b]);
                }
            }
        }
    }

    /// Rows `r0..` (as many as `dst` holds, `k` values each) decoded to f32.
    pub fn rows_f32(&self, r0: usize, dst: &mut [f32]) {
        let k = self.k;
        if k == 0 {
            return;
        }
        let r1 = r0 + dst.len() / k;
        match &self.data {
            Packed::F32(w) => dst.copy_from_slice(&w[r0 * k..r1 * k]),
            Packed::F16(w) => super::convert::f16_to_f32(&w[r0 * k..r1 * k], dst),
            _ => {
                for (i, d) in dst.chunks_exact_mut(k).enumerate() {
                    self.decode_row(r0 + i, d);
                }
            }
        }
    }

    /// The dense `[n, k]` f32 weight (for GEMM-sized products, made per call).
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.n * self.k];
        out.par_chunks_mut(self.k.max(1))
            .enumerate()
            .for_each(|(r, d)| self.decode_row(r, d));
        out
    }

    /// `y = x · Wᵀ` for `m` rows of `x` (`[m, k]` row-major); returns `[m, n]`.
    pub fn gemv(&self, x: &[f32], m: usize) -> Result<Vec<f32>> {
        self.gemv_with(x, m, Isa::best())
    }

    /// [`PackedWeight::gemv`] through the inner loops of `isa` (which the CPU must run:
    /// see [`Isa::supported`]; a wider one than it has is narrowed).
    pub fn gemv_with(&self, x: &[f32], m: usize, isa: Isa) -> Result<Vec<f32>> {
        let isa = isa.min(Isa::cpu());
        let (n, k) = (self.n, self.k);
        ensure!(
            x.len() == m * k,
            "{} activations for {m} rows of {k}",
            x.len()
        );
        if n == 0 || m == 0 {
            return Ok(vec![0.0; m * n]);
        }
        // int4: the zero-point term needs each block's activation sum, shared by all rows.
        let xsum: Vec<f32> = match &self.data {
            Packed::Int4 { block, .. } => x.chunks(*block).map(|c| c.iter().sum()).collect(),
            _ => vec![],
        };
        let (simd, wide) = (isa != Isa::Portable, isa == Isa::Avx512);
        // The lookup kernels take the activations permuted, once per call. A uniform
        // integer zero point is folded into the code table (`code − zero`, exact in fp16
        // and f32), which drops the zero-point term.
        let (int4_vals, folded) = match &self.data {
            Packed::Int4 {
                uniform_zero: Some(z),
                ..
            } => (INT4_CODES.map(|c| c - z), true),
            _ => (INT4_CODES, false),
        };
        let int4_table = simd::f16_table(&int4_vals);
        let shuffle = match wide {
            true => {
                k >= wide::STEP
                    && match &self.data {
                        Packed::Lut4 { .. } => true,
                        Packed::Int4 { block, .. } => block % wide::STEP == 0 || *block == k,
                        _ => false,
                    }
            }
            false => {
                simd && k >= simd::CHUNK
                    && match &self.data {
                        Packed::Lut4 { tables, .. } => tables.is_some(),
                        Packed::Int4 { block, .. } => block % 32 == 0 && int4_table.is_some(),
                        _ => false,
                    }
            }
        };
        // (A loop of `extend`s: a `flat_map` collect pushes element by element, which
        // cost more than the kernel itself on a small weight.)
        let mut xp: Vec<f32> = Vec::with_capacity(if shuffle { x.len() } else { 0 });
        if shuffle {
            for row in x.chunks(k) {
                xp.extend(match wide {
                    true => wide::permute_pairs(row),
                    false => simd::permute_chunks(row),
                });
            }
        }
        let cx = RowCx {
            xsum: &xsum,
            xp: shuffle.then_some(xp.as_slice()),
            int4_table: int4_table.unwrap_or([0; 32]),
            int4_vals,
            zero_folded: folded && shuffle,
            simd,
            wide,
        };
        // Each task streams ≥ 256 KiB of weight (fork/join costs microseconds, and a long
        // run of consecutive rows keeps the prefetchers streaming), and there are at least
        // as many tasks as threads when the matrix is big enough.
        let row_bytes = (self.bytes() / n).max(1);
        let threads = rayon::current_num_threads().max(1);
        let mut rows = ((256 << 10) / row_bytes).clamp(1, n.div_ceil(threads).max(1));
        // The AVX-512 code lookups are compute-bound (~20 G elements/s a thread here), and
        // a small coded weight takes a few microseconds on one thread, about what the
        // fork/join costs: a 384 × 384 LUT4 product ran 7.7 µs on one thread against
        // 8.8-9.1 µs split over two. Such weights stay one task.
        if wide && m == 1 && shuffle && n * k < SMALL_CODED {
            rows = n;
        }
        let mut yt = vec![0f32; n * m];
        let work = |(t, out): (usize, &mut [f32])| {
            let r0 = t * rows;
            if m == 1 && self.rows_shuffled(r0, out, x, &cx) {
                return;
            }
            for (i, o) in out.chunks_mut(m).enumerate() {
                let r = r0 + i;
                for (j, y) in o.iter_mut().enumerate() {
                    let xs = &x[j * k..(j + 1) * k];
                    *y = self.dot(r, xs, j, &cx);
                }
            }
        };
        if n <= rows {
            work((0, &mut yt));
        } else {
            yt.par_chunks_mut(rows * m).enumerate().for_each(work);
        }
        if m == 1 {
            return Ok(yt);
        }
        let mut y = vec![0f32; m * n];
        for r in 0..n {
            for j in 0..m {
                y[j * n + r] = yt[r * m + j];
            }
        }
        Ok(y)
    }

    /// One activation row against the output rows `r0..r0 + out.len()` through the
    /// many-row kernels (fp16 with AVX-512; the lookup kernels in runs of rows: a palette
    /// group for LUT4, the whole range for int4); false when this call does not use them.
    fn rows_shuffled(&self, r0: usize, out: &mut [f32], x: &[f32], cx: &RowCx) -> bool {
        let (k, r1) = (self.k, r0 + out.len());
        if let (Packed::F16(w), true) = (&self.data, cx.wide) {
            wide::f16_rows(&w[r0 * k..r1 * k], x, out, true);
            return true;
        }
        match cx.xp {
            Some(xp) => self.rows_coded(r0, out, xp, x, cx),
            None => false,
        }
    }

    /// The lookup kernels of this call's level over rows `r0..r0 + out.len()`: AVX-512
    /// (`xp` after `wide::permute_pairs`) or the `pshufb` ones (`xp` after
    /// `simd::permute_chunks`); false for a weight they do not take.
    fn rows_coded(&self, r0: usize, out: &mut [f32], xp: &[f32], x: &[f32], cx: &RowCx) -> bool {
        let (k, r1) = (self.k, r0 + out.len());
        let half = k / 2;
        match &self.data {
            Packed::Lut4 {
                idx,
                lut,
                rows_per_group: rpg,
                tables,
            } => {
                if !cx.wide && tables.is_none() {
                    return false;
                }
                let mut r = r0;
                while r < r1 {
                    let g = r / rpg;
                    let end = ((g + 1) * rpg).min(r1);
                    let pal: &[f32; 16] = lut[g * 16..][..16].try_into().unwrap_or(&[0.0; 16]);
                    let (codes, o) = (&idx[r * half..end * half], &mut out[r - r0..end - r0]);
                    match tables {
                        Some(t) if !cx.wide => {
                            simd::lut4_f16_rows(codes, k, &t[g], pal, xp, x, o, cx.simd)
                        }
                        _ => wide::code_rows(codes, k, pal, None, k, xp, x, o, true),
                    }
                    r = end;
                }
            }
            Packed::Int4 {
                q,
                scale,
                zero,
                block,
                ..
            } => {
                let nb = k / block;
                let (codes, sc) = (&q[r0 * half..r1 * half], &scale[r0 * nb..r1 * nb]);
                if cx.wide {
                    let t = &cx.int4_vals;
                    wide::code_rows(codes, k, t, Some(sc), *block, xp, x, out, true);
                } else {
                    let t = &cx.int4_table;
                    simd::int4_f16_rows(codes, k, sc, *block, t, xp, x, out, cx.simd);
                }
                if !cx.zero_folded {
                    int4_zero_term(out, r0, nb, scale, zero, cx.xsum);
                }
            }
            _ => return false,
        }
        true
    }

    /// Output row `r` dotted with one activation row `x` (row `j` of the call).
    fn dot(&self, r: usize, x: &[f32], j: usize, cx: &RowCx) -> f32 {
        let (k, simd) = (self.k, cx.simd);
        if let Some(p) = cx.xp {
            // The lookup kernels on this activation row (and its block sums, int4).
            let sub = RowCx {
                xsum: match &self.data {
                    Packed::Int4 { block, .. } => &cx.xsum[j * (k / block)..(j + 1) * (k / block)],
                    _ => cx.xsum,
                },
                ..*cx
            };
            let mut y = [0f32];
            if self.rows_coded(r, &mut y, &p[j * k..(j + 1) * k], x, &sub) {
                return y[0];
            }
        }
        match &self.data {
            Packed::F32(w) => simd::dot_f32(&w[r * k..(r + 1) * k], x, simd),
            Packed::F16(w) => simd::dot_f16(&w[r * k..(r + 1) * k], x, simd),
            Packed::Lut4 {
                idx,
                lut,
                rows_per_group,
                ..
            } => {
                let g = r / rows_per_group;
                let pal: &[f32; 16] = lut[g * 16..][..16].try_into().unwrap_or(&[0.0; 16]);
                simd::dot_lut4(&idx[r * k / 2..(r + 1) * k / 2], pal, x, simd)
            }
            Packed::Int4 {
                q,
                scale,
                zero,
                block,
                ..
            } => {
                let nb = k / block;
                let qs = &q[r * k / 2..(r + 1) * k / 2];
                let s = &scale[r * nb..(r + 1) * nb];
                let mut y = [simd::dot_int4_blocks(qs, s, *block, x, simd)];
                int4_zero_term(&mut y, r, nb, scale, zero, &cx.xsum[j * nb..(j + 1) * nb]);
                y[0]
            }
        }
    }
}

/// Subtracts the int4 zero-point term `Σ_b scale·zero·Σ_{j ∈ b} x_j` from the products of
/// rows `r0..r0 + out.len()` (`nb` blocks a row; `xsum`: the activation row's block sums).
fn int4_zero_term(
    out: &mut [f32],
    r0: usize,
    nb: usize,
    scale: &[f32],
    zero: &[f32],
    xsum: &[f32],
) {
    for (i, y) in out.iter_mut().enumerate() {
        let b = (r0 + i) * nb;
        let (s, z) = (&scale[b..b + nb], &zero[b..b + nb]);
        let zs = s.iter().zip(z).zip(xsum);
        *y -= zs.map(|((s, z), x)| s * z * x).sum::<f32>();
    }
}

/// What every row of one `gemv` call shares: per-block activation sums (int4), the
/// activations permuted for the shuffle kernels (when they run), the int4 code table and
/// whether it has the zero point folded in.
#[derive(Clone, Copy)]
struct RowCx<'a> {
    xsum: &'a [f32],
    xp: Option<&'a [f32]>,
    int4_table: simd::F16Table,
    /// The int4 codes' values in the table (the zero point subtracted when folded).
    int4_vals: [f32; 16],
    zero_folded: bool,
    simd: bool,
    /// The AVX-512 loops ([`wide`]) run.
    wide: bool,
}

/// int4 codes as values: the palette the int4 shuffle kernel looks them up in.
const INT4_CODES: [f32; 16] = [
    0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
];

/// Elements below which a coded (LUT4/int4) one-row product on the AVX-512 kernels runs
/// as one task (see `gemv_with`).
const SMALL_CODED: usize = 1 << 18;

/// Activation rows up to which the packed kernels run. Above it the product is a GEMM: the
/// weight is decoded to a dense f32 `[n, k]` for that call and handed to candle's gemm.
/// Decoding costs O(n·k) against the product's O(m·n·k), i.e. at most 1/9 of it here and
/// ~0.1% for an encoder's 1500 rows, while keeping no f32 copy saves 4 bytes per weight
/// element for the session's lifetime (an fp16 weight stays 2 bytes, a LUT4 one ½).
pub const GEMV_MAX_ROWS: usize = 8;

/// `x [..., k] · Wᵀ → [..., n]` in f32 (a `linear` without bias).
pub fn linear(x: &Tensor, p: &PackedWeight) -> Result<Tensor> {
    let d = x.dims();
    ensure!(
        d.last() == Some(&p.k),
        "input {d:?} does not match a weight of {} columns",
        p.k
    );
    let m = x.elem_count() / p.k.max(1);
    let mut shape = d[..d.len() - 1].to_vec();
    shape.push(p.n);
    if m <= GEMV_MAX_ROWS {
        let xs = super::to_f32_vec(x)?;
        return super::from_vec(p.gemv(&xs, m)?, &shape);
    }
    let w = Tensor::from_vec(p.to_f32(), (p.n, p.k), x.device())?;
    super::matmul(x, &w, false, true)
}

/// A 1x1, stride-1, unpadded, ungrouped convolution of `x [N, C, *S]` (S: spatial axes)
/// with `W [O, C, 1..]`, plus `bias` (one per output channel) when given, computed in f32
/// and rounded once to `dtype`: `[N, O, *S]`. `None` when the rows (N·ΠS) are too many for
/// the GEMV path: the caller then runs its general convolution.
pub fn conv1x1(
    x: &Tensor,
    p: &PackedWeight,
    bias: Option<&[f32]>,
    dtype: candle_core::DType,
) -> Result<Option<Tensor>> {
    let d = x.dims();
    ensure!(
        d.len() >= 2 && d[1] == p.k,
        "conv input {d:?} for a 1x1 kernel of {} input channels",
        p.k
    );
    if let Some(b) = bias {
        ensure!(
            b.len() == p.n,
            "{} bias values for {} output channels",
            b.len(),
            p.n
        );
    }
    let (nb, s): (usize, usize) = (d[0], d[2..].iter().product());
    let m = nb * s;
    if m > GEMV_MAX_ROWS {
        return Ok(None);
    }
    let xs = super::to_f32_vec(x)?;
    let mut shape = d.to_vec();
    shape[1] = p.n;
    let add_bias = |y: &mut [f32]| {
        if let Some(b) = bias {
            for row in y.chunks_mut(p.n) {
                row.iter_mut().zip(b).for_each(|(v, b)| *v += b);
            }
        }
    };
    if s == 1 {
        // [N, C, 1…] already is rows [N, C], and [N, O] is the output's layout.
        let mut y = p.gemv(&xs, m)?;
        add_bias(&mut y);
        return Ok(Some(super::from_f32(y, &shape, dtype)?));
    }
    // [N, C, S] → rows [N·S, C] (a copy of ≤ GEMV_MAX_ROWS columns).
    let mut rows = vec![0f32; m * p.k];
    for b in 0..nb {
        for c in 0..p.k {
            for j in 0..s {
                rows[(b * s + j) * p.k + c] = xs[(b * p.k + c) * s + j];
            }
        }
    }
    let mut y = p.gemv(&rows, m)?;
    add_bias(&mut y);
    let mut out = vec![0f32; m * p.n];
    for b in 0..nb {
        for j in 0..s {
            for o in 0..p.n {
                out[(b * p.n + o) * s + j] = y[(b * s + j) * p.n + o];
            }
        }
    }
    Ok(Some(super::from_f32(out, &shape, dtype)?))
}

/// The inner loops; the decode-step attention (`kernels::attention`) uses the fp16 ones.
pub(super) mod simd;

#[cfg(test)]
mod tests;
