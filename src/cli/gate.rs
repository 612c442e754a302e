//! `milkit gate`: the cheapest-falsifier ladder of a compressed models folder against its
//! baseline (glue over `quality::gate`); exit 0 go, 1 kill, 2 unusable input.

use anyhow::{Context, Result};
use clap::Args;
use milkit::quality::gate::{gate, GateOptions};
use milkit::report::{GateThresholds, GateVerdict};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Decides go or kill for a candidate models folder (e.g. a compressed export) against its
/// baseline (e.g. the fp16 export), rung by rung, cheapest first, stopping at the first
/// failed rung unless --all:
///
/// 1. package physics: the same packages with equal inputs, outputs and states; op
///    histograms; constexpr ops by kind (--expect-lut-ops); the positional embedding a
///    plain fp16 constant; compressed weights at least --min-compression × smaller than
///    fp16; digests.
/// 2. static placement: no conv/linear/matmul/attention predicted on the Neural Engine in
///    the baseline is predicted elsewhere in the candidate (milkit's rules; labelled
///    `predicted`).
/// 3. numerical parity on three probes per component (speech, the log-mel of silence, a
///    fixed stress tensor): SNR and cosine of the candidate's encoder output and decoder
///    logits against the baseline's.
/// 4. end to end, both decoding as `milkit transcribe` does: no text regression on --smoke
///    clips, held-out WER regression within --max-wer-regression (against the manifest's
///    texts, or against the baseline's transcripts without them), segment timestamps and
///    no-speech decisions agreeing.
///
/// Exit status: 0 go, 1 kill (the rung and reason are printed), 2 unusable input. The JSON
/// receipt (--json; schemas/gate.schema.json) holds every number measured and the command
/// line. Method: docs/quality.md.
#[derive(Args)]
pub struct GateArgs {
    /// The candidate models folder (.mlpackage components, or compiled .mlmodelc where
    /// the package is absent).
    pub candidate: PathBuf,
    /// The baseline models folder it must hold up against (the same kinds of component).
    #[arg(long)]
    pub baseline: PathBuf,
    /// Held-out clips: audio files (any supported format) and/or JSON-lines manifests
    /// (`audio`, optional `text`, `language`).
    #[arg(long, num_args = 1.., required = true)]
    pub audio: Vec<PathBuf>,
    /// Smoke clips (audio files or manifest) whose text must not regress at all.
    #[arg(long, num_args = 1..)]
    pub smoke: Vec<PathBuf>,
    /// Largest allowed held-out WER regression, in percentage points.
    #[arg(long, default_value_t = GateThresholds::defaults().max_wer_regression_points)]
    pub max_wer_regression: f64,
    /// Expected constexpr_lut_to_dense ops: `N` for AudioEncoder.mlpackage or
    /// `PACKAGE=N` (repeatable), e.g. 194 for a large-v3-turbo encoder.
    #[arg(long)]
    pub expect_lut_ops: Vec<String>,
    /// Smallest allowed ratio of compressed weights' fp16 bytes to their stored bytes.
    #[arg(long, default_value_t = GateThresholds::defaults().min_compression)]
    pub min_compression: f64,
    /// Parity: smallest allowed SNR (dB) of every probe. The defaults catch a broken
    /// package (a wrong table, axis or scale: cosine near 0), not a weak compression — a
    /// LUT4 k-means tiny.en encoder measures 5.7–11 dB; `eval --against` measures fidelity.
    #[arg(long, default_value_t = GateThresholds::defaults().min_parity_snr_db)]
    pub min_parity_snr: f64,
    /// Parity: smallest allowed cosine of every probe.
    #[arg(long, default_value_t = GateThresholds::defaults().min_parity_cosine)]
    pub min_parity_cosine: f64,
    /// Timestamps: share of the baseline's segment boundaries the candidate must match.
    #[arg(long, default_value_t = GateThresholds::defaults().min_timestamp_agreement)]
    pub min_timestamp_agreement: f64,
    /// Timestamps: how close (seconds) a boundary must be to match.
    #[arg(long, default_value_t = GateThresholds::defaults().timestamp_tolerance_s)]
    pub timestamp_tolerance: f64,
    /// Run every rung even after one failed.
    #[arg(long)]
    pub all: bool,
    /// Print the receipt as JSON (schemas/gate.schema.json).
    #[arg(long)]
    pub json: bool,
    /// No progress lines.
    #[arg(long, short)]
    pub quiet: bool,
}

fn lut_expectations(v: &[String]) -> Result<BTreeMap<String, u64>> {
    let mut m = BTreeMap::new();
    for s in v {
        let (name, n) = match s.split_once('=') {
            Some((p, n)) => (p.to_string(), n),
            None => ("AudioEncoder.mlpackage".to_string(), s.as_str()),
        };
        let n: u64 = n
            .trim()
            .parse()
            .with_context(|| format!("--expect-lut-ops {s}: `{n}` is not a count"))?;
        m.insert(name, n);
    }
    Ok(m)
}

pub fn run(a: &GateArgs) -> Result<u8> {
    let thresholds = GateThresholds {
        max_wer_regression_points: a.max_wer_regression,
        min_compression: a.min_compression,
        min_parity_snr_db: a.min_parity_snr,
        min_parity_cosine: a.min_parity_cosine,
        timestamp_tolerance_s: a.timestamp_tolerance,
        min_timestamp_agreement: a.min_timestamp_agreement,
        expected_lut_ops: lut_expectations(&a.expect_lut_ops)?,
    };
    let o = GateOptions {
        candidate: a.candidate.clone(),
        baseline: a.baseline.clone(),
        audio: a.audio.clone(),
        smoke: a.smoke.clone(),
        thresholds,
        all: a.all,
        command_line: std::env::args().collect(),
    };
    let quiet = a.quiet || a.json;
    let r = gate(&o, &mut |what| {
        if !quiet {
            eprintln!("{what}");
        }
    })?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", r.to_text());
    }
    Ok(match r.verdict {
        GateVerdict::Go => 0,
        GateVerdict::Kill => 1,
    })
}
