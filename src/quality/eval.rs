//! `milkit eval`: corpus word error rate of a models folder on a manifest of clips, with the
//! runtime's transcription (`crate::transcribe`) and the normalisation of `whisper::wer`.

use super::bits::folder_bits;
use crate::transcribe::Transcriber;
use crate::whisper::wer::word_errors;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

pub use crate::report::{ClipResult, EvalReport};

/// The normalisation, in words (also in `milkit eval --help`).
pub const NORMALIZATION: &str = "lowercase; punctuation dropped (dashes and slashes become spaces); letters and digits kept; whitespace collapsed";

/// One line of a manifest.
pub struct ManifestClip {
    /// The `audio` field as written.
    pub name: String,
    /// That path resolved against the manifest's folder.
    pub path: PathBuf,
    /// The `text` field (the reference transcript), if any.
    pub text: Option<String>,
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
        });
    }
    if out.is_empty() {
        bail!("{}: no clips", path.display());
    }
    Ok(out)
}

/// Transcribes every clip of `manifest` with the models in `models` and scores it.
pub fn evaluate(
    models: &Path,
    manifest: &Path,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<EvalReport> {
    let clips = read_manifest(manifest)?;
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
    let mut t = Transcriber::open(models)?;
    let mut rows = Vec::new();
    for (i, (clip, reference)) in clips.iter().zip(refs).enumerate() {
        let (name, path) = (&clip.name, &clip.path);
        let hyp = t
            .transcribe_file(path)
            .with_context(|| format!("transcribing {}", path.display()))?
            .text
            .trim()
            .to_string();
        let (errors, words) = word_errors(reference, &hyp);
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
        normalization: NORMALIZATION.into(),
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
