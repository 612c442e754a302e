//! WhisperKit's `MelSpectrogram` model as a MIL program: 30 s of 16 kHz audio `audio` fp16
//! [480000] → `melspectrogram_features` fp16 [1, n_mels, 1, 3000], the log-mel features
//! Whisper's encoder takes (the same numbers as `audio::log_mel`, i.e. Hugging Face's
//! `WhisperFeatureExtractor`).
//!
//! The STFT is a strided 1-D convolution whose kernels are the Hann-windowed DFT basis
//! (cosine rows, then sine rows), after reflect padding of n_fft/2 samples on each side.
//! That convolution, the only heavy part, runs in fp16. Its output is cast to fp32 for the
//! rest (power, mel projection, log10 with the 1e-10 clamp, floor at max − 8, (x + 4)/4):
//! quiet bins have powers far below fp16's smallest normal number, and 1e-10 itself is not
//! representable in fp16, so silence would otherwise give −inf instead of Whisper's −1.5.

use super::audio::{MelFilters, HOP_LENGTH, N_FFT, N_FRAMES, N_FREQS, N_SAMPLES};
use super::config::WhisperConfig;
use super::decoder::finish_model;
use crate::ir::{ArrayDType, Description, Feature, Model, Opset, Tensor, Value, ValueType};
use crate::ops::builder::{int, ints};
use crate::ops::{Builder, In, V};
use anyhow::{ensure, Result};
use half::f16;
use std::path::Path;

/// Input name of the MelSpectrogram model (WhisperKit's).
pub const MEL_INPUT: &str = "audio";
/// Output name of the MelSpectrogram model (= the WhisperKit AudioEncoder's input).
pub const MEL_OUTPUT: &str = "melspectrogram_features";

/// The windowed DFT basis as conv kernels [2·N_FREQS, 1, N_FFT]: rows 0..201 are
/// w[n]·cos(2πkn/N), rows 201..402 are −w[n]·sin(2πkn/N), w the periodic Hann window.
fn dft_kernels() -> Vec<f16> {
    let n = N_FFT as f64;
    let window: Vec<f64> = (0..N_FFT)
        .map(|i| 0.5 - 0.5 * (2.0 * std::f64::consts::PI * i as f64 / n).cos())
        .collect();
    let mut k = Vec::with_capacity(2 * N_FREQS * N_FFT);
    for part in 0..2 {
        for f in 0..N_FREQS {
            for (i, w) in window.iter().enumerate() {
                // The phase k·i mod N keeps the angle small and the basis exact to f64.
                let a = 2.0 * std::f64::consts::PI * ((f * i) % N_FFT) as f64 / n;
                let v = if part == 0 { w * a.cos() } else { -w * a.sin() };
                k.push(f16::from_f64(v));
            }
        }
    }
    k
}

fn op2(b: &mut Builder, op: &str, name: &str, x: &V, y: In) -> Result<V> {
    b.op1(op, name, vec![("x", x.into()), ("y", y)])
}

/// Builds the MelSpectrogram model for `filters` (its band count is n_mels).
pub fn build_mel(filters: &MelFilters, opset: Opset) -> Result<Model> {
    let n_mels = filters.n_mels();
    ensure!(
        filters.weights().len() == n_mels * N_FREQS,
        "mel filter bank has {} weights, expected {n_mels} × {N_FREQS}",
        filters.weights().len()
    );
    let fin = Feature::new(MEL_INPUT, ArrayDType::F16, &[N_SAMPLES]);
    let fout = Feature::new(MEL_OUTPUT, ArrayDType::F16, &[1, n_mels, 1, N_FRAMES]);
    let mut b = Builder::new(opset);
    let audio = b.input(MEL_INPUT, ValueType::Tensor(fin.tensor_type()));
    let x = b.reshape("audio_1_1_n", &audio, &[1, 1, N_SAMPLES as i32])?;
    let half = (N_FFT / 2) as i32;
    let x = b.op1(
        "pad",
        "audio_reflect_pad",
        vec![
            ("x", In::V(x)),
            ("pad", ints(&[half, half])),
            ("mode", In::C(Value::str("reflect"))),
        ],
    )?;
    let basis = b.konst(
        "stft_basis",
        Value::Tensor(Tensor::f16(&[2 * N_FREQS, 1, N_FFT], &dft_kernels())),
    );
    // [1, 402, 3001]: real and imaginary parts of every centred frame.
    let spec = b.op1(
        "conv",
        "stft",
        vec![
            ("x", In::V(x)),
            ("weight", In::V(basis)),
            ("strides", ints(&[HOP_LENGTH as i32])),
            ("pad_type", In::C(Value::str("valid"))),
            ("dilations", ints(&[1])),
            ("groups", int(1)),
        ],
    )?;
    let spec = b.op1(
        "cast",
        "stft_fp32",
        vec![("x", In::V(spec)), ("dtype", In::C(Value::str("fp32")))],
    )?;
    let power = op2(&mut b, "mul", "stft_power", &spec, In::from(&spec))?;
    // Power = re² + im²: the filters applied to both halves and summed by one conv.
    let mut proj = Vec::with_capacity(n_mels * 2 * N_FREQS);
    for row in filters.weights().chunks_exact(N_FREQS) {
        let row: Vec<f32> = row.iter().map(|&w| w as f32).collect();
        proj.extend_from_slice(&row);
        proj.extend_from_slice(&row);
    }
    let proj = b.konst(
        "mel_filters",
        Value::Tensor(Tensor::f32(&[n_mels, 2 * N_FREQS, 1], &proj)),
    );
    let mel = b.op1(
        "conv",
        "mel_projection",
        vec![
            ("x", In::V(power)),
            ("weight", In::V(proj)),
            ("strides", ints(&[1])),
            ("pad_type", In::C(Value::str("valid"))),
            ("dilations", ints(&[1])),
            ("groups", int(1)),
        ],
    )?;
    // Whisper drops the last of the 3001 centred frames.
    let mel = b.op1(
        "slice_by_index",
        "mel_frames",
        vec![
            ("x", In::V(mel)),
            ("begin", ints(&[0, 0, 0])),
            ("end", ints(&[1, n_mels as i32, N_FRAMES as i32])),
        ],
    )?;
    let mel = op2(
        &mut b,
        "maximum",
        "mel_clamped",
        &mel,
        In::C(Value::f32_scalar(1e-10)),
    )?;
    let ln = b.op1("log", "mel_ln", vec![("x", In::V(mel))])?;
    let log10 = op2(
        &mut b,
        "mul",
        "mel_log10",
        &ln,
        In::C(Value::f32_scalar(std::f32::consts::LOG10_E)),
    )?;
    let top = b.op1(
        "reduce_max",
        "mel_log10_max",
        vec![
            ("x", In::from(&log10)),
            ("keep_dims", In::C(Value::bool_scalar(false))),
        ],
    )?;
    let floor = op2(
        &mut b,
        "sub",
        "mel_floor",
        &top,
        In::C(Value::f32_scalar(8.0)),
    )?;
    let y = op2(&mut b, "maximum", "mel_floored", &log10, In::from(&floor))?;
    let y = op2(
        &mut b,
        "add",
        "mel_plus4",
        &y,
        In::C(Value::f32_scalar(4.0)),
    )?;
    let y = op2(
        &mut b,
        "mul",
        "mel_scaled",
        &y,
        In::C(Value::f32_scalar(0.25)),
    )?;
    let y = b.op1(
        "cast",
        "mel_fp16",
        vec![("x", In::V(y)), ("dtype", In::C(Value::str("fp16")))],
    )?;
    let y = b.reshape("mel_bc1s", &y, &[1, n_mels as i32, 1, N_FRAMES as i32])?;
    let (inputs, block) = b.finish(&[(y, MEL_OUTPUT)])?;
    let mut description = Description {
        inputs: vec![fin],
        outputs: vec![fout],
        ..Default::default()
    };
    description.short_description = format!(
        "Whisper log-mel spectrogram ({n_mels} bands, 3000 frames) of 30 s of 16 kHz audio (WhisperKit MelSpectrogram ABI)"
    );
    Ok(finish_model("mel", inputs, block, opset, description))
}

/// The mel filter bank of the checkpoint in `model_dir` with config `cfg`: `mel_filters` of
/// preprocessor_config.json when present, else the Slaney bank with config.json's
/// `num_mel_bins` bands.
pub fn model_filters(model_dir: &Path, cfg: &WhisperConfig) -> Result<MelFilters> {
    let pre = model_dir.join("preprocessor_config.json");
    if pre.exists() {
        if let Some(f) = MelFilters::from_preprocessor_config(&pre)? {
            ensure!(
                f.n_mels() == cfg.num_mel_bins,
                "{}: mel_filters has {} bands but config.json says num_mel_bins = {}",
                pre.display(),
                f.n_mels(),
                cfg.num_mel_bins
            );
            return Ok(f);
        }
    }
    MelFilters::slaney(cfg.num_mel_bins)
}
