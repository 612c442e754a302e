//! `milkit eval`: corpus word error rate of a models folder on a manifest of clips, with the
//! runtime's transcription (`crate::transcribe`, decoding as `milkit transcribe` does; the
//! language from a line's `language` field, else detected) and the normalisation of
//! `whisper::wer` (ASCII-style, or Unicode-aware for non-English sets).

use super::bits::folder_bits;
use crate::transcribe::{OpenOptions, TranscribeOptions, Transcriber};
use crate::whisper::wer::{word_errors_with, Normalization};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

pub use crate::report::{ClipResult, EvalReport};

/// One line of a manifest.
pub struct ManifestClip {
    /// The `audio` field as written.
    pub name: String,
    /// That path resolved against the manifest's folder.
    pub path: PathBuf,
    /// The `text` field (the reference transcript), if any.
    pub text: Option<String>,
    /// The `language` field (a Whisper code), if any.
    pub language: Option<String>,
}

/// The clips of a JSON-lines manifest (`audio` required, `text` optional); paths relative to
/// the manifest.
pub fn read_manifest(path: &Path) -> Result<Vec<ManifestClip>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading manifest {}", path.display()))?;
    let base = path.parent().unwrap_or(Path::new("."));
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("{}: line {} is not JSON", path.display(), i + 1))?;
        let Some(a) = v.get("audio").and_then(|a| a.as_str()) else {
            bail!("{}: line {} has no \"audio\" string", path.display(), i + 1);
        };
        out.push(ManifestClip {
            name: a.to_string(),
            path: base.join(a),
            text: v.get("text").and_then(|t| t.as_str()).map(str::to_string),
            language: v
                .get("language")
                .and_then(|t| t.as_str())
                .map(str::to_string),
        });
    }
    if out.is_empty() {
        bail!("{}: no clips", path.display());
    }
    Ok(out)
}

/// The normalisation a manifest gets by default: Unicode-aware when any line names a
/// language other than English.
pub fn default_normalization(clips: &[ManifestClip]) -> Normalization {
    if clips
        .iter()
        .any(|c| c.language.as_deref().is_some_and(|l| l != "en"))
    {
        Normalization::Unicode
    } else {
        Normalization::Ascii
    }
}

/// Transcribes every clip of `manifest` with the models in `models` and scores it: decoding
/// as `opts` says (each clip's language from its manifest line when it has one), texts
/// normalised by `normalization` (None: [`default_normalization`]).
pub fn evaluate(
    models: &Path,
    open: &OpenOptions,
    manifest: &Path,
    opts: &TranscribeOptions,
    normalization: Option<Normalization>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<EvalReport> {
    let clips = read_manifest(manifest)?;
    let norm = normalization.unwrap_or_else(|| default_normalization(&clips));
    // Every clip needs its reference before any transcription starts.
    let mut refs = Vec::new();
    for c in &clips {
        match &c.text {
            Some(t) => refs.push(t),
            None => bail!(
                "{}: clip {} has no \"text\" (the reference transcript)",
                manifest.display(),
                c.name
            ),
        }
    }
    let bits = folder_bits(models)?;
    let mut t = Transcriber::open_with(models, open)?;
    t.check_options(opts)?;
    let mut rows = Vec::new();
    for (i, (clip, reference)) in clips.iter().zip(refs).enumerate() {
        let (name, path) = (&clip.name, &clip.path);
        let mut o = opts.clone();
        if let Some(l) = &clip.language {
            o.language = Some(l.clone());
        }
        let hyp = t
            .transcribe_file_with(path, &o)
            .with_context(|| format!("transcribing {}", path.display()))?
            .text
            .trim()
            .to_string();
        let (errors, words) = word_errors_with(reference, &hyp, norm);
        rows.push(ClipResult {
            audio: name.clone(),
            reference: reference.clone(),
            hypothesis: hyp,
            errors,
            words,
            wer: errors as f64 / words.max(1) as f64,
        });
        progress(i + 1, clips.len());
    }
    let errors = rows.iter().map(|r| r.errors).sum();
    let words = rows.iter().map(|r| r.words).sum();
    Ok(EvalReport {
        models: models.display().to_string(),
        manifest: manifest.display().to_string(),
        normalization: norm.describe().into(),
        clips: rows,
        errors,
        words,
        wer: errors as f64 / (words as f64).max(1.0),
        bits,
    })
}

impl EvalReport {
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        for r in &self.clips {
            s += &format!(
                "{:>7.2}%  {:>3}/{:<3}  {}\n",
                r.wer * 100.0,
                r.errors,
                r.words,
                r.audio
            );
        }
        s += &format!(
            "corpus WER {:.2}% ({} errors / {} words, {} clips)\n",
            self.wer * 100.0,
            self.errors,
            self.words,
            self.clips.len()
        );
        s += &self.bits.to_text();
        s
    }
}
