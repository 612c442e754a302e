//! Compression by a quality target: the fewest bits whose fidelity against fp16 meets a
//! [`QualityTarget`]. The plans form a ladder of widths for every compressed component of a
//! recipe — 2, 3, 4, 6, 8 bits, fp16 — and between two uniform widths the existing
//! mixed-bits planner (`target_bits` at their mean over the 2/3/4/6/8-bit widths, weighted
//! by the calibration statistics; between 8 bits and fp16, within 12 bits, a weight's
//! choice is 8 bits or fp16). Each plan is exported and measured with `fidelity` on
//! held-back clips against the fp16 folder of the same recipe. Fidelity rises with the
//! width, so the uniform widths are bisected (three plans measured instead of six), then
//! the mixed plan just below the first uniform width that meets the target is tried (mixed
//! plans cost a measurement of every weight at every width, so only that one). Also: the deterministic split of
//! calibration clips into statistics and held-back halves, and a content-addressed cache
//! of statistics and measurements (keys: checkpoint digest, clip digests, the plan).

use super::bits::folder_bits;
use super::fidelity::{fidelity, FidelityInput, FidelityReport};
use crate::convert::bundle::write_folder;
use crate::convert::recipe::{recipe_components, QualityTarget, Recipe};
use crate::passes::lut::LutMode;
use crate::whisper::checkpoint::Checkpoint;
use crate::whisper::wer::Normalization;
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// One plan of the ladder: every compressed component at `nbits` (mixed up to
/// `target_bits` when given), or fp16 (`nbits` None).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rung {
    pub nbits: Option<u32>,
    pub target_bits: Option<f64>,
}

impl Rung {
    /// The bits the plan is named by (its budget; 16 for fp16).
    pub fn nominal_bits(&self) -> f64 {
        match (self.nbits, self.target_bits) {
            (None, _) => 16.0,
            (Some(_), Some(t)) => t,
            (Some(b), None) => b as f64,
        }
    }

    pub fn name(&self) -> String {
        match (self.nbits, self.target_bits) {
            (None, _) => "fp16".into(),
            (Some(b), Some(t)) => format!("{b}+ bits mixed within {t}"),
            (Some(b), None) => format!("{b} bits"),
        }
    }
}

/// The plans, fewest bits first: uniform widths, and between two of them the mixed plan
/// within their mean (between 8 bits and fp16: 8-bit tables with the weights that buy the
/// most kept fp16, within 12 bits).
pub const LADDER: [Rung; 11] = [
    Rung {
        nbits: Some(2),
        target_bits: None,
    },
    Rung {
        nbits: Some(2),
        target_bits: Some(2.5),
    },
    Rung {
        nbits: Some(3),
        target_bits: None,
    },
    Rung {
        nbits: Some(3),
        target_bits: Some(3.5),
    },
    Rung {
        nbits: Some(4),
        target_bits: None,
    },
    Rung {
        nbits: Some(4),
        target_bits: Some(5.0),
    },
    Rung {
        nbits: Some(6),
        target_bits: None,
    },
    Rung {
        nbits: Some(6),
        target_bits: Some(7.0),
    },
    Rung {
        nbits: Some(8),
        target_bits: None,
    },
    Rung {
        nbits: Some(8),
        target_bits: Some(12.0),
    },
    Rung {
        nbits: None,
        target_bits: None,
    },
];

/// The recipe with every compressed component at the rung's widths (fp16: uncompressed).
pub fn rung_recipe(recipe: &Recipe, rung: Rung) -> Result<Recipe> {
    let mut r = recipe.clone();
    for c in &mut r.components {
        let Some(cc) = c.compress.as_mut() else {
            continue;
        };
        if cc.palettize != Some(LutMode::Kmeans) {
            bail!(
                "recipe `{}`: component `{}` must use palettize = \"kmeans\" for a quality target (the plans vary its widths)",
                recipe.name,
                c.file
            );
        }
        match rung.nbits {
            None => c.compress = None,
            Some(b) => {
                cc.nbits = b;
                cc.target_bits = rung.target_bits;
            }
        }
    }
    r.target = None;
    Ok(r)
}

/// The recipe with no compression at all: the baseline plans are measured against.
pub fn fp16_recipe(recipe: &Recipe) -> Recipe {
    let mut r = recipe.clone();
    for c in &mut r.components {
        c.compress = None;
    }
    r.target = None;
    r
}

/// One plan's measurement.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RungResult {
    pub plan: String,
    pub nominal_bits: f64,
    /// Bits per compressed weight of the folder (None for fp16).
    pub avg_bits: Option<f64>,
    pub mean_kl: f64,
    pub top1_agreement: f64,
    pub encoder_psnr_db: Option<f64>,
    /// Percent.
    pub wer_vs_fp16: f64,
    pub qoi: Option<f64>,
    /// Points, with the 95 % paired bootstrap interval.
    pub wer_delta: Option<f64>,
    pub wer_delta_ci95: Option<(f64, f64)>,
    /// The bounds it misses, one sentence each; empty when it meets the target.
    pub misses: Vec<String>,
    /// Read from the cache instead of measured.
    pub cached: bool,
}

/// What a quality search reports: the target, the clips, every plan measured, the choice.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TargetReport {
    pub recipe: String,
    pub target: String,
    /// Clips the plans were measured on (held back from the statistics).
    pub held_back: Vec<String>,
    /// Clips the statistics were gathered on.
    pub statistics_clips: Vec<String>,
    pub tried: Vec<RungResult>,
    /// The plan chosen: the fewest nominal bits among those meeting the target.
    pub chosen: String,
    pub chosen_avg_bits: Option<f64>,
}

impl TargetReport {
    pub fn to_text(&self) -> String {
        let mut s = format!(
            "quality target {} ({} held-back clips; statistics from {})\n| plan | bits | mean KL | top-1 | encoder PSNR | WER vs fp16 | WER Δ (95 % CI) | QoI | meets |\n|---|---|---|---|---|---|---|---|---|\n",
            self.target,
            self.held_back.len(),
            self.statistics_clips.len()
        );
        for r in &self.tried {
            s += &format!(
                "| {} | {} | {:.5} | {:.2} % | {} | {:.2} % | {} | {} | {}{} |\n",
                r.plan,
                r.avg_bits.map_or("16".into(), |b| format!("{b:.3}")),
                r.mean_kl,
                100.0 * r.top1_agreement,
                r.encoder_psnr_db
                    .map_or("identical".into(), |p| format!("{p:.1} dB")),
                r.wer_vs_fp16,
                match (r.wer_delta, r.wer_delta_ci95) {
                    (Some(d), Some((lo, hi))) => format!("{d:+.2} ({lo:+.2} to {hi:+.2})"),
                    _ => "—".into(),
                },
                r.qoi.map_or("—".into(), |q| format!("{:.0} %", 100.0 * q)),
                if r.misses.is_empty() {
                    "yes".to_string()
                } else {
                    format!("no: {}", r.misses.join("; "))
                },
                if r.cached { " (cached)" } else { "" }
            );
        }
        s += &format!(
            "chosen: {} ({})\n",
            self.chosen,
            self.chosen_avg_bits.map_or("fp16".into(), |b| format!(
                "{b:.3} bits per compressed weight"
            ))
        );
        s
    }
}

/// The bounds of `t` that `r` misses, one sentence each.
pub fn misses(t: &QualityTarget, r: &FidelityReport) -> Vec<String> {
    let mut out = Vec::new();
    let delta = r.wer_delta.as_ref().map(|d| d.delta_points);
    if let Some(b) = t.max_wer_delta {
        match delta {
            None => out.push("WER Δ needs clips with reference texts".into()),
            Some(d) if d > b => out.push(format!("WER Δ {d:+.2} points > {b}")),
            _ => {}
        }
    }
    if let Some(b) = t.min_qoi {
        match r.qoi {
            None => out.push("QoI needs clips with reference texts".into()),
            Some(q) if q < b => out.push(format!("QoI {:.1} % < {:.1} %", 100.0 * q, 100.0 * b)),
            _ => {}
        }
    }
    if let Some(b) = t.max_wer_vs_fp16 {
        let w = 100.0 * r.wer_vs_baseline;
        if w > b {
            out.push(format!("WER vs fp16 {w:.2} % > {b} %"));
        }
    }
    if let Some(b) = t.max_mean_kl {
        if r.mean_kl > b {
            out.push(format!("mean KL {:.5} > {b}", r.mean_kl));
        }
    }
    if let Some(b) = t.min_top1 {
        if r.top1_agreement < b {
            out.push(format!(
                "top-1 {:.2} % < {:.2} %",
                100.0 * r.top1_agreement,
                100.0 * b
            ));
        }
    }
    if let Some(b) = t.min_encoder_psnr_db {
        // Identical outputs (None) have infinite PSNR.
        if let Some(p) = r.encoder_psnr_db.filter(|p| *p < b) {
            out.push(format!("encoder PSNR {p:.1} dB < {b} dB"));
        }
    }
    out
}

/// FNV-1a 64 of a string: the order of the deterministic clip split.
pub fn fnv1a64(s: &str) -> u64 {
    s.bytes().fold(0xCBF2_9CE4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01B3)
    })
}

/// Splits calibration clips into the statistics half and the held-back half: clips ordered
/// by FNV-1a 64 of their file name (then the name), every second one held back (the first
/// of the order goes to the statistics). A single clip does both jobs.
pub fn split_clips(mut clips: Vec<FidelityInput>) -> (Vec<FidelityInput>, Vec<FidelityInput>) {
    let key = |c: &FidelityInput| {
        let f = c
            .path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        (fnv1a64(&f), f)
    };
    clips.sort_by_cached_key(key);
    if clips.len() == 1 {
        return (clips.clone(), clips);
    }
    let (mut stats, mut held) = (Vec::new(), Vec::new());
    for (i, c) in clips.into_iter().enumerate() {
        if i % 2 == 0 {
            stats.push(c);
        } else {
            held.push(c);
        }
    }
    (stats, held)
}

/// SHA-256 of a file's bytes, hex (the digest `verify` records for package files).
pub fn file_digest(path: &Path) -> Result<String> {
    crate::verify::digest::sha256_file(path)
}

/// Digest of a checkpoint folder: every regular file directly inside it, by name.
pub fn checkpoint_digest(dir: &Path) -> Result<String> {
    let mut names = Vec::new();
    for e in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let p = e
            .with_context(|| format!("listing {}", dir.display()))?
            .path();
        if p.is_file() {
            names.push(p);
        }
    }
    names.sort();
    let mut h = Sha256::new();
    for p in names {
        h.update(
            p.file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .as_bytes(),
        );
        h.update(file_digest(&p)?.as_bytes());
    }
    Ok(format!("{:x}", h.finalize()))
}

/// A cache key: SHA-256 over the parts, hex (the first 32 digits).
pub fn cache_key(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p.as_bytes());
    }
    format!("{:x}", h.finalize())[..32].to_string()
}

/// The search over the first `n` plans of [`LADDER`]: fidelity rises with the width, so the
/// uniform widths are bisected for the first that `meets`, then the mixed plan just below it
/// is tried (none below the narrowest; none at all without `mixed`). Returns the plan chosen
/// and whether it meets the target (when none does, the widest measured).
pub fn bisect_ladder(
    n: usize,
    mixed: bool,
    meets: &mut dyn FnMut(usize) -> Result<bool>,
) -> Result<(usize, bool)> {
    let uniform: Vec<usize> = (0..n.min(LADDER.len()))
        .filter(|&i| LADDER[i].target_bits.is_none())
        .collect();
    if uniform.is_empty() {
        bail!("no uniform width among the plans searched");
    }
    let (mut lo, mut hi) = (0usize, uniform.len() - 1);
    while lo < hi {
        let mid = (lo + hi) / 2;
        if meets(uniform[mid])? {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    let met = meets(uniform[lo])?;
    let mut lo = uniform[lo];
    if met && mixed && lo > 0 && LADDER[lo - 1].target_bits.is_some() && meets(lo - 1)? {
        lo -= 1;
    }
    Ok((lo, met))
}

/// Where the search works and what it keeps.
pub struct Search<'a> {
    pub ckpt: &'a Checkpoint,
    pub recipe: &'a Recipe,
    pub recipe_path: &'a Path,
    /// Statistics files (`--calibration`), passed to every plan.
    pub calibration: &'a [PathBuf],
    pub held_back: &'a [FidelityInput],
    pub statistics_clips: &'a [String],
    pub norm: Normalization,
    pub target: &'a QualityTarget,
    /// Scratch folder for the plans' folders (removed by the caller).
    pub scratch: &'a Path,
    /// Measurements cache folder and the key part naming checkpoint and clips; None: no cache.
    pub cache: Option<(&'a Path, String)>,
}

#[derive(Serialize, Deserialize)]
struct Cached {
    report: FidelityReport,
    avg_bits: Option<f64>,
}

impl Search<'_> {
    fn folder(&self, recipe: &Recipe, dir: &Path, progress: &mut dyn FnMut(&str)) -> Result<()> {
        let components = recipe_components(recipe, self.recipe_path, self.calibration)?;
        write_folder(
            self.ckpt,
            dir,
            &components,
            &crate::convert::bundle::MODEL_FILES,
            true,
            progress,
        )?;
        Ok(())
    }

    /// Measures one rung (or reads it from the cache).
    fn measure(
        &self,
        i: usize,
        baseline: &mut Option<PathBuf>,
        progress: &mut dyn FnMut(&str),
    ) -> Result<RungResult> {
        let rung = LADDER[i];
        let recipe = rung_recipe(self.recipe, rung)?;
        let cache_file = self.cache.as_ref().map(|(dir, part)| {
            dir.join("measurements").join(format!(
                "{}.json",
                cache_key(&[part, &format!("{recipe:?}"), &format!("{:?}", self.norm)])
            ))
        });
        let cached: Option<Cached> = cache_file
            .as_ref()
            .filter(|f| f.is_file())
            .and_then(|f| std::fs::read(f).ok())
            .and_then(|b| serde_json::from_slice(&b).ok());
        let (report, avg_bits, was_cached) = match cached {
            Some(c) => (c.report, c.avg_bits, true),
            None => {
                let base = match baseline {
                    Some(b) => b.clone(),
                    None => {
                        let b = self.scratch.join("fp16");
                        progress("exporting the fp16 baseline");
                        self.folder(&fp16_recipe(self.recipe), &b, progress)?;
                        *baseline = Some(b.clone());
                        b
                    }
                };
                let dir = self.scratch.join(format!("plan-{i}"));
                progress(&format!("exporting plan {}", rung.name()));
                self.folder(&recipe, &dir, progress)?;
                let avg_bits = folder_bits(&dir)?.avg_bits;
                progress(&format!("measuring plan {}", rung.name()));
                let report = fidelity(&dir, &base, self.held_back, self.norm, &mut |_, _| {})?;
                let _ = std::fs::remove_dir_all(&dir);
                if let Some(f) = &cache_file {
                    let c = Cached {
                        report: report.clone(),
                        avg_bits,
                    };
                    if let Some(p) = f.parent() {
                        std::fs::create_dir_all(p)
                            .with_context(|| format!("creating {}", p.display()))?;
                    }
                    let bytes = serde_json::to_vec_pretty(&c)?;
                    crate::package::fsio::write_file_atomically(f, &bytes, true)
                        .with_context(|| format!("writing the cache file {}", f.display()))?;
                }
                (report, avg_bits, false)
            }
        };
        Ok(RungResult {
            plan: rung.name(),
            nominal_bits: rung.nominal_bits(),
            avg_bits,
            mean_kl: report.mean_kl,
            top1_agreement: report.top1_agreement,
            encoder_psnr_db: report.encoder_psnr_db,
            wer_vs_fp16: 100.0 * report.wer_vs_baseline,
            qoi: report.qoi,
            wer_delta: report.wer_delta.as_ref().map(|d| d.delta_points),
            wer_delta_ci95: report.wer_delta.as_ref().map(|d| (d.ci95_low, d.ci95_high)),
            misses: misses(self.target, &report),
            cached: was_cached,
        })
    }

    /// Bisects the ladder (up to `max_bits`) for the first plan meeting the target; returns
    /// the chosen plan's recipe and the report, or an error naming the best plan reached.
    pub fn run(&self, progress: &mut dyn FnMut(&str)) -> Result<(Recipe, TargetReport)> {
        if self.held_back.is_empty() {
            bail!("a quality target needs held-back clips to measure on");
        }
        let max = self.target.max_bits.unwrap_or(f64::INFINITY);
        let n = LADDER.iter().filter(|r| r.nominal_bits() <= max).count();
        if n == 0 {
            bail!("max_bits = {max}: no plan of the ladder (2 bits and up) is that small");
        }
        let mut results: Vec<Option<RungResult>> = vec![None; n];
        let mut baseline = None;
        let (lo, met) = bisect_ladder(n, true, &mut |i| {
            if results[i].is_none() {
                results[i] = Some(self.measure(i, &mut baseline, progress)?);
            }
            Ok(results[i].as_ref().is_some_and(|r| r.misses.is_empty()))
        })?;
        let tried: Vec<RungResult> = results.into_iter().flatten().collect();
        if !met {
            let best = tried
                .iter()
                .max_by(|a, b| a.nominal_bits.total_cmp(&b.nominal_bits))
                .context("no plan measured")?;
            bail!(
                "recipe `{}`: no plan up to {} meets the quality target {} on {} held-back clips; the best reached is {} ({}): {}; mean KL {:.5}, top-1 {:.2} %, WER vs fp16 {:.2} %{}{}",
                self.recipe.name,
                LADDER[n - 1].name(),
                self.target.to_text(),
                self.held_back.len(),
                best.plan,
                best.avg_bits.map_or("fp16".into(), |b| format!("{b:.3} bits")),
                best.misses.join("; "),
                best.mean_kl,
                100.0 * best.top1_agreement,
                best.wer_vs_fp16,
                best.wer_delta.map(|d| format!(", WER Δ {d:+.2} points")).unwrap_or_default(),
                best.qoi.map(|q| format!(", QoI {:.1} %", 100.0 * q)).unwrap_or_default(),
            );
        }
        let chosen = tried
            .iter()
            .find(|r| r.plan == LADDER[lo].name())
            .context("the chosen plan was not measured")?;
        let report = TargetReport {
            recipe: self.recipe.name.clone(),
            target: self.target.to_text(),
            held_back: self.held_back.iter().map(|c| c.name.clone()).collect(),
            statistics_clips: self.statistics_clips.to_vec(),
            chosen: chosen.plan.clone(),
            chosen_avg_bits: chosen.avg_bits,
            tried,
        };
        Ok((rung_recipe(self.recipe, LADDER[lo])?, report))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ladder_rises_in_bits_and_ends_at_fp16() {
        let bits: Vec<f64> = LADDER.iter().map(Rung::nominal_bits).collect();
        assert!(bits.windows(2).all(|w| w[0] < w[1]), "{bits:?}");
        assert_eq!(LADDER.last().unwrap().name(), "fp16");
        // Every mixed plan sits between its floor and the next uniform width.
        for w in LADDER.windows(3).filter(|w| w[1].target_bits.is_some()) {
            assert_eq!(w[1].nbits, w[0].nbits);
            assert!(w[2].target_bits.is_none() && w[2].nominal_bits() > w[1].nominal_bits());
        }
    }

    #[test]
    fn the_split_is_deterministic_disjoint_and_order_free() {
        let clip = |n: &str| FidelityInput {
            name: n.into(),
            path: PathBuf::from(format!("/x/{n}")),
            reference: None,
            language: None,
        };
        let names = ["a.wav", "b.wav", "c.wav", "d.wav", "e.wav"];
        let (s1, h1) = split_clips(names.iter().map(|n| clip(n)).collect());
        let (s2, h2) = split_clips(names.iter().rev().map(|n| clip(n)).collect());
        let n = |v: &[FidelityInput]| v.iter().map(|c| c.name.clone()).collect::<Vec<_>>();
        assert_eq!((n(&s1), n(&h1)), (n(&s2), n(&h2)));
        assert_eq!((s1.len(), h1.len()), (3, 2));
        assert!(n(&s1).iter().all(|x| !n(&h1).contains(x)));
    }

    #[test]
    fn a_target_parses_from_text_and_names_what_it_misses() {
        let t = QualityTarget::parse("max_wer_delta=0.5, min_qoi=0.9,max_mean_kl=0.01").unwrap();
        assert_eq!(
            t.to_text(),
            "max_wer_delta=0.5,min_qoi=0.9,max_mean_kl=0.01"
        );
        assert!(QualityTarget::parse("max_wer=1").is_err());
        assert!(QualityTarget::parse("max_bits=4").is_err());
        let r = FidelityReport {
            candidate: String::new(),
            baseline: String::new(),
            clips: vec![],
            mean_kl: 0.02,
            top1_agreement: 0.99,
            encoder_psnr_db: Some(40.0),
            encoder_cosine: 1.0,
            wer_vs_baseline: 0.01,
            qoi: Some(0.95),
            wer_delta: None,
        };
        let m = misses(&t, &r);
        assert_eq!(m.len(), 2, "{m:?}");
        assert!(
            m[0].contains("reference texts") && m[1].contains("mean KL"),
            "{m:?}"
        );
    }
}
