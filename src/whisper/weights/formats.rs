//! Low-level readers for `weights.rs`: mapping and validating safetensors files, fp16
//! conversion, page release, and reading tensors from a PyTorch zip checkpoint.

use super::StoredDType;
use crate::ir::Bytes;
use anyhow::{bail, ensure, Context, Result};
use half::f16;
use rayon::prelude::*;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

pub(super) type MappedTensor = (String, StoredDType, Vec<usize>, Range<usize>);

/// Maps a safetensors file and validates its header, with messages that name the file and
/// say what is wrong (the crate's own errors are terse).
pub(super) fn map_safetensors(path: &Path) -> Result<(Arc<memmap2::Mmap>, Vec<MappedTensor>)> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    // SAFETY: the map is read-only; like every mmap reader we assume the checkpoint is not
    // modified while it is open.
    let map = unsafe { memmap2::Mmap::map(&file) }
        .with_context(|| format!("cannot memory-map {}", path.display()))?;
    let len = map.len();
    ensure!(
        len >= 8,
        "{}: file of {len} bytes is too short for a safetensors header",
        path.display()
    );
    let mut n_bytes = [0u8; 8];
    n_bytes.copy_from_slice(&map[..8]);
    let n = u64::from_le_bytes(n_bytes);
    ensure!(
        n <= (len - 8) as u64,
        "{}: header length {n} is larger than the file ({len} bytes): truncated or not a \
         safetensors file",
        path.display()
    );
    let (n, meta) = match safetensors::SafeTensors::read_metadata(&map) {
        Ok(v) => v,
        Err(safetensors::SafeTensorError::MetadataIncompleteBuffer) => {
            let have = len - 8 - n as usize;
            let declared = declared_data_len(&map[8..8 + n as usize]);
            bail!(
                "{}: truncated or corrupt: the header declares {declared} bytes of tensor data \
                 but the file holds {have}",
                path.display()
            )
        }
        Err(e) => bail!("{}: invalid safetensors header: {e}", path.display()),
    };
    let start = 8 + n;
    let tensors = meta
        .tensors()
        .into_iter()
        .map(|(name, info)| {
            let (s, e) = info.data_offsets;
            let dtype = StoredDType::from_safetensors(info.dtype);
            (name, dtype, info.shape.clone(), start + s..start + e)
        })
        .collect();
    Ok((Arc::new(map), tensors))
}

/// The largest end offset in a safetensors header (for the truncation message only).
fn declared_data_len(header: &[u8]) -> usize {
    let json: serde_json::Value = serde_json::from_slice(header).unwrap_or_default();
    json.as_object()
        .into_iter()
        .flat_map(|m| m.values())
        .filter_map(|t| t.get("data_offsets")?.get(1)?.as_u64())
        .max()
        .unwrap_or(0) as usize
}

/// Converts `N`-byte little-endian floats to fp16 bytes (round to nearest even), in
/// parallel chunks; a finite value beyond fp16's range is an error, not a silent infinity.
pub(super) fn convert<const N: usize>(
    raw: &[u8],
    decode: impl Fn([u8; N]) -> f32 + Sync,
) -> Result<Bytes> {
    const CHUNK: usize = 1 << 16;
    let count = raw.len() / N;
    let mut out = vec![0u8; count * 2];
    out.par_chunks_mut(CHUNK * 2)
        .zip(raw.par_chunks(CHUNK * N))
        .try_for_each(|(dst, src)| {
            for (d, s) in dst.chunks_exact_mut(2).zip(src.chunks_exact(N)) {
                let mut b = [0u8; N];
                b.copy_from_slice(s);
                let v = decode(b);
                let h = f16::from_f32(v);
                if v.is_finite() && !h.is_finite() {
                    bail!("value {v} overflows fp16 (max 65504)");
                }
                d.copy_from_slice(&h.to_le_bytes());
            }
            Ok(())
        })?;
    Ok(Bytes::from_vec(out))
}

/// f64 → f32 keeping finite values finite, so that the fp16 overflow check still fires.
pub(super) fn f64_to_f32(x: f64) -> f32 {
    if x.is_finite() {
        x.clamp(-(f32::MAX as f64), f32::MAX as f64) as f32
    } else {
        x as f32
    }
}

/// Drops the mapped pages of a tensor that was just converted (we hold its fp16 copy), so
/// converting an fp32 checkpoint does not keep the whole file resident. Pages are clean and
/// file-backed, so anything still reading them simply faults them back in.
pub(super) fn release_pages(map: &memmap2::Mmap, range: &Range<usize>) {
    #[cfg(unix)]
    {
        // SAFETY: the map is read-only and file-backed, so MADV_DONTNEED only discards clean
        // page-cache copies; later reads see the same file contents.
        let _ = unsafe {
            map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, range.start, range.len())
        };
    }
    #[cfg(not(unix))]
    let _ = (map, range);
}

pub(super) fn read_pickled(
    pth: &candle_core::pickle::PthTensors,
    key: &str,
    dtype: &StoredDType,
) -> Result<Bytes> {
    let t = pth
        .get(key)?
        .context("listed in the state dict but not readable")?;
    // flatten_all also makes Fortran-ordered (transposed) storage row-major.
    let t = t.flatten_all()?;
    if *dtype == StoredDType::F16 {
        return Ok(Bytes::from_f16(&t.to_vec1::<f16>()?));
    }
    let v = t.to_dtype(candle_core::DType::F32)?.to_vec1::<f32>()?;
    convert::<4>(bytemuck::cast_slice(&v), f32::from_le_bytes)
}

/// Deflate's largest expansion (a run of one byte compresses about 1032:1): an entry whose
/// declared size exceeds its compressed size by more than this is lying about its length.
const DEFLATE_MAX_RATIO: u64 = 1032;

/// Checks every tensor a PyTorch zip checkpoint's pickle declares against the storage entry
/// it points at, before anything is allocated for it: the element count must not overflow,
/// and offset plus bytes must lie inside the entry, whose own declared size must be one the
/// file can hold. Errors name the file and the tensor.
pub(super) fn check_pickled(
    path: &Path,
    infos: &std::collections::HashMap<String, candle_core::pickle::TensorInfo>,
) -> Result<()> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let file_len = file
        .metadata()
        .with_context(|| format!("cannot stat {}", path.display()))?
        .len();
    let mut zip = zip::ZipArchive::new(std::io::BufReader::new(file))
        .with_context(|| format!("{}: not a readable zip archive", path.display()))?;
    let mut names: Vec<&String> = infos.keys().collect();
    names.sort();
    for name in names {
        let info = &infos[name];
        let what = || format!("{}: tensor {name}", path.display());
        let dims = info.layout.dims();
        let elems = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
            .with_context(|| format!("{}: shape {dims:?} overflows its element count", what()))?;
        let bytes = elems
            .checked_mul(info.dtype.size_in_bytes() as u64)
            .with_context(|| format!("{}: shape {dims:?} overflows its byte count", what()))?;
        let start = info.layout.start_offset() as u64;
        let end = start.checked_add(bytes).with_context(|| {
            format!(
                "{}: storage offset {start} + {bytes} bytes overflows",
                what()
            )
        })?;
        let entry = zip.by_name(&info.path).with_context(|| {
            format!(
                "{}: its storage {} is not in the archive",
                what(),
                info.path
            )
        })?;
        let (size, packed) = (entry.size(), entry.compressed_size());
        let stored = entry.compression() == zip::CompressionMethod::Stored;
        ensure!(
            if stored {
                size <= file_len
            } else {
                size <= packed.saturating_mul(DEFLATE_MAX_RATIO)
            },
            "{}: its storage {} declares {size} bytes, more than the {file_len}-byte file \
             can hold",
            what(),
            info.path
        );
        ensure!(
            end <= size,
            "{}: shape {dims:?} ({:?}) at byte offset {start} needs bytes {start}..{end} of \
             its storage {}, which holds {size} bytes",
            what(),
            info.dtype,
            info.path
        );
    }
    Ok(())
}
