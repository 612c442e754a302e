//! `milkit eval`: corpus word error rate of a models folder.

use super::progress;
use super::transcribe::DecodeArgs;
use anyhow::Result;
use clap::Args;
use milkit::quality::bits::folder_bits;
use milkit::quality::eval::{default_normalization, evaluate, read_manifest};
use milkit::quality::fidelity::{fidelity, FidelityInput};
use milkit::whisper::wer::Normalization;
use std::path::PathBuf;

/// Transcribes every clip of a manifest with the bundled runtime and prints the word error
/// rate per clip and over the corpus (Σ errors / Σ reference words).
///
/// Clips are decoded as `milkit transcribe` decodes (same flags); a manifest line's
/// `language` field sets that clip's language, else it is detected.
///
/// Normalisation before scoring (--normalize): `ascii` lowercases, drops punctuation (dashes
/// and slashes become spaces), keeps letters and digits and collapses whitespace; `unicode`
/// applies NFKC, lowercases, turns Unicode punctuation and symbols into spaces (openai-whisper's basic normaliser) and collapses whitespace.
/// The default is `unicode` when a manifest line names a language other than English, else
/// `ascii`.
///
/// Also reports the folder's bits per compressed weight: per package, the elements its
/// constexpr ops decompress to and the bytes they store (tables and scales included), and
/// 8 × Σ bytes ÷ Σ elements over all packages. Without --manifest only that is printed.
///
/// With --against BASE: dense fidelity of --models against the baseline folder instead, on
/// the manifest's clips or on --audio files (no reference text needed): teacher-forced
/// next-token KL along the baseline's transcript, top-1 agreement, encoder PSNR and cosine,
/// WER against the baseline's transcript, and QoI where the manifest has texts (schema:
/// schemas/fidelity.schema.json).
#[derive(Args)]
pub struct EvalArgs {
    /// Models folder, as for `milkit transcribe` (e.g. written by `milkit export --component all`).
    #[arg(long)]
    pub models: PathBuf,
    /// JSON lines with `audio` (path relative to the manifest) and `text` (the reference).
    /// Absent: only the bits per compressed weight (schema: schemas/folder-bits.schema.json).
    #[arg(long)]
    pub manifest: Option<PathBuf>,
    /// Baseline models folder: measure --models' fidelity against it.
    #[arg(long)]
    pub against: Option<PathBuf>,
    /// Audio files (WAV, FLAC, MP3, Ogg, Opus, M4A, ...) to measure with --against (instead
    /// of a manifest).
    #[arg(long, num_args = 1.., requires = "against")]
    pub audio: Vec<PathBuf>,
    /// Print the report as JSON (per-clip table included; schema: schemas/eval.schema.json).
    #[arg(long)]
    pub json: bool,
    /// Text normalisation before scoring (default: unicode for non-English manifests).
    #[arg(long, value_enum)]
    pub normalize: Option<Normalization>,
    #[command(flatten)]
    pub decode: DecodeArgs,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
}

pub fn run(a: &EvalArgs) -> Result<u8> {
    if let Some(base) = &a.against {
        return against(a, base);
    }
    let Some(manifest) = &a.manifest else {
        let b = folder_bits(&a.models)?;
        if a.json {
            println!("{}", serde_json::to_string_pretty(&b)?);
        } else {
            print!("{}", b.to_text());
        }
        return Ok(0);
    };
    let opts = a.decode.options(&a.models)?;
    let r = with_bar(a, "transcribing", |p| {
        let open = milkit::transcribe::OpenOptions {
            compute: a.decode.compute,
            ..Default::default()
        };
        evaluate(&a.models, &open, manifest, &opts, a.normalize, p)
    })?;
    print_report(a, &r, r.to_text())
}

/// Runs `f` under a progress bar (none with --quiet or --json).
fn with_bar<T>(
    a: &EvalArgs,
    what: &'static str,
    f: impl FnOnce(&mut dyn FnMut(usize, usize)) -> Result<T>,
) -> Result<T> {
    let pb = progress::bar(0, what, a.quiet || a.json);
    let r = f(&mut |d, n| {
        pb.set_length(n as u64);
        pb.set_position(d as u64);
    });
    pb.finish_and_clear();
    r
}

/// The report as JSON (--json) or as its text.
fn print_report(a: &EvalArgs, r: &impl serde::Serialize, text: String) -> Result<u8> {
    if a.json {
        println!("{}", serde_json::to_string_pretty(r)?);
    } else {
        print!("{text}");
    }
    Ok(0)
}

fn against(a: &EvalArgs, base: &std::path::Path) -> Result<u8> {
    let mut clips: Vec<FidelityInput> = Vec::new();
    let mut norm = Normalization::Ascii;
    if let Some(m) = &a.manifest {
        let lines = read_manifest(m)?;
        norm = default_normalization(&lines);
        clips.extend(lines.into_iter().map(|c| FidelityInput {
            name: c.name,
            path: c.path,
            reference: c.text,
            language: c.language,
        }));
    }
    clips.extend(a.audio.iter().map(|p| FidelityInput {
        name: p.display().to_string(),
        path: p.clone(),
        reference: None,
        language: None,
    }));
    anyhow::ensure!(
        !clips.is_empty(),
        "--against needs clips: --manifest M.jsonl or --audio FILE..."
    );
    let norm = a.normalize.unwrap_or(norm);
    let r = with_bar(a, "measuring", |p| {
        fidelity(&a.models, base, &clips, norm, p)
    })?;
    print_report(a, &r, r.to_text())
}
