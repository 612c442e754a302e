//! End-metric sensitivity of a text decoder's weights (`milkit calibrate --component decoder
//! --sensitivity-recipe R`): for every weight the recipe's decoder compression selects and
//! every asked bit width, the mean teacher-forced next-token KL divergence
//! KL(fp16 ‖ compressed) of the decoder's logits when only that weight is compressed as the
//! recipe says (same tables, scales, grouping and statistics), along the fp16 model's own
//! greedy transcripts of the calibration clips, with the fp16 encoder's output as the
//! cross-attention input. The curves go into the statistics file
//! ([`Calibration::set_end_metric`]); the mixed-precision plan (`passes::mixed`) then spends
//! the bit budget where it lowers this divergence most per stored bit, instead of where each
//! op's own output error falls most. [`weight_sensitivity`], the sweep itself, serves the
//! encoder's weights too (`super::encoder_sensitivity`).

use super::fidelity::kl_divergence;
use crate::convert::bundle::Compression;
use crate::ir::Model;
use crate::passes::calibrate::{Calibration, EndMetric};
use crate::passes::compress::{compress_with, selected_weights, Method, Selection};
use crate::passes::lut::LutConfig;
use crate::runtime::Session;
use crate::transcribe::decoder::{Cross, TextDecoder};
use crate::transcribe::{TranscribeOptions, Transcriber};
use crate::whisper::audio::load_audio;
use anyhow::{bail, ensure, Context, Result};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// One calibration clip as the fp16 model decodes it: the cross-attention input, the tokens
/// fed (prompt and transcript), and the fp16 next-token log-probabilities from the last
/// prompt token on.
pub struct Reference {
    cross: Cross,
    fed: Vec<u32>,
    start: usize,
    log_probs: Vec<Vec<f64>>,
}

impl Reference {
    /// The positions measured along this clip.
    pub fn positions(&self) -> usize {
        self.log_probs.len()
    }
}

/// log-softmax of one logits row.
pub fn log_softmax(l: &[f32]) -> Vec<f64> {
    let lse = crate::whisper::generate::log_sum_exp(l);
    l.iter().map(|&v| f64::from(v) - lse).collect()
}

/// Decodes the first 30-s window of every clip greedily (no timestamps) with the
/// transcriber's current (fp16) models and keeps what teacher forcing needs.
pub fn references(t: &mut Transcriber, audio: &[PathBuf]) -> Result<Vec<Reference>> {
    let mut out = Vec::new();
    for path in audio {
        let samples = load_audio(path)?;
        let (_, cross) = t
            .encode_window(&samples)
            .with_context(|| format!("encoding {}", path.display()))?;
        let pass = t
            .greedy_pass(&cross, &TranscribeOptions::greedy_no_timestamps())
            .with_context(|| format!("decoding {}", path.display()))?;
        ensure!(
            !pass.prompt.is_empty(),
            "{}: the decoder was given no prompt",
            path.display()
        );
        let fed: Vec<u32> = pass.prompt.iter().chain(&pass.tokens).copied().collect();
        let start = pass.prompt.len() - 1;
        let logits = t.teacher_force(&cross, &fed)?;
        let log_probs = logits[start..].iter().map(|l| log_softmax(l)).collect();
        out.push(Reference {
            cross,
            fed,
            start,
            log_probs,
        });
    }
    Ok(out)
}

/// Mean KL(reference ‖ current decoder) over every position of every reference, in nats.
pub fn mean_kl(t: &mut Transcriber, refs: &[Reference]) -> Result<f64> {
    let (mut sum, mut n) = (0f64, 0usize);
    for r in refs {
        let logits = t.teacher_force(&r.cross, &r.fed)?;
        for (want, got) in r.log_probs.iter().zip(&logits[r.start..]) {
            sum += kl_divergence(want, &log_softmax(got));
            n += 1;
        }
    }
    ensure!(n > 0, "no decoder positions to measure");
    Ok(sum / n as f64)
}

/// Measures the end-metric curve of every weight `compression` selects in `model`, at each
/// of `widths`: the model is prepared as the compression prepares it (a decoder's head
/// padded, channels regrouped, with `calibration`'s statistics following), then for each
/// weight and width a copy with only that weight compressed at that width goes to
/// `metric`, which returns its divergence from the uncompressed model.
/// `progress(done, total)` after each measurement.
pub fn weight_sensitivity(
    model: &Model,
    compression: &Compression,
    calibration: Option<&Calibration>,
    widths: &[u32],
    metric: &mut dyn FnMut(Model) -> Result<f64>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<BTreeMap<String, EndMetric>> {
    let Method::Palettize(cfg) = compression.method else {
        bail!("end-metric sensitivity measures palettization (the recipe's compression must use `palettize`, not `quantize`)");
    };
    ensure!(!widths.is_empty(), "no bit widths to measure");
    let mut c = compression.clone();
    c.calibration = calibration.cloned();
    c.target_bits = None;
    c.nbits.clear();
    // The weights exactly as they will be compressed: head padded, channels regrouped.
    let mut prepared = model.clone();
    let p = c.prepare(&mut prepared)?;
    let weights = selected_weights(&prepared, &c.method, &p.sel)?;
    ensure!(!weights.is_empty(), "the compression selects no weights");
    let total = weights.len() * widths.len();
    let mut out = BTreeMap::new();
    for (i, w) in weights.iter().enumerate() {
        let mut curve = EndMetric::new();
        for (j, &b) in widths.iter().enumerate() {
            let mut m = prepared.clone();
            let sel = Selection {
                op_names: vec![w.weight.clone()],
                ..p.sel.clone()
            };
            let method = Method::Palettize(LutConfig { nbits: b, ..cfg });
            compress_with(
                &mut m,
                &method,
                &sel,
                p.calibration.as_deref(),
                &BTreeMap::new(),
                c.error_feedback,
            )
            .with_context(|| format!("compressing `{}` at {b} bits", w.weight))?;
            let v = metric(m).with_context(|| format!("measuring `{}` at {b} bits", w.weight))?;
            ensure!(
                v.is_finite() && v >= 0.0,
                "`{}` at {b} bits measured {v}, not a finite divergence",
                w.weight
            );
            curve.push((b, v));
            progress(i * widths.len() + j + 1, total);
        }
        curve.sort_by_key(|c| c.0);
        out.insert(w.weight.clone(), curve);
    }
    Ok(out)
}

/// [`weight_sensitivity`] of the fp16 text decoder `model` with the end metric
/// [`mean_kl`] along `refs` (made with the same transcriber's fp16 decoder). The
/// transcriber's decoder is replaced while measuring and left as the plain fp16 decoder.
pub fn decoder_sensitivity(
    t: &mut Transcriber,
    model: &Model,
    compression: &Compression,
    calibration: Option<&Calibration>,
    refs: &[Reference],
    widths: &[u32],
    progress: &mut dyn FnMut(usize, usize),
) -> Result<BTreeMap<String, EndMetric>> {
    let mut metric = |m: Model| -> Result<f64> {
        let session = Session::from_model(m).context("preparing a measured decoder")?;
        t.set_decoder(TextDecoder::new(session)?);
        mean_kl(t, refs)
    };
    let out = weight_sensitivity(
        model,
        compression,
        calibration,
        widths,
        &mut metric,
        progress,
    )?;
    t.set_decoder(TextDecoder::new(Session::from_model(model.clone())?)?);
    Ok(out)
}
