//! `milkit gate`: the cheapest-falsifier ladder for a compressed models folder against its
//! baseline, rung by rung, stopping at the first failed rung unless asked to run them all.
//!
//! Components may be packages or compiled `.mlmodelc` models, matched by name
//! (`AudioEncoder.mlpackage` and `AudioEncoder.mlmodelc` are one component).
//!
//! 1. Package physics (no model run): the same packages with the same I/O (inputs, outputs,
//!    states), op histograms side by side, the candidate's constexpr ops by kind and a stated
//!    LUT count, the positional embedding a plain fp16 constant, the compressed weights at
//!    least `min_compression` times smaller than their fp16 bytes, digests of both.
//! 2. Static placement: no material op (conv, linear, matmul, attention) on the Neural Engine
//!    in the baseline is placed elsewhere in the candidate — predicted by milkit's rules
//!    (`verify --placement`), labelled so; Core ML's MLComputePlan measures only on macOS.
//! 3. Numerical parity on three probes per component — real speech (the first clip's first
//!    30 s), the processor's log-mel of silence, and a deterministic stress tensor: the
//!    encoders on the same input, the decoders teacher-forced on the same tokens over the
//!    baseline encoder's output; max and mean absolute error, cosine and SNR per probe.
//! 4. End to end, both folders decoding as `milkit transcribe` does: no text regression on
//!    the smoke clips, the held-out WER regression within bound (against the reference texts,
//!    or against the baseline's transcripts when the clips have none), segment timestamps and
//!    no-speech decisions agreeing with the baseline's.
//!
//! The [`GateReport`] holds every number measured; it has no timings, so the same inputs give
//! the same report.

use crate::quality::eval::{default_normalization, read_manifest, ManifestClip};
use crate::quality::fidelity::{flat, psnr_and_cosine};
use crate::report::{
    GateClip, GateEndToEnd, GatePackage, GatePlacement, GateProbe, GateReport, GateRung,
    GateThresholds, GateVerdict, PositionalStatus, RungStatus, TensorInfo, VerifyReport,
};
use crate::runtime::Tensor;
use crate::transcribe::decoder::Cross;
use crate::transcribe::{component, components, TranscribeOptions, Transcriber, Transcript};
use crate::verify::cli::verify_package;
use crate::verify::VerifyOptions;
use crate::whisper::audio::{load_audio, N_SAMPLES};
use crate::whisper::wer::{rate, word_errors_with, Normalization};
use anyhow::{bail, ensure, Context, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Op types whose placement rung 2 guards.
pub const MATERIAL_OPS: [&str; 5] = [
    "conv",
    "linear",
    "matmul",
    "scaled_dot_product_attention",
    "einsum",
];

/// Tokens of the baseline's speech transcript the decoder probes are teacher-forced on,
/// after the prompt.
const PROBE_TOKENS: usize = 8;

/// What to gate and with which limits.
#[derive(Clone, Debug)]
pub struct GateOptions {
    pub candidate: PathBuf,
    pub baseline: PathBuf,
    /// Held-out clips: WAV files or JSON-lines manifests (`audio`, optional `text`,
    /// `language`).
    pub audio: Vec<PathBuf>,
    /// Smoke clips (same forms): their text must not regress at all.
    pub smoke: Vec<PathBuf>,
    pub thresholds: GateThresholds,
    /// Run every rung even after one failed.
    pub all: bool,
    pub command_line: Vec<String>,
}

impl GateThresholds {
    /// The gate's defaults (see `milkit gate --help`).
    pub fn defaults() -> GateThresholds {
        GateThresholds {
            max_wer_regression_points: 1.0,
            min_compression: 3.5,
            min_parity_snr_db: 3.0,
            min_parity_cosine: 0.8,
            timestamp_tolerance_s: 0.5,
            min_timestamp_agreement: 0.9,
            expected_lut_ops: BTreeMap::new(),
        }
    }
}

/// A clip of rung 4.
struct Clip {
    name: String,
    path: PathBuf,
    text: Option<String>,
    language: Option<String>,
    smoke: bool,
}

fn clips_of(paths: &[PathBuf], smoke: bool) -> Result<(Vec<Clip>, Vec<ManifestClip>)> {
    let mut out = vec![];
    let mut manifest_clips = vec![];
    for p in paths {
        if p.extension().is_some_and(|e| e == "jsonl") {
            for c in read_manifest(p)? {
                out.push(Clip {
                    name: c.name.clone(),
                    path: c.path.clone(),
                    text: c.text.clone(),
                    language: c.language.clone(),
                    smoke,
                });
                manifest_clips.push(c);
            }
        } else {
            ensure!(p.is_file(), "{}: no such audio file", p.display());
            out.push(Clip {
                name: p.display().to_string(),
                path: p.clone(),
                text: None,
                language: None,
                smoke,
            });
        }
    }
    Ok((out, manifest_clips))
}

/// The components of a models folder (packages, or compiled models where the package is
/// absent), each named as its package.
fn packages(dir: &Path) -> Result<Vec<String>> {
    let out = components(dir)?;
    ensure!(
        !out.is_empty(),
        "{} holds no .mlpackage or .mlmodelc",
        dir.display()
    );
    Ok(out)
}

fn ops_of(r: &VerifyReport) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for f in &r.model.functions {
        for (k, v) in &f.ops {
            *m.entry(k.clone()).or_insert(0) += v;
        }
    }
    m
}

fn features(kind: &str, a: &[TensorInfo], b: &[TensorInfo], out: &mut Vec<String>) {
    let show = |t: &TensorInfo| format!("{} {} {:?}", t.name, t.dtype, t.shape);
    for t in a {
        match b.iter().find(|u| u.name == t.name) {
            None => out.push(format!("{kind} `{}` missing in the candidate", t.name)),
            Some(u) if u != t => out.push(format!(
                "{kind} `{}`: baseline {}, candidate {}",
                t.name,
                show(t),
                show(u)
            )),
            Some(_) => {}
        }
    }
    for u in b {
        if !a.iter().any(|t| t.name == u.name) {
            out.push(format!("{kind} `{}` only in the candidate", u.name));
        }
    }
}

/// Rung 1 for one package.
fn physics(
    name: &str,
    base: &VerifyReport,
    cand: &VerifyReport,
    th: &GateThresholds,
) -> GatePackage {
    let mut diffs = vec![];
    features("input", &base.model.inputs, &cand.model.inputs, &mut diffs);
    features(
        "output",
        &base.model.outputs,
        &cand.model.outputs,
        &mut diffs,
    );
    features("state", &base.model.states, &cand.model.states, &mut diffs);
    let (fp16, stored) = cand.constexpr.ops.iter().fold((0u64, 0u64), |(a, b), o| {
        (a + o.dense_fp16_bytes, b + o.stored_bytes)
    });
    GatePackage {
        package: name.to_string(),
        abi_equal: diffs.is_empty(),
        abi_differences: diffs,
        baseline_ops: ops_of(base),
        candidate_ops: ops_of(cand),
        candidate_constexpr: cand.constexpr.counts.clone(),
        lut_ops: cand
            .constexpr
            .counts
            .get("constexpr_lut_to_dense")
            .copied()
            .unwrap_or(0),
        expected_lut_ops: th.expected_lut_ops.get(name).copied(),
        positional_embedding: cand.positional_embedding.status,
        compressed_fp16_bytes: fp16,
        compressed_stored_bytes: stored,
        compression_ratio: (stored > 0).then(|| fp16 as f64 / stored as f64),
        baseline_sha256: base.receipt.digests.package.clone(),
        candidate_sha256: cand.receipt.digests.package.clone(),
    }
}

fn physics_reasons(p: &GatePackage, th: &GateThresholds) -> Vec<String> {
    let mut r = vec![];
    for d in &p.abi_differences {
        r.push(format!("{}: {d}", p.package));
    }
    if let Some(want) = p.expected_lut_ops {
        if p.lut_ops != want {
            r.push(format!(
                "{}: {} constexpr_lut_to_dense ops, expected {want}",
                p.package, p.lut_ops
            ));
        }
    }
    if matches!(
        p.positional_embedding,
        PositionalStatus::Compressed | PositionalStatus::NotFp16
    ) {
        r.push(format!(
            "{}: the positional embedding is not a plain fp16 constant ({:?})",
            p.package, p.positional_embedding
        ));
    }
    if let Some(ratio) = p.compression_ratio {
        if ratio < th.min_compression {
            r.push(format!(
                "{}: compressed weights are {ratio:.2}× smaller than fp16, below {:.2}×",
                p.package, th.min_compression
            ));
        }
    }
    r
}

/// Rung 2 for one package.
fn placement(name: &str, base: &VerifyReport, cand: &VerifyReport) -> Result<GatePlacement> {
    let (Some(pb), Some(pc)) = (&base.placement, &cand.placement) else {
        bail!("{name}: no placement in the verify reports");
    };
    let material = |t: &str| MATERIAL_OPS.contains(&t);
    let on_ane = |u: crate::report::ComputeUnit| u == crate::report::ComputeUnit::Ane;
    let mut moved = vec![];
    let mut base_ane = 0;
    for row in pb
        .ops
        .iter()
        .filter(|r| material(&r.op_type) && on_ane(r.unit))
    {
        base_ane += 1;
        let same = pc
            .ops
            .iter()
            .find(|c| c.function == row.function && c.name == row.name);
        match same {
            Some(c) if on_ane(c.unit) => {}
            Some(c) => moved.push(format!(
                "{} `{}` ({}): ANE in the baseline, {:?} in the candidate",
                row.op_type, row.name, row.function, c.unit
            )),
            None => moved.push(format!(
                "{} `{}` ({}): on the ANE in the baseline, absent from the candidate",
                row.op_type, row.name, row.function
            )),
        }
    }
    let cand_ane = pc
        .ops
        .iter()
        .filter(|r| material(&r.op_type) && on_ane(r.unit))
        .count() as u64;
    Ok(GatePlacement {
        package: name.to_string(),
        basis: pc.basis.clone(),
        baseline_ane_material_ops: base_ane,
        candidate_ane_material_ops: cand_ane,
        moved_off_ane: moved,
    })
}

/// Max and mean absolute error, cosine and SNR of `got` against `want`.
pub fn compare(component: &str, probe: &str, want: &[f32], got: &[f32]) -> GateProbe {
    let (mut max, mut sum, mut sig, mut err) = (0f64, 0f64, 0f64, 0f64);
    for (&w, &g) in want.iter().zip(got) {
        let (w, g) = (f64::from(w), f64::from(g));
        let d = (w - g).abs();
        // A NaN anywhere is a collapse, never a pass.
        max = if d.is_nan() {
            f64::INFINITY
        } else {
            max.max(d)
        };
        sum += d;
        sig += w * w;
        err += d * d;
    }
    let n = want.len().max(1) as f64;
    let (_, cosine) = psnr_and_cosine(want, got);
    let snr_db = if err == 0.0 && want.len() == got.len() {
        None
    } else if err.is_nan() {
        Some(f64::NEG_INFINITY)
    } else {
        Some(10.0 * (sig / err).log10())
    };
    GateProbe {
        component: component.to_string(),
        probe: probe.to_string(),
        values: want.len() as u64,
        max_abs_error: max,
        mean_abs_error: if sum.is_nan() { f64::INFINITY } else { sum / n },
        cosine: if cosine.is_nan() { 0.0 } else { cosine },
        snr_db: if want.len() == got.len() {
            snr_db
        } else {
            Some(f64::NEG_INFINITY)
        },
    }
}

/// A deterministic stress input: uniform values in [-1.5, 1.5] (the log-mel's range is
/// about [-1, 1.5]) from a fixed linear congruential sequence.
fn stress(shape: &[usize]) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let v: Vec<f32> = (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 3.0 - 1.5
        })
        .collect();
    Ok(Tensor::from_vec(v, shape, &candle_core::Device::Cpu)?)
}

/// Rung 3: the probes of both components.
fn parity(
    base: &mut Transcriber,
    cand: &mut Transcriber,
    speech: &[f32],
) -> Result<Vec<GateProbe>> {
    ensure!(
        base.encoder_input_shape() == cand.encoder_input_shape(),
        "the encoders take {:?} and {:?}",
        base.encoder_input_shape(),
        cand.encoder_input_shape()
    );
    let shape = base.encoder_input_shape().to_vec();
    let silence = vec![0.0f32; N_SAMPLES];
    let speech = &speech[..speech.len().min(N_SAMPLES)];
    let mut encoded = vec![];
    for (probe, samples) in [
        ("speech", Some(speech)),
        ("silence", Some(&silence[..])),
        ("stress", None),
    ] {
        let (eb, cb, ec) = match samples {
            Some(s) => {
                let (eb, cb) = base.encode_window(s)?;
                let (ec, _) = cand.encode_window(s)?;
                (eb, cb, ec)
            }
            None => {
                let mel = stress(&shape)?;
                let (eb, cb) = base.encode_mel(mel.clone())?;
                let (ec, _) = cand.encode_mel(mel)?;
                (eb, cb, ec)
            }
        };
        encoded.push((probe, eb, cb, ec));
    }
    let mut out = vec![];
    for (probe, eb, _, ec) in &encoded {
        out.push(compare("encoder", probe, &flat(eb)?, &flat(ec)?));
    }
    // The decoders read the same cross-attention input (the baseline encoder's output, each
    // through its own CrossKV model if any) and the same tokens: the prompt and the first
    // tokens of the baseline's speech transcript.
    let pass = base.greedy_pass(&encoded[0].2, &TranscribeOptions::greedy_no_timestamps())?;
    let fed: Vec<u32> = pass
        .prompt
        .iter()
        .chain(pass.tokens.iter().take(PROBE_TOKENS))
        .copied()
        .collect();
    for (probe, eb, cb, _) in &encoded {
        let cross: Cross = cand.cross_for(eb.clone())?;
        let lb: Vec<f32> = base.teacher_force(cb, &fed)?.concat();
        let lc: Vec<f32> = cand.teacher_force(&cross, &fed)?.concat();
        out.push(compare("decoder", probe, &lb, &lc));
    }
    Ok(out)
}

fn boundaries(t: &Transcript) -> Vec<f64> {
    t.segments.iter().flat_map(|s| [s.start, s.end]).collect()
}

/// Rung 4.
fn end_to_end(
    base: &mut Transcriber,
    cand: &mut Transcriber,
    clips: &[Clip],
    norm: Normalization,
    th: &GateThresholds,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<GateEndToEnd> {
    let mut rows = vec![];
    for (i, c) in clips.iter().enumerate() {
        let opts = TranscribeOptions {
            language: c.language.clone(),
            ..TranscribeOptions::default()
        };
        let tb = base
            .transcribe_file_with(&c.path, &opts)
            .with_context(|| format!("baseline on {}", c.path.display()))?;
        // The candidate decodes in the language the baseline found.
        let opts = TranscribeOptions {
            language: tb.language.clone().or(opts.language),
            ..opts
        };
        let tc = cand
            .transcribe_file_with(&c.path, &opts)
            .with_context(|| format!("candidate on {}", c.path.display()))?;
        let (bt, ct) = (tb.text.trim().to_string(), tc.text.trim().to_string());
        let refs = c.text.as_deref().map(|r| {
            let (eb, n) = word_errors_with(r, &bt, norm);
            let (ec, _) = word_errors_with(r, &ct, norm);
            (eb, ec, n)
        });
        let (errors_vs_baseline, baseline_words) = word_errors_with(&bt, &ct, norm);
        let (bb, cb) = (boundaries(&tb), boundaries(&tc));
        let matched = bb
            .iter()
            .filter(|&&b| {
                cb.iter()
                    .any(|&c| (c - b).abs() <= th.timestamp_tolerance_s + 1e-9)
            })
            .count();
        rows.push(GateClip {
            audio: c.name.clone(),
            smoke: c.smoke,
            reference: c.text.clone(),
            baseline_text: bt,
            candidate_text: ct,
            baseline_errors: refs.map(|r| r.0),
            candidate_errors: refs.map(|r| r.1),
            reference_words: refs.map(|r| r.2),
            errors_vs_baseline,
            baseline_words,
            timestamp_boundaries: bb.len(),
            timestamps_matched: matched,
            baseline_silent: tb.windows.iter().map(|w| w.silent).collect(),
            candidate_silent: tc.windows.iter().map(|w| w.silent).collect(),
        });
        progress(i + 1, clips.len());
    }
    let held: Vec<&GateClip> = rows.iter().filter(|r| !r.smoke).collect();
    let with_refs = !held.is_empty() && held.iter().all(|r| r.reference.is_some());
    let (baseline_wer, candidate_wer) = if with_refs {
        let words: usize = held.iter().filter_map(|r| r.reference_words).sum();
        (
            rate((held.iter().filter_map(|r| r.baseline_errors).sum(), words)),
            rate((held.iter().filter_map(|r| r.candidate_errors).sum(), words)),
        )
    } else {
        (
            0.0,
            rate((
                held.iter().map(|r| r.errors_vs_baseline).sum(),
                held.iter().map(|r| r.baseline_words).sum(),
            )),
        )
    };
    let total: usize = rows.iter().map(|r| r.timestamp_boundaries).sum();
    let matched: usize = rows.iter().map(|r| r.timestamps_matched).sum();
    Ok(GateEndToEnd {
        measured_against: if with_refs {
            "reference"
        } else {
            "baseline transcript"
        }
        .to_string(),
        baseline_wer,
        candidate_wer,
        wer_regression_points: 100.0 * (candidate_wer - baseline_wer),
        timestamp_agreement: if total == 0 {
            1.0
        } else {
            matched as f64 / total as f64
        },
        no_speech_agreement: rows.iter().all(|r| r.baseline_silent == r.candidate_silent),
        clips: rows,
    })
}

fn end_to_end_reasons(e: &GateEndToEnd, th: &GateThresholds) -> Vec<String> {
    let mut r = vec![];
    for c in e.clips.iter().filter(|c| c.smoke) {
        let regressed = match (c.baseline_errors, c.candidate_errors) {
            (Some(b), Some(k)) => k > b,
            _ => c.errors_vs_baseline > 0,
        };
        if regressed {
            r.push(format!(
                "smoke clip {}: the text regressed (baseline \"{}\", candidate \"{}\")",
                c.audio, c.baseline_text, c.candidate_text
            ));
        }
    }
    if e.wer_regression_points > th.max_wer_regression_points + 1e-9 {
        r.push(format!(
            "held-out WER {:.2} % against {:.2} % ({}): +{:.2} points, above {:.2}",
            100.0 * e.candidate_wer,
            100.0 * e.baseline_wer,
            e.measured_against,
            e.wer_regression_points,
            th.max_wer_regression_points
        ));
    }
    if e.timestamp_agreement + 1e-9 < th.min_timestamp_agreement {
        r.push(format!(
            "{:.1} % of the baseline's segment boundaries matched within {} s, below {:.1} %",
            100.0 * e.timestamp_agreement,
            th.timestamp_tolerance_s,
            100.0 * th.min_timestamp_agreement
        ));
    }
    for c in e
        .clips
        .iter()
        .filter(|c| c.baseline_silent != c.candidate_silent)
    {
        r.push(format!(
            "{}: no-speech decisions differ (baseline {:?}, candidate {:?})",
            c.audio, c.baseline_silent, c.candidate_silent
        ));
    }
    r
}

fn parity_reasons(probes: &[GateProbe], th: &GateThresholds) -> Vec<String> {
    probes
        .iter()
        .filter(|p| {
            // NaN compares false with everything: a NaN SNR or cosine is below any limit.
            let snr_ok = p.snr_db.is_none_or(|s| s >= th.min_parity_snr_db);
            let cos_ok = p.cosine >= th.min_parity_cosine;
            !(snr_ok && cos_ok)
        })
        .map(|p| {
            format!(
                "{} on the {} probe: SNR {} dB, cosine {:.4} (limits {} dB, {})",
                p.component,
                p.probe,
                p.snr_db.map_or("∞".to_string(), |s| format!("{s:.1}")),
                p.cosine,
                th.min_parity_snr_db,
                th.min_parity_cosine
            )
        })
        .collect()
}

/// Runs the ladder. Errors only for unusable input (a folder or package that cannot be
/// read, no clips); a failed rung is a [`GateVerdict::Kill`] in the report.
pub fn gate(o: &GateOptions, progress: &mut dyn FnMut(&str)) -> Result<GateReport> {
    let (smoke, mut manifest) = clips_of(&o.smoke, true)?;
    let (held, m2) = clips_of(&o.audio, false)?;
    manifest.extend(m2);
    let clips: Vec<Clip> = smoke.into_iter().chain(held).collect();
    ensure!(
        clips.iter().any(|c| !c.smoke),
        "no held-out clips: give --audio WAV files or a manifest"
    );
    let base_pkgs = packages(&o.baseline)?;
    let cand_pkgs = packages(&o.candidate)?;
    for name in o.thresholds.expected_lut_ops.keys() {
        ensure!(
            cand_pkgs.contains(name),
            "--expect-lut-ops names {name}, which {} does not hold",
            o.candidate.display()
        );
    }
    let opts = VerifyOptions {
        placement: true,
        ..Default::default()
    };
    let mut rungs = vec![];
    let mut packages_out = vec![];
    let mut placements = vec![];
    let mut reasons1 = vec![];
    let mut reports = vec![];
    progress("rung 1: package physics");
    for name in &base_pkgs {
        if !cand_pkgs.contains(name) {
            reasons1.push(format!("{name}: missing in the candidate"));
            continue;
        }
        let b = verify_package(&component(&o.baseline, name), &opts, &o.command_line)?;
        let c = verify_package(&component(&o.candidate, name), &opts, &o.command_line)?;
        let p = physics(name, &b, &c, &o.thresholds);
        reasons1.extend(physics_reasons(&p, &o.thresholds));
        packages_out.push(p);
        reports.push((name.clone(), b, c));
    }
    for name in cand_pkgs.iter().filter(|n| !base_pkgs.contains(n)) {
        reasons1.push(format!("{name}: only in the candidate"));
    }
    let mut failed = !reasons1.is_empty();
    rungs.push(rung(1, "package physics", reasons1));

    let run = |failed: bool| !failed || o.all;
    if run(failed) {
        progress("rung 2: static placement (predicted)");
        let mut reasons = vec![];
        for (name, b, c) in &reports {
            let p = placement(name, b, c)?;
            reasons.extend(p.moved_off_ane.iter().map(|m| format!("{name}: {m}")));
            placements.push(p);
        }
        failed |= !reasons.is_empty();
        rungs.push(rung(2, "static placement", reasons));
    } else {
        rungs.push(not_run(2, "static placement"));
    }

    let mut parity_out = vec![];
    let mut e2e = None;
    if run(failed) {
        let mut base = Transcriber::open(&o.baseline)
            .with_context(|| format!("opening the baseline {}", o.baseline.display()))?;
        let mut cand = Transcriber::open(&o.candidate)
            .with_context(|| format!("opening the candidate {}", o.candidate.display()))?;
        progress("rung 3: numerical parity");
        let first = clips.iter().find(|c| !c.smoke).unwrap_or(&clips[0]);
        let speech = load_audio(&first.path)?;
        parity_out = parity(&mut base, &mut cand, &speech)?;
        let reasons = parity_reasons(&parity_out, &o.thresholds);
        failed |= !reasons.is_empty();
        rungs.push(rung(3, "numerical parity", reasons));
        if run(failed) {
            progress("rung 4: end to end");
            let norm = if !manifest.is_empty() {
                default_normalization(&manifest)
            } else if base.rules().is_multilingual() {
                Normalization::Unicode
            } else {
                Normalization::Ascii
            };
            let e = end_to_end(
                &mut base,
                &mut cand,
                &clips,
                norm,
                &o.thresholds,
                &mut |i, n| progress(&format!("  clip {i}/{n}")),
            )?;
            let reasons = end_to_end_reasons(&e, &o.thresholds);
            rungs.push(rung(4, "end to end", reasons));
            e2e = Some(e);
        } else {
            rungs.push(not_run(4, "end to end"));
        }
    } else {
        rungs.push(not_run(3, "numerical parity"));
        rungs.push(not_run(4, "end to end"));
    }
    let first_fail = rungs.iter().find(|r| r.status == RungStatus::Fail);
    Ok(GateReport {
        tool: "milkit".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        command_line: o.command_line.clone(),
        candidate: o.candidate.display().to_string(),
        baseline: o.baseline.display().to_string(),
        verdict: if first_fail.is_some() {
            GateVerdict::Kill
        } else {
            GateVerdict::Go
        },
        failed_rung: first_fail.map(|r| r.rung),
        reason: first_fail.and_then(|r| r.reasons.first().cloned()),
        thresholds: o.thresholds.clone(),
        rungs,
        packages: packages_out,
        placement: placements,
        parity: parity_out,
        end_to_end: e2e,
    })
}

fn rung(n: u32, name: &str, reasons: Vec<String>) -> GateRung {
    GateRung {
        rung: n,
        name: name.to_string(),
        status: if reasons.is_empty() {
            RungStatus::Pass
        } else {
            RungStatus::Fail
        },
        reasons,
    }
}

fn not_run(n: u32, name: &str) -> GateRung {
    GateRung {
        rung: n,
        name: name.to_string(),
        status: RungStatus::NotRun,
        reasons: vec![],
    }
}

impl GateReport {
    /// The human-readable summary `milkit gate` prints.
    pub fn to_text(&self) -> String {
        let mut s = format!(
            "gate {} against {}: {}\n",
            self.candidate,
            self.baseline,
            match self.verdict {
                GateVerdict::Go => "GO".to_string(),
                GateVerdict::Kill => format!(
                    "KILL at rung {} ({})",
                    self.failed_rung.unwrap_or(0),
                    self.reason.as_deref().unwrap_or("")
                ),
            }
        );
        for r in &self.rungs {
            s += &format!(
                "  rung {} {:<18} {}\n",
                r.rung,
                r.name,
                match r.status {
                    RungStatus::Pass => "pass",
                    RungStatus::Fail => "FAIL",
                    RungStatus::NotRun => "not run",
                }
            );
            for why in &r.reasons {
                s += &format!("      {why}\n");
            }
        }
        s += "\n| package | ABI | LUT ops | positional | compressed fp16 → stored | ratio |\n|---|---|---|---|---|---|\n";
        for p in &self.packages {
            s += &format!(
                "| {} | {} | {}{} | {:?} | {} → {} | {} |\n",
                p.package,
                if p.abi_equal { "equal" } else { "differs" },
                p.lut_ops,
                p.expected_lut_ops
                    .map(|e| format!(" (expected {e})"))
                    .unwrap_or_default(),
                p.positional_embedding,
                p.compressed_fp16_bytes,
                p.compressed_stored_bytes,
                p.compression_ratio
                    .map(|r| format!("{r:.2}×"))
                    .unwrap_or_else(|| "—".into())
            );
        }
        if !self.parity.is_empty() {
            s += "\n| component | probe | max abs | mean abs | cosine | SNR |\n|---|---|---|---|---|---|\n";
            for p in &self.parity {
                s += &format!(
                    "| {} | {} | {:.4} | {:.5} | {:.5} | {} |\n",
                    p.component,
                    p.probe,
                    p.max_abs_error,
                    p.mean_abs_error,
                    p.cosine,
                    p.snr_db
                        .map(|d| format!("{d:.1} dB"))
                        .unwrap_or_else(|| "identical".into())
                );
            }
        }
        if let Some(e) = &self.end_to_end {
            s += &format!(
                "\nend to end ({} clips, against the {}): WER {:.2} % → {:.2} % ({:+.2} points); \
                 timestamps {:.1} % within {} s; no-speech decisions {}\n",
                e.clips.len(),
                e.measured_against,
                100.0 * e.baseline_wer,
                100.0 * e.candidate_wer,
                e.wer_regression_points,
                100.0 * e.timestamp_agreement,
                self.thresholds.timestamp_tolerance_s,
                if e.no_speech_agreement {
                    "agree"
                } else {
                    "differ"
                }
            );
        }
        s
    }
}
