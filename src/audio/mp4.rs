//! The one thing Symphonia's MP4 reader leaves out that decoding needs: the audio track's
//! edit list (`moov/trak/edts/elst`), which says how many decoded samples at the start are
//! the encoder's priming (1024 for ffmpeg's AAC encoder, 2112 for Apple's) and how long the
//! presentation is, so that an M4A lines up with the audio it was made from, as ffmpeg and
//! AVFoundation play it. Only box headers and the few boxes named here are read; any
//! malformed box makes the edit list unknown (None), never an error of its own.
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// The presentation an edit list selects, in decoded samples at the track's media rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Edit {
    /// Samples to drop from the start (the first non-empty edit's media time).
    pub skip: u64,
    /// Samples to keep after that, when the edit states a duration.
    pub keep: Option<u64>,
}

/// A box: its type, where its payload starts and how long the payload is.
struct BoxHeader {
    kind: [u8; 4],
    start: u64,
    len: u64,
}

fn read_u32(f: &mut File) -> Option<u32> {
    let mut b = [0u8; 4];
    f.read_exact(&mut b).ok()?;
    Some(u32::from_be_bytes(b))
}

fn read_u64(f: &mut File) -> Option<u64> {
    let mut b = [0u8; 8];
    f.read_exact(&mut b).ok()?;
    Some(u64::from_be_bytes(b))
}

/// The boxes directly inside `[from, to)`.
fn children(f: &mut File, from: u64, to: u64) -> Option<Vec<BoxHeader>> {
    let mut out = Vec::new();
    let mut at = from;
    while at + 8 <= to && out.len() < 4096 {
        f.seek(SeekFrom::Start(at)).ok()?;
        let size = u64::from(read_u32(f)?);
        let mut kind = [0u8; 4];
        f.read_exact(&mut kind).ok()?;
        let (header, size) = match size {
            0 => (8, to - at),
            1 => (16, read_u64(f)?),
            s => (8, s),
        };
        if size < header || at.checked_add(size)? > to {
            return None;
        }
        out.push(BoxHeader {
            kind,
            start: at + header,
            len: size - header,
        });
        at += size;
    }
    Some(out)
}

fn find<'a>(boxes: &'a [BoxHeader], kind: &[u8; 4]) -> Option<&'a BoxHeader> {
    boxes.iter().find(|b| &b.kind == kind)
}

/// Reads a full box's payload (at most 1 MiB: the boxes read here are small).
fn payload(f: &mut File, b: &BoxHeader) -> Option<Vec<u8>> {
    if b.len > 1 << 20 {
        return None;
    }
    f.seek(SeekFrom::Start(b.start)).ok()?;
    let mut v = vec![0u8; b.len as usize];
    f.read_exact(&mut v).ok()?;
    Some(v)
}

fn be(b: &[u8], at: usize, n: usize) -> Option<u64> {
    let s = b.get(at..at + n)?;
    Some(s.iter().fold(0u64, |acc, &x| (acc << 8) | u64::from(x)))
}

/// A header box's timescale (`mvhd` or `mdhd`, versions 0 and 1).
fn timescale(b: &[u8]) -> Option<u64> {
    let at = if *b.first()? == 1 { 20 } else { 12 };
    be(b, at, 4).filter(|&t| t > 0)
}

/// The edit list of the first sound track of the MP4 file at `path`, converted to samples
/// at `rate` (the decoder's output rate); None when the file has none or it cannot be read.
pub fn audio_edit(path: &Path, rate: u32) -> Option<Edit> {
    let mut f = File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    let top = children(&mut f, 0, len)?;
    let moov = find(&top, b"moov")?;
    let moov_children = children(&mut f, moov.start, moov.start + moov.len)?;
    let movie_scale = timescale(&payload(&mut f, find(&moov_children, b"mvhd")?)?)?;
    for trak in moov_children.iter().filter(|b| &b.kind == b"trak") {
        let tk = children(&mut f, trak.start, trak.start + trak.len)?;
        let Some(mdia) = find(&tk, b"mdia") else {
            continue;
        };
        let md = children(&mut f, mdia.start, mdia.start + mdia.len)?;
        let hdlr = payload(&mut f, find(&md, b"hdlr")?)?;
        if hdlr.get(8..12) != Some(b"soun") {
            continue;
        }
        let media_scale = timescale(&payload(&mut f, find(&md, b"mdhd")?)?)?;
        let edts = find(&tk, b"edts")?;
        let ed = children(&mut f, edts.start, edts.start + edts.len)?;
        let elst = payload(&mut f, find(&ed, b"elst")?)?;
        let wide = *elst.first()? == 1;
        let entries = be(&elst, 4, 4)? as usize;
        let (dur_n, time_n) = if wide { (8, 8) } else { (4, 4) };
        let stride = dur_n + time_n + 4;
        for i in 0..entries.min(64) {
            let at = 8 + i * stride;
            let duration = be(&elst, at, dur_n)?;
            let raw = be(&elst, at + dur_n, time_n)?;
            // Media time −1 (all ones) is an empty edit: a pause before the media starts.
            let media_time = if wide {
                raw as i64
            } else {
                raw as u32 as i32 as i64
            };
            if media_time < 0 {
                continue;
            }
            let to_samples = |v: u64, scale: u64| {
                u64::try_from(u128::from(v) * u128::from(rate) / u128::from(scale)).ok()
            };
            return Some(Edit {
                skip: to_samples(media_time as u64, media_scale)?,
                keep: if duration == 0 {
                    None
                } else {
                    to_samples(duration, movie_scale)
                },
            });
        }
        return None;
    }
    None
}
