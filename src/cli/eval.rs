//! `milkit eval`: corpus word error rate of a models folder.

use super::progress;
use anyhow::Result;
use clap::Args;
use milkit::quality::eval::evaluate;
use std::path::PathBuf;

/// Transcribes every clip of a manifest with the bundled runtime and prints the word error
/// rate per clip and over the corpus (Σ errors / Σ reference words).
///
/// Normalisation before scoring: lowercase; punctuation dropped (dashes and slashes become
/// spaces); letters and digits kept; whitespace collapsed.
#[derive(Args)]
pub struct EvalArgs {
    /// Models folder, as for `milkit transcribe` (e.g. written by `milkit export --component all`).
    #[arg(long)]
    pub models: PathBuf,
    /// JSON lines with `audio` (path relative to the manifest) and `text` (the reference).
    #[arg(long)]
    pub manifest: PathBuf,
    /// Print the report as JSON (per-clip table included; schema: schemas/eval.schema.json).
    #[arg(long)]
    pub json: bool,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
}

pub fn run(a: &EvalArgs) -> Result<u8> {
    let pb = progress::bar(0, "transcribing", a.quiet || a.json);
    let r = evaluate(&a.models, &a.manifest, &mut |d, n| {
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
