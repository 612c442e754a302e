//! Audio files of every common container and codec, decoded to mono f32 at the file's own
//! rate: WAV (every PCM/float/extensible variant, read with hound), FLAC, MP3, Ogg (Vorbis,
//! Opus, FLAC), WebM/Matroska (Opus, Vorbis, FLAC, AAC, MP3), MP4/M4A (AAC-LC, ALAC), read
//! with Symphonia; Opus packets are decoded by the
//! pure-Rust `opus-decoder` (Symphonia has no Opus codec). The container is recognised by its
//! bytes, the file name only hints. Encoder delay and padding are removed where the file
//! states them (MP3's LAME tag, Vorbis and Opus granule positions, Opus pre-skip, MP4 edit
//! lists: `mp4`), so the samples line up with the source the file was made from. Channels are averaged in f64.
//!
//! Nothing here knows about Whisper: resampling to its 16 kHz is `whisper::audio`'s job.
//! Every failure is an error naming the file and what is wrong with it (not audio, an
//! unsupported codec, a truncated stream); nothing panics on hostile bytes (fuzzed by
//! `fuzzing::audio`).
mod mp4;

use crate::report::AudioInfo;
use anyhow::{ensure, Context, Result};
use std::fs::File;
use std::io::{ErrorKind, Read};
use std::path::Path;
use symphonia::core::codecs::{CodecType, DecoderOptions, CODEC_TYPE_NULL, CODEC_TYPE_OPUS};
use symphonia::core::errors::Error as SymphoniaError;
use symphonia::core::formats::{FormatOptions, FormatReader, Packet, Track};
use symphonia::core::io::MediaSourceStream;
use symphonia::core::meta::MetadataOptions;
use symphonia::core::probe::Hint;

/// What `decode` supports, for error messages and `--help`.
pub const SUPPORTED: &str = "WAV (PCM 8/16/24/32-bit, float 32), FLAC, MP3, Ogg (Vorbis, \
                             Opus, FLAC), WebM/Matroska (Opus, Vorbis, FLAC, AAC, MP3), \
                             M4A/MP4 (AAC-LC, ALAC)";

/// Bounds that keep a corrupt header from asking for absurd work.
const MAX_RATE: u32 = 1_000_000;
const MAX_CHANNELS: usize = 255;

/// A decoded file: mono samples at `info.sample_rate`, in [-1, 1] for integer sources.
#[derive(Debug, Clone)]
pub struct Decoded {
    pub samples: Vec<f32>,
    pub info: AudioInfo,
}

/// Decodes `path` to mono f32 at the file's own rate.
pub fn decode(path: impl AsRef<Path>) -> Result<Decoded> {
    let path = path.as_ref();
    let mut head = [0u8; 12];
    let n = File::open(path)
        .and_then(|mut f| read_up_to(&mut f, &mut head))
        .with_context(|| format!("{}: cannot read the audio file", path.display()))?;
    if n == 12 && &head[..4] == b"RIFF" && &head[8..12] == b"WAVE" {
        let hound_error = match decode_wav(path) {
            Ok(Some(d)) => return Ok(d),
            Ok(None) => None,
            Err(WavError::Header(e)) => Some(e),
            Err(WavError::Data(e)) => return Err(e),
        };
        // µ-law, A-law, ADPCM, 64-bit float, ...: Symphonia's WAV reader.
        decode_symphonia(path, &head[..n]).map_err(|e| match wav_format_tag(path) {
            Some(tag) if !matches!(tag, 0x0001 | 0x0003) => e.context(format!(
                "{}: WAV with format tag {tag:#06x} ({}), which milkit does not decode \
                 (supported: {SUPPORTED}, and µ-law, A-law, IMA and MS ADPCM in WAV)",
                path.display(),
                wav_format_name(tag)
            )),
            _ => hound_error.unwrap_or(e),
        })
    } else {
        decode_symphonia(path, &head[..n])
    }
}

/// The `fmt ` chunk's format tag of a RIFF/WAVE file (the sub-format's for
/// WAVE_FORMAT_EXTENSIBLE); None when the chunk cannot be found.
fn wav_format_tag(path: &Path) -> Option<u16> {
    use std::io::{Read, Seek, SeekFrom};
    // Chunk headers only: the data chunk before `fmt ` (if any) is skipped, not read.
    let mut f = File::open(path).ok()?;
    f.seek(SeekFrom::Start(12)).ok()?;
    loop {
        let mut head = [0u8; 8];
        f.read_exact(&mut head).ok()?;
        let size = u32::from_le_bytes(head[4..].try_into().ok()?);
        if &head[..4] == b"fmt " {
            let mut body = [0u8; 26];
            let n = read_up_to(&mut f, &mut body[..(size as usize).min(26)]).ok()?;
            if n < 2 {
                return None;
            }
            let tag = u16::from_le_bytes([body[0], body[1]]);
            return Some(if tag == 0xFFFE && n >= 26 {
                u16::from_le_bytes([body[24], body[25]])
            } else {
                tag
            });
        }
        f.seek(SeekFrom::Current(i64::from(size) + i64::from(size & 1)))
            .ok()?;
    }
}

/// The name of a WAV format tag (mmreg.h), for messages.
fn wav_format_name(tag: u16) -> &'static str {
    match tag {
        0x0001 => "PCM",
        0x0002 => "Microsoft ADPCM",
        0x0003 => "IEEE float",
        0x0006 => "A-law",
        0x0007 => "µ-law",
        0x0011 => "IMA ADPCM",
        0x0022 => "TrueSpeech",
        0x0031 => "GSM 6.10",
        0x0050 => "MPEG audio",
        0x0055 => "MPEG Layer 3",
        0x00FF => "AAC",
        0x0160..=0x0163 => "Windows Media Audio",
        0x2000 => "AC-3",
        _ => "unknown codec",
    }
}

fn read_up_to(f: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// Averages interleaved frames of `channels` samples (f64 sums, so many channels lose
/// nothing).
fn downmix(interleaved: &[f32], channels: usize) -> Vec<f32> {
    if channels == 1 {
        return interleaved.to_vec();
    }
    interleaved
        .chunks_exact(channels)
        .map(|frame| (frame.iter().map(|&v| f64::from(v)).sum::<f64>() / channels as f64) as f32)
        .collect()
}

fn info(container: &str, codec: &str, rate: u32, channels: usize, frames: usize) -> AudioInfo {
    AudioInfo {
        container: container.into(),
        codec: codec.into(),
        sample_rate: rate,
        channels: channels as u32,
        duration_s: frames as f64 / f64::from(rate.max(1)),
        skipped_packets: 0,
    }
}

/// WAV through hound: integer PCM of 8/16/24/32 bits scaled by 2^(bits-1) (as
/// soundfile/librosa do), 32-bit float as is.
/// Why hound could not read a WAV: its header (then Symphonia may still read the file),
/// or its data (then the file is damaged).
enum WavError {
    Header(anyhow::Error),
    Data(anyhow::Error),
}

/// None when the file is a WAV in a codec hound does not read.
fn decode_wav(path: &Path) -> Result<Option<Decoded>, WavError> {
    let mut reader = match hound::WavReader::open(path) {
        Ok(r) => r,
        Err(hound::Error::Unsupported) => return Ok(None),
        Err(e) => {
            return Err(WavError::Header(anyhow::Error::new(e).context(format!(
                "{}: not a readable RIFF/WAVE audio file",
                path.display()
            ))))
        }
    };
    decode_wav_data(path, &mut reader).map_err(WavError::Data)
}

fn decode_wav_data(
    path: &Path,
    reader: &mut hound::WavReader<std::io::BufReader<File>>,
) -> Result<Option<Decoded>> {
    let spec = reader.spec();
    let channels = usize::from(spec.channels);
    ensure!(
        channels > 0,
        "{}: WAV header declares zero channels",
        path.display()
    );
    ensure!(
        (1..=MAX_RATE).contains(&spec.sample_rate),
        "{}: implausible sample rate {} Hz in WAV header",
        path.display(),
        spec.sample_rate
    );
    // The data chunk's declared length against the file: a header claiming gigabytes of
    // samples in a small file is corrupt (or truncated), said before anything is read.
    let file_len = std::fs::metadata(path)
        .with_context(|| format!("{}: cannot stat the audio file", path.display()))?
        .len();
    let declared = u64::from(reader.len()) * u64::from(spec.bits_per_sample).div_ceil(8);
    ensure!(
        declared <= file_len,
        "{}: WAV header declares {declared} bytes of samples but the file holds only \
         {file_len} bytes (truncated, or a corrupt data chunk length)",
        path.display()
    );
    let (interleaved, codec): (Result<Vec<f32>, hound::Error>, String) =
        match (spec.sample_format, spec.bits_per_sample) {
            (hound::SampleFormat::Int, bits @ (8 | 16 | 24 | 32)) => {
                let scale = 1.0 / f64::from(1u32 << (bits - 1));
                let s = reader
                    .samples::<i32>()
                    .map(|s| s.map(|v| (f64::from(v) * scale) as f32))
                    .collect::<Result<_, _>>();
                (s, format!("pcm_s{bits}"))
            }
            (hound::SampleFormat::Float, 32) => (
                reader.samples::<f32>().collect::<Result<_, _>>(),
                "pcm_f32".to_string(),
            ),
            _ => return Ok(None),
        };
    let interleaved = interleaved
        .with_context(|| format!("{}: truncated or corrupt WAV sample data", path.display()))?;
    let samples = downmix(&interleaved, channels);
    let frames = samples.len();
    Ok(Some(Decoded {
        samples,
        info: info("wav", &codec, spec.sample_rate, channels, frames),
    }))
}

/// The codec's short name as Symphonia's registry knows it ("mp3", "aac", ...), or its id.
fn codec_name(codec: CodecType) -> String {
    if codec == CODEC_TYPE_OPUS {
        return "opus".into();
    }
    symphonia::default::get_codecs()
        .get_codec(codec)
        .map(|d| d.short_name.to_string())
        .unwrap_or_else(|| format!("{codec}"))
}

/// The first track with a codec (an audio file's only one, in practice).
fn audio_track(format: &dyn FormatReader) -> Option<Track> {
    format
        .tracks()
        .iter()
        .find(|t| t.codec_params.codec != CODEC_TYPE_NULL)
        .cloned()
}

/// Reads the next packet of `track_id`; None at the end of the stream. A read error other
/// than the end of the file is an error (a corrupt container).
fn next_packet(format: &mut dyn FormatReader, track_id: u32) -> Result<Option<Packet>> {
    loop {
        match format.next_packet() {
            Ok(p) if p.track_id() == track_id => return Ok(Some(p)),
            Ok(_) => continue,
            Err(SymphoniaError::IoError(e)) if e.kind() == ErrorKind::UnexpectedEof => {
                return Ok(None)
            }
            Err(SymphoniaError::ResetRequired) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
    }
}

/// Symphonia (and opus-decoder) on one file. Symphonia panics on some malformed headers
/// (a zero sample rate in a WAV's `fmt ` chunk makes a zero time base): that is an error
/// about the file, not a crash.
fn decode_symphonia(path: &Path, head: &[u8]) -> Result<Decoded> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        decode_symphonia_unguarded(path, head)
    }))
    .unwrap_or_else(|_| {
        Err(anyhow::anyhow!(
            "{}: malformed audio file (its decoder gave up on a header or packet)",
            path.display()
        ))
    })
}

fn decode_symphonia_unguarded(path: &Path, head: &[u8]) -> Result<Decoded> {
    let file =
        File::open(path).with_context(|| format!("{}: cannot open the file", path.display()))?;
    let mss = MediaSourceStream::new(Box::new(file), Default::default());
    let mut hint = Hint::new();
    if let Some(ext) = path.extension().and_then(|e| e.to_str()) {
        hint.with_extension(ext);
    }
    let opts = FormatOptions {
        enable_gapless: true,
        ..Default::default()
    };
    if head.starts_with(b"OggS") {
        ogg_check_complete(path)?;
    }
    let probed = symphonia::default::get_probe()
        .format(&hint, mss, &opts, &MetadataOptions::default())
        .map_err(|e| {
            anyhow::anyhow!(
                "{}: not a recognised audio file ({e}); supported: {SUPPORTED}",
                path.display()
            )
        })?;
    let mut format = probed.format;
    let container = container_name(path, format.as_ref());
    let track = audio_track(format.as_ref()).with_context(|| {
        let ids = matroska_codec_ids(path);
        format!(
            "{}: the {container} file has no audio track in a codec milkit decodes{} \
             (supported: {SUPPORTED})",
            path.display(),
            if ids.is_empty() {
                String::new()
            } else {
                format!(": it holds {}", ids.join(", "))
            }
        )
    })?;
    let codec = codec_name(track.codec_params.codec);
    let r = if track.codec_params.codec == CODEC_TYPE_OPUS {
        decode_opus(format.as_mut(), &track)
    } else {
        decode_track(format.as_mut(), &track)
    };
    let (samples, rate, channels, skipped) =
        r.with_context(|| format!("{}: {container} file, {codec} stream", path.display()))?;
    let frames = samples.len();
    let mut info = info(&container, &codec, rate, channels, frames);
    info.skipped_packets = skipped;
    // A stream that states its length and delivers much less was cut short.
    if let Some(declared) = declared_frames(&track) {
        let missing = declared.saturating_sub(frames as u64);
        ensure!(
            missing <= (declared / 100).max(u64::from(rate) / 10),
            "{}: truncated {container} file: its {codec} stream declares {:.2} s but only \
             {:.2} s could be decoded",
            path.display(),
            declared as f64 / f64::from(rate),
            frames as f64 / f64::from(rate)
        );
    }
    // MP4 states the encoder's priming and the presentation's length in an edit list.
    let mut samples = samples;
    let is_mp4 = head.get(4..8) == Some(b"ftyp");
    if let Some(edit) = is_mp4.then(|| mp4::audio_edit(path, rate)).flatten() {
        let skip = (edit.skip as usize).min(samples.len());
        samples.drain(..skip);
        if let Some(keep) = edit.keep {
            samples.truncate(keep as usize);
        }
        info.duration_s = samples.len() as f64 / f64::from(rate);
    }
    Ok(Decoded { samples, info })
}

/// The codec ids (`A_AC3`, `A_DTS`, ...) a Matroska/WebM file's first 64 KiB name: Symphonia
/// drops tracks in codecs it does not know, so the message names them from the bytes
/// (element 0x86, CodecID, an ASCII string).
fn matroska_codec_ids(path: &Path) -> Vec<String> {
    let mut buf = vec![0u8; 64 << 10];
    let n = File::open(path)
        .and_then(|mut f| read_up_to(&mut f, &mut buf))
        .unwrap_or(0);
    let buf = &buf[..n];
    let mut ids: Vec<String> = Vec::new();
    for i in 0..n.saturating_sub(4) {
        // ID 0x86, a one-byte size 0x80 | len, then the id, which starts with A_ or V_.
        if buf[i] != 0x86 || buf[i + 1] & 0x80 == 0 {
            continue;
        }
        let len = usize::from(buf[i + 1] & 0x7f);
        let Some(id) = buf.get(i + 2..i + 2 + len) else {
            continue;
        };
        if len >= 3
            && (id.starts_with(b"A_") || id.starts_with(b"V_") || id.starts_with(b"S_"))
            && id.iter().all(|c| c.is_ascii_graphic())
        {
            let id = String::from_utf8_lossy(id).into_owned();
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
    }
    ids
}

/// An Ogg file must end on a whole page: Ogg states no length up front, so a file cut
/// anywhere but between pages is found by its last page running past the end of the file.
fn ogg_check_complete(path: &Path) -> Result<()> {
    use std::io::{Seek, SeekFrom};
    // The largest page: a 27-byte header, 255 lacing values, 255 × 255 bytes of data.
    const MAX_PAGE: u64 = 27 + 255 + 255 * 255;
    let mut f =
        File::open(path).with_context(|| format!("{}: cannot open the file", path.display()))?;
    let len = f.metadata()?.len();
    let from = len.saturating_sub(MAX_PAGE);
    f.seek(SeekFrom::Start(from))?;
    let mut tail = Vec::new();
    f.read_to_end(&mut tail)?;
    // Some page that starts in the tail must end exactly at the end of the file.
    let ends_at_eof = |at: usize| -> bool {
        let h = &tail[at..];
        if h.len() < 27 || &h[..4] != b"OggS" {
            return false;
        }
        let segments = usize::from(h[26]);
        if h.len() < 27 + segments {
            return false;
        }
        let body: usize = h[27..27 + segments].iter().map(|&b| usize::from(b)).sum();
        27 + segments + body == h.len()
    };
    let whole = (0..tail.len().saturating_sub(3))
        .rev()
        .filter(|&i| &tail[i..i + 4] == b"OggS")
        .any(ends_at_eof);
    ensure!(
        whole,
        "{}: truncated Ogg file: its last page runs past the end of the file",
        path.display()
    );
    Ok(())
}

/// The stream's declared length in output frames, when the container states it.
fn declared_frames(track: &Track) -> Option<u64> {
    let p = &track.codec_params;
    let n = p.n_frames?;
    if p.codec == CODEC_TYPE_OPUS {
        // Ogg states Opus lengths in 48 kHz granules, delay included.
        return Some(n.saturating_sub(u64::from(p.delay.unwrap_or(0))));
    }
    Some(n)
}

fn container_name(path: &Path, format: &dyn FormatReader) -> String {
    // Symphonia does not name the reader it chose; the track's codec and the file name
    // together tell the container well enough for messages and reports.
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(|e| e.to_ascii_lowercase())
        .unwrap_or_default();
    let codec = format
        .tracks()
        .first()
        .map(|t| t.codec_params.codec)
        .unwrap_or(CODEC_TYPE_NULL);
    let by_codec = match codec_name(codec).as_str() {
        "mp3" | "mp2" | "mp1" => "mpeg audio",
        "vorbis" | "opus" => "ogg",
        "alac" | "aac" => "mp4",
        _ => "",
    };
    match ext.as_str() {
        "flac" | "ogg" | "oga" | "opus" | "m4a" | "mp4" | "m4b" | "mp3" | "wav" | "webm"
        | "mka" | "mkv" => ext,
        _ if !by_codec.is_empty() => by_codec.into(),
        _ => "audio".into(),
    }
}

/// Decodes every packet of a Symphonia-supported codec. Packets the codec rejects are
/// skipped and counted (as ffmpeg does); a stream where more than a tenth of the packets fail
/// is an error. Returns mono samples, the rate, the channel count and the skipped packets.
fn decode_track(
    format: &mut dyn FormatReader,
    track: &Track,
) -> Result<(Vec<f32>, u32, usize, usize)> {
    let codec = track.codec_params.codec;
    let mut decoder = symphonia::default::get_codecs()
        .make(&track.codec_params, &DecoderOptions::default())
        .map_err(|e| match e {
            SymphoniaError::Unsupported(_) => anyhow::anyhow!(
                "the {} codec is not supported (supported: {SUPPORTED})",
                codec_name(codec)
            ),
            e => anyhow::anyhow!("cannot start the {} decoder: {e}", codec_name(codec)),
        })?;
    let mut mono = Vec::new();
    let mut interleaved: Vec<f32> = Vec::new();
    let (mut rate, mut channels) = (0u32, 0usize);
    let (mut packets, mut skipped) = (0usize, 0usize);
    let mut first_error = None;
    while let Some(packet) = next_packet(format, track.id)? {
        packets += 1;
        let buf = match decoder.decode(&packet) {
            Ok(buf) => buf,
            Err(SymphoniaError::DecodeError(e)) => {
                skipped += 1;
                first_error.get_or_insert_with(|| e.to_string());
                continue;
            }
            Err(SymphoniaError::IoError(e)) if e.kind() == ErrorKind::UnexpectedEof => {
                skipped += 1;
                first_error.get_or_insert_with(|| "packet ends early".to_string());
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let spec = *buf.spec();
        let n = spec.channels.count();
        ensure!(
            (1..=MAX_CHANNELS).contains(&n) && (1..=MAX_RATE).contains(&spec.rate),
            "implausible stream: {n} channels at {} Hz",
            spec.rate
        );
        if channels == 0 {
            (rate, channels) = (spec.rate, n);
        }
        ensure!(
            (rate, channels) == (spec.rate, n),
            "the stream changes from {channels} channels at {rate} Hz to {n} at {} Hz",
            spec.rate
        );
        let frames = buf.frames();
        if frames == 0 {
            continue;
        }
        interleaved.resize(frames * n, 0.0);
        let mut sb = symphonia::core::audio::SampleBuffer::<f32>::new(frames as u64, spec);
        sb.copy_interleaved_ref(buf);
        interleaved.copy_from_slice(sb.samples());
        mono.extend(downmix(&interleaved, n));
    }
    check_skipped(packets, skipped, first_error)?;
    ensure!(channels > 0, "no packet could be decoded");
    Ok((mono, rate, channels, skipped))
}

fn check_skipped(packets: usize, skipped: usize, first_error: Option<String>) -> Result<()> {
    ensure!(
        skipped * 10 <= packets,
        "{skipped} of {packets} packets could not be decoded (first: {})",
        first_error.unwrap_or_default()
    );
    Ok(())
}

/// Opus in Ogg (RFC 7845): the identification header gives the channel mapping, pre-skip and
/// output gain; decoded at 48 kHz, Opus's own rate, and trimmed by the packets' gapless
/// bounds (pre-skip at the start, the final granule position at the end).
fn decode_opus(
    format: &mut dyn FormatReader,
    track: &Track,
) -> Result<(Vec<f32>, u32, usize, usize)> {
    const RATE: u32 = 48_000;
    let head = track
        .codec_params
        .extra_data
        .as_deref()
        .context("the Opus stream has no identification header")?;
    let head = OpusHead::parse(head)?;
    let mut decoder = head.decoder()?;
    let channels = head.channels;
    // 120 ms, the longest Opus packet, at 48 kHz.
    let mut pcm = vec![0f32; 5760 * channels];
    let gain = 10f32.powf(f32::from(head.output_gain_q8) / 256.0 / 20.0);
    let mut mono = Vec::new();
    let (mut packets, mut skipped) = (0usize, 0usize);
    let mut first_error = None;
    // The header's pre-skip is dropped here (Symphonia's Ogg reader trims the end of the
    // stream by its final granule position, not the start); `max` below keeps a reader that
    // does trim the start from having it dropped twice.
    let mut pre_skip = usize::from(head.pre_skip);
    while let Some(packet) = next_packet(format, track.id)? {
        packets += 1;
        let n = match decoder.decode_float(&packet.data, &mut pcm) {
            Ok(n) => n,
            Err(e) => {
                skipped += 1;
                first_error.get_or_insert_with(|| e.to_string());
                continue;
            }
        };
        let skip = pre_skip.min(n);
        pre_skip -= skip;
        let start = (packet.trim_start as usize).max(skip).min(n);
        let end = n.saturating_sub(packet.trim_end as usize).max(start);
        let frames = &pcm[start * channels..end * channels];
        mono.extend(downmix(frames, channels).into_iter().map(|v| v * gain));
    }
    check_skipped(packets, skipped, first_error)?;
    Ok((mono, RATE, channels, skipped))
}

/// The fields of an Opus identification header ("OpusHead") that decoding needs.
struct OpusHead {
    channels: usize,
    /// Samples at 48 kHz to drop from the start (the encoder's look-ahead).
    pre_skip: u16,
    output_gain_q8: i16,
    /// Mapping family 0: one stream, mono or stereo. Else (streams, coupled, mapping).
    multistream: Option<(usize, usize, Vec<u8>)>,
}

impl OpusHead {
    fn parse(b: &[u8]) -> Result<OpusHead> {
        ensure!(
            b.len() >= 19 && &b[..8] == b"OpusHead",
            "the Opus stream has no valid identification header (OpusHead)"
        );
        let channels = usize::from(b[9]);
        ensure!(channels > 0, "the Opus header declares zero channels");
        let pre_skip = u16::from_le_bytes([b[10], b[11]]);
        let output_gain_q8 = i16::from_le_bytes([b[16], b[17]]);
        let family = b[18];
        let multistream = if family == 0 {
            ensure!(
                channels <= 2,
                "Opus mapping family 0 with {channels} channels (at most 2)"
            );
            None
        } else {
            ensure!(
                b.len() >= 21 + channels,
                "the Opus header's channel mapping table is cut short"
            );
            let (streams, coupled) = (usize::from(b[19]), usize::from(b[20]));
            Some((streams, coupled, b[21..21 + channels].to_vec()))
        };
        Ok(OpusHead {
            channels,
            pre_skip,
            output_gain_q8,
            multistream,
        })
    }

    fn decoder(&self) -> Result<OpusStream> {
        Ok(match &self.multistream {
            None => OpusStream::Single(Box::new(
                opus_decoder::OpusDecoder::new(48_000, self.channels)
                    .map_err(|e| anyhow::anyhow!("cannot start the Opus decoder: {e}"))?,
            )),
            Some((streams, coupled, mapping)) => OpusStream::Multi(
                opus_decoder::OpusMultistreamDecoder::new(
                    48_000,
                    self.channels,
                    *streams,
                    *coupled,
                    mapping,
                )
                .map_err(|e| anyhow::anyhow!("cannot start the Opus multistream decoder: {e}"))?,
            ),
        })
    }
}

enum OpusStream {
    Single(Box<opus_decoder::OpusDecoder>),
    Multi(opus_decoder::OpusMultistreamDecoder),
}

impl OpusStream {
    fn decode_float(&mut self, packet: &[u8], pcm: &mut [f32]) -> Result<usize> {
        // An empty packet would ask for loss concealment: treat it as the damage it is.
        ensure!(!packet.is_empty(), "an empty Opus packet");
        match self {
            OpusStream::Single(d) => d.decode_float(packet, pcm, false),
            OpusStream::Multi(d) => d.decode_float(packet, pcm, false),
        }
        .map_err(|e| anyhow::anyhow!("{e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn downmix_averages_each_frame() {
        assert_eq!(downmix(&[1.0, 0.0, 0.5, 0.5], 2), vec![0.5, 0.5]);
        assert_eq!(downmix(&[0.25, -0.25], 1), vec![0.25, -0.25]);
    }

    #[test]
    fn an_opus_header_with_too_many_channels_for_family_zero_is_refused() {
        let mut h = b"OpusHead".to_vec();
        h.extend([1, 3, 0x38, 0x01, 0x80, 0xbb, 0, 0, 0, 0, 0]);
        let e = OpusHead::parse(&h).err().expect("refused").to_string();
        assert!(e.contains("family 0 with 3 channels"), "{e}");
        assert!(OpusHead::parse(b"OpusHea").is_err());
    }
}
