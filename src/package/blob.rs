//! MIL blob storage, version 2: the `weights/weight.bin` file of an `.mlpackage`. Owns the
//! on-disk layout, a streaming writer, and a validating memory-mapped reader.
//!
//! # Layout (all integers little-endian)
//!
//! Learned by writing blobs of every dtype with coremltools 9's `_BlobStorageWriter` and
//! reading the bytes back, and by dumping the headers of coremltools-made packages.
//!
//! File header, 64 bytes at offset 0:
//!
//! | bytes  | field                                  |
//! |--------|----------------------------------------|
//! | 0..4   | `u32` number of blobs                  |
//! | 4..8   | `u32` format version, always 2         |
//! | 8..64  | reserved, zero                         |
//!
//! Then, per blob, in append order: zero padding up to the next multiple of 64, a 64-byte
//! metadata record, and the data, which starts right after the record (so it is 64-aligned):
//!
//! | bytes  | field                                                              |
//! |--------|--------------------------------------------------------------------|
//! | 0..4   | `u32` sentinel `0xDEADBEEF`                                         |
//! | 4..8   | `u32` dtype code ([`BlobDType::code`])                              |
//! | 8..16  | `u64` data size in bytes                                           |
//! | 16..24 | `u64` absolute file offset of the data (= record offset + 64)      |
//! | 24..32 | `u64` padding bits: unused bits in the last byte of a sub-byte blob |
//! | 32..64 | reserved, zero                                                     |
//!
//! A `BlobFileValue.offset` in the program is the offset of the *metadata record*. The file
//! ends right after the last blob's data (no trailing padding). An empty blob occupies only its
//! record, so the next record starts where its (empty) data would. Files written before iOS 18
//! may carry garbage in the reserved words and, for whole-byte dtypes, in the padding word, so
//! the reader ignores those.
//!
//! # Sub-byte dtypes
//!
//! `I4`, `U1`, `U2`, `U3`, `U4`, `U6` are bit-packed as one little-endian bit stream: element
//! `i` occupies bits `i*b .. (i+1)*b` counted from the least significant bit of byte 0 (so for
//! 4-bit types element 0 is the low nibble of byte 0; 3- and 6-bit elements straddle bytes).
//! A blob of `n` elements of `b` bits occupies `ceil(n*b / 8)` bytes; the padding field holds
//! `(8 - n*b % 8) % 8`. `I4` stores two's complement nibbles. Observed: uint4 `[1,2,3]` →
//! `21 03`, int4 `[-1,2,-3]` → `2f 0d`, uint3 `[1..=7]` → `d1 58 1f`, uint6 `[1,63,32]` →
//! `c1 0f 02`, uint1 `[1,0,1,1,0,0,0,0,1,1]` → `0d 03`.

use anyhow::{ensure, Context, Result};
use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::ir::Bytes;

/// Size of the file header and of each metadata record; also the data alignment.
pub const ALIGNMENT: u64 = 64;
/// Marks a valid metadata record.
pub const SENTINEL: u32 = 0xDEAD_BEEF;
/// The only storage format version this module reads or writes.
pub const VERSION: u32 = 2;

/// Element type of a blob, with Apple's `BlobDataType` codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlobDType {
    F16,
    F32,
    U8,
    I8,
    BF16,
    I16,
    U16,
    I4,
    U1,
    U2,
    U4,
    U3,
    U6,
    I32,
    U32,
    F8E4M3FN,
    F8E5M2,
}

impl BlobDType {
    /// Every dtype, in code order.
    pub const ALL: [BlobDType; 17] = [
        BlobDType::F16,
        BlobDType::F32,
        BlobDType::U8,
        BlobDType::I8,
        BlobDType::BF16,
        BlobDType::I16,
        BlobDType::U16,
        BlobDType::I4,
        BlobDType::U1,
        BlobDType::U2,
        BlobDType::U4,
        BlobDType::U3,
        BlobDType::U6,
        BlobDType::I32,
        BlobDType::U32,
        BlobDType::F8E4M3FN,
        BlobDType::F8E5M2,
    ];

    /// The code stored in the metadata record (Apple's `BlobDataType`, 1-based, stable).
    pub fn code(self) -> u32 {
        match self {
            BlobDType::F16 => 1,
            BlobDType::F32 => 2,
            BlobDType::U8 => 3,
            BlobDType::I8 => 4,
            BlobDType::BF16 => 5,
            BlobDType::I16 => 6,
            BlobDType::U16 => 7,
            BlobDType::I4 => 8,
            BlobDType::U1 => 9,
            BlobDType::U2 => 10,
            BlobDType::U4 => 11,
            BlobDType::U3 => 12,
            BlobDType::U6 => 13,
            BlobDType::I32 => 14,
            BlobDType::U32 => 15,
            BlobDType::F8E4M3FN => 16,
            BlobDType::F8E5M2 => 17,
        }
    }

    /// Inverse of [`code`](Self::code); `None` for unknown codes.
    pub fn from_code(code: u32) -> Option<BlobDType> {
        BlobDType::ALL.iter().copied().find(|d| d.code() == code)
    }

    /// Width of one element in bits.
    pub fn bits(self) -> u32 {
        match self {
            BlobDType::U1 => 1,
            BlobDType::U2 => 2,
            BlobDType::U3 => 3,
            BlobDType::I4 | BlobDType::U4 => 4,
            BlobDType::U6 => 6,
            BlobDType::U8 | BlobDType::I8 | BlobDType::F8E4M3FN | BlobDType::F8E5M2 => 8,
            BlobDType::F16 | BlobDType::BF16 | BlobDType::I16 | BlobDType::U16 => 16,
            BlobDType::F32 | BlobDType::I32 | BlobDType::U32 => 32,
        }
    }

    /// Whether elements are bit-packed (narrower than a byte).
    pub fn is_sub_byte(self) -> bool {
        self.bits() < 8
    }

    /// Bytes occupied by `n` elements: `ceil(n * bits / 8)`. `None` on overflow.
    pub fn byte_len(self, n: u64) -> Option<u64> {
        Some(n.checked_mul(u64::from(self.bits()))?.div_ceil(8))
    }

    /// The padding-bits value the writer stores for `n` elements.
    pub fn padding_bits(self, n: u64) -> u64 {
        let rem = (n % 8) * u64::from(self.bits()) % 8;
        (8 - rem) % 8
    }
}

/// Packs unsigned codes (each below `2^bits`) of a sub-byte dtype LSB-first.
/// For `I4` pass the two's complement nibble (`v as u8 & 0xF`) or use [`pack_i4`].
pub fn pack_sub_byte(dtype: BlobDType, codes: &[u8]) -> Result<Vec<u8>> {
    ensure!(dtype.is_sub_byte(), "{dtype:?} is not a sub-byte dtype");
    let bits = dtype.bits() as usize;
    let mut out = vec![0u8; (codes.len() * bits).div_ceil(8)];
    for (i, &c) in codes.iter().enumerate() {
        ensure!(
            u32::from(c) >> bits == 0,
            "value {c} at index {i} does not fit in {bits} bits ({dtype:?})"
        );
        let bit = i * bits;
        // Up to 16 bits wide window: a 3- or 6-bit element may straddle two bytes.
        let v = u16::from(c) << (bit % 8);
        out[bit / 8] |= v as u8;
        if bit % 8 + bits > 8 {
            out[bit / 8 + 1] |= (v >> 8) as u8;
        }
    }
    Ok(out)
}

/// Unpacks `n` unsigned codes of a sub-byte dtype (inverse of [`pack_sub_byte`]).
pub fn unpack_sub_byte(dtype: BlobDType, packed: &[u8], n: usize) -> Result<Vec<u8>> {
    ensure!(dtype.is_sub_byte(), "{dtype:?} is not a sub-byte dtype");
    let bits = dtype.bits() as usize;
    ensure!(
        packed.len() * 8 >= n * bits,
        "{n} elements of {dtype:?} need {} bytes, have {}",
        (n * bits).div_ceil(8),
        packed.len()
    );
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

/// Packs signed 4-bit values (-8..=7).
pub fn pack_i4(values: &[i8]) -> Result<Vec<u8>> {
    let mut codes = Vec::with_capacity(values.len());
    for (i, &v) in values.iter().enumerate() {
        ensure!(
            (-8..=7).contains(&v),
            "int4 value {v} at index {i} is outside -8..=7"
        );
        codes.push(v as u8 & 0xF);
    }
    pack_sub_byte(BlobDType::I4, &codes)
}

/// Unpacks `n` signed 4-bit values.
pub fn unpack_i4(packed: &[u8], n: usize) -> Result<Vec<i8>> {
    Ok(unpack_sub_byte(BlobDType::I4, packed, n)?
        .into_iter()
        .map(|c| ((c << 4) as i8) >> 4)
        .collect())
}

fn header_bytes(count: u32) -> [u8; 64] {
    let mut h = [0u8; 64];
    h[0..4].copy_from_slice(&count.to_le_bytes());
    h[4..8].copy_from_slice(&VERSION.to_le_bytes());
    h
}

/// Writes a blob storage file front to back. Blob data is streamed through, never held, so
/// multi-gigabyte weight files need no memory; the header's blob count is patched by
/// [`finish`](Self::finish), which must be called (dropping the writer leaves count 0).
pub struct BlobWriter<W: Write + Seek = BufWriter<File>> {
    out: W,
    /// Bytes written so far (= current end of file).
    pos: u64,
    count: u32,
    name: String,
}

impl BlobWriter<BufWriter<File>> {
    /// Creates (truncates) `path` and writes the header.
    pub fn create(path: &Path) -> Result<Self> {
        let file =
            File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
        BlobWriter::from_writer(BufWriter::with_capacity(1 << 20, file), path.display())
    }
}

impl BlobWriter<std::io::Cursor<Vec<u8>>> {
    /// An in-memory writer; get the bytes with [`finish`](Self::finish) + `into_inner`.
    pub fn new() -> Self {
        let mut cursor = std::io::Cursor::new(header_bytes(0).to_vec());
        cursor.set_position(ALIGNMENT);
        BlobWriter {
            out: cursor,
            pos: ALIGNMENT,
            count: 0,
            name: "<memory>".into(),
        }
    }
}

impl Default for BlobWriter<std::io::Cursor<Vec<u8>>> {
    fn default() -> Self {
        Self::new()
    }
}

impl<W: Write + Seek> BlobWriter<W> {
    /// Wraps an empty seekable stream; `name` is used in error messages.
    pub fn from_writer(mut out: W, name: impl std::fmt::Display) -> Result<Self> {
        let name = name.to_string();
        out.write_all(&header_bytes(0))
            .with_context(|| format!("{name}: cannot write the blob storage header"))?;
        Ok(BlobWriter {
            out,
            pos: ALIGNMENT,
            count: 0,
            name,
        })
    }

    /// Number of blobs appended so far.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Appends a blob of a whole-byte dtype (`data.len()` must be a multiple of the element
    /// size). Returns the offset to store in `BlobFileValue.offset`.
    pub fn append(&mut self, dtype: BlobDType, data: &[u8]) -> Result<u64> {
        ensure!(
            !dtype.is_sub_byte(),
            "{}: {dtype:?} is bit-packed; use append_sub_byte with the element count",
            self.name
        );
        let elem = (dtype.bits() / 8) as usize;
        ensure!(
            data.len().is_multiple_of(elem),
            "{}: {} bytes is not a whole number of {dtype:?} elements",
            self.name,
            data.len()
        );
        self.append_raw(dtype, data, 0)
    }

    /// Appends `n` bit-packed elements of a sub-byte dtype (see [`pack_sub_byte`]);
    /// `packed.len()` must be exactly `ceil(n * bits / 8)`.
    pub fn append_sub_byte(&mut self, dtype: BlobDType, n: u64, packed: &[u8]) -> Result<u64> {
        ensure!(
            dtype.is_sub_byte(),
            "{}: {dtype:?} is not a sub-byte dtype",
            self.name
        );
        ensure!(
            dtype.byte_len(n) == Some(packed.len() as u64),
            "{}: {n} elements of {dtype:?} occupy {:?} bytes, got {}",
            self.name,
            dtype.byte_len(n),
            packed.len()
        );
        self.append_raw(dtype, packed, dtype.padding_bits(n))
    }

    fn append_raw(&mut self, dtype: BlobDType, data: &[u8], padding_bits: u64) -> Result<u64> {
        let ctx = || format!("{}: cannot append blob {}", self.name, self.count);
        let count = self
            .count
            .checked_add(1)
            .context("more than u32::MAX blobs")?;
        let meta_offset = self.pos.next_multiple_of(ALIGNMENT);
        let gap = (meta_offset - self.pos) as usize;
        let data_offset = meta_offset + ALIGNMENT;
        let mut meta = [0u8; 64];
        meta[0..4].copy_from_slice(&SENTINEL.to_le_bytes());
        meta[4..8].copy_from_slice(&dtype.code().to_le_bytes());
        meta[8..16].copy_from_slice(&(data.len() as u64).to_le_bytes());
        meta[16..24].copy_from_slice(&data_offset.to_le_bytes());
        meta[24..32].copy_from_slice(&padding_bits.to_le_bytes());
        self.out.write_all(&[0u8; 64][..gap]).with_context(ctx)?;
        self.out.write_all(&meta).with_context(ctx)?;
        self.out.write_all(data).with_context(ctx)?;
        self.pos = data_offset + data.len() as u64;
        self.count = count;
        Ok(meta_offset)
    }

    /// Patches the blob count into the header and flushes. Returns the stream and the file
    /// length. For files, fsync is left to the caller (see `fsio`).
    pub fn finish(mut self) -> Result<(W, u64)> {
        let ctx = || format!("{}: cannot finish blob storage", self.name);
        self.out.seek(SeekFrom::Start(0)).with_context(ctx)?;
        self.out
            .write_all(&header_bytes(self.count))
            .with_context(ctx)?;
        self.out.seek(SeekFrom::Start(self.pos)).with_context(ctx)?;
        self.out.flush().with_context(ctx)?;
        Ok((self.out, self.pos))
    }
}

/// One blob as found in the file.
#[derive(Clone, Debug)]
pub struct Blob {
    pub dtype: BlobDType,
    /// The stored bytes (bit-packed for sub-byte dtypes), a window into the mapping.
    pub data: Bytes,
    /// Unused trailing bits (sub-byte dtypes only; 0 otherwise).
    pub padding_bits: u64,
}

impl Blob {
    /// Number of elements the blob holds.
    pub fn num_elements(&self) -> u64 {
        (self.data.len() as u64 * 8 - self.padding_bits) / u64::from(self.dtype.bits())
    }
}

/// Reads a blob storage file through a memory map, validating every record it is asked for.
pub struct BlobReader {
    path: PathBuf,
    map: Arc<memmap2::Mmap>,
    count: u32,
}

impl BlobReader {
    /// Maps `path` and checks the header.
    pub fn open(path: &Path) -> Result<BlobReader> {
        let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        let len = file
            .metadata()
            .with_context(|| format!("cannot stat {}", path.display()))?
            .len();
        ensure!(
            len >= ALIGNMENT,
            "{}: {len} bytes is too short for a blob storage file (64-byte header)",
            path.display()
        );
        // SAFETY: the mapping is read-only; like every reader of weight files we assume the
        // file is not truncated or rewritten while mapped (packages are written atomically).
        let map = unsafe { memmap2::Mmap::map(&file) }
            .with_context(|| format!("cannot map {}", path.display()))?;
        let version = read_u32(&map, 4);
        ensure!(
            version == VERSION,
            "{}: blob storage version {version}, only version {VERSION} is supported",
            path.display()
        );
        let count = read_u32(&map, 0);
        Ok(BlobReader {
            path: path.to_path_buf(),
            map: Arc::new(map),
            count,
        })
    }

    /// The file this reader maps.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Blob count from the header.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The dtype and bytes of the blob whose metadata record is at `offset`.
    pub fn read(&self, offset: u64) -> Result<(BlobDType, Bytes)> {
        let blob = self.read_blob(offset)?;
        Ok((blob.dtype, blob.data))
    }

    /// The blob whose metadata record is at `offset`, fully validated.
    pub fn read_blob(&self, offset: u64) -> Result<Blob> {
        let file_len = self.map.len() as u64;
        let fail = |msg: String| -> anyhow::Error {
            anyhow::anyhow!("{}: blob at offset {offset}: {msg}", self.path.display())
        };
        if offset < ALIGNMENT {
            return Err(fail("offset lies inside the 64-byte file header".into()));
        }
        if !offset.is_multiple_of(ALIGNMENT) {
            return Err(fail("offset is not a multiple of 64".into()));
        }
        if offset
            .checked_add(ALIGNMENT)
            .is_none_or(|end| end > file_len)
        {
            return Err(fail(format!(
                "metadata record runs past the end of the file ({file_len} bytes)"
            )));
        }
        let o = offset as usize;
        let sentinel = read_u32(&self.map, o);
        if sentinel != SENTINEL {
            return Err(fail(format!("sentinel {sentinel:#010x} is not 0xdeadbeef")));
        }
        let code = read_u32(&self.map, o + 4);
        let dtype = BlobDType::from_code(code)
            .ok_or_else(|| fail(format!("unknown blob dtype code {code}")))?;
        let size = read_u64(&self.map, o + 8);
        let data_offset = read_u64(&self.map, o + 16);
        if data_offset < offset + ALIGNMENT {
            return Err(fail(format!(
                "data offset {data_offset} overlaps the header or the metadata record"
            )));
        }
        let end = data_offset
            .checked_add(size)
            .filter(|&end| end <= file_len)
            .ok_or_else(|| {
                fail(format!(
                    "data {data_offset}+{size} bytes runs past the end of the file ({file_len} bytes)"
                ))
            })?;
        let padding_bits = if dtype.is_sub_byte() {
            let p = read_u64(&self.map, o + 24);
            if p >= 8 || (size == 0 && p != 0) {
                return Err(fail(format!("invalid padding of {p} bits")));
            }
            if !(size * 8 - p).is_multiple_of(u64::from(dtype.bits())) {
                return Err(fail(format!(
                    "{size} bytes minus {p} padding bits is not a whole number of {dtype:?} elements"
                )));
            }
            p
        } else {
            if !size.is_multiple_of(u64::from(dtype.bits() / 8)) {
                return Err(fail(format!(
                    "{size} bytes is not a whole number of {dtype:?} elements"
                )));
            }
            0
        };
        let data = Bytes::from_mmap(self.map.clone(), data_offset as usize..end as usize)
            .map_err(|e| fail(e.to_string()))?;
        Ok(Blob {
            dtype,
            data,
            padding_bits,
        })
    }

    /// Offsets of all blobs, found by walking the records from the header on (as Core ML
    /// does); every record is validated.
    pub fn offsets(&self) -> Result<Vec<u64>> {
        let mut out = Vec::with_capacity(self.count.min(1 << 16) as usize);
        let mut next = ALIGNMENT;
        for _ in 0..self.count {
            let blob = self.read_blob(next)?;
            out.push(next);
            let data_offset = read_u64(&self.map, next as usize + 16);
            next = (data_offset + blob.data.len() as u64).next_multiple_of(ALIGNMENT);
        }
        Ok(out)
    }
}

fn read_u32(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

fn read_u64(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}
