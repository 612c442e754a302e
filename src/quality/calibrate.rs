//! `milkit calibrate`: second moments of every compressible op's input, per input channel,
//! measured by running the fp16 encoder on real audio.

use super::eval::read_manifest;
use crate::ir::Opset;
use crate::passes::calibrate::{instrument, Calibration, Moments, Probe, COMPONENT_KEY};
use crate::passes::compress::Selection;
use crate::runtime::{Session, Tensor};
use crate::whisper::audio::{load_wav, log_mel_windows, MelFilters};
use crate::whisper::encoder::EncoderAbi;
use crate::whisper::export::{export_encoder, source_name};
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

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
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Calibration> {
    let model = export_encoder(
        model_dir,
        EncoderAbi::WhisperKit,
        Opset::Ios18,
        &mut |_, _| {},
    )?;
    let n_mels = model
        .description
        .inputs
        .first()
        .and_then(|f| f.shape.get(1).copied())
        .context("the encoder has no mel input")?;
    let filters = MelFilters::from_preprocessor_config(model_dir.join("preprocessor_config.json"))?;
    let (inst, probes) = instrument(&model, sel)?;
    let input = inst.description.inputs[0].name.clone();
    let mut session = Session::from_model(inst).context("preparing the instrumented encoder")?;
    let mut moments = Moments::default();
    for (i, path) in audio.iter().enumerate() {
        let samples = load_wav(path)?;
        for mel in log_mel_windows(&samples, n_mels, filters.as_ref())? {
            let frames = mel.len() / n_mels;
            let x = Tensor::from_vec(mel, (1, n_mels, 1, frames), &candle_core::Device::Cpu)?;
            let outs = session
                .predict(&[(input.as_str(), x)])
                .with_context(|| format!("running the encoder on {}", path.display()))?;
            moments.add(&probes, &probe_values(&probes, outs)?)?;
        }
        progress(i + 1, audio.len());
    }
    let mut cal = moments.finish(&source_name(model_dir));
    cal.meta.insert(COMPONENT_KEY.into(), "encoder".into());
    Ok(cal)
}

/// The probe outputs of one run as f32 vectors.
pub fn probe_values(
    probes: &[Probe],
    outs: Vec<(String, Tensor)>,
) -> Result<BTreeMap<String, Vec<f32>>> {
    let wanted: std::collections::HashSet<&str> =
        probes.iter().map(|p| p.output.as_str()).collect();
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
