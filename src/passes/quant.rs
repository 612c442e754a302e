//! Linear (affine) weight quantization for the iOS18 `constexpr_blockwise_shift_scale` op,
//! reproducing coremltools 9's `linear_quantize_weights` numbers exactly, plus its decode.
//!
//! coremltools (`optimize/_utils.py: quantize_weight_by_dtype`) runs on the fp16 weight in
//! numpy fp16 arithmetic, i.e. every operation is rounded to fp16. We mirror each rounding:
//! - symmetric: `scale = fp16(2·max|w| / (qmax − qmin))`, range int4 [-7, 7], int8 [-127, 127],
//!   uint4 [0, 14] with offset 7, uint8 [0, 254] with offset 127;
//! - asymmetric: `lo = min(0, min w)`, `hi = max(0, max w)`, `scale = fp16(fp16(hi − lo) / (qmax −
//!   qmin))`, offset `round(fp16(fp16(fp16(qmin·hi) − fp16(qmax·lo)) / fp16(hi − lo)))` clipped,
//!   range int4 [-8, 7], uint4 [0, 15], int8 [-128, 127], uint8 [0, 255];
//! - `q = clip(round_half_even(fp16(w / scale)) + offset, qmin, qmax)`; a NaN (0/0 on an all-zero
//!   block) becomes 0, as numpy's cast does on x86-64.
//!
//! Decode (`constexpr_blockwise_shift_scale.decompress`): `fp16(scale · fp16(q − offset))`.

use anyhow::{bail, ensure, Context, Result};
use half::{f16, slice::HalfFloatSliceExt};
use rayon::prelude::*;

/// Integer storage type of quantized weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantDtype {
    Int4,
    Uint4,
    Int8,
    Uint8,
}

impl QuantDtype {
    pub fn nbits(self) -> u32 {
        match self {
            QuantDtype::Int4 | QuantDtype::Uint4 => 4,
            QuantDtype::Int8 | QuantDtype::Uint8 => 8,
        }
    }
    pub fn is_signed(self) -> bool {
        matches!(self, QuantDtype::Int4 | QuantDtype::Int8)
    }
    /// The MIL type name (`int4`, `uint4`, `int8`, `uint8`).
    pub fn mil_name(self) -> &'static str {
        match self {
            QuantDtype::Int4 => "int4",
            QuantDtype::Uint4 => "uint4",
            QuantDtype::Int8 => "int8",
            QuantDtype::Uint8 => "uint8",
        }
    }
    /// coremltools' `get_quant_range`: symmetric mode gives up the most negative code
    /// (signed) or the top code (unsigned) so that zero sits exactly in the middle.
    pub fn range(self, symmetric: bool) -> (i32, i32) {
        let n = self.nbits();
        let (mut lo, mut hi) = if self.is_signed() {
            (-(1i32 << (n - 1)), (1i32 << (n - 1)) - 1)
        } else {
            (0, (1i32 << n) - 1)
        };
        if symmetric {
            if self.is_signed() {
                lo += 1;
            } else {
                hi -= 1;
            }
        }
        (lo, hi)
    }
}

/// Quantized element values, one per element (sub-byte types are packed only when written).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuantValues {
    Signed(Vec<i8>),
    Unsigned(Vec<u8>),
}

impl QuantValues {
    pub fn len(&self) -> usize {
        match self {
            QuantValues::Signed(v) => v.len(),
            QuantValues::Unsigned(v) => v.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Element `i` as an integer (caller keeps `i` in range).
    #[inline]
    pub fn get(&self, i: usize) -> i32 {
        match self {
            QuantValues::Signed(v) => i32::from(v[i]),
            QuantValues::Unsigned(v) => i32::from(v[i]),
        }
    }
    /// Bytes as Core ML stores them for `dtype` (4-bit types packed LSB-first).
    pub fn to_storage_bytes(&self, dtype: QuantDtype) -> Result<Vec<u8>> {
        use super::subbyte::{pack_bits, pack_int4};
        match (self, dtype) {
            (QuantValues::Signed(v), QuantDtype::Int8) => Ok(bytemuck::cast_slice(v).to_vec()),
            (QuantValues::Unsigned(v), QuantDtype::Uint8) => Ok(v.clone()),
            (QuantValues::Signed(v), QuantDtype::Int4) => pack_int4(v),
            (QuantValues::Unsigned(v), QuantDtype::Uint4) => pack_bits(v, 4),
            _ => bail!(
                "quantized values' signedness does not match {}",
                dtype.mil_name()
            ),
        }
    }
}

/// Which elements share one scale (and offset).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantGranularity {
    /// One scale for the whole tensor.
    PerTensor,
    /// One scale per output channel (axis 0).
    PerChannel,
    /// One scale per output channel and block of `n` input channels (axis 1).
    PerBlock(usize),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantConfig {
    pub dtype: QuantDtype,
    pub granularity: QuantGranularity,
    /// coremltools' `linear_symmetric` (its default) when true, `linear` otherwise.
    pub symmetric: bool,
}

impl Default for QuantConfig {
    fn default() -> Self {
        QuantConfig {
            dtype: QuantDtype::Int8,
            granularity: QuantGranularity::PerChannel,
            symmetric: true,
        }
    }
}

/// Inputs of one iOS18 `constexpr_blockwise_shift_scale`: `data`, `scale`, optional `offset`.
#[derive(Debug, Clone, PartialEq)]
pub struct Quantized {
    pub dtype: QuantDtype,
    /// Shape of `data` (= the weight's shape).
    pub shape: Vec<usize>,
    pub data: QuantValues,
    /// fp16 scales, row-major in `scale_shape` (same rank as `shape`, each dim dividing it).
    pub scale: Vec<f16>,
    pub scale_shape: Vec<usize>,
    /// Present for unsigned symmetric and all asymmetric configs; shape `scale_shape`, same
    /// dtype as `data`.
    pub offset: Option<QuantValues>,
}

impl Quantized {
    /// The fp16 weight Core ML materializes from this op.
    pub fn decode(&self) -> Result<Vec<f16>> {
        decode_blockwise(
            &self.data,
            &self.shape,
            &self.scale,
            &self.scale_shape,
            self.offset.as_ref(),
        )
    }
}

/// The low 13 bits of an f32 mantissa rounded to nearest, ties to even: what is left is an
/// fp16 value (for magnitudes in fp16's normal range).
#[inline(always)]
fn round_mantissa_to_fp16(b: u32) -> u32 {
    (b + 0x0fff + ((b >> 13) & 1)) & !0x1fff
}

/// |x| bits in [2^-14, 65504): fp16 normal numbers, where fp16 rounding is a mantissa rounding.
#[inline(always)]
fn in_fp16_normal_range(a: u32) -> bool {
    (0x3880_0000..0x477f_e000).contains(&a)
}

#[inline(always)]
fn r16(x: f32) -> f32 {
    // One fp16 rounding. The f32 inputs are fp16 values, and f32 carries more than twice
    // fp16's precision, so an f32 op followed by this is numpy's correctly rounded fp16 op.
    // Normal-range values are rounded in place by bit arithmetic (the conversion through
    // `half` costs a call and a CPU-feature check per element); the rest (subnormal,
    // overflow, NaN) take the exact library path.
    let b = x.to_bits();
    if in_fp16_normal_range(b & 0x7fff_ffff) {
        f32::from_bits(round_mantissa_to_fp16(b))
    } else {
        f16::from_f32(x).to_f32()
    }
}

/// `f16::from_f32` (nearest, ties to even) with the same fast path as [`r16`].
#[inline(always)]
fn to_f16(x: f32) -> f16 {
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
fn round_even(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    if x.abs() < 4_194_304.0 {
        (x + MAGIC) - MAGIC
    } else {
        x
    }
}

/// Largest divisor of `dim` not above `want` (for error messages suggesting a fix).
fn divisor_at_most(dim: usize, want: usize) -> usize {
    (1..=want.min(dim))
        .rev()
        .find(|d| dim % d == 0)
        .unwrap_or(1)
}

/// Quantizes an fp16 weight (output channels on axis 0, input channels on axis 1).
pub fn quantize(weight: &[f16], shape: &[usize], cfg: &QuantConfig) -> Result<Quantized> {
    let numel: usize = shape.iter().product();
    ensure!(
        !shape.is_empty() && numel == weight.len() && numel > 0,
        "quantize: weight has {} elements but shape {shape:?} holds {numel}",
        weight.len()
    );
    if let Some((i, v)) = weight.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        bail!("quantize: weight of shape {shape:?} has non-finite element {i} ({v})");
    }
    let rank = shape.len();
    let mut scale_shape = vec![1usize; rank];
    // Elements sharing a scale are contiguous in row-major order in every granularity.
    let chunk = match cfg.granularity {
        QuantGranularity::PerTensor => numel,
        QuantGranularity::PerChannel => {
            scale_shape[0] = shape[0];
            numel / shape[0]
        }
        QuantGranularity::PerBlock(block) => {
            ensure!(
                rank >= 2,
                "quantize: per-block quantization needs an input axis (axis 1), but the weight \
                 has shape {shape:?}; use per-channel granularity for it"
            );
            let input = shape[1];
            if block == 0 || input % block != 0 {
                bail!(
                    "quantize: block_size {block} does not divide the input axis (axis 1 = \
                     {input}) of the weight with shape {shape:?}; use a block size that divides \
                     {input} (e.g. {}) or per-channel granularity for this weight",
                    divisor_at_most(input, block.max(1))
                );
            }
            scale_shape[0] = shape[0];
            scale_shape[1] = input / block;
            block * shape[2..].iter().product::<usize>()
        }
    };
    let (qmin, qmax) = cfg.dtype.range(cfg.symmetric);
    let unsigned_sym = cfg.symmetric && !cfg.dtype.is_signed();

    // Codes go straight into one byte buffer (an i8 code stored as its two's-complement byte)
    // and the parameters into one array: no allocation per block, which at 32 elements a block
    // would dominate the run time. Blocks are batched so rayon's per-task cost stays small.
    let nblocks = numel / chunk;
    let mut raw = vec![0u8; numel];
    let mut params = vec![(f16::ZERO, 0i32); nblocks];
    raw.par_chunks_mut(chunk)
        .zip(weight.par_chunks(chunk))
        .zip(params.par_iter_mut())
        .with_min_len((4096 / chunk).max(1))
        .for_each_init(Vec::new, |buf: &mut Vec<f32>, ((dst, w), p)| {
            // Widen the block at once (vectorized by `half`) rather than element by element.
            buf.clear();
            buf.resize(w.len(), 0.0);
            w.convert_to_f32_slice(buf);
            let (scale, zp) = chunk_params(buf, qmin, qmax, cfg.symmetric, unsigned_sym);
            for (o, &x) in dst.iter_mut().zip(buf.iter()) {
                let mut q = round_even(r16(x / scale));
                if let Some(z) = zp {
                    q = r16(q + z);
                }
                // NaN (an all-zero block: 0/0) casts to 0, as numpy does on x86-64.
                *o = (q.clamp(qmin as f32, qmax as f32) as i32) as u8;
            }
            *p = (f16::from_f32(scale), zp.map_or(0, |z| z as i32));
        });

    let scale: Vec<f16> = params.iter().map(|c| c.0).collect();
    let has_offset = unsigned_sym || !cfg.symmetric;
    let signed = cfg.dtype.is_signed();
    let data = if signed {
        QuantValues::Signed(raw.into_iter().map(|b| b as i8).collect())
    } else {
        QuantValues::Unsigned(raw)
    };
    let offset = has_offset.then(|| {
        if signed {
            QuantValues::Signed(params.iter().map(|c| c.1 as i8).collect())
        } else {
            QuantValues::Unsigned(params.iter().map(|c| c.1 as u8).collect())
        }
    });
    Ok(Quantized {
        dtype: cfg.dtype,
        shape: shape.to_vec(),
        data,
        scale,
        scale_shape,
        offset,
    })
}

/// (scale, zero point before clipping) of one block, in coremltools' fp16 arithmetic.
fn chunk_params(
    w: &[f32],
    qmin: i32,
    qmax: i32,
    symmetric: bool,
    unsigned_sym: bool,
) -> (f32, Option<f32>) {
    let (mut lo, mut hi) = (f32::INFINITY, f32::NEG_INFINITY);
    for &v in w {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    let span = (qmax - qmin) as f32;
    if symmetric {
        let a = lo.abs().max(hi.abs());
        let scale = r16(r16(a - (-a)) / span);
        // coremltools shifts unsigned symmetric data by qmax // 2.
        (scale, unsigned_sym.then_some((qmax / 2) as f32))
    } else {
        let (lo, hi) = (lo.min(0.0), hi.max(0.0));
        let width = r16(hi - lo);
        let scale = r16(width / span);
        let num = r16(r16(qmin as f32 * hi) - r16(qmax as f32 * lo));
        // Rounded and clipped before it is added to the codes (NaN for an all-zero block).
        let zp = round_even(r16(num / width)).clamp(qmin as f32, qmax as f32);
        (scale, Some(zp))
    }
}

/// Core ML's materialization of `constexpr_blockwise_shift_scale` with integer `data` (and
/// integer `offset` of the same dtype) and fp16 `scale`: `fp16(scale · fp16(data − offset))`,
/// each scale covering a block of `shape[a] / scale_shape[a]` along every axis `a`.
pub fn decode_blockwise(
    data: &QuantValues,
    shape: &[usize],
    scale: &[f16],
    scale_shape: &[usize],
    offset: Option<&QuantValues>,
) -> Result<Vec<f16>> {
    let numel: usize = shape.iter().product();
    ensure!(
        data.len() == numel,
        "decode_blockwise: data has {} elements, shape {shape:?} needs {numel}",
        data.len()
    );
    ensure!(
        scale_shape.len() == shape.len(),
        "decode_blockwise: scale shape {scale_shape:?} and data shape {shape:?} differ in rank"
    );
    let nscale: usize = scale_shape.iter().product();
    ensure!(
        scale.len() == nscale,
        "decode_blockwise: {} scales for scale shape {scale_shape:?}",
        scale.len()
    );
    if let Some(o) = offset {
        ensure!(
            o.len() == nscale,
            "decode_blockwise: offset has {} elements, scale shape {scale_shape:?} needs {nscale}",
            o.len()
        );
    }
    let mut blocks = Vec::with_capacity(shape.len());
    for (a, (&d, &s)) in shape.iter().zip(scale_shape).enumerate() {
        ensure!(
            s > 0 && d % s == 0,
            "decode_blockwise: axis {a}: data dim {d} is not a multiple of scale dim {s}"
        );
        blocks.push(d / s);
    }
    if numel == 0 {
        return Ok(Vec::new());
    }
    // Trailing size-1 axes (linear weights stored as [out, in, 1, 1]) change no flat index;
    // without them rows stay long, so the per-row index arithmetic and rayon's per-task cost
    // stay off the per-element path.
    let rank = effective_rank(shape);
    let (shape, scale_shape, blocks) = (&shape[..rank], &scale_shape[..rank], &blocks[..rank]);
    // Map every flat element to its scale index: row-major strides of the scale tensor.
    let mut sstride = vec![1usize; rank];
    for a in (0..rank.saturating_sub(1)).rev() {
        sstride[a] = sstride[a + 1] * scale_shape[a + 1];
    }
    let last = shape[rank - 1];
    let last_map: Vec<usize> = (0..last)
        .map(|i| (i / blocks[rank - 1]) * sstride[rank - 1])
        .collect();
    let outer = &shape[..rank - 1];
    let mut out = vec![f16::ZERO; numel];
    out.par_chunks_mut(last)
        .enumerate()
        .with_min_len((4096 / last).max(1))
        .for_each(|(row, dst)| {
            // Scale index contributed by the outer axes of this row.
            let (mut rem, mut base) = (row, 0usize);
            for a in (0..outer.len()).rev() {
                let idx = rem % outer[a];
                rem /= outer[a];
                base += (idx / blocks[a]) * sstride[a];
            }
            for (i, o) in dst.iter_mut().enumerate() {
                let s = base + last_map[i];
                let q = data.get(row * last + i) - offset.map_or(0, |o| o.get(s));
                // q − offset is a small integer (exact in fp16), and the f32 product of it with
                // an fp16 scale is exact, so this is the single fp16 rounding numpy does.
                *o = to_f16(scale[s].to_f32() * q as f32);
            }
        });
    Ok(out)
}

/// Rank of `shape` without its trailing size-1 axes (at least 1).
pub(crate) fn effective_rank(shape: &[usize]) -> usize {
    shape.iter().rposition(|&d| d != 1).map_or(1, |i| i + 1)
}

/// rms(orig − decoded) / rms(orig), in f64. Zero when both are identical (even if all zero).
pub fn relative_rms_error(orig: &[f16], decoded: &[f16]) -> Result<f64> {
    ensure!(
        orig.len() == decoded.len(),
        "relative_rms_error: {} original vs {} decoded elements",
        orig.len(),
        decoded.len()
    );
    let (mut num, mut den) = (0.0f64, 0.0f64);
    // Widen 1024 elements at a time (vectorized); f32 holds fp16 values and their
    // differences exactly, and the sums are kept in f64.
    let (mut fa, mut fb) = ([0.0f32; 1024], [0.0f32; 1024]);
    for (ca, cb) in orig.chunks(1024).zip(decoded.chunks(1024)) {
        let (fa, fb) = (&mut fa[..ca.len()], &mut fb[..ca.len()]);
        ca.convert_to_f32_slice(fa);
        cb.convert_to_f32_slice(fb);
        for (&a, &b) in fa.iter().zip(fb.iter()) {
            let (a, b) = (f64::from(a), f64::from(b));
            num += (a - b) * (a - b);
            den += a * a;
        }
    }
    if num == 0.0 {
        return Ok(0.0);
    }
    Ok((num / den).sqrt())
}

/// Convenience: quantize then report the relative RMS error of the decode.
pub fn quantize_with_error(
    weight: &[f16],
    shape: &[usize],
    cfg: &QuantConfig,
) -> Result<(Quantized, f64)> {
    let q = quantize(weight, shape, cfg)?;
    let dec = q.decode().context("decoding freshly quantized weight")?;
    let err = relative_rms_error(weight, &dec)?;
    Ok((q, err))
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
        for b in (0..=u32::MAX).step_by(61).chain(near) {
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
        }
        for i in -40_000..40_000 {
            let x = i as f32 * 0.25 + 0.5 * (i % 3) as f32;
            assert_eq!(round_even(x), x.round_ties_even(), "{x}");
        }
        assert_eq!(round_even(1e9), 1e9);
        assert!(round_even(f32::NAN).is_nan());
    }

    #[test]
    fn ranges_match_coremltools() {
        assert_eq!(QuantDtype::Int4.range(true), (-7, 7));
        assert_eq!(QuantDtype::Int4.range(false), (-8, 7));
        assert_eq!(QuantDtype::Uint4.range(true), (0, 14));
        assert_eq!(QuantDtype::Uint8.range(false), (0, 255));
        assert_eq!(QuantDtype::Int8.range(true), (-127, 127));
    }

    #[test]
    fn per_block_shapes_and_refusal() {
        let w: Vec<f16> = (0..4 * 64)
            .map(|i| f16::from_f32((i as f32 - 100.0) / 300.0))
            .collect();
        let cfg = QuantConfig {
            dtype: QuantDtype::Int4,
            granularity: QuantGranularity::PerBlock(32),
            symmetric: true,
        };
        let q = quantize(&w, &[4, 64], &cfg).unwrap();
        assert_eq!(q.scale_shape, vec![4, 2]);
        assert!(q.offset.is_none());
        let w80 = vec![f16::ONE; 2 * 80];
        let msg = quantize(&w80, &[2, 80], &cfg).unwrap_err().to_string();
        assert!(msg.contains("[2, 80]") && msg.contains("e.g. 20"), "{msg}");
    }
}
