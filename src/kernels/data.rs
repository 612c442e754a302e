//! Getting numbers in and out of candle CPU tensors: borrowed typed slices, f32 copies for
//! computing (fp16 → f32 with F16C-vectorised slice conversion, split across rayon threads),
//! and results rounded back to the storage dtype.

use anyhow::{anyhow, bail, ensure, Result};
use candle_core::{DType, Device, Storage, Tensor, WithDType};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use rayon::prelude::*;

/// Elements per rayon task for cheap per-element work: large enough that scheduling costs
/// vanish, small enough that 2..16 threads all get work on a 500k-element activation.
pub const CHUNK: usize = 1 << 14;

/// Below this many elements, a conversion called from outside the rayon pool runs on the
/// calling thread. From outside, a parallel loop injects its jobs into the pool and blocks
/// on a latch until a worker has woken and taken them: tens of microseconds on a 2-core
/// VM, which turned a decode step's 51,864 logits from fp16 to f32 (a few microseconds of
/// F16C work) into 60-70 µs per token. Inside the pool a fork is a push onto the thread's
/// own deque and stays cheap, so there the loops keep their `CHUNK` tasks.
pub const OUTSIDE_POOL_MIN: usize = 1 << 18;

/// The task length for cheap per-element work over `n` elements: [`CHUNK`], or all `n`
/// in one task (run inline, no fork) when called from outside the pool on fewer than
/// [`OUTSIDE_POOL_MIN`].
pub fn chunk_for(n: usize) -> usize {
    if n < OUTSIDE_POOL_MIN && rayon::current_thread_index().is_none() {
        n.max(1)
    } else {
        CHUNK
    }
}

/// `f(src part, dst part)` over matching [`chunk_for`] parts of two equally long slices,
/// in parallel where that pays.
fn convert_parts<A: Sync, B: Send>(src: &[A], dst: &mut [B], f: impl Fn(&[A], &mut [B]) + Sync) {
    let c = chunk_for(src.len());
    dst.par_chunks_mut(c)
        .zip(src.par_chunks(c))
        .for_each(|(o, i)| f(i, o));
}

/// Calls `f` with the elements of `t` in row-major order. `t` must hold `T`; non-contiguous
/// views are copied first.
pub fn with_slice<T: WithDType, R>(t: &Tensor, f: impl FnOnce(&[T]) -> R) -> Result<R> {
    if t.dtype() != T::DTYPE {
        bail!("expected a {:?} tensor, got {:?}", T::DTYPE, t.dtype());
    }
    let t = if t.is_contiguous() {
        t.clone()
    } else {
        t.contiguous()?
    };
    let (st, layout) = t.storage_and_layout();
    let Storage::Cpu(cs) = &*st else {
        bail!("only CPU tensors are supported")
    };
    let s = cs.as_slice::<T>()?;
    let (a, b) = layout
        .contiguous_offsets()
        .ok_or_else(|| anyhow!("tensor is not contiguous"))?;
    Ok(f(&s[a..b]))
}

/// `bytes` (a whole number of `T`s in the host's byte order) copied into a new vector,
/// slices of 1 MiB at a time across the rayon threads, the fresh vector's page faults
/// included: a weight copied out of its mapped file at load, on every core.
pub fn par_copy<T: bytemuck::Pod + Send>(bytes: &[u8]) -> Vec<T> {
    const SLICE: usize = 1 << 20;
    let n = bytes.len() / size_of::<T>();
    let bytes = &bytes[..n * size_of::<T>()];
    let mut v: Vec<T> = Vec::with_capacity(n);
    let base = v.as_mut_ptr() as usize;
    bytes.par_chunks(SLICE).enumerate().for_each(|(i, s)| {
        // SAFETY: slice i lands at byte i·SLICE of the vector's capacity of `n` elements
        // (`bytes` is exactly that long); the slices do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(s.as_ptr(), (base + i * SLICE) as *mut u8, s.len()) }
    });
    // SAFETY: every byte of the first n elements was written above, and any bit pattern
    // is a valid `T` (Pod).
    unsafe { v.set_len(n) };
    v
}

/// Calls `f` with the raw little-endian bytes of `t`'s elements in row-major order (a
/// view of the storage when `t` is contiguous).
pub fn with_bytes<R>(t: &Tensor, f: impl FnOnce(&[u8]) -> R) -> Result<R> {
    match t.dtype() {
        DType::U8 => with_slice(t, |s: &[u8]| f(s)),
        DType::U32 => with_slice(t, |s: &[u32]| f(bytemuck::cast_slice(s))),
        DType::I16 => with_slice(t, |s: &[i16]| f(bytemuck::cast_slice(s))),
        DType::I32 => with_slice(t, |s: &[i32]| f(bytemuck::cast_slice(s))),
        DType::I64 => with_slice(t, |s: &[i64]| f(bytemuck::cast_slice(s))),
        DType::F16 => with_slice(t, |s: &[f16]| f(bytemuck::cast_slice(s))),
        DType::BF16 => with_slice(t, |s: &[half::bf16]| f(bytemuck::cast_slice(s))),
        DType::F32 => with_slice(t, |s: &[f32]| f(bytemuck::cast_slice(s))),
        DType::F64 => with_slice(t, |s: &[f64]| f(bytemuck::cast_slice(s))),
        d => bail!("no byte view of {d:?} tensors"),
    }
}

/// A copy of the elements of `t` as `T` (any candle dtype is converted by candle).
pub fn to_vec<T: WithDType>(t: &Tensor) -> Result<Vec<T>> {
    if t.dtype() == T::DTYPE {
        with_slice(t, |s: &[T]| s.to_vec())
    } else {
        let c = t.to_dtype(T::DTYPE)?;
        with_slice(&c, |s: &[T]| s.to_vec())
    }
}

/// A row-major tensor from a vector.
pub fn from_vec<T: WithDType>(v: Vec<T>, shape: &[usize]) -> Result<Tensor> {
    Ok(Tensor::from_vec(v, shape, &Device::Cpu)?)
}

/// The elements of a float or integer tensor as f32.
pub fn to_f32_vec(t: &Tensor) -> Result<Vec<f32>> {
    match t.dtype() {
        DType::F32 => with_slice(t, |s: &[f32]| s.to_vec()),
        DType::F16 => with_slice(t, |s: &[f16]| {
            let mut out = vec![0f32; s.len()];
            convert_parts(s, &mut out, super::convert::f16_to_f32);
            out
        }),
        DType::BF16 => with_slice(t, |s: &[bf16]| {
            let mut out = vec![0f32; s.len()];
            convert_parts(s, &mut out, |i, o| i.convert_to_f32_slice(o));
            out
        }),
        _ => to_vec::<f32>(t),
    }
}

/// Calls `f` with the elements of `t` as f32, borrowing when `t` already is f32.
pub fn with_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    if t.dtype() == DType::F32 {
        with_slice(t, f)
    } else {
        let v = to_f32_vec(t)?;
        Ok(f(&v))
    }
}

/// A tensor of `dtype` from f32 values: one rounding for fp16/bf16, truncation toward zero
/// for integers (candle's conversion), `!= 0` for u8 used as bool is left to the caller.
pub fn from_f32(v: Vec<f32>, shape: &[usize], dtype: DType) -> Result<Tensor> {
    match dtype {
        DType::F32 => from_vec(v, shape),
        DType::F16 => {
            let mut out = vec![f16::ZERO; v.len()];
            convert_parts(&v, &mut out, super::convert::f32_to_f16);
            from_vec(out, shape)
        }
        DType::BF16 => {
            let mut out = vec![bf16::ZERO; v.len()];
            convert_parts(&v, &mut out, |i, o| o.convert_from_f32_slice(i));
            from_vec(out, shape)
        }
        d => Ok(from_vec(v, shape)?.to_dtype(d)?),
    }
}

/// A tensor of `dtype` from f64 values (integers rounded toward zero by candle).
pub fn from_f64(v: Vec<f64>, shape: &[usize], dtype: DType) -> Result<Tensor> {
    match dtype {
        DType::F64 => from_vec(v, shape),
        DType::F32 | DType::F16 | DType::BF16 => {
            from_f32(v.into_iter().map(|x| x as f32).collect(), shape, dtype)
        }
        d => Ok(from_vec(v, shape)?.to_dtype(d)?),
    }
}

/// Applies `f` in place to consecutive rows of `n` f32 values of a float tensor; see
/// [`map_chunks`].
pub fn map_rows(t: &Tensor, n: usize, f: impl Fn(&mut [f32]) + Sync + Send) -> Result<Tensor> {
    map_chunks(t, n, |c| c.chunks_mut(n).for_each(&f))
}

/// Applies `f` in place to chunks (whole multiples of `n` values) of a float tensor as f32,
/// in parallel. Each task converts its chunk from and back to the storage dtype in its own
/// buffer, so an fp16 tensor never exists as a whole in f32. Keeps shape and dtype.
pub fn map_chunks(t: &Tensor, n: usize, f: impl Fn(&mut [f32]) + Sync + Send) -> Result<Tensor> {
    ensure!(
        n > 0 && t.elem_count().is_multiple_of(n),
        "rows of {n} do not tile {:?}",
        t.dims()
    );
    let rows_per_task = (CHUNK / n).max(1);
    let step = rows_per_task * n;
    match t.dtype() {
        DType::F16 => {
            let out = with_slice(t, |s: &[f16]| {
                let mut out = vec![f16::ZERO; s.len()];
                out.par_chunks_mut(step)
                    .zip(s.par_chunks(step))
                    .for_each(|(o, i)| {
                        let mut buf = vec![0f32; i.len()];
                        super::convert::f16_to_f32(i, &mut buf);
                        f(&mut buf);
                        super::convert::f32_to_f16(&buf, o);
                    });
                out
            })?;
            from_vec(out, t.dims())
        }
        DType::F32 => {
            let mut v = to_f32_vec(t)?;
            v.par_chunks_mut(step).for_each(&f);
            from_vec(v, t.dims())
        }
        d if is_float(d) => {
            let mut v = to_f32_vec(t)?;
            v.par_chunks_mut(step).for_each(&f);
            from_f32(v, t.dims(), d)
        }
        d => bail!("expected a float tensor, got {d:?}"),
    }
}

/// Converts `t` to `dtype` (fast parallel path between f16 and f32; a no-op when equal).
pub fn cast(t: &Tensor, dtype: DType) -> Result<Tensor> {
    if t.dtype() == dtype {
        return Ok(t.clone());
    }
    match (t.dtype(), dtype) {
        (DType::F16 | DType::BF16, DType::F32) => from_vec(to_f32_vec(t)?, t.dims()),
        // Converted straight from the storage (no f32 copy first: a decode step's logits
        // are 200 KB).
        (DType::F32, DType::F16) => {
            let v = with_slice(t, |s: &[f32]| {
                let mut out = vec![f16::ZERO; s.len()];
                convert_parts(s, &mut out, super::convert::f32_to_f16);
                out
            })?;
            from_vec(v, t.dims())
        }
        (DType::F32, DType::BF16) => {
            with_slice(t, |s: &[f32]| s.to_vec()).and_then(|v| from_f32(v, t.dims(), dtype))
        }
        _ => Ok(t.to_dtype(dtype)?),
    }
}

/// `t` as f32 (shares storage when it already is f32).
pub fn to_f32(t: &Tensor) -> Result<Tensor> {
    cast(t, DType::F32)
}

pub fn is_float(d: DType) -> bool {
    matches!(d, DType::F16 | DType::F32 | DType::F64 | DType::BF16)
}

/// The contiguous (row-major) strides of `shape`.
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Unpacks `n` codes of `bits` bits (1..=8) from a little-endian bit stream: code `i` sits
/// at bits `i*bits..(i+1)*bits` counted from the least significant bit of byte 0.
pub fn unpack_bits(packed: &[u8], bits: usize, n: usize) -> Result<Vec<u8>> {
    ensure!((1..=8).contains(&bits), "cannot unpack {bits}-bit codes");
    ensure!(
        packed.len() * 8 >= n * bits,
        "{n} codes of {bits} bits need {} bytes, have {}",
        (n * bits).div_ceil(8),
        packed.len()
    );
    if bits == 8 {
        return Ok(packed[..n].to_vec());
    }
    match bits {
        // Whole codes per byte, the first in the low bits: a byte at a time, which the
        // compiler vectorises (the general loop below costs about 2 ns a code: over a
        // second for a large-v3-turbo LUT4 encoder's codes).
        1 => return Ok(unpack_whole::<1, 8>(packed, n)),
        2 => return Ok(unpack_whole::<2, 4>(packed, n)),
        4 => return Ok(unpack_whole::<4, 2>(packed, n)),
        _ => {}
    }
    let mask = (1u16 << bits) - 1;
    Ok((0..n)
        .map(|i| {
            let bit = i * bits;
            let lo = u16::from(packed[bit / 8]);
            let hi = packed.get(bit / 8 + 1).copied().map_or(0, u16::from);
            (((lo | hi << 8) >> (bit % 8)) & mask) as u8
        })
        .collect())
}

/// [`unpack_bits`] for `BITS` dividing 8 (`PER` = 8 / `BITS` codes a byte); `packed` holds
/// at least ⌈n / PER⌉ bytes.
fn unpack_whole<const BITS: usize, const PER: usize>(packed: &[u8], n: usize) -> Vec<u8> {
    let bytes = n.div_ceil(PER);
    let mask = ((1u16 << BITS) - 1) as u8;
    let mut out = vec![0u8; bytes * PER];
    for (codes, &byte) in out.chunks_exact_mut(PER).zip(&packed[..bytes]) {
        for (t, c) in codes.iter_mut().enumerate() {
            *c = (byte >> (t * BITS)) & mask;
        }
    }
    out.truncate(n);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_round_trip_and_views() {
        let v: Vec<f32> = (0..40_000).map(|i| i as f32 * 0.25 - 5000.0).collect();
        let t = from_f32(v.clone(), &[200, 200], DType::F16).unwrap();
        let back = to_f32_vec(&t).unwrap();
        for (a, b) in v.iter().zip(&back) {
            assert_eq!(f16::from_f32(*a).to_f32(), *b);
        }
        // A transposed view is read in its logical order.
        let tt = t.t().unwrap();
        let r = to_f32_vec(&tt).unwrap();
        assert_eq!(r[1], back[200]);
    }

    /// From outside the pool a small conversion is one inline task (no fork, no wake-up)
    /// and a large one is split; inside the pool both are split; either way the values are
    /// those of the element-wise conversion.
    #[test]
    fn conversions_fork_only_where_forking_pays() {
        assert!(rayon::current_thread_index().is_none(), "a test thread");
        assert_eq!(chunk_for(51_864), 51_864);
        assert_eq!(chunk_for(0), 1);
        assert_eq!(chunk_for(OUTSIDE_POOL_MIN), CHUNK);
        assert_eq!(rayon::scope(|_| chunk_for(51_864)), CHUNK);
        for n in [51_864usize, OUTSIDE_POOL_MIN + 5] {
            let v: Vec<f32> = (0..n).map(|i| (i % 4001) as f32 * 0.37 - 700.0).collect();
            let want: Vec<f32> = v.iter().map(|&x| f16::from_f32(x).to_f32()).collect();
            let t = from_f32(v.clone(), &[n], DType::F16).unwrap();
            assert_eq!(to_f32_vec(&t).unwrap(), want, "{n} outside the pool");
            let inside = rayon::scope(|_| to_f32_vec(&t).unwrap());
            assert_eq!(inside, want, "{n} inside the pool");
            let back = cast(&from_vec(v, &[n]).unwrap(), DType::F16).unwrap();
            assert_eq!(to_f32_vec(&back).unwrap(), want, "{n} cast");
        }
    }

    #[test]
    fn unpack_lsb_first() {
        // uint3 [1..=7] packs to d1 58 1f; uint6 [1, 63, 32] to c1 0f 02.
        assert_eq!(
            unpack_bits(&[0xd1, 0x58, 0x1f], 3, 7).unwrap(),
            vec![1, 2, 3, 4, 5, 6, 7]
        );
        assert_eq!(
            unpack_bits(&[0xc1, 0x0f, 0x02], 6, 3).unwrap(),
            vec![1, 63, 32]
        );
        assert!(unpack_bits(&[0xff], 4, 3).is_err());
    }

    #[test]
    fn whole_codes_per_byte_unpack_as_the_bit_stream_reads() {
        // 1, 2 and 4 bits take a byte-at-a-time path: each code must be bits i·b.. of the
        // little-endian bit stream, also for counts that end inside a byte.
        let packed: Vec<u8> = (0..37u32).map(|i| (i * 89 + 17) as u8).collect();
        for bits in [1usize, 2, 4] {
            for n in [1, 7, 8, 9, 37 * 8 / bits - 3, 37 * 8 / bits] {
                let want: Vec<u8> = (0..n)
                    .map(|i| {
                        (0..bits)
                            .map(|b| {
                                ((packed[(i * bits + b) / 8] >> ((i * bits + b) % 8)) & 1) << b
                            })
                            .sum()
                    })
                    .collect();
                assert_eq!(
                    unpack_bits(&packed, bits, n).unwrap(),
                    want,
                    "{bits} bits, {n}"
                );
            }
        }
    }

    #[test]
    fn strides_row_major() {
        assert_eq!(strides(&[2, 3, 4]), vec![12, 4, 1]);
        assert!(strides(&[]).is_empty());
    }
}
