//! Mixed-precision palettization by sensitivity: for a budget of average bits per compressed
//! weight (LUT overhead included), give each weight the bit width where it buys the most
//! accuracy, like WhisperKit's mixed-bit recipes.
//!
//! Sensitivity is measured on calibration audio when statistics are given (without them
//! every `m` is 1, i.e. plain weight error): with `m` the input channels' second moments
//! (see [`super::calibrate`]), a weight palettized at `b` bits has the relative output error
//! `e(b) = Σᵢⱼ mⱼ·ΔWᵢⱼ² / Σᵢⱼ mⱼ·Wᵢⱼ²` (the diagonal estimate of E‖ΔW·x‖² / E‖W·x‖²).
//! Allocation is greedy: every weight starts at the base width (`--nbits`, never lower: on
//! tiny.en, letting the diagonal estimate push a weight down to 2 bits to pay for upgrades
//! elsewhere cost 20 points of WER), then the upgrade with the largest error drop per extra
//! stored bit is taken while the budget allows. All candidate widths are still measured and
//! reported.
//!
//! [`plan_bits_joint`] does the same over several models at once (a Whisper encoder and its
//! decoder): one budget over all their weights. Errors are relative to each weight's own
//! output signal, so weights of different models compete on the same scale.
//!
//! Width 16 ([`FP16`]) stands for a weight left fp16: it costs 16 bits per element and has
//! no error; [`candidates_for`] offers it when the budget is above 8 bits, so a plan between
//! 8 bits and fp16 keeps its most sensitive weights exact and palettizes the rest at 8.
//!
//! Widths fixed beforehand by name (`--op-nbits`, [`PlanPart::fixed`]) are kept: such a
//! weight is measured at its width only, counts towards the average, and is never upgraded,
//! so the other weights share what it leaves of the budget.
//!
//! End-metric sensitivity: when the statistics carry a weight's end-metric curve
//! ([`Calibration::end_metric`], e.g. the decoder's next-token KL divergence or the encoder
//! output's relative squared error with only that weight compressed, measured by
//! `milkit calibrate --sensitivity-recipe`), that curve is the weight's error, at the widths
//! it was measured at, instead of its own relative output error: the allocation then buys
//! the largest drop of the model's output divergence per stored bit (the divergences of
//! single weights taken as adding up). A part's statistics give such curves for all of its
//! weights or for none; parts measured on different scales (per-op errors against curves,
//! or the curves of different components, [`Calibration::end_metric_scale`]) cannot share
//! one budget ([`end_metric_parts`] tells whether a part has curves).

use super::calibrate::Calibration;
use super::compress::{selected_weights, Method, Selection};
use super::lut::{palettize, LutConfig, LutGranularity};
use crate::ir::Model;
use anyhow::{bail, ensure, Context, Result};
use half::f16;
use rayon::prelude::*;
use std::collections::BTreeMap;

/// Bit widths tried by default.
pub const DEFAULT_CANDIDATES: [u32; 5] = [2, 3, 4, 6, 8];

pub use super::compress::FP16;

/// The widths a plan within `target_bits` chooses among: [`DEFAULT_CANDIDATES`], and fp16
/// when the budget is above 8 bits (the widest table), the only way to spend it.
pub fn candidates_for(target_bits: f64) -> Vec<u32> {
    let mut c = DEFAULT_CANDIDATES.to_vec();
    if target_bits > 8.0 {
        c.push(FP16);
    }
    c
}

/// One weight's measured curve and the width chosen for it.
#[derive(Clone, Debug)]
pub struct WeightPlan {
    pub weight: String,
    pub op: String,
    pub elements: usize,
    /// (nbits, stored bits incl. the table, relative output error) per candidate.
    pub curve: Vec<(u32, u64, f64)>,
    pub chosen: u32,
}

/// The allocation.
#[derive(Clone, Debug)]
pub struct MixedPlan {
    pub weights: Vec<WeightPlan>,
    /// Average stored bits per compressed weight element, tables included.
    pub avg_bits: f64,
    pub target_bits: f64,
}

impl MixedPlan {
    pub fn nbits(&self) -> BTreeMap<String, u32> {
        self.weights
            .iter()
            .map(|w| (w.weight.clone(), w.chosen))
            .collect()
    }
}

fn stored_bits(cfg: &LutConfig, shape: &[usize]) -> u64 {
    let numel: u64 = shape.iter().map(|d| *d as u64).product();
    if cfg.nbits == FP16 {
        return numel * 16;
    }
    let tables = match cfg.granularity {
        LutGranularity::PerTensor => 1,
        LutGranularity::PerGroupedChannel(g) => (shape[0] / g.max(1)).max(1) as u64,
    };
    // Per-channel scales add one fp16 value per output channel.
    let scales = if cfg.per_channel_scale {
        shape[0] as u64 * 16
    } else {
        0
    };
    // One index per vector of `cluster_dim` elements; entries of `cluster_dim` fp16 values.
    let cd = cfg.cluster_dim.max(1) as u64;
    numel / cd * cfg.nbits as u64 + tables * (1u64 << cfg.nbits) * 16 * cd + scales
}

/// Measures every selected weight at every candidate width and allocates widths so that the
/// average stored bits stay within `target_bits`.
pub fn plan_bits(
    model: &Model,
    base: &LutConfig,
    sel: &Selection,
    calibration: Option<&Calibration>,
    target_bits: f64,
    candidates: &[u32],
) -> Result<MixedPlan> {
    plan_bits_fixed(
        model,
        base,
        sel,
        calibration,
        target_bits,
        candidates,
        &BTreeMap::new(),
    )
}

/// [`plan_bits`] with the widths of some weights fixed (weight constant name → nbits).
pub fn plan_bits_fixed(
    model: &Model,
    base: &LutConfig,
    sel: &Selection,
    calibration: Option<&Calibration>,
    target_bits: f64,
    candidates: &[u32],
    fixed: &BTreeMap<String, u32>,
) -> Result<MixedPlan> {
    let part = PlanPart {
        model,
        base: *base,
        sel,
        calibration,
        fixed,
    };
    let mut plans = plan_bits_joint(&[part], target_bits, candidates)?;
    Ok(plans.remove(0))
}

/// One model of a joint plan: its weights are measured with its own base table layout,
/// selection and statistics.
pub struct PlanPart<'a> {
    pub model: &'a Model,
    pub base: LutConfig,
    pub sel: &'a Selection,
    pub calibration: Option<&'a Calibration>,
    /// Widths fixed beforehand (weight constant name → nbits): kept, counted, never upgraded.
    pub fixed: &'a BTreeMap<String, u32>,
}

/// Plans several models under ONE budget (e.g. a Whisper encoder and decoder): every weight
/// of every part competes for the same bits, so the average over all parts' compressed
/// weights stays within `target_bits` while each part's own average may be above or below
/// it. Returns one plan per part (its `avg_bits` is that part's own average).
pub fn plan_bits_joint(
    parts: &[PlanPart],
    target_bits: f64,
    candidates: &[u32],
) -> Result<Vec<MixedPlan>> {
    ensure!(!candidates.is_empty(), "no candidate bit widths");
    let mut cands = candidates.to_vec();
    cands.sort_unstable();
    cands.dedup();
    let mut plans = Vec::new();
    let mut owner = Vec::new();
    let mut starts = Vec::new();
    ensure!(
        end_metric_parts(parts).iter().all(|&e| e) || end_metric_parts(parts).iter().all(|&e| !e),
        "one budget over parts whose errors are on different scales: some statistics carry end-metric sensitivity curves and some do not; plan them separately"
    );
    let scales: Vec<Option<&str>> = parts
        .iter()
        .map(|p| p.calibration.and_then(|c| c.end_metric_scale()))
        .collect();
    ensure!(
        scales.windows(2).all(|w| w[0] == w[1]),
        "one budget over parts whose errors are on different scales: end-metric curves measured on {:?}; plan them separately",
        scales.iter().flatten().collect::<Vec<_>>()
    );
    for (i, part) in parts.iter().enumerate() {
        for w in measure(part, &cands)? {
            if part.fixed.contains_key(&w.weight) {
                // A one-point curve: nowhere to move.
                plans.push(w);
                owner.push(i);
                starts.push(0);
                continue;
            }
            // Position on the curve of the part's base width: the first width at or above it.
            let start = w
                .curve
                .iter()
                .position(|c| c.0 >= part.base.nbits)
                .with_context(|| {
                    format!(
                        "`{}`: no candidate width at or above the base {} bits",
                        w.weight, part.base.nbits
                    )
                })?;
            plans.push(w);
            owner.push(i);
            starts.push(start);
        }
    }
    allocate(&mut plans, &starts, target_bits)?;
    let mut out: Vec<MixedPlan> = parts
        .iter()
        .map(|_| MixedPlan {
            weights: Vec::new(),
            avg_bits: 0.0,
            target_bits,
        })
        .collect();
    for (w, i) in plans.into_iter().zip(owner) {
        out[i].weights.push(w);
    }
    for p in &mut out {
        let bits: u64 = p.weights.iter().map(|w| w.chosen_stored_bits()).sum();
        let elems: u64 = p.weights.iter().map(|w| w.elements as u64).sum();
        p.avg_bits = bits as f64 / elems.max(1) as f64;
    }
    Ok(out)
}

/// Per part, whether its statistics carry end-metric sensitivity curves.
pub fn end_metric_parts(parts: &[PlanPart]) -> Vec<bool> {
    parts
        .iter()
        .map(|p| p.calibration.is_some_and(|c| c.has_end_metric()))
        .collect()
}

impl WeightPlan {
    /// Stored bits (tables included) at the chosen width.
    pub fn chosen_stored_bits(&self) -> u64 {
        self.curve
            .iter()
            .find(|c| c.0 == self.chosen)
            .map(|c| c.1)
            .unwrap_or(0)
    }
}

/// Every selected weight of one part at every candidate width (`cands` sorted, unique).
fn measure(part: &PlanPart, cands: &[u32]) -> Result<Vec<WeightPlan>> {
    let base = &part.base;
    let weights = selected_weights(part.model, &Method::Palettize(*base), part.sel)?;
    ensure!(
        !weights.is_empty(),
        "no weights selected for mixed precision"
    );
    let end_metric = part.calibration.filter(|c| c.has_end_metric());
    let measured: Vec<Result<WeightPlan>> = weights
        .par_iter()
        .map(|sw| {
            let shape = &sw.tensor.shape;
            let fixed = part.fixed.get(&sw.weight).map(|&b| [b]);
            let cands: &[u32] = match &fixed {
                Some(b) => b,
                None => cands,
            };
            if let (Some(&[b]), Some(cal)) = (fixed.as_ref(), end_metric) {
                // Its measured divergence at that width where there is one (only reported).
                let e = cal
                    .end_metric(&sw.weight)?
                    .and_then(|c| c.iter().find(|m| m.0 == b).map(|m| m.1))
                    .unwrap_or(0.0);
                return Ok(WeightPlan {
                    weight: sw.weight.clone(),
                    op: sw.op.clone(),
                    elements: sw.tensor.num_elements(),
                    curve: vec![(b, stored_bits(&LutConfig { nbits: b, ..*base }, shape), e)],
                    chosen: b,
                });
            }
            if let Some(cal) = end_metric {
                let measured = cal.end_metric(&sw.weight)?.with_context(|| {
                    format!(
                        "the statistics carry end-metric sensitivity curves, but none for weight `{}`; measure them again on this model and recipe",
                        sw.weight
                    )
                })?;
                // The widths both measured and asked for, at their stored bits.
                let mut curve: Vec<(u32, u64, f64)> = measured
                    .iter()
                    .filter(|(b, _)| cands.contains(b))
                    .map(|&(b, e)| (b, stored_bits(&LutConfig { nbits: b, ..*base }, shape), e))
                    .collect();
                if cands.contains(&FP16) {
                    // Left fp16, the weight is the model's own: no divergence.
                    curve.push((FP16, stored_bits(&LutConfig { nbits: FP16, ..*base }, shape), 0.0));
                }
                ensure!(
                    !curve.is_empty(),
                    "the end-metric curve of `{}` measures none of the widths {cands:?}",
                    sw.weight
                );
                return Ok(WeightPlan {
                    weight: sw.weight.clone(),
                    op: sw.op.clone(),
                    elements: sw.tensor.num_elements(),
                    curve,
                    chosen: base.nbits,
                });
            }
            let w: Vec<f16> = sw.tensor.data.to_f16_vec();
            // Without statistics every input channel counts the same (plain squared error).
            let imp = match part.calibration {
                Some(cal) => cal.importance(&sw.weight, shape)?.with_context(|| {
                    format!(
                        "no calibration statistics for weight `{}`; run `milkit calibrate` on this model",
                        sw.weight
                    )
                })?,
                None => vec![1.0; w.len() / shape[0].max(1)],
            };
            let rest = imp.len();
            let signal: f64 = w
                .iter()
                .enumerate()
                .map(|(i, v)| imp[i % rest] as f64 * (v.to_f64()).powi(2))
                .sum::<f64>()
                .max(f64::MIN_POSITIVE);
            let mut curve = Vec::new();
            for &b in cands {
                let cfg = LutConfig { nbits: b, ..*base };
                if b == FP16 {
                    curve.push((b, stored_bits(&cfg, shape), 0.0));
                    continue;
                }
                let p = palettize(&w, shape, &cfg, Some(&imp))
                    .with_context(|| format!("palettizing `{}` at {b} bits", sw.weight))?;
                let d = p.decode()?;
                let err: f64 = w
                    .iter()
                    .zip(&d)
                    .enumerate()
                    .map(|(i, (a, b))| imp[i % rest] as f64 * (a.to_f64() - b.to_f64()).powi(2))
                    .sum();
                curve.push((b, stored_bits(&cfg, shape), err / signal));
            }
            Ok(WeightPlan {
                weight: sw.weight.clone(),
                op: sw.op.clone(),
                elements: w.len(),
                curve,
                chosen: base.nbits,
            })
        })
        .collect();
    measured.into_iter().collect()
}

/// Greedy allocation: every weight starts at its curve position `starts[k]`, then the
/// upgrade with the largest error drop per extra stored bit is taken while the budget
/// (`target_bits` × all elements) allows. Sets `chosen`.
fn allocate(plans: &mut [WeightPlan], starts: &[usize], target_bits: f64) -> Result<()> {
    let total_elems: u64 = plans.iter().map(|p| p.elements as u64).sum();
    let budget = (target_bits * total_elems as f64).floor() as u64;
    let mut at = starts.to_vec();
    let mut used: u64 = plans.iter().zip(&at).map(|(p, &s)| p.curve[s].1).sum();
    if used > budget {
        bail!(
            "--target-bits {target_bits} is below what the base width needs: {:.3} bits per weight; lower --nbits",
            used as f64 / total_elems as f64
        );
    }
    loop {
        // Best next step per weight: the hull step (to any higher width) with the largest
        // error drop per extra bit that still fits.
        let mut best: Option<(f64, usize, usize)> = None;
        for (k, p) in plans.iter().enumerate() {
            let (_, bits0, e0) = p.curve[at[k]];
            for j in at[k] + 1..p.curve.len() {
                let (_, bits1, e1) = p.curve[j];
                if bits1 <= bits0 || used - bits0 + bits1 > budget {
                    continue;
                }
                let gain = (e0 - e1) / (bits1 - bits0) as f64;
                if gain > 0.0 && best.is_none_or(|(g, _, _)| gain > g) {
                    best = Some((gain, k, j));
                }
            }
        }
        let Some((_, k, j)) = best else { break };
        used = used - plans[k].curve[at[k]].1 + plans[k].curve[j].1;
        at[k] = j;
    }
    for (k, p) in plans.iter_mut().enumerate() {
        p.chosen = p.curve[at[k]].0;
    }
    Ok(())
}
