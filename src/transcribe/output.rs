//! Transcript files in openai-whisper's formats (its `utils.py` writers, default options):
//! `txt` (each segment's text, trimmed, one per line), `json` (the
//! [`TranscriptionResult`] itself, schema `schemas/transcription.schema.json`), `srt`
//! (numbered cues, `HH:MM:SS,mmm`, hours always shown) and `vtt` (`WEBVTT` header,
//! `MM:SS.mmm`, hours only from one hour on). With word timings a subtitle cue spans its
//! segment's first word's start to its last word's end, as openai's writers do; without, the
//! segment's own times. [`write_all`] writes `DIR/<stem>.<ext>` atomically.
use crate::package::fsio::write_file_atomically;
use crate::report::TranscriptionResult;
use anyhow::{ensure, Context, Result};
use std::path::{Path, PathBuf};

/// A transcript file format (`--output-format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum OutputFormat {
    Txt,
    Json,
    Srt,
    Vtt,
    /// Every format above.
    All,
}

impl OutputFormat {
    /// The single formats this one stands for (`All` → txt, json, srt, vtt).
    pub fn expand(self) -> Vec<OutputFormat> {
        match self {
            OutputFormat::All => vec![
                OutputFormat::Txt,
                OutputFormat::Json,
                OutputFormat::Srt,
                OutputFormat::Vtt,
            ],
            f => vec![f],
        }
    }

    /// File extension, without the dot (`All` has none: it is several files).
    pub fn extension(self) -> Option<&'static str> {
        match self {
            OutputFormat::Txt => Some("txt"),
            OutputFormat::Json => Some("json"),
            OutputFormat::Srt => Some("srt"),
            OutputFormat::Vtt => Some("vtt"),
            OutputFormat::All => None,
        }
    }
}

/// openai-whisper's `format_timestamp`: `[HH:]MM:SS<marker>mmm`, milliseconds rounded half
/// to even (Python's `round`), hours shown when asked or when not zero. Negative or
/// non-finite times are an error.
pub fn format_timestamp(seconds: f64, always_include_hours: bool, marker: char) -> Result<String> {
    ensure!(
        seconds.is_finite() && seconds >= 0.0,
        "timestamp {seconds} s is not a non-negative time"
    );
    let ms = (seconds * 1000.0).round_ties_even() as u64;
    let (h, rest) = (ms / 3_600_000, ms % 3_600_000);
    let (m, rest) = (rest / 60_000, rest % 60_000);
    let (s, ms) = (rest / 1000, rest % 1000);
    let hours = if always_include_hours || h > 0 {
        format!("{h:02}:")
    } else {
        String::new()
    };
    Ok(format!("{hours}{m:02}:{s:02}{marker}{ms:03}"))
}

/// The txt file: each segment's text, trimmed, on its own line.
pub fn to_txt(result: &TranscriptionResult) -> String {
    result
        .segments
        .iter()
        .map(|s| format!("{}\n", s.text.trim()))
        .collect()
}

/// The json file: the result as one line of JSON (and a newline).
pub fn to_json(result: &TranscriptionResult) -> Result<String> {
    let mut s = serde_json::to_string(result).context("serializing the transcription")?;
    s.push('\n');
    Ok(s)
}

/// (start, end, text) of every subtitle cue, as openai's `SubtitlesWriter.iterate_result`
/// with default options: one cue per segment; with word timings (judged, as there, by the
/// first segment) the words' span and their concatenated text (the first word trimmed),
/// segments without words giving no cue; otherwise the segment's times and its trimmed text
/// with `-->` written `->`.
fn cues(result: &TranscriptionResult) -> Vec<(f64, f64, String)> {
    let with_words = result.segments.first().is_some_and(|s| s.words.is_some());
    let mut out = vec![];
    for seg in &result.segments {
        if with_words {
            let words = seg.words.as_deref().unwrap_or_default();
            let (Some(first), Some(last)) = (words.first(), words.last()) else {
                continue;
            };
            let mut text = first.word.trim().to_string();
            for w in &words[1..] {
                text.push_str(&w.word);
            }
            out.push((first.start, last.end, text));
        } else {
            out.push((seg.start, seg.end, seg.text.trim().replace("-->", "->")));
        }
    }
    out
}

/// The srt file: `N`, `HH:MM:SS,mmm --> HH:MM:SS,mmm`, the text, a blank line, per cue.
pub fn to_srt(result: &TranscriptionResult) -> Result<String> {
    let mut s = String::new();
    for (i, (start, end, text)) in cues(result).into_iter().enumerate() {
        s.push_str(&format!(
            "{}\n{} --> {}\n{text}\n\n",
            i + 1,
            format_timestamp(start, true, ',')?,
            format_timestamp(end, true, ',')?
        ));
    }
    Ok(s)
}

/// The vtt file: `WEBVTT`, a blank line, then `[HH:]MM:SS.mmm --> [HH:]MM:SS.mmm`, the text
/// and a blank line per cue.
pub fn to_vtt(result: &TranscriptionResult) -> Result<String> {
    let mut s = String::from("WEBVTT\n\n");
    for (start, end, text) in cues(result) {
        s.push_str(&format!(
            "{} --> {}\n{text}\n\n",
            format_timestamp(start, false, '.')?,
            format_timestamp(end, false, '.')?
        ));
    }
    Ok(s)
}

/// The text of one file of `format` (`All` is refused: it is several files).
pub fn render(result: &TranscriptionResult, format: OutputFormat) -> Result<String> {
    match format {
        OutputFormat::Txt => Ok(to_txt(result)),
        OutputFormat::Json => to_json(result),
        OutputFormat::Srt => to_srt(result),
        OutputFormat::Vtt => to_vtt(result),
        OutputFormat::All => anyhow::bail!("`all` is several files; render each format"),
    }
}

/// Writes `dir/<stem>.<ext>` for every format of `formats` (`All` expanded, duplicates
/// written once), each atomically (temporary file, then rename). An existing file is
/// replaced only with `force` (else nothing is written). Every file is rendered and checked
/// before the first is written, so a bad result (a negative time) writes nothing. Returns
/// the paths written, in order.
pub fn write_all(
    result: &TranscriptionResult,
    dir: &Path,
    stem: &str,
    formats: &[OutputFormat],
    force: bool,
) -> Result<Vec<PathBuf>> {
    ensure!(
        !stem.is_empty() && !stem.contains(['/', '\\']),
        "output file stem {stem:?} must be a plain, non-empty file name"
    );
    let mut singles: Vec<OutputFormat> = vec![];
    for f in formats.iter().flat_map(|f| f.expand()) {
        if !singles.contains(&f) {
            singles.push(f);
        }
    }
    let mut files = vec![];
    for f in singles {
        let ext = f.extension().context("a single format has an extension")?;
        let text = render(result, f).with_context(|| format!("rendering the {ext} output"))?;
        files.push((dir.join(format!("{stem}.{ext}")), text));
    }
    if !force {
        if let Some((p, _)) = files.iter().find(|(p, _)| p.exists()) {
            anyhow::bail!("{} already exists; pass --force to replace it", p.display());
        }
    }
    let mut written = vec![];
    for (path, text) in files {
        write_file_atomically(&path, text.as_bytes(), force)
            .with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}
