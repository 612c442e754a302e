//! Dense, label-free fidelity of a candidate models folder against a baseline folder
//! (`milkit eval --models CAND --against BASE`), per clip and overall: the teacher-forced
//! next-token KL divergence KL(baseline ‖ candidate) along the baseline's own greedy
//! transcript, top-1 agreement along it, the encoder output's PSNR and cosine against the
//! baseline's, the candidate transcript's WER against the baseline's transcript, and — when
//! the clips have reference texts — QoI, the share of clips whose WER is not worse than the
//! baseline's. Each clip's first 30-s window is measured (greedy, no timestamps; the
//! baseline's detected language is used for both).

use crate::runtime::Tensor;
use crate::transcribe::{TranscribeOptions, Transcriber};
use crate::whisper::audio::load_audio;
use crate::whisper::generate::argmax;
use crate::whisper::wer::{rate, word_errors_with, Normalization};
use anyhow::{ensure, Context, Result};
use std::path::{Path, PathBuf};

pub use crate::report::{FidelityClip, FidelityReport, WerDelta};

/// A clip to measure: its name, path and optional reference text.
#[derive(Clone, Debug)]
pub struct FidelityInput {
    pub name: String,
    pub path: PathBuf,
    pub reference: Option<String>,
    pub language: Option<String>,
}

/// A tensor's values as f32, flattened.
pub(crate) fn flat(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.to_dtype(candle_core::DType::F32)?
        .flatten_all()?
        .to_vec1()?)
}

/// PSNR (dB, peak = max |reference|) and cosine of `got` against `reference`.
pub fn psnr_and_cosine(reference: &[f32], got: &[f32]) -> (f64, f64) {
    let (mut se, mut dot, mut nr, mut ng, mut peak) = (0f64, 0f64, 0f64, 0f64, 0f64);
    for (&r, &g) in reference.iter().zip(got) {
        let (r, g) = (f64::from(r), f64::from(g));
        se += (r - g) * (r - g);
        dot += r * g;
        nr += r * r;
        ng += g * g;
        peak = peak.max(r.abs());
    }
    let mse = se / reference.len().max(1) as f64;
    let psnr = if mse == 0.0 {
        f64::INFINITY
    } else {
        10.0 * (peak * peak / mse).log10()
    };
    let cos = if nr == 0.0 || ng == 0.0 {
        0.0
    } else {
        dot / (nr.sqrt() * ng.sqrt())
    };
    (psnr, cos)
}

/// log-softmax over the finite entries (masked ones stay −∞).
fn log_softmax(l: &[f32]) -> Vec<f64> {
    let lse = crate::whisper::generate::log_sum_exp(l);
    l.iter().map(|&v| f64::from(v) - lse).collect()
}

/// KL(p ‖ q) in nats from log-probabilities; entries where p is 0 add nothing, entries where
/// p > 0 and q is 0 make it infinite.
pub fn kl_divergence(log_p: &[f64], log_q: &[f64]) -> f64 {
    log_p
        .iter()
        .zip(log_q)
        .filter(|(p, _)| p.is_finite())
        .map(|(&p, &q)| p.exp() * (p - q))
        .sum()
}

/// Measures every clip with `candidate` against `baseline`.
pub fn fidelity(
    candidate: &Path,
    baseline: &Path,
    clips: &[FidelityInput],
    norm: Normalization,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<FidelityReport> {
    ensure!(!clips.is_empty(), "no clips to measure");
    let mut base = Transcriber::open(baseline)
        .with_context(|| format!("opening the baseline {}", baseline.display()))?;
    let mut cand = Transcriber::open(candidate)
        .with_context(|| format!("opening the candidate {}", candidate.display()))?;
    let mut rows = Vec::new();
    for (i, clip) in clips.iter().enumerate() {
        let samples = load_audio(&clip.path)?;
        let row = measure(&mut base, &mut cand, clip, &samples, norm)
            .with_context(|| format!("measuring {}", clip.path.display()))?;
        rows.push(row);
        progress(i + 1, clips.len());
    }
    let positions: usize = rows.iter().map(|r| r.positions).sum::<usize>().max(1);
    let weighted = |f: fn(&FidelityClip) -> f64| {
        rows.iter().map(|r| f(r) * r.positions as f64).sum::<f64>() / positions as f64
    };
    let n = rows.len() as f64;
    let with_refs: Vec<&FidelityClip> = rows.iter().filter(|r| r.candidate_wer.is_some()).collect();
    let qoi = (!with_refs.is_empty()).then(|| {
        with_refs
            .iter()
            .filter(|r| r.candidate_wer <= r.baseline_wer)
            .count() as f64
            / with_refs.len() as f64
    });
    Ok(FidelityReport {
        candidate: candidate.display().to_string(),
        baseline: baseline.display().to_string(),
        mean_kl: weighted(|r| r.mean_kl),
        top1_agreement: weighted(|r| r.top1_agreement),
        encoder_psnr_db: {
            let finite: Vec<f64> = rows.iter().filter_map(|r| r.encoder_psnr_db).collect();
            (!finite.is_empty()).then(|| finite.iter().sum::<f64>() / finite.len() as f64)
        },
        encoder_cosine: rows.iter().map(|r| r.encoder_cosine).sum::<f64>() / n,
        wer_vs_baseline: rate((
            rows.iter().map(|r| r.errors_vs_baseline).sum(),
            rows.iter().map(|r| r.baseline_words).sum(),
        )),
        qoi,
        wer_delta: wer_delta(&rows, 2000),
        clips: rows,
    })
}

/// The corpus WER difference of the clips with reference texts and its 95 % paired
/// bootstrap interval over `resamples` resamples of the clips (xorshift64*, fixed seed).
pub fn wer_delta(rows: &[FidelityClip], resamples: usize) -> Option<WerDelta> {
    let clips: Vec<(f64, f64, f64)> = rows
        .iter()
        .filter_map(|r| {
            Some((
                r.baseline_errors? as f64,
                r.candidate_errors? as f64,
                r.reference_words? as f64,
            ))
        })
        .collect();
    let words: f64 = clips.iter().map(|c| c.2).sum();
    if clips.is_empty() || words == 0.0 {
        return None;
    }
    let pct = |e: f64, w: f64| if w > 0.0 { 100.0 * e / w } else { 0.0 };
    let base = pct(clips.iter().map(|c| c.0).sum(), words);
    let cand = pct(clips.iter().map(|c| c.1).sum(), words);
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = |n: usize| {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        (state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as usize % n
    };
    let mut diffs: Vec<f64> = (0..resamples)
        .map(|_| {
            let (mut b, mut c, mut w) = (0.0, 0.0, 0.0);
            for _ in 0..clips.len() {
                let k = clips[next(clips.len())];
                b += k.0;
                c += k.1;
                w += k.2;
            }
            pct(c, w) - pct(b, w)
        })
        .collect();
    diffs.sort_by(f64::total_cmp);
    let q = |p: f64| diffs[((p * (diffs.len() - 1) as f64).round() as usize).min(diffs.len() - 1)];
    Some(WerDelta {
        baseline_wer_pct: base,
        candidate_wer_pct: cand,
        delta_points: cand - base,
        ci95_low: q(0.025),
        ci95_high: q(0.975),
        clips: clips.len(),
        resamples,
    })
}

fn measure(
    base: &mut Transcriber,
    cand: &mut Transcriber,
    clip: &FidelityInput,
    samples: &[f32],
    norm: Normalization,
) -> Result<FidelityClip> {
    let (eb, cb) = base.encode_window(samples)?;
    let (ec, cc) = cand.encode_window(samples)?;
    let (psnr, cos) = psnr_and_cosine(&flat(&eb)?, &flat(&ec)?);
    let mut opts = TranscribeOptions::greedy_no_timestamps();
    opts.language = clip.language.clone();
    let pass = base.greedy_pass(&cb, &opts)?;
    // The candidate decodes with the baseline's prompt (so its detected language too).
    let lang = pass
        .prompt
        .iter()
        .find_map(|&t| base.rules().language_code(t));
    opts.language = lang.map(str::to_string);
    let fed: Vec<u32> = pass.prompt.iter().chain(&pass.tokens).copied().collect();
    let lb = base.teacher_force(&cb, &fed)?;
    let lc = cand.teacher_force(&cc, &fed)?;
    let start = pass.prompt.len() - 1;
    let (mut kl_sum, mut kl_max, mut agree) = (0f64, 0f64, 0usize);
    for k in start..fed.len() {
        // The tokens sampled before this position (none at the last prompt token).
        let generated = &fed[pass.prompt.len()..k + 1];
        let (mut a, mut b) = (lb[k].clone(), lc[k].clone());
        base.rules().apply(&mut a, generated, false);
        base.rules().apply(&mut b, generated, false);
        let kl = kl_divergence(&log_softmax(&a), &log_softmax(&b));
        kl_sum += kl;
        kl_max = kl_max.max(kl);
        agree += usize::from(argmax(&a) == argmax(&b));
    }
    let positions = fed.len() - start;
    let cand_pass = cand.greedy_pass(&cc, &opts)?;
    let baseline_text = base.tokenizer().decode(&pass.tokens, true);
    let candidate_text = cand.tokenizer().decode(&cand_pass.tokens, true);
    let (errors_vs_baseline, baseline_words) =
        word_errors_with(&baseline_text, &candidate_text, norm);
    let counts_of = |hyp: &str| {
        clip.reference
            .as_deref()
            .map(|r| word_errors_with(r, hyp, norm))
    };
    let (bc, cc) = (counts_of(&baseline_text), counts_of(&candidate_text));
    Ok(FidelityClip {
        audio: clip.name.clone(),
        positions,
        mean_kl: kl_sum / positions as f64,
        max_kl: kl_max,
        top1_agreement: agree as f64 / positions as f64,
        encoder_psnr_db: psnr.is_finite().then_some(psnr),
        encoder_cosine: cos,
        baseline_wer: bc.map(rate),
        candidate_wer: cc.map(rate),
        baseline_errors: bc.map(|c| c.0),
        candidate_errors: cc.map(|c| c.0),
        reference_words: bc.map(|c| c.1),
        baseline_text,
        candidate_text,
        errors_vs_baseline,
        baseline_words,
    })
}

fn psnr_text(p: Option<f64>) -> String {
    p.map(|p| format!("{p:.1} dB"))
        .unwrap_or_else(|| "identical".into())
}

impl FidelityReport {
    pub fn to_text(&self) -> String {
        let mut s = String::from(
            "| clip | positions | mean KL | max KL | top-1 agreement | encoder PSNR | cosine | WER vs baseline |\n|---|---|---|---|---|---|---|---|\n",
        );
        for r in &self.clips {
            s += &format!(
                "| {} | {} | {:.5} | {:.4} | {:.2} % | {} | {:.5} | {}/{} |\n",
                r.audio,
                r.positions,
                r.mean_kl,
                r.max_kl,
                100.0 * r.top1_agreement,
                psnr_text(r.encoder_psnr_db),
                r.encoder_cosine,
                r.errors_vs_baseline,
                r.baseline_words
            );
        }
        s += &format!(
            "overall: mean KL {:.5} nats, top-1 agreement {:.2} %, encoder PSNR {}, cosine {:.5}, WER vs baseline {:.2} %{}\n",
            self.mean_kl,
            100.0 * self.top1_agreement,
            psnr_text(self.encoder_psnr_db),
            self.encoder_cosine,
            100.0 * self.wer_vs_baseline,
            self.qoi
                .map(|q| format!(", QoI {:.0} %", 100.0 * q))
                .unwrap_or_default()
        );
        if let Some(d) = &self.wer_delta {
            s += &format!(
                "WER against the references: baseline {:.2} %, candidate {:.2} %, difference {:+.2} points (95 % paired bootstrap over {} clips: {:+.2} to {:+.2})\n",
                d.baseline_wer_pct, d.candidate_wer_pct, d.delta_points, d.clips, d.ci95_low, d.ci95_high
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kl_is_zero_for_equal_distributions_and_matches_the_formula() {
        let p = log_softmax(&[1.0, 2.0, f32::NEG_INFINITY]);
        assert!(kl_divergence(&p, &p).abs() < 1e-12);
        let q = log_softmax(&[2.0, 1.0, f32::NEG_INFINITY]);
        // p = (1, e)/(1+e), q = (e, 1)/(1+e): KL = (e - 1)/(1 + e) · 1 nat.
        let e = std::f64::consts::E;
        let want = (e - 1.0) / (1.0 + e);
        assert!((kl_divergence(&p, &q) - want).abs() < 1e-6);
    }

    fn clip(base: usize, cand: usize, words: usize) -> FidelityClip {
        FidelityClip {
            audio: String::new(),
            positions: 1,
            mean_kl: 0.0,
            max_kl: 0.0,
            top1_agreement: 1.0,
            encoder_psnr_db: None,
            encoder_cosine: 1.0,
            baseline_text: String::new(),
            candidate_text: String::new(),
            errors_vs_baseline: 0,
            baseline_words: words,
            baseline_wer: Some(base as f64 / words as f64),
            candidate_wer: Some(cand as f64 / words as f64),
            baseline_errors: Some(base),
            candidate_errors: Some(cand),
            reference_words: Some(words),
        }
    }

    #[test]
    fn the_wer_difference_is_the_corpus_difference_and_its_interval_holds_it() {
        // 2 extra errors in 40 words: +5 points; a clip-level change so the interval is wide.
        let rows = vec![
            clip(1, 3, 10),
            clip(0, 0, 10),
            clip(2, 2, 10),
            clip(1, 1, 10),
        ];
        let d = wer_delta(&rows, 2000).unwrap();
        assert!((d.delta_points - 5.0).abs() < 1e-9, "{d:?}");
        assert!((d.baseline_wer_pct - 10.0).abs() < 1e-9);
        assert!(
            d.ci95_low <= d.delta_points && d.delta_points <= d.ci95_high,
            "{d:?}"
        );
        assert!(d.ci95_low >= 0.0 && d.ci95_high > 5.0, "{d:?}");
        // The same errors on every clip: no difference and no spread.
        let same = vec![clip(1, 1, 10), clip(2, 2, 10)];
        let d = wer_delta(&same, 500).unwrap();
        assert_eq!((d.delta_points, d.ci95_low, d.ci95_high), (0.0, 0.0, 0.0));
        let mut no_refs = clip(0, 0, 10);
        no_refs.reference_words = None;
        assert!(wer_delta(&[no_refs], 100).is_none());
    }

    #[test]
    fn psnr_and_cosine_of_a_known_error() {
        let r = [1.0f32, -2.0, 0.5, 0.0];
        let (p, c) = psnr_and_cosine(&r, &r);
        assert!(p.is_infinite() && (c - 1.0).abs() < 1e-12);
        let g = [1.0f32, -2.0, 0.5, 0.1];
        // MSE = 0.01 / 4, peak 2: 10·log10(4 / 0.0025) = 32.04 dB.
        let (p, _) = psnr_and_cosine(&r, &g);
        assert!((p - 10.0 * (4.0f64 / 0.0025).log10()).abs() < 1e-4, "{p}");
    }
}
