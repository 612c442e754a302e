//! Compression of one package by a quality target on its own outputs (`milkit compress
//! --target-quality`): the plans of [`super::target::LADDER`] up to 8 bits (2, 3, 4, 6, 8
//! bits and the mixed plans between them), each applied to a copy of the model with the
//! caller's compression flags, run on probe inputs beside the uncompressed model, and the
//! fewest bits whose outputs meet every bound kept. The measures are those of any package:
//! the PSNR of each output against the uncompressed model's (peak = the reference's largest
//! magnitude, as `fidelity` measures the encoder) and its relative L2 error, the worst over
//! outputs and probes. Probes are the caller's tensors, or seeded standard-normal tensors of
//! each float input's default shape.

use super::fidelity::{flat, psnr_and_cosine};
use super::target::{bisect_ladder, Rung, LADDER};
use crate::convert::compress::CompressFlags;
use crate::convert::recipe::target_items;
use crate::ir::{ArrayDType, FeatureKind, Model};
use crate::ops::random::Rng;
use crate::passes::compress::Outcome;
use crate::passes::lut::LutMode;
use crate::runtime::{Session, Tensor};
use anyhow::{bail, ensure, Context, Result};
use serde::Serialize;

/// Bounds on a compressed package's outputs against the uncompressed package; every bound
/// given must hold. On the command line `KEY=VALUE,...` with the field names as keys.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OutputTarget {
    /// Lowest PSNR of any output on any probe, dB.
    pub min_psnr_db: Option<f64>,
    /// Highest relative L2 error ‖got − want‖ / ‖want‖ of any output on any probe.
    pub max_rel_error: Option<f64>,
    /// Try no plan with more nominal bits than this.
    pub max_bits: Option<f64>,
}

const KEYS: &str = "min_psnr_db, max_rel_error, max_bits";

impl OutputTarget {
    /// Parses `KEY=VALUE,...`; at least one quality bound must be given.
    pub fn parse(text: &str) -> Result<OutputTarget> {
        let mut t = OutputTarget::default();
        for (k, v) in target_items(text, "min_psnr_db=40")? {
            let slot = match k {
                "min_psnr_db" => &mut t.min_psnr_db,
                "max_rel_error" => &mut t.max_rel_error,
                "max_bits" => &mut t.max_bits,
                other => bail!(
                    "unknown quality target `{other}` for one package ({KEYS}; the Whisper measures such as max_wer_delta belong to `export --recipe`)"
                ),
            };
            *slot = Some(v);
        }
        ensure!(
            t.min_psnr_db.is_some() || t.max_rel_error.is_some(),
            "quality target `{text}` sets no bound on the outputs (min_psnr_db or max_rel_error)"
        );
        Ok(t)
    }

    pub fn to_text(&self) -> String {
        [
            ("min_psnr_db", self.min_psnr_db),
            ("max_rel_error", self.max_rel_error),
            ("max_bits", self.max_bits),
        ]
        .iter()
        .filter_map(|(k, v)| v.map(|v| format!("{k}={v}")))
        .collect::<Vec<_>>()
        .join(",")
    }

    /// The bounds a measurement misses, one sentence each.
    fn misses(&self, psnr_db: f64, rel_error: f64) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(b) = self.min_psnr_db.filter(|&b| psnr_db < b) {
            out.push(format!("PSNR {psnr_db:.1} dB < {b} dB"));
        }
        if let Some(b) = self.max_rel_error.filter(|&b| rel_error > b) {
            out.push(format!("relative error {rel_error:.2e} > {b:e}"));
        }
        out
    }
}

/// One set of inputs for the default function, by name.
pub type Probe = Vec<(String, Tensor)>;

/// `n` probes of seeded standard-normal values, each float input at its default shape.
/// Inputs of other kinds (integers, images, strings) have no neutral random value: they are
/// refused by name, to be given as files.
pub fn random_probes(model: &Model, n: usize, seed: u64) -> Result<Vec<Probe>> {
    let mut rng = Rng::new(seed);
    let mut probes = Vec::new();
    for _ in 0..n {
        let mut p = Probe::new();
        for f in &model.description.inputs {
            // fp32 values; the session converts them at the boundary as Core ML does.
            match (&f.kind, f.dtype) {
                (FeatureKind::Array, ArrayDType::F16 | ArrayDType::F32 | ArrayDType::F64) => {}
                _ => bail!(
                    "input `{}` is not a float array, so random probes cannot stand for it; give its values with --target-input {}=FILE.npy",
                    f.name,
                    f.name
                ),
            }
            let len: usize = f.shape.iter().product();
            let v: Vec<f32> = (0..len).map(|_| rng.normal() as f32).collect();
            p.push((
                f.name.clone(),
                Tensor::from_vec(v, f.shape.as_slice(), &candle_core::Device::Cpu)?,
            ));
        }
        probes.push(p);
    }
    Ok(probes)
}

/// What the search chose.
pub struct Chosen {
    /// The model compressed by the chosen plan.
    pub model: Model,
    /// The flags of that plan (the caller's, with its widths).
    pub flags: CompressFlags,
    pub outcome: Outcome,
    pub report: OutputTargetReport,
}

/// The caller's flags with a plan's widths.
fn rung_flags(flags: &CompressFlags, rung: Rung) -> Result<CompressFlags> {
    let mut f = flags.clone();
    f.nbits = rung.nbits.context("compressed plans only")?;
    f.target_bits = rung.target_bits;
    Ok(f)
}

/// One plan's measurement.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OutputRung {
    pub plan: String,
    pub nominal_bits: f64,
    /// Stored bits per compressed weight element, tables and scales included.
    pub avg_bits: f64,
    /// The lowest PSNR over outputs and probes, dB (infinite where identical).
    pub psnr_db: f64,
    /// The highest relative L2 error over outputs and probes.
    pub rel_error: f64,
    /// The bounds it misses; empty when it meets the target.
    pub misses: Vec<String>,
}

/// The search: the target, how many probes, every plan measured, the one chosen.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OutputTargetReport {
    pub target: String,
    pub probes: usize,
    pub tried: Vec<OutputRung>,
    pub chosen: String,
    pub chosen_avg_bits: f64,
}

impl OutputTargetReport {
    pub fn to_text(&self) -> String {
        let mut s = format!(
            "quality target {} ({} probe{})\n| plan | bits | lowest PSNR | highest relative error | meets |\n|---|---|---|---|---|\n",
            self.target,
            self.probes,
            if self.probes == 1 { "" } else { "s" }
        );
        for r in &self.tried {
            s += &format!(
                "| {} | {:.3} | {} | {:.2e} | {} |\n",
                r.plan,
                r.avg_bits,
                psnr_text(r.psnr_db),
                r.rel_error,
                if r.misses.is_empty() {
                    "yes".to_string()
                } else {
                    format!("no: {}", r.misses.join("; "))
                }
            );
        }
        s += &format!(
            "chosen: {} ({:.3} bits per compressed weight)\n",
            self.chosen, self.chosen_avg_bits
        );
        s
    }
}

fn psnr_text(p: f64) -> String {
    if p.is_finite() {
        format!("{p:.1} dB")
    } else {
        "identical".into()
    }
}

/// Stored bits per compressed element of an outcome.
fn outcome_bits(o: &Outcome) -> f64 {
    let bytes: u64 = o.compressed.iter().map(|c| c.bytes_after).sum();
    let elems: usize = o
        .compressed
        .iter()
        .map(|c| c.shape.iter().product::<usize>())
        .sum();
    8.0 * bytes as f64 / elems.max(1) as f64
}

/// ‖b − a‖ / ‖a‖ (infinite when `a` is all zeros and `b` is not).
fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let (mut d, mut r) = (0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        d += (f64::from(*x) - f64::from(*y)).powi(2);
        r += f64::from(*x).powi(2);
    }
    if r > 0.0 {
        (d / r).sqrt()
    } else if d > 0.0 {
        f64::INFINITY
    } else {
        0.0
    }
}

/// Each probe's outputs, by name, as f32 values.
type Outputs = Vec<Vec<(String, Vec<f32>)>>;

fn run_all(session: &mut Session, probes: &[Probe]) -> Result<Outputs> {
    probes
        .iter()
        .map(|p| {
            let feeds: Vec<(&str, Tensor)> =
                p.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
            session
                .predict(&feeds)?
                .into_iter()
                .map(|(n, t)| Ok((n, flat(&t)?)))
                .collect()
        })
        .collect()
}

/// Searches the plans for the fewest bits whose outputs on `probes` meet `target`; `flags`
/// give everything but the widths (k-means or uniform palettization, its granularity,
/// statistics, selection). Returns the model compressed by the chosen plan with its flags,
/// outcome and the report; an error names the best plan reached when none meets the target.
pub fn search(
    model: &Model,
    flags: &CompressFlags,
    target: &OutputTarget,
    probes: &[Probe],
    progress: &mut dyn FnMut(&str),
) -> Result<Chosen> {
    ensure!(
        flags.palettize.is_some(),
        "a quality target chooses palettization widths: give --palettize kmeans (or uniform)"
    );
    ensure!(
        flags.target_bits.is_none() && flags.op_nbits.is_empty(),
        "a quality target chooses the widths itself: leave out --target-bits and --op-nbits"
    );
    ensure!(
        flags.cluster_dim == 1,
        "a quality target plans scalar tables; it does not apply with --cluster-dim {}",
        flags.cluster_dim
    );
    ensure!(!probes.is_empty(), "a quality target needs probe inputs");
    let max = target.max_bits.unwrap_or(f64::INFINITY);
    // Up to 8 bits: the plans above keep weights fp16, which one package's budget has no
    // use for (compress less instead).
    let n = LADDER
        .iter()
        .filter(|r| r.nbits.is_some() && r.nominal_bits() <= max.min(8.0))
        .count();
    if n == 0 {
        bail!("max_bits = {max}: no plan (2 bits and up) is that small");
    }
    let mut reference =
        Session::from_model(model.clone()).context("preparing the uncompressed model to run")?;
    progress("running the uncompressed model on the probes");
    let want = run_all(&mut reference, probes)?;
    let mut results: Vec<Option<OutputRung>> = vec![None; n];
    // The compressed model of the fewest-bits plan met so far (one copy held at a time).
    let mut kept: Option<(usize, Model, Outcome)> = None;
    let mixed = flags.palettize == Some(LutMode::Kmeans);
    let (chosen, met) = bisect_ladder(n, mixed, &mut |i| {
        if let Some(r) = &results[i] {
            return Ok(r.misses.is_empty());
        }
        let rung = LADDER[i];
        let f = rung_flags(flags, rung)?;
        progress(&format!("compressing: plan {}", rung.name()));
        let mut m = model.clone();
        let c = f.compression()?.context("palettization asked for")?;
        let outcome = c
            .apply(&mut m)
            .with_context(|| format!("plan {}", rung.name()))?;
        progress(&format!("measuring plan {}", rung.name()));
        let mut s = Session::from_model(m.clone())
            .with_context(|| format!("preparing plan {} to run", rung.name()))?;
        let got = run_all(&mut s, probes)?;
        let (mut psnr, mut rel) = (f64::INFINITY, 0f64);
        for (w, g) in want.iter().zip(&got) {
            for ((name, a), (_, b)) in w.iter().zip(g) {
                ensure!(
                    a.len() == b.len(),
                    "output `{name}` changed size under plan {}",
                    rung.name()
                );
                psnr = psnr.min(psnr_and_cosine(a, b).0);
                rel = rel.max(rel_l2(a, b));
            }
        }
        let r = OutputRung {
            plan: rung.name(),
            nominal_bits: rung.nominal_bits(),
            avg_bits: outcome_bits(&outcome),
            psnr_db: psnr,
            rel_error: rel,
            misses: target.misses(psnr, rel),
        };
        let meets = r.misses.is_empty();
        if meets && kept.as_ref().is_none_or(|(j, _, _)| i < *j) {
            kept = Some((i, m, outcome));
        }
        results[i] = Some(r);
        Ok(meets)
    })?;
    let tried: Vec<OutputRung> = results.into_iter().flatten().collect();
    if !met {
        let best = tried
            .iter()
            .max_by(|a, b| a.nominal_bits.total_cmp(&b.nominal_bits))
            .context("no plan measured")?;
        bail!(
            "no plan up to {} meets the quality target {} on {} probe{}; the best reached is {} ({:.3} bits), which misses {}: its lowest PSNR is {}, its highest relative error {:.2e}",
            LADDER[n - 1].name(),
            target.to_text(),
            probes.len(),
            if probes.len() == 1 { "" } else { "s" },
            best.plan,
            best.avg_bits,
            best.misses.join("; "),
            psnr_text(best.psnr_db),
            best.rel_error
        );
    }
    let (i, m, outcome) = kept.context("the chosen plan was not kept")?;
    ensure!(i == chosen, "the plan kept is not the plan chosen");
    let rung = &tried[tried
        .iter()
        .position(|r| r.plan == LADDER[i].name())
        .context("the chosen plan was not measured")?];
    let report = OutputTargetReport {
        target: target.to_text(),
        probes: probes.len(),
        chosen: rung.plan.clone(),
        chosen_avg_bits: rung.avg_bits,
        tried: tried.clone(),
    };
    Ok(Chosen {
        model: m,
        flags: rung_flags(flags, LADDER[i])?,
        outcome,
        report,
    })
}
