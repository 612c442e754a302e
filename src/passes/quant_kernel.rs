//! The element loop of linear quantization: one parallel pass over an fp16 weight that finds
//! each block's scale (and zero point), writes its codes — packed as Core ML stores them, or
//! one byte each — and measures the error of their decode, without materializing the decoded
//! weight or any f32 copy of the whole tensor. The arithmetic (coremltools 9's, in fp16) is
//! stated in [`super::quant`]; this module owns the fp16 rounding helpers it is built from and
//! the error sums shared with [`super::quant::relative_rms_error`] and the LUT path.

use super::quant_config::QuantConfig;
use super::subbyte::{pack_into, packed_len};
use anyhow::{bail, Result};
use half::{f16, slice::HalfFloatSliceExt};
use rayon::prelude::*;

/// Elements per partial sum of the relative error. Fixed so that every path summing the same
/// weight and decode (this kernel when its groups coincide with pieces, `relative_rms_error`,
/// the LUT error) adds the same numbers in the same order: deterministic, and equal.
pub(crate) const ERR_PIECE: usize = 4096;

/// The low 13 bits of an f32 mantissa rounded to nearest, ties to even: what is left is an
/// fp16 value (for magnitudes in fp16's normal range).
#[inline(always)]
fn round_mantissa_to_fp16(b: u32) -> u32 {
    // Wrapping: callers also feed NaN patterns and discard the result (no overflow check,
    // which would also keep the element loop from vectorizing).
    b.wrapping_add(0x0fff + ((b >> 13) & 1)) & !0x1fff
}

/// |x| bits in [2^-14, 65504): fp16 normal numbers, where fp16 rounding is a mantissa rounding.
#[inline(always)]
fn in_fp16_normal_range(a: u32) -> bool {
    (0x3880_0000..0x477f_e000).contains(&a)
}

/// One fp16 rounding. The f32 inputs are fp16 values, and f32 carries more than twice fp16's
/// precision, so an f32 op followed by this is numpy's correctly rounded fp16 op. Normal-range
/// values are rounded in place by bit arithmetic and zeros (every zero code decodes to one)
/// are exact (the conversion through `half` costs a call and a CPU-feature check per
/// element); the rest (subnormal, overflow, NaN) take the exact library path.
#[inline(always)]
pub(crate) fn r16(x: f32) -> f32 {
    let b = x.to_bits();
    let a = b & 0x7fff_ffff;
    if in_fp16_normal_range(a) {
        f32::from_bits(round_mantissa_to_fp16(b))
    } else if a == 0 {
        x
    } else {
        f16::from_f32(x).to_f32()
    }
}

/// [`r16`] where the result is then rounded to an integer and clipped to at most ±255: values
/// below fp16's normal range round to 0 either way, and values above it (or ±inf) clip to
/// the same bound, so they pass unchanged. Branch-free, so the element loop vectorizes.
#[inline(always)]
fn r16_before_round(x: f32) -> f32 {
    let b = x.to_bits();
    let r = f32::from_bits(round_mantissa_to_fp16(b));
    if in_fp16_normal_range(b & 0x7fff_ffff) {
        r
    } else {
        x
    }
}

/// `f16::from_f32` (nearest, ties to even) with the same fast path as [`r16`].
#[inline(always)]
pub(crate) fn to_f16(x: f32) -> f16 {
    let b = x.to_bits();
    let a = b & 0x7fff_ffff;
    if a == 0 {
        // ±0 (every zero code decodes to it): keep the sign.
        return f16::from_bits((b >> 16) as u16);
    }
    if in_fp16_normal_range(a) {
        // Rebias the exponent from 127 to 15 and drop the rounded-off bits.
        let mag = (round_mantissa_to_fp16(a) >> 13) - (112 << 10);
        f16::from_bits(((b >> 16) & 0x8000) as u16 | mag as u16)
    } else {
        f16::from_f32(x)
    }
}

/// `x.round_ties_even()` without a libm call (baseline x86-64 has no rounding instruction):
/// adding and subtracting 1.5·2^23 leaves x rounded to an integer in the default
/// ties-to-even mode, exactly for |x| < 2^22; larger values are integers already, and NaN
/// passes through. (A negative x rounding to zero gives +0 instead of -0; callers convert to
/// an integer, where both are 0.)
#[inline(always)]
pub(crate) fn round_even(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    if x.abs() < 4_194_304.0 {
        (x + MAGIC) - MAGIC
    } else {
        x
    }
}

/// (Σ (orig − dec)², Σ orig²) of one piece, in a fixed order. Runs of 32 elements are
/// summed in eight f32 lanes (four terms each: relative error about 2^-22, far below what is
/// reported, and 4-wide vector arithmetic instead of scalar f64), the lanes accumulated in f64,
/// the tail in f64 into lane 0, then the lanes pairwise.
#[inline(always)]
pub(crate) fn sq_sums(orig: &[f32], dec: &[f32]) -> [f64; 2] {
    const RUN: usize = 32;
    let (mut num, mut den) = ([0.0f64; 8], [0.0f64; 8]);
    let n = orig.len().min(dec.len());
    let main = n / RUN * RUN;
    for (a, d) in orig[..main]
        .chunks_exact(RUN)
        .zip(dec[..main].chunks_exact(RUN))
    {
        let (mut sn, mut sd) = ([0.0f32; 8], [0.0f32; 8]);
        for (a, d) in a.chunks_exact(8).zip(d.chunks_exact(8)) {
            for l in 0..8 {
                let e = a[l] - d[l];
                sn[l] += e * e;
                sd[l] += a[l] * a[l];
            }
        }
        for l in 0..8 {
            num[l] += f64::from(sn[l]);
            den[l] += f64::from(sd[l]);
        }
    }
    for (&a, &d) in orig[main..n].iter().zip(&dec[main..n]) {
        let (x, y) = (f64::from(a), f64::from(d));
        num[0] += (x - y) * (x - y);
        den[0] += x * x;
    }
    let pairwise = |v: [f64; 8]| ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
    [pairwise(num), pairwise(den)]
}

/// sqrt(Σ num / Σ den) over pieces in order; zero when the decode is exact (even all-zero).
pub(crate) fn rel_from_sums(sums: &[[f64; 2]]) -> f64 {
    let (num, den) = sums
        .iter()
        .fold((0.0, 0.0), |(n, d), s| (n + s[0], d + s[1]));
    if num == 0.0 {
        0.0
    } else {
        (num / den).sqrt()
    }
}

/// Per-config constants of the element loop.
#[derive(Clone, Copy)]
struct Params {
    qmin: f32,
    qmax: f32,
    symmetric: bool,
    /// Unsigned symmetric: codes shifted by `qmax / 2`.
    unsigned_sym: bool,
}

/// What one pass produced: `data` (packed storage bytes, or one two's-complement code byte
/// per element), one fp16 scale and one zero-point code byte per block, the error sums.
pub(crate) struct Raw {
    pub data: Vec<u8>,
    pub scale: Vec<f16>,
    pub zero: Vec<u8>,
    pub rel_rms_error: f64,
}

/// Order key of an fp16 bit pattern: comparing keys as i16 compares the values (−0 just below
/// +0). Min/max over integer lanes vectorize where f32 min/max (NaN-aware) do not.
#[inline(always)]
fn key(b: u16) -> i16 {
    let k = b as i16;
    k ^ ((k >> 15) & 0x7fff)
}

/// (scale, zero point before clipping) of one block from its fp16 bit patterns, in
/// coremltools' fp16 arithmetic; None when the block holds inf or NaN.
#[inline(always)]
fn block_params(bits: &[u16], p: &Params) -> Option<(f32, Option<f32>)> {
    let span = p.qmax - p.qmin;
    if p.symmetric {
        let m = bits.iter().fold(0i16, |m, &b| m.max((b & 0x7fff) as i16));
        if m >= 0x7c00 {
            return None;
        }
        let a = f16::from_bits(m as u16).to_f32();
        let scale = r16(r16(a - (-a)) / span);
        // coremltools shifts unsigned symmetric data by qmax // 2.
        Some((scale, p.unsigned_sym.then_some((p.qmax as i32 / 2) as f32)))
    } else {
        let (lo, hi) = bits.iter().fold((i16::MAX, i16::MIN), |(lo, hi), &b| {
            let k = key(b);
            (lo.min(k), hi.max(k))
        });
        if hi >= 0x7c00 || lo <= -0x7c01 {
            return None;
        }
        // The key is its own inverse.
        let lo = f16::from_bits(key(lo as u16) as u16).to_f32().min(0.0);
        let hi = f16::from_bits(key(hi as u16) as u16).to_f32().max(0.0);
        let width = r16(hi - lo);
        let scale = r16(width / span);
        let num = r16(r16(p.qmin * hi) - r16(p.qmax * lo));
        // Rounded and clipped before it is added to the codes (NaN for an all-zero block).
        let zp = round_even(r16(num / width)).clamp(p.qmin, p.qmax);
        Some((scale, Some(zp)))
    }
}

/// Codes of one block (two's-complement bytes) and the f32 value of their fp16 decode
/// `fp16(scale · (code − zero point))`, for any scale (the exact reference path).
#[inline(never)]
fn block_codes_general<const OFFSET: bool>(
    w: &[f32],
    scale: f32,
    zp: f32,
    p: &Params,
    codes: &mut [u8],
    dec: &mut [f32],
) {
    // A NaN zero point (all-zero asymmetric block) is stored as 0, as numpy casts it.
    let zi = zp as i32;
    for ((&x, c), d) in w.iter().zip(codes.iter_mut()).zip(dec.iter_mut()) {
        let mut q = round_even(r16_before_round(x / scale));
        if OFFSET {
            q = r16(q + zp);
        }
        // NaN (an all-zero block: 0/0) casts to 0, as numpy does on x86-64.
        let code = q.clamp(p.qmin, p.qmax) as i32;
        *c = code as u8;
        // code − zp is a small integer and its product with an fp16 scale is exact in f32,
        // so this is the single fp16 rounding of Core ML's decode.
        *d = r16(scale * (code - zi) as f32);
    }
}

/// [`block_codes_general`] for the common block, branch-free so that it vectorizes: `scale`
/// is a normal fp16 number and every decoded value `scale · (code − zp)` stays below 65504.
/// Then `x / scale` is finite and, as |x| ≤ the block's range, at most about `qmax − qmin`
/// in size; `q + zp` is an integer below 2^11 (exact, so its fp16 rounding is a no-op); and
/// every nonzero decode lies in fp16's normal range, where its rounding is the mantissa
/// rounding (which also maps ±0 to itself).
#[inline(always)]
fn block_codes_normal(
    w: &[f32],
    scale: f32,
    zp: f32,
    p: &Params,
    codes: &mut [u8],
    dec: &mut [f32],
) {
    for ((&x, c), d) in w.iter().zip(codes.iter_mut()).zip(dec.iter_mut()) {
        let q = (round_even(r16_before_round(x / scale)) + zp).clamp(p.qmin, p.qmax);
        // SAFETY: q is finite (a finite x over a normal scale, plus a finite zp) and clipped
        // to [qmin, qmax] ⊂ [-128, 255], so it is an integer-valued f32 that fits an i32.
        let code = unsafe { q.to_int_unchecked::<i32>() };
        *c = code as u8;
        let prod = scale * (q - zp);
        *d = f32::from_bits(round_mantissa_to_fp16(prod.to_bits()));
    }
}

/// Codes and decode of one block, by the vectorized path where its preconditions hold.
#[inline(always)]
fn block_codes(
    w: &[f32],
    scale: f32,
    zp: Option<f32>,
    p: &Params,
    codes: &mut [u8],
    dec: &mut [f32],
) {
    let z = zp.unwrap_or(0.0);
    let kmax = (p.qmax - z).abs().max((p.qmin - z).abs());
    let normal = in_fp16_normal_range(scale.to_bits()) && scale * kmax < 65504.0;
    match (normal, zp) {
        (true, _) => block_codes_normal(w, scale, z, p, codes, dec),
        (false, Some(z)) => block_codes_general::<true>(w, scale, z, p, codes, dec),
        (false, None) => block_codes_general::<false>(w, scale, 0.0, p, codes, dec),
    }
}

/// Per-task scratch: the group widened to f32, its decode, its unpacked codes.
#[derive(Default)]
struct Scratch {
    w: Vec<f32>,
    dec: Vec<f32>,
    codes: Vec<u8>,
}

/// One task's share: whole blocks' fp16 bits and where their packed codes, scales and zero
/// points go.
struct Group<'a> {
    bits: &'a [u16],
    out: &'a mut [u8],
    scale: &'a mut [f16],
    zero: &'a mut [u8],
}

/// Quantizes one group; its error sums, or None if it holds inf or NaN. Inlined into both
/// the baseline and the AVX2 entry, so everything it calls is compiled for each.
#[inline(always)]
fn quantize_group(
    s: &mut Scratch,
    g: Group<'_>,
    chunk: usize,
    p: &Params,
    nbits: usize,
) -> Option<[f64; 2]> {
    let n = g.bits.len();
    s.w.resize(n, 0.0);
    s.dec.resize(n, 0.0);
    s.codes.resize(n, 0);
    // Widen the group at once (vectorized by `half`), not element by element.
    let w16: &[f16] = bytemuck::cast_slice(g.bits);
    w16.convert_to_f32_slice(&mut s.w[..n]);
    let out = g.out;
    let codes = if nbits == 8 {
        &mut out[..n]
    } else {
        &mut s.codes[..n]
    };
    let blocks = g
        .bits
        .chunks(chunk)
        .zip(s.w.chunks(chunk))
        .zip(codes.chunks_mut(chunk).zip(s.dec.chunks_mut(chunk)))
        .zip(g.scale.iter_mut().zip(g.zero.iter_mut()));
    for (((b16, bw), (bc, bd)), (sc, zp)) in blocks {
        let (scl, z) = block_params(b16, p)?;
        block_codes(bw, scl, z, p, bc, bd);
        *sc = to_f16(scl);
        *zp = z.map_or(0, |z| z as i32 as u8);
    }
    if nbits != 8 {
        pack_into(&s.codes[..n], nbits as u32, out);
    }
    Some(sq_sums(&s.w[..n], &s.dec[..n]))
}

/// [`quantize_group`] compiled for AVX2: twice the vector width of baseline x86-64 in the
/// element loop, with the same IEEE results (no fused multiply-add is formed).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_group_avx2(
    s: &mut Scratch,
    g: Group<'_>,
    chunk: usize,
    p: &Params,
    nbits: usize,
) -> Option<[f64; 2]> {
    quantize_group(s, g, chunk, p, nbits)
}

/// Quantizes `weight` in blocks of `chunk` contiguous elements (row-major) with `cfg`'s dtype
/// and mode. `pack`: codes packed at the dtype's width (else one byte each). `shape` only
/// names the weight in errors.
pub(crate) fn quantize_blocks(
    weight: &[f16],
    shape: &[usize],
    chunk: usize,
    cfg: &QuantConfig,
    pack: bool,
) -> Result<Raw> {
    let numel = weight.len();
    if chunk == 0 || !numel.is_multiple_of(chunk) {
        bail!("quantize: blocks of {chunk} elements do not tile the weight of shape {shape:?}");
    }
    let (qmin, qmax) = cfg.dtype.range(cfg.symmetric);
    let p = Params {
        qmin: qmin as f32,
        qmax: qmax as f32,
        symmetric: cfg.symmetric,
        unsigned_sym: cfg.symmetric && !cfg.dtype.is_signed(),
    };
    let offset = !cfg.symmetric || p.unsigned_sym;
    let nbits = if pack { cfg.dtype.nbits() as usize } else { 8 };
    // Work is split into groups of whole blocks: an error piece when blocks tile one (then the
    // sums equal `relative_rms_error`'s), else about as many elements; and a whole number of
    // bytes once packed, so each group writes its own bytes.
    let mut ge = if chunk <= ERR_PIECE && ERR_PIECE.is_multiple_of(chunk) {
        ERR_PIECE
    } else {
        chunk * (ERR_PIECE / chunk).max(1)
    };
    if ge * nbits % 8 != 0 {
        ge *= 2;
    }
    let (nb, gbytes) = (ge / chunk, ge * nbits / 8);
    let nblocks = numel / chunk;
    let mut data = vec![0u8; packed_len(numel, nbits as u32)];
    let mut scale = vec![f16::ZERO; nblocks];
    let mut zero = vec![0u8; nblocks];
    let bits: &[u16] = bytemuck::cast_slice(weight);
    #[cfg(target_arch = "x86_64")]
    let avx2 = std::arch::is_x86_feature_detected!("avx2");
    let sums: Vec<Option<[f64; 2]>> = data
        .par_chunks_mut(gbytes)
        .zip(bits.par_chunks(ge))
        .zip(scale.par_chunks_mut(nb))
        .zip(zero.par_chunks_mut(nb))
        .map_init(Scratch::default, |s, (((out, wb), sc), zp)| {
            let g = Group {
                bits: wb,
                out,
                scale: sc,
                zero: zp,
            };
            #[cfg(target_arch = "x86_64")]
            if avx2 {
                // SAFETY: the CPU has AVX2 (checked at run time above).
                return unsafe { quantize_group_avx2(s, g, chunk, &p, nbits) };
            }
            quantize_group(s, g, chunk, &p, nbits)
        })
        .collect();
    let Some(sums) = sums.into_iter().collect::<Option<Vec<_>>>() else {
        let (i, v) = weight
            .iter()
            .enumerate()
            .find(|(_, v)| !v.is_finite())
            .map_or((0, f16::NAN), |(i, v)| (i, *v));
        bail!("quantize: weight of shape {shape:?} has non-finite element {i} ({v})");
    };
    if !offset {
        zero.clear();
    }
    Ok(Raw {
        data,
        scale,
        zero,
        rel_rms_error: rel_from_sums(&sums),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_fp16_rounding_matches_half() {
        // A sweep of f32 bit patterns (every 61st, plus all patterns next to fp16's range
        // edges and rounding ties) against the library conversion.
        let edges = [
            0x3880_0000u32,
            0x477f_e000,
            0x3380_0000,
            0x3f80_1000,
            0x4780_0000,
        ];
        let near = edges
            .iter()
            .flat_map(|&e| (e - 0x4000..e + 0x4000).flat_map(|b| [b, b | 0x8000_0000]));
        for b in (0..=u32::MAX)
            .step_by(61)
            .chain(near)
            .chain([0, 0x8000_0000])
        {
            let x = f32::from_bits(b);
            let want = f16::from_f32(x);
            let got = to_f16(x);
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{x:e} ({b:#x}): {got} vs {want}"
            );
            let r = r16(x);
            assert!(
                r.to_bits() == want.to_f32().to_bits() || (r.is_nan() && x.is_nan()),
                "{x:e} ({b:#x})"
            );
            // Where only the rounded integer (clipped to ±255) matters, the shortcut agrees.
            if !x.is_nan() {
                let clip = |v: f32| round_even(v).clamp(-255.0, 255.0);
                assert_eq!(clip(r16_before_round(x)), clip(want.to_f32()), "{x:e}");
            }
        }
        for i in -40_000..40_000 {
            let x = i as f32 * 0.25 + 0.5 * (i % 3) as f32;
            assert_eq!(round_even(x), x.round_ties_even(), "{x}");
        }
        assert_eq!(round_even(1e9), 1e9);
        assert!(round_even(f32::NAN).is_nan());
    }

    #[test]
    fn vectorized_block_path_equals_the_general_one() {
        use super::super::quant_config::QuantDtype;
        let mut st = 99u32;
        let mut checked = 0;
        for dtype in QuantDtype::ALL {
            for symmetric in [true, false] {
                let (qmin, qmax) = dtype.range(symmetric);
                let p = Params {
                    qmin: qmin as f32,
                    qmax: qmax as f32,
                    symmetric,
                    unsigned_sym: symmetric && !dtype.is_signed(),
                };
                for round in 0..2000 {
                    // Magnitudes from 1e-3 to 3e4, one-sided blocks, exact ties.
                    let mag = 10f32.powf((round % 8) as f32 - 3.0) * 3.0;
                    let bits: Vec<u16> = (0..32)
                        .map(|i| {
                            st = st.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                            let u = (st >> 8) as f32 / (1u32 << 24) as f32;
                            let v = match round % 3 {
                                0 => u - 0.5,
                                1 => u,
                                _ => ((u * 16.0).round() - 8.0) / 16.0,
                            };
                            f16::from_f32(if i == 0 { 0.5 } else { v } * mag).to_bits()
                        })
                        .collect();
                    let w: Vec<f32> = bits.iter().map(|&b| f16::from_bits(b).to_f32()).collect();
                    let (scale, zp) = block_params(&bits, &p).unwrap();
                    let z = zp.unwrap_or(0.0);
                    let kmax = (p.qmax - z).abs().max((p.qmin - z).abs());
                    if !(in_fp16_normal_range(scale.to_bits()) && scale * kmax < 65504.0) {
                        continue;
                    }
                    let (mut c1, mut d1) = (vec![0u8; 32], vec![0f32; 32]);
                    let (mut c2, mut d2) = (vec![0u8; 32], vec![0f32; 32]);
                    block_codes_normal(&w, scale, z, &p, &mut c1, &mut d1);
                    match zp {
                        Some(z) => block_codes_general::<true>(&w, scale, z, &p, &mut c2, &mut d2),
                        None => block_codes_general::<false>(&w, scale, 0.0, &p, &mut c2, &mut d2),
                    }
                    assert_eq!(c1, c2, "{dtype:?} sym {symmetric} round {round}");
                    let (b1, b2): (Vec<u32>, Vec<u32>) = (
                        d1.iter().map(|d| d.abs().to_bits()).collect(),
                        d2.iter().map(|d| d.abs().to_bits()).collect(),
                    );
                    assert_eq!(b1, b2, "{dtype:?} sym {symmetric} round {round}");
                    checked += 1;
                }
            }
        }
        assert!(checked > 10_000, "{checked}");
    }

    #[test]
    fn avx2_build_equals_the_baseline_build() {
        #[cfg(target_arch = "x86_64")]
        {
            if !std::arch::is_x86_feature_detected!("avx2") {
                eprintln!("SKIP: no AVX2 on this CPU");
                return;
            }
            use super::super::quant_config::QuantDtype;
            let n = 4096;
            let w: Vec<u16> = (0..n)
                .map(|i| {
                    let v = ((i * 7919 % 2003) as f32 - 1001.0) / 1000.0;
                    // Blocks of every magnitude, so both block paths run.
                    f16::from_f32(v * 10f32.powi((i / 32 % 9) as i32 - 6)).to_bits()
                })
                .collect();
            for (dtype, symmetric) in [(QuantDtype::Int4, true), (QuantDtype::Uint8, false)] {
                let (qmin, qmax) = dtype.range(symmetric);
                let p = Params {
                    qmin: qmin as f32,
                    qmax: qmax as f32,
                    symmetric,
                    unsigned_sym: symmetric && !dtype.is_signed(),
                };
                let nbits = dtype.nbits() as usize;
                let run = |avx: bool| {
                    let mut out = vec![0u8; n * nbits / 8];
                    let (mut sc, mut zp) = (vec![f16::ZERO; n / 32], vec![0u8; n / 32]);
                    let g = Group {
                        bits: &w,
                        out: &mut out,
                        scale: &mut sc,
                        zero: &mut zp,
                    };
                    let mut s = Scratch::default();
                    let sums = if avx {
                        // SAFETY: AVX2 was detected above.
                        unsafe { quantize_group_avx2(&mut s, g, 32, &p, nbits) }
                    } else {
                        quantize_group(&mut s, g, 32, &p, nbits)
                    };
                    (out, sc, zp, sums.map(|s| s.map(f64::to_bits)))
                };
                assert_eq!(run(false), run(true), "{dtype:?}");
            }
        }
    }

    #[test]
    fn order_key_sorts_like_values() {
        let mut all: Vec<u16> = (0..=u16::MAX)
            .filter(|&b| f16::from_bits(b).is_finite())
            .collect();
        all.sort_by_key(|&b| key(b));
        for w in all.windows(2) {
            let (a, b) = (f16::from_bits(w[0]), f16::from_bits(w[1]));
            assert!(a <= b, "{a} before {b}");
        }
        assert!(all.iter().all(|&b| key(key(b) as u16) as u16 == b));
    }
}
