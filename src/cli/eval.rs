//! `milkit eval`: corpus word error rate of a models folder.

use super::progress;
use anyhow::Result;
use clap::Args;
use milkit::quality::bits::folder_bits;
use milkit::quality::eval::evaluate;
use std::path::PathBuf;

/// Transcribes every clip of a manifest with the bundled runtime and prints the word error
/// rate per clip and over the corpus (Σ errors / Σ reference words).
///
/// Normalisation before scoring: lowercase; punctuation dropped (dashes and slashes become
/// spaces); letters and digits kept; whitespace collapsed.
///
/// Also reports the folder's bits per compressed weight: per package, the elements its
/// constexpr ops decompress to and the bytes they store (tables and scales included), and
/// 8 × Σ bytes ÷ Σ elements over all packages. Without --manifest only that is printed.
#[derive(Args)]
pub struct EvalArgs {
    /// Models folder, as for `milkit transcribe` (e.g. written by `milkit export --component all`).
    #[arg(long)]
    pub models: PathBuf,
    /// JSON lines with `audio` (path relative to the manifest) and `text` (the reference).
    /// Absent: only the bits per compressed weight (schema: schemas/folder-bits.schema.json).
    #[arg(long)]
    pub manifest: Option<PathBuf>,
    /// Print the report as JSON (per-clip table included; schema: schemas/eval.schema.json).
    #[arg(long)]
    pub json: bool,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
}

pub fn run(a: &EvalArgs) -> Result<u8> {
    let Some(manifest) = &a.manifest else {
        let b = folder_bits(&a.models)?;
        if a.json {
            println!("{}", serde_json::to_string_pretty(&b)?);
        } else {
            print!("{}", b.to_text());
        }
        return Ok(0);
    };
    let pb = progress::bar(0, "transcribing", a.quiet || a.json);
    let r = evaluate(&a.models, manifest, &mut |d, n| {
        pb.set_length(n as u64);
        pb.set_position(d as u64);
    })?;
    pb.finish_and_clear();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", r.to_text());
    }
    Ok(0)
}
