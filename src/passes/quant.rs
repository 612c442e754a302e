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
//!
//! The element loop itself (one parallel pass: scales, codes, packing, error) is in
//! `quant_kernel`; this module owns the types, the shape rules, the decode and the error.

pub use super::quant_config::{QuantConfig, QuantDtype, QuantGranularity};
use super::quant_kernel::{quantize_blocks, rel_from_sums, sq_sums, to_f16, ERR_PIECE};
use anyhow::{bail, ensure, Result};
use half::{f16, slice::HalfFloatSliceExt};
use rayon::prelude::*;

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

/// Largest divisor of `dim` not above `want` (for error messages suggesting a fix).
fn divisor_at_most(dim: usize, want: usize) -> usize {
    (1..=want.min(dim))
        .rev()
        .find(|d| dim.is_multiple_of(*d))
        .unwrap_or(1)
}

/// Elements per scale (contiguous in row-major order in every granularity) and the scale
/// tensor's shape, or why `cfg` does not fit `shape`.
fn layout(weight: &[f16], shape: &[usize], cfg: &QuantConfig) -> Result<(usize, Vec<usize>)> {
    let numel: usize = shape.iter().product();
    ensure!(
        !shape.is_empty() && numel == weight.len() && numel > 0,
        "quantize: weight has {} elements but shape {shape:?} holds {numel}",
        weight.len()
    );
    let rank = shape.len();
    let mut scale_shape = vec![1usize; rank];
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
            if block == 0 || !input.is_multiple_of(block) {
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
    Ok((chunk, scale_shape))
}

/// Quantizes an fp16 weight (output channels on axis 0, input channels on axis 1).
pub fn quantize(weight: &[f16], shape: &[usize], cfg: &QuantConfig) -> Result<Quantized> {
    Ok(quantize_with_error(weight, shape, cfg)?.0)
}

/// [`quantize`] and the relative RMS error of its decode (as [`relative_rms_error`] computes
/// it), measured in the same pass.
pub fn quantize_with_error(
    weight: &[f16],
    shape: &[usize],
    cfg: &QuantConfig,
) -> Result<(Quantized, f64)> {
    let (chunk, scale_shape) = layout(weight, shape, cfg)?;
    let raw = quantize_blocks(weight, shape, chunk, cfg, false)?;
    let signed = cfg.dtype.is_signed();
    // Codes and zero points arrive as two's-complement bytes.
    let values = |v: Vec<u8>| {
        if signed {
            QuantValues::Signed(v.into_iter().map(|b| b as i8).collect())
        } else {
            QuantValues::Unsigned(v)
        }
    };
    let offset = (!raw.zero.is_empty()).then(|| values(raw.zero));
    let q = Quantized {
        dtype: cfg.dtype,
        shape: shape.to_vec(),
        data: values(raw.data),
        scale: raw.scale,
        scale_shape,
        offset,
    };
    Ok((q, raw.rel_rms_error))
}

/// A quantized weight in storage form, as the compression pass writes it.
#[derive(Debug, Clone, PartialEq)]
pub struct PackedQuantized {
    pub dtype: QuantDtype,
    pub shape: Vec<usize>,
    /// `data` as Core ML stores it (= `Quantized::data.to_storage_bytes(dtype)`).
    pub data: Vec<u8>,
    pub scale: Vec<f16>,
    pub scale_shape: Vec<usize>,
    /// `offset` as Core ML stores it, when the config has one.
    pub offset: Option<Vec<u8>>,
    /// rms(w − decode) / rms(w), as [`relative_rms_error`] computes it.
    pub rel_rms_error: f64,
}

/// [`quantize`] straight to storage bytes, with the error of the decode: one parallel pass
/// over the weight, which is how the compression pass runs it on multi-GB models.
pub fn quantize_packed(
    weight: &[f16],
    shape: &[usize],
    cfg: &QuantConfig,
) -> Result<PackedQuantized> {
    let (chunk, scale_shape) = layout(weight, shape, cfg)?;
    let raw = quantize_blocks(weight, shape, chunk, cfg, true)?;
    let offset = if raw.zero.is_empty() {
        None
    } else if cfg.dtype.nbits() == 8 {
        Some(raw.zero)
    } else {
        // Zero points are clipped to the code range, so their low nibbles are the values.
        let nibbles: Vec<u8> = raw.zero.iter().map(|z| z & 0x0f).collect();
        Some(super::subbyte::pack_bits(&nibbles, 4)?)
    };
    Ok(PackedQuantized {
        dtype: cfg.dtype,
        shape: shape.to_vec(),
        data: raw.data,
        scale: raw.scale,
        scale_shape,
        offset,
        rel_rms_error: raw.rel_rms_error,
    })
}

/// Core ML's materialization of `constexpr_blockwise_shift_scale` with integer `data` (and
/// integer `offset` of the same dtype) and fp16 `scale`: `fp16(scale · (data − offset))`,
/// each scale covering a block of `shape[a] / scale_shape[a]` along every axis `a` — the op's
/// own decode ([`crate::ops::decode_shift_scale`]), which the interpreter runs too. `data −
/// offset` is a small integer (exact in f32) and its product with an fp16 scale is exact, so
/// the one rounding is numpy's.
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
    let off = offset.map(|o| move |g: usize| o.get(g) as f32);
    crate::ops::decode_shift_scale(
        shape,
        scale_shape,
        |i| data.get(i) as f32,
        |g| scale[g].to_f32(),
        off.as_ref().map(|f| f as &(dyn Fn(usize) -> f32 + Sync)),
        to_f16,
    )
}

/// rms(orig − decoded) / rms(orig), in f64. Zero when both are identical (even if all zero).
/// Summed in fixed pieces (deterministic, and equal to the error the quantization pass
/// measures when its blocks tile a piece).
pub fn relative_rms_error(orig: &[f16], decoded: &[f16]) -> Result<f64> {
    ensure!(
        orig.len() == decoded.len(),
        "relative_rms_error: {} original vs {} decoded elements",
        orig.len(),
        decoded.len()
    );
    let sums: Vec<[f64; 2]> = orig
        .par_chunks(ERR_PIECE)
        .zip(decoded.par_chunks(ERR_PIECE))
        .map_init(
            || (vec![0.0f32; ERR_PIECE], vec![0.0f32; ERR_PIECE]),
            |(fa, fb), (a, b)| {
                // Widen a piece at once (vectorized); f32 holds fp16 values exactly.
                let (fa, fb) = (&mut fa[..a.len()], &mut fb[..a.len()]);
                a.convert_to_f32_slice(fa);
                b.convert_to_f32_slice(fb);
                sq_sums(fa, fb)
            },
        )
        .collect();
    Ok(rel_from_sums(&sums))
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// Pseudo-random fp16 weights with a spread of magnitudes, some all-zero blocks, some
    /// subnormals and ties.
    fn weights(n: usize, seed: u32) -> Vec<f16> {
        let mut st = seed;
        (0..n)
            .map(|i| {
                st = st.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                let u = (st >> 8) as f32 / (1u32 << 24) as f32 - 0.5;
                match (i / 32) % 7 {
                    0 => 0.0,
                    1 => u * 1e-6,
                    2 => (u * 16.0).round() / 8.0,
                    _ => u * (1 + (i % 5)) as f32 * 0.1,
                }
            })
            .map(f16::from_f32)
            .collect()
    }

    #[test]
    fn packed_pass_equals_the_unpacked_codes_and_their_decode() {
        // Block 32 (tiling error pieces), odd per-channel rows, per-tensor; every dtype/mode.
        let cases: [(&[usize], QuantGranularity); 4] = [
            (&[64, 256, 1, 1], QuantGranularity::PerBlock(32)),
            (&[6, 96, 3], QuantGranularity::PerBlock(32)),
            (&[7, 4097], QuantGranularity::PerChannel),
            (&[9, 13], QuantGranularity::PerTensor),
        ];
        for (k, (shape, granularity)) in cases.into_iter().enumerate() {
            let n: usize = shape.iter().product();
            let w = weights(n, 7 + k as u32);
            for dtype in QuantDtype::ALL {
                for symmetric in [true, false] {
                    let cfg = QuantConfig {
                        dtype,
                        granularity,
                        symmetric,
                    };
                    let what = format!("{shape:?} {cfg:?}");
                    let q = quantize(&w, shape, &cfg).unwrap();
                    let p = quantize_packed(&w, shape, &cfg).unwrap();
                    assert_eq!(p.data, q.data.to_storage_bytes(dtype).unwrap(), "{what}");
                    assert_eq!(p.scale, q.scale, "{what}");
                    assert_eq!(p.scale_shape, q.scale_shape, "{what}");
                    let off = q
                        .offset
                        .as_ref()
                        .map(|o| o.to_storage_bytes(dtype).unwrap());
                    assert_eq!(p.offset, off, "{what}");
                    // The in-pass error against an explicit decode: identical where blocks
                    // tile the error pieces, else equal up to summation order (f32 runs).
                    let want = relative_rms_error(&w, &q.decode().unwrap()).unwrap();
                    assert!(want > 0.0, "{what}");
                    if matches!(granularity, QuantGranularity::PerBlock(_)) && k == 0 {
                        assert_eq!(p.rel_rms_error, want, "{what}");
                    } else {
                        assert!((p.rel_rms_error - want).abs() <= 1e-6 * want, "{what}");
                    }
                }
            }
        }
        let mut bad = weights(64, 1);
        bad[40] = f16::INFINITY;
        let cfg = QuantConfig {
            dtype: QuantDtype::Int4,
            granularity: QuantGranularity::PerBlock(32),
            symmetric: true,
        };
        let msg = quantize_packed(&bad, &[2, 32], &cfg)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("non-finite element 40"), "{msg}");
    }
}
