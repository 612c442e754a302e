//! `coremldata.bin` of a compiled ML Program: Core ML's `ModelDescription` protobuf (the
//! message a package's `model.mlmodel` holds as its `description`) behind a small header.
//! Apple documents no layout; this one is read off every `coremldata.bin` in
//! `../shared/compiled` (five, from coremlc 3404.23 to 3520.5; numbers little-endian):
//!
//! | bytes | what |
//! |---|---|
//! | 4 | `502`: the `Model.Type` field number of an ML Program (`mlProgram = 502`) |
//! | 4 | 5, or 9 in the iOS18 sample (not read; see [`coremldata_bytes`]) |
//! | 20 | zeros |
//! | 8 + n | `u64` n, then the model kind in n bytes: `generic` |
//! | 8 | `u64` the specification version (`metadata.json`'s `specificationVersion`) |
//! | 24 | zeros |
//! | 8 + m | `u64` m, then the `ModelDescription` in m bytes |
//! | 16 | `502` again (`u32`), then 12 zeros (not read) |
//!
//! The reader follows the two lengths and checks both `502`s, the bounds and that the
//! description decodes; anything else is an error naming the file, the offset and what was
//! found (a compiled folder then opens with `metadata.json` and the program alone).
//! `analytics/coremldata.bin` beside it is a different file (build details, a model hash)
//! and is neither read nor written. [`coremldata_bytes`] writes the same layout.

use super::fsio::LFS_POINTER;
use crate::proto::specification as spec;
use anyhow::{anyhow, bail, ensure, Context, Result};
use prost::Message;
use std::path::Path;

/// What a `coremldata.bin` holds.
#[derive(Clone, Debug, PartialEq)]
pub struct CoremlData {
    /// The model kind string of the header (`generic` in every sample).
    pub kind: String,
    /// The specification version the header records.
    pub spec_version: u64,
    pub description: spec::ModelDescription,
}

/// The `Model.Type` field number of an ML Program, which opens and closes the file.
const ML_PROGRAM_TAG: u32 = 502;
/// Bytes from the file's start to the model kind's length.
const KIND_AT: usize = 28;
/// Zero bytes between the specification version and the description's length.
const GAP: usize = 24;
/// The longest model kind read (the samples' is 7 bytes).
const MAX_KIND: u64 = 64;

struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8]> {
        let left = self.bytes.len() - self.at;
        let n = usize::try_from(n)
            .ok()
            .filter(|&n| n <= left)
            .ok_or_else(|| {
                anyhow!(
                    "at byte {}: {what} needs {n} bytes, the file has {left} left (truncated?)",
                    self.at
                )
            })?;
        let s = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes(b.try_into().expect("4 bytes")))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        let b = self.take(8, what)?;
        Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }
}

/// The model kind every sample's header names.
const KIND: &str = "generic";

/// The second header word for a specification version: 9 in the one sample of version 9
/// (iOS18, coremlc 3520), 5 in the four of versions 6 and 7 (coremlc 3404 and 3500).
/// Version 8 is in no sample; it is given 5. Its meaning is unknown: milkit's reader
/// ignores it, and what Core ML does with another value is unknown.
fn second_word(spec_version: u64) -> u32 {
    if spec_version >= 9 {
        9
    } else {
        5
    }
}

/// A `coremldata.bin` holding `description` (the layout of the module doc). The header of
/// every sample is rebuilt byte for byte from its specification version and description
/// (tests/compiled.rs).
pub fn coremldata_bytes(spec_version: u64, description: &spec::ModelDescription) -> Vec<u8> {
    let body = description.encode_to_vec();
    let mut b = Vec::with_capacity(body.len() + 100);
    b.extend(ML_PROGRAM_TAG.to_le_bytes());
    b.extend(second_word(spec_version).to_le_bytes());
    b.resize(KIND_AT, 0);
    b.extend((KIND.len() as u64).to_le_bytes());
    b.extend(KIND.as_bytes());
    b.extend(spec_version.to_le_bytes());
    b.resize(b.len() + GAP, 0);
    b.extend((body.len() as u64).to_le_bytes());
    b.extend(body);
    b.extend(ML_PROGRAM_TAG.to_le_bytes());
    b.resize(b.len() + 12, 0);
    b
}

/// Reads `coremldata.bin`'s bytes (see the module doc for the layout).
pub fn parse_coremldata(bytes: &[u8]) -> Result<CoremlData> {
    let mut c = Cursor { bytes, at: 0 };
    let tag = c.u32("the header")?;
    ensure!(
        tag == ML_PROGRAM_TAG,
        "starts with {tag}, not {ML_PROGRAM_TAG} (an ML Program's tag): not a compiled ML \
         Program's description"
    );
    c.take((KIND_AT - 4) as u64, "the header")?;
    let kind_at = c.at;
    let n = c.u64("the model kind's length")?;
    ensure!(
        n <= MAX_KIND,
        "at byte {kind_at}: a model kind of {n} bytes (at most {MAX_KIND} expected)"
    );
    let kind = std::str::from_utf8(c.take(n, "the model kind")?)
        .map_err(|_| anyhow!("at byte {}: the model kind is not UTF-8", kind_at + 8))?
        .to_string();
    let spec_version = c.u64("the specification version")?;
    c.take(GAP as u64, "the header")?;
    let len_at = c.at;
    let m = c.u64("the description's length")?;
    let body_at = c.at;
    let body = c.take(m, "the description")?;
    let end = c.u32("the closing tag")?;
    ensure!(
        end == ML_PROGRAM_TAG,
        "at byte {}: the description (length {m} at byte {len_at}) is followed by {end}, not \
         {ML_PROGRAM_TAG}",
        body_at + body.len()
    );
    let description = spec::ModelDescription::decode(body)
        .map_err(|e| anyhow!("the {m} bytes at byte {body_at} are not a ModelDescription: {e}"))?;
    Ok(CoremlData {
        kind,
        spec_version,
        description,
    })
}

/// Reads a compiled folder's `coremldata.bin`; `None` when the folder has none.
pub fn read_coremldata(dir: &Path) -> Result<Option<CoremlData>> {
    let file = dir.join("coremldata.bin");
    let bytes = match std::fs::read(&file) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", file.display())),
    };
    if bytes.starts_with(LFS_POINTER) {
        bail!(
            "{} is a Git LFS pointer, not the file (fetch it with `git lfs pull`)",
            file.display()
        );
    }
    match parse_coremldata(&bytes) {
        Ok(d) => Ok(Some(d)),
        Err(e) => bail!("{}: {e:#}", file.display()),
    }
}
