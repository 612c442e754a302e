//! `milkit calibrate`: second moments of every compressible op's input, per input channel,
//! measured by running the fp16 model on real audio: the encoder on every 30-s window, the
//! text decoder on every token of greedy transcription (its own tokens fed back, the fp16
//! encoder's states as cross-attention input: the inputs it sees in use); optionally also
//! the weights' end-metric sensitivity: the decoder's ([`super::sensitivity`]) or the
//! encoder's ([`super::encoder_sensitivity`]).

use super::encoder_sensitivity::{describe, encoder_references, encoder_sensitivity};
use super::eval::read_manifest;
use super::sensitivity::{decoder_sensitivity, references, Reference};
use crate::convert::bundle::Compression;
use crate::convert::bundle::{write_whisperkit_folder, BundleOptions};
use crate::convert::decoder_export::{export_decoder, DecoderExport};
use crate::convert::export::export_encoder;
use crate::ir::Opset;
use crate::passes::calibrate::{instrument, Calibration, Moments, Probe, COMPONENT_KEY};
use crate::passes::compress::Selection;
use crate::runtime::{Session, Tensor};
use crate::transcribe::decoder::TextDecoder;
use crate::transcribe::{TranscribeOptions, Transcriber};
use crate::whisper::audio::{load_audio, log_mel_windows, MelFilters};
use crate::whisper::checkpoint::Checkpoint;
use crate::whisper::encoder::EncoderAbi;
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Audio files named on the command line: WAV files, or `.jsonl` manifests whose lines
/// carry an `audio` path relative to the manifest (read as `milkit eval` reads them).
pub fn expand_audio_list(items: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for it in items {
        if it.extension().is_some_and(|e| e == "jsonl") {
            out.extend(read_manifest(it)?.into_iter().map(|c| c.path));
        } else {
            out.push(it.clone());
        }
    }
    if out.is_empty() {
        bail!("no audio given to calibrate on");
    }
    Ok(out)
}

/// Runs the fp16 encoder of the checkpoint at `model_dir` on every 30-s window of `audio`
/// and returns the per-channel second moments of every selected weight's input.
/// `progress(done, total)` is called after each file.
pub fn calibrate_encoder(
    model_dir: &Path,
    audio: &[PathBuf],
    sel: &Selection,
    grams: bool,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Calibration> {
    calibrate_encoder_with(model_dir, audio, sel, grams, None, progress, &mut |_, _| {})
}

/// What [`calibrate_encoder_with`] also measures: the end-metric sensitivity of every weight
/// `compression` (a recipe's encoder compression) selects, at `widths`
/// ([`super::encoder_sensitivity`]).
pub struct EncoderSensitivityRequest<'a> {
    pub compression: &'a Compression,
    pub widths: &'a [u32],
}

/// [`calibrate_encoder`], and with `sensitivity` also each selected weight's end-metric
/// curve (the encoder output's mean relative squared error against fp16 with only that
/// weight compressed, per width, on the first 30-s window of each clip, compressed with the
/// statistics just gathered), stored in the statistics ([`Calibration::set_end_metric`]).
/// `sweep(done, total)` is called after each of those measurements.
pub fn calibrate_encoder_with(
    model_dir: &Path,
    audio: &[PathBuf],
    sel: &Selection,
    grams: bool,
    sensitivity: Option<EncoderSensitivityRequest>,
    progress: &mut dyn FnMut(usize, usize),
    sweep: &mut dyn FnMut(usize, usize),
) -> Result<Calibration> {
    let ckpt = Checkpoint::open(model_dir)?;
    let model = export_encoder(&ckpt, EncoderAbi::WhisperKit, Opset::Ios18, &mut |_, _| {})?;
    let n_mels = model
        .description
        .inputs
        .first()
        .and_then(|f| f.shape.get(1).copied())
        .context("the encoder has no mel input")?;
    let filters = MelFilters::from_preprocessor_config(model_dir.join("preprocessor_config.json"))?;
    let (inst, probes) = instrument(&model, sel, grams)?;
    let input = inst.description.inputs[0].name.clone();
    let mut session = Session::from_model(inst).context("preparing the instrumented encoder")?;
    let mut moments = Moments::default();
    // The first window of every clip: what the end-metric sweep measures on.
    let mut first_windows = Vec::new();
    for (i, path) in audio.iter().enumerate() {
        let samples = load_audio(path)?;
        for (k, mel) in log_mel_windows(&samples, n_mels, filters.as_ref())?
            .into_iter()
            .enumerate()
        {
            let frames = mel.len() / n_mels;
            let x = Tensor::from_vec(mel, (1, n_mels, 1, frames), &candle_core::Device::Cpu)?;
            if k == 0 && sensitivity.is_some() {
                first_windows.push(x.clone());
            }
            let outs = session
                .predict(&[(input.as_str(), x)])
                .with_context(|| format!("running the encoder on {}", path.display()))?;
            moments.add(&probes, &probe_values(&probes, outs)?)?;
        }
        progress(i + 1, audio.len());
    }
    drop(session);
    let mut cal = moments.finish(&ckpt.source_name());
    cal.meta.insert(COMPONENT_KEY.into(), "encoder".into());
    if let Some(req) = sensitivity {
        let refs = encoder_references(&model, first_windows)?;
        let curves = encoder_sensitivity(
            &model,
            req.compression,
            Some(&cal),
            &refs,
            req.widths,
            sweep,
        )?;
        cal.set_end_metrics(&curves, describe(refs.len()));
    }
    Ok(cal)
}

/// Removes a scratch directory when dropped (also on errors).
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Transcribes `audio` greedily with the fp16 model of the checkpoint at `model_dir` and
/// returns the per-channel second moments of every selected text-decoder weight's input,
/// one run per decoded token (prompt tokens included). Writes an fp16 models folder into
/// the system's temporary directory while it runs.
pub fn calibrate_decoder(
    model_dir: &Path,
    audio: &[PathBuf],
    sel: &Selection,
    grams: bool,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Calibration> {
    calibrate_decoder_with(model_dir, audio, sel, grams, None, progress, &mut |_, _| {})
}

/// What [`calibrate_decoder_with`] also measures: the end-metric sensitivity of every weight
/// `compression` selects, at `widths` ([`super::sensitivity`]), in the decoder exported as
/// `decoder` says (a recipe's head chunks are separate weights; the statistics are then
/// measured on that decoder too, so their names match the recipe's export).
pub struct SensitivityRequest<'a> {
    pub compression: &'a Compression,
    pub decoder: DecoderExport,
    pub widths: &'a [u32],
}

/// [`calibrate_decoder`], and with `sensitivity` also each selected weight's end-metric
/// curve (the decoder's teacher-forced next-token KL against fp16 with only that weight
/// compressed, per width) along the same clips, stored in the statistics
/// ([`Calibration::set_end_metric`]). `sweep(done, total)` is called after each of those
/// measurements.
pub fn calibrate_decoder_with(
    model_dir: &Path,
    audio: &[PathBuf],
    sel: &Selection,
    grams: bool,
    sensitivity: Option<SensitivityRequest>,
    progress: &mut dyn FnMut(usize, usize),
    sweep: &mut dyn FnMut(usize, usize),
) -> Result<Calibration> {
    let dir = std::env::temp_dir().join(format!("milkit-calibrate-{}", std::process::id()));
    let scratch = Scratch(dir);
    let opts = BundleOptions {
        opset: Opset::Ios18,
        decoder: DecoderExport::default(),
        encoder_compression: None,
        decoder_compression: None,
    };
    let ckpt = Checkpoint::open(model_dir)?;
    write_whisperkit_folder(&ckpt, &scratch.0, &opts, true, &mut |_| {})
        .context("writing the fp16 models folder to calibrate with")?;
    let mut t = Transcriber::open(&scratch.0)?;
    let shape = sensitivity.as_ref().map_or(opts.decoder, |r| r.decoder);
    let model = export_decoder(&ckpt, &shape, opts.opset)?;
    let (inst, probes) = instrument(&model, sel, grams)?;
    let session = Session::from_model(inst).context("preparing the instrumented decoder")?;
    let mut decoder = TextDecoder::new(session)?;
    let moments = Arc::new(Mutex::new(Moments::default()));
    let sink = Arc::clone(&moments);
    decoder.set_observer(Box::new(move |outs| {
        let values = probe_values(&probes, outs)?;
        sink.lock()
            .map_err(|_| anyhow::anyhow!("calibration statistics poisoned"))?
            .add(&probes, &values)
    }));
    t.set_decoder(decoder);
    for (i, path) in audio.iter().enumerate() {
        t.transcribe_file_with(path, &TranscribeOptions::greedy_no_timestamps())
            .with_context(|| format!("transcribing {}", path.display()))?;
        progress(i + 1, audio.len());
    }
    let mut cal = moments
        .lock()
        .map_err(|_| anyhow::anyhow!("calibration statistics poisoned"))?
        .finish(&ckpt.source_name());
    cal.meta.insert(COMPONENT_KEY.into(), "decoder".into());
    if let Some(req) = sensitivity {
        t.set_decoder(TextDecoder::new(Session::from_model(model.clone())?)?);
        let refs = references(&mut t, audio)?;
        let curves = decoder_sensitivity(
            &mut t,
            &model,
            req.compression,
            Some(&cal),
            &refs,
            req.widths,
            sweep,
        )?;
        let positions: usize = refs.iter().map(Reference::positions).sum();
        cal.set_end_metrics(
            &curves,
            format!(
                "mean teacher-forced next-token KL(fp16 || one weight compressed), nats, over {positions} positions of {} clips",
                refs.len()
            ),
        );
    }
    Ok(cal)
}

/// The probe outputs of one run as f32 vectors.
pub fn probe_values(
    probes: &[Probe],
    outs: Vec<(String, Tensor)>,
) -> Result<BTreeMap<String, Vec<f32>>> {
    let wanted: std::collections::HashSet<&str> = probes
        .iter()
        .flat_map(|p| std::iter::once(p.output.as_str()).chain(p.gram.as_deref()))
        .collect();
    let mut m = BTreeMap::new();
    for (name, t) in outs {
        if wanted.contains(name.as_str()) {
            let v = t
                .flatten_all()?
                .to_dtype(candle_core::DType::F32)?
                .to_vec1::<f32>()?;
            m.insert(name, v);
        }
    }
    Ok(m)
}
