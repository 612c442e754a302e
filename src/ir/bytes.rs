//! Cheaply clonable, immutable byte storage for tensor data: owned (`Arc<Vec<u8>>`) or a window
//! into a memory-mapped file, so multi-gigabyte checkpoints flow into packages without copies.

use std::ops::Range;
use std::sync::Arc;

/// Immutable bytes shared by reference count. Cloning never copies the data.
#[derive(Clone)]
pub struct Bytes {
    inner: Inner,
    range: Range<usize>,
}

#[derive(Clone)]
enum Inner {
    Owned(Arc<Vec<u8>>),
    Mapped(Arc<memmap2::Mmap>),
}

impl Bytes {
    /// Takes ownership of a vector.
    pub fn from_vec(v: Vec<u8>) -> Bytes {
        let len = v.len();
        Bytes {
            inner: Inner::Owned(Arc::new(v)),
            range: 0..len,
        }
    }

    /// A window `range` of a mapped file. Errors when the range is out of bounds.
    pub fn from_mmap(map: Arc<memmap2::Mmap>, range: Range<usize>) -> anyhow::Result<Bytes> {
        anyhow::ensure!(
            range.start <= range.end && range.end <= map.len(),
            "byte range {}..{} outside a mapped file of {} bytes",
            range.start,
            range.end,
            map.len()
        );
        Ok(Bytes {
            inner: Inner::Mapped(map),
            range,
        })
    }

    /// Copies little-endian `f16` values.
    pub fn from_f16(v: &[half::f16]) -> Bytes {
        Bytes::from_vec(bytemuck::cast_slice(v).to_vec())
    }

    /// Copies little-endian `f32` values.
    pub fn from_f32(v: &[f32]) -> Bytes {
        Bytes::from_vec(bytemuck::cast_slice(v).to_vec())
    }

    /// A sub-window; errors when out of bounds.
    pub fn slice(&self, range: Range<usize>) -> anyhow::Result<Bytes> {
        anyhow::ensure!(
            range.start <= range.end && range.end <= self.len(),
            "slice {}..{} of {} bytes",
            range.start,
            range.end,
            self.len()
        );
        Ok(Bytes {
            inner: self.inner.clone(),
            range: self.range.start + range.start..self.range.start + range.end,
        })
    }

    pub fn len(&self) -> usize {
        self.range.len()
    }

    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }

    pub fn as_slice(&self) -> &[u8] {
        match &self.inner {
            Inner::Owned(v) => &v[self.range.clone()],
            Inner::Mapped(m) => &m[self.range.clone()],
        }
    }

    /// Whether the bytes are a window of a mapped file.
    pub fn is_mapped(&self) -> bool {
        matches!(self.inner, Inner::Mapped(_))
    }

    /// Drops the whole pages of this window of a mapped file from the process's resident
    /// set (Linux `madvise(MADV_DONTNEED)`); the data stays in the page cache and is read
    /// back on the next access, so nothing changes but memory use. A runtime that copies a
    /// weight out of the mapping calls this so the weight is not resident twice. Does
    /// nothing for owned bytes or elsewhere than Linux.
    pub fn release_pages(&self) {
        #[cfg(target_os = "linux")]
        if let Inner::Mapped(m) = &self.inner {
            const PAGE: usize = 4096;
            let base = m.as_ptr() as usize;
            let start = (base + self.range.start).next_multiple_of(PAGE);
            let end = (base + self.range.end) / PAGE * PAGE;
            if end > start {
                // SAFETY: the range lies inside a read-only file mapping that
                // `m` keeps alive; dropping its pages never changes what a later read
                // sees (they are faulted in again from the file), and a failure is
                // harmless.
                unsafe {
                    libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED)
                };
            }
        }
    }

    /// Decodes little-endian f16 values (copying, since the window may be unaligned).
    pub fn to_f16_vec(&self) -> Vec<half::f16> {
        self.as_slice()
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]))
            .collect()
    }

    /// Decodes little-endian f32 values.
    pub fn to_f32_vec(&self) -> Vec<f32> {
        self.as_slice()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl std::fmt::Debug for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bytes({} bytes)", self.len())
    }
}

impl PartialEq for Bytes {
    fn eq(&self, other: &Bytes) -> bool {
        self.as_slice() == other.as_slice()
    }
}
