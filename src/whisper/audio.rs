//! Whisper audio front end: audio files of any supported format (`crate::audio`) → 16 kHz
//! mono f32, a band-limited resampler, and the log-mel spectrogram with the exact
//! semantics of Hugging Face `WhisperFeatureExtractor` (30-s windows of [n_mels, 3000]).
use crate::report::AudioInfo;
use anyhow::{bail, ensure, Context, Result};
use rayon::prelude::*;
use realfft::RealFftPlanner;
use std::path::Path;

/// Sample rate every Whisper model expects.
pub const SAMPLE_RATE: u32 = 16_000;
/// STFT size (25 ms at 16 kHz).
pub const N_FFT: usize = 400;
/// STFT hop (10 ms at 16 kHz).
pub const HOP_LENGTH: usize = 160;
/// Samples in one 30-s window.
pub const N_SAMPLES: usize = 480_000;
/// Frames in one window's log-mel (the STFT yields one more, which is dropped).
pub const N_FRAMES: usize = N_SAMPLES / HOP_LENGTH;
/// Frequency bins of a one-sided `N_FFT` spectrum.
pub const N_FREQS: usize = N_FFT / 2 + 1;

/// Read an audio file (any format of [`crate::audio::SUPPORTED`]) as 16 kHz mono f32 in
/// [-1, 1]: decoded by [`crate::audio::decode`] (integer PCM scaled by 2^(bits-1), as
/// soundfile/librosa do; channels averaged), then resampled with [`resample`].
pub fn load_audio(path: impl AsRef<Path>) -> Result<Vec<f32>> {
    Ok(load_audio_info(path)?.0)
}

/// [`load_audio`], with what the file held (container, codec, rate, channels, duration).
pub fn load_audio_info(path: impl AsRef<Path>) -> Result<(Vec<f32>, AudioInfo)> {
    let d = crate::audio::decode(path)?;
    Ok((
        resample(&d.samples, d.info.sample_rate, SAMPLE_RATE),
        d.info,
    ))
}

// Resampler design: a Kaiser-windowed sinc low-pass, applied as a polyphase filter. Output
// sample n sits at input position n·from/to = i + φ; its value is a dot product of the input
// around i with the kernel row for phase φ. With L = to/gcd there are only L distinct phases:
// when L ≤ MAX_EXACT_PHASES (every common rate pair) each phase gets its own exact row;
// otherwise rows are tabulated at GRID_PHASES steps and the two neighbouring dot products are
// linearly interpolated (error ≈ (π/GRID_PHASES)²/8 ≈ 5e-6, below the stopband).
const ZERO_CROSSINGS: f64 = 48.0;
const KAISER_BETA: f64 = 10.0;
/// Fraction of the lower Nyquist frequency kept in the passband; the ~1 kHz-wide (at 16 kHz)
/// transition band of the 96-zero-crossing Kaiser kernel ends about at Nyquist, so nothing
/// audible aliases back.
const ROLLOFF: f64 = 0.94;
const MAX_EXACT_PHASES: u64 = 1024;
const GRID_PHASES: usize = 512;
/// Outputs per parallel task.
const RESAMPLE_CHUNK: usize = 4096;

fn bessel_i0(x: f64) -> f64 {
    // Power series; converges quickly for the arguments used here (|x| ≤ KAISER_BETA).
    let mut sum = 1.0;
    let mut term = 1.0;
    let q = x * x / 4.0;
    for k in 1..64 {
        term *= q / (k * k) as f64;
        sum += term;
        if term < sum * 1e-17 {
            break;
        }
    }
    sum
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Dot product with 8 independent accumulators so that the compiler vectorises it.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Band-limited resampling from `from_rate` to `to_rate` (Kaiser-windowed sinc): the passband
/// is flat to about 88 % of the lower Nyquist frequency (7 kHz when producing 16 kHz), the
/// stopband (≈ −100 dB) starts near Nyquist. Samples outside the input count as zero. The
/// output has ceil(len · to / from) samples; equal rates return a copy.
pub fn resample(samples: &[f32], from_rate: u32, to_rate: u32) -> Vec<f32> {
    if from_rate == to_rate || samples.is_empty() || from_rate == 0 || to_rate == 0 {
        return samples.to_vec();
    }
    let g = gcd(u64::from(from_rate), u64::from(to_rate));
    let (step_num, den) = (u64::from(from_rate) / g, u64::from(to_rate) / g);
    let out_len = (samples.len() as u64 * den).div_ceil(step_num) as usize;
    // Cutoff as a fraction of the input Nyquist frequency; below 1 when downsampling.
    let cutoff = (f64::from(to_rate) / f64::from(from_rate)).min(1.0) * ROLLOFF;
    let half_width = ZERO_CROSSINGS / cutoff;
    // Taps k = i − half + 1 ..= i + half cover every |i + φ − k| < half_width.
    let half = half_width.ceil() as usize + 1;
    let taps = 2 * half;
    let exact = den <= MAX_EXACT_PHASES;
    let rows = if exact { den as usize } else { GRID_PHASES + 1 };
    let norm = bessel_i0(KAISER_BETA);
    let mut table = vec![0f32; rows * taps];
    for (r, row) in table.chunks_exact_mut(taps).enumerate() {
        let phase = if exact {
            r as f64 / den as f64
        } else {
            r as f64 / GRID_PHASES as f64
        };
        for (j, h) in row.iter_mut().enumerate() {
            let d = phase + half as f64 - 1.0 - j as f64;
            if d.abs() >= half_width {
                continue;
            }
            let x = std::f64::consts::PI * cutoff * d;
            let sinc = if x == 0.0 { 1.0 } else { x.sin() / x };
            let r = d / half_width;
            *h = (cutoff * sinc * bessel_i0(KAISER_BETA * (1.0 - r * r).sqrt()) / norm) as f32;
        }
    }
    // Zero margins make every output a plain dot product over one contiguous slice.
    let mut padded = vec![0f32; samples.len() + taps];
    padded[half..half + samples.len()].copy_from_slice(samples);

    let mut out = vec![0f32; out_len];
    out.par_chunks_mut(RESAMPLE_CHUNK)
        .enumerate()
        .for_each(|(chunk, dst)| {
            for (j, o) in dst.iter_mut().enumerate() {
                let pos = (chunk * RESAMPLE_CHUNK + j) as u64 * step_num;
                let (i, p) = ((pos / den) as usize, pos % den);
                // Input k = i − half + 1 + t sits at padded[i + 1 + t].
                let x = &padded[i + 1..i + 1 + taps];
                *o = if exact {
                    dot(x, &table[p as usize * taps..(p as usize + 1) * taps])
                } else {
                    let f = p as f64 / den as f64 * GRID_PHASES as f64;
                    let r = (f as usize).min(GRID_PHASES - 1);
                    let w = (f - r as f64) as f32;
                    let a = dot(x, &table[r * taps..(r + 1) * taps]);
                    let b = dot(x, &table[(r + 1) * taps..(r + 2) * taps]);
                    a + (b - a) * w
                };
            }
        });
    out
}

/// A mel filter bank: `n_mels` rows of `N_FREQS` weights over the one-sided power spectrum.
#[derive(Debug, Clone, PartialEq)]
pub struct MelFilters {
    n_mels: usize,
    /// Row-major [n_mels, N_FREQS].
    weights: Vec<f64>,
    /// Per mel row, the half-open range of non-zero bins (triangles are narrow; skipping the
    /// zeros makes the projection ~40x cheaper).
    ranges: Vec<(usize, usize)>,
}

fn hz_to_mel_slaney(hz: f64) -> f64 {
    let min_log_hz = 1000.0;
    let min_log_mel = 15.0;
    let logstep = 27.0 / 6.4f64.ln();
    if hz >= min_log_hz {
        min_log_mel + (hz / min_log_hz).ln() * logstep
    } else {
        3.0 * hz / 200.0
    }
}

fn mel_to_hz_slaney(mel: f64) -> f64 {
    let min_log_hz = 1000.0;
    let min_log_mel = 15.0;
    let logstep = 6.4f64.ln() / 27.0;
    if mel >= min_log_mel {
        min_log_hz * (logstep * (mel - min_log_mel)).exp()
    } else {
        200.0 * mel / 3.0
    }
}

fn linspace(start: f64, end: f64, n: usize) -> Vec<f64> {
    if n == 1 {
        return vec![start];
    }
    let step = (end - start) / (n - 1) as f64;
    // numpy.linspace computes start + i*step and pins the last point to `end`.
    (0..n)
        .map(|i| {
            if i == n - 1 {
                end
            } else {
                start + i as f64 * step
            }
        })
        .collect()
}

impl MelFilters {
    /// The bank Hugging Face computes for Whisper: `mel_filter_bank(num_frequency_bins=201,
    /// num_mel_filters=n_mels, min_frequency=0, max_frequency=8000, sampling_rate=16000,
    /// norm="slaney", mel_scale="slaney")`, i.e. triangles equally spaced on the Slaney mel
    /// scale, each scaled to unit area (2 / bandwidth in Hz).
    pub fn slaney(n_mels: usize) -> Result<Self> {
        ensure!(n_mels > 0, "mel filter bank needs at least one mel band");
        let fft_freqs = linspace(0.0, f64::from(SAMPLE_RATE / 2), N_FREQS);
        let mel_min = hz_to_mel_slaney(0.0);
        let mel_max = hz_to_mel_slaney(8000.0);
        let edges: Vec<f64> = linspace(mel_min, mel_max, n_mels + 2)
            .into_iter()
            .map(mel_to_hz_slaney)
            .collect();
        let mut weights = vec![0f64; n_mels * N_FREQS];
        for m in 0..n_mels {
            let (left, center, right) = (edges[m], edges[m + 1], edges[m + 2]);
            let enorm = 2.0 / (right - left);
            for (k, &f) in fft_freqs.iter().enumerate() {
                let down = (f - left) / (center - left);
                let up = (right - f) / (right - center);
                weights[m * N_FREQS + k] = down.min(up).max(0.0) * enorm;
            }
        }
        Self::from_weights(n_mels, weights)
    }

    /// A bank given as rows: either [n_mels][201] or, as HF stores it in memory,
    /// [201][n_mels] (recognised by shape).
    pub fn from_rows(rows: &[Vec<f64>]) -> Result<Self> {
        ensure!(!rows.is_empty(), "mel filter bank is empty");
        let width = rows[0].len();
        ensure!(
            rows.iter().all(|r| r.len() == width),
            "mel filter bank rows have different lengths"
        );
        if width == N_FREQS {
            let weights = rows.iter().flatten().copied().collect();
            Self::from_weights(rows.len(), weights)
        } else if rows.len() == N_FREQS && width > 0 {
            let mut weights = vec![0f64; width * N_FREQS];
            for (k, row) in rows.iter().enumerate() {
                for (m, &w) in row.iter().enumerate() {
                    weights[m * N_FREQS + k] = w;
                }
            }
            Self::from_weights(width, weights)
        } else {
            bail!(
                "mel filter bank has shape [{}, {width}]; expected [n_mels, {N_FREQS}] or [{N_FREQS}, n_mels]",
                rows.len()
            )
        }
    }

    fn from_weights(n_mels: usize, weights: Vec<f64>) -> Result<Self> {
        ensure!(
            weights.iter().all(|w| w.is_finite()),
            "mel filter bank contains non-finite weights"
        );
        let ranges = weights
            .chunks_exact(N_FREQS)
            .map(|row| {
                let first = row.iter().position(|&w| w != 0.0).unwrap_or(0);
                let end = row.iter().rposition(|&w| w != 0.0).map_or(0, |i| i + 1);
                (first, end.max(first))
            })
            .collect();
        Ok(Self {
            n_mels,
            weights,
            ranges,
        })
    }

    /// `mel_filters` from a preprocessor_config.json, if the file has that key (older exports
    /// do; current transformers recomputes the bank and no longer saves it).
    pub fn from_preprocessor_config(path: impl AsRef<Path>) -> Result<Option<Self>> {
        let path = path.as_ref();
        super::file_reads::note(path);
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("{}: cannot read preprocessor config", path.display()))?;
        let json: serde_json::Value = serde_json::from_str(&text).with_context(|| {
            format!("{}: preprocessor config is not valid JSON", path.display())
        })?;
        let Some(value) = json.get("mel_filters") else {
            return Ok(None);
        };
        let rows: Vec<Vec<f64>> = serde_json::from_value(value.clone()).with_context(|| {
            format!(
                "{}: `mel_filters` is not a 2-D array of numbers",
                path.display()
            )
        })?;
        Self::from_rows(&rows)
            .map(Some)
            .with_context(|| format!("{}: bad `mel_filters`", path.display()))
    }

    /// Number of mel bands.
    pub fn n_mels(&self) -> usize {
        self.n_mels
    }

    /// Weights, row-major [n_mels, 201].
    pub fn weights(&self) -> &[f64] {
        &self.weights
    }
}

/// Log-mel spectrogram of one 30-s window, row-major [n_mels, 3000], exactly as
/// `WhisperFeatureExtractor`: audio zero-padded or truncated to 480000 samples, centred STFT
/// (reflect padding, periodic Hann, n_fft 400, hop 160), power spectrum, last frame dropped,
/// mel projection, log10(max(x, 1e-10)), floor at (max − 8), then (x + 4) / 4.
///
/// `filters` overrides the default Slaney bank (e.g. from preprocessor_config.json); its band
/// count must equal `n_mels`. All arithmetic is f64; only the result is rounded to f32.
pub fn log_mel(samples: &[f32], n_mels: usize, filters: Option<&MelFilters>) -> Result<Vec<f32>> {
    log_mel_frames(samples, N_SAMPLES, n_mels, filters)
}

/// Log-mel of a whole recording for sequential long-form decoding, as openai-whisper
/// computes it: the audio followed by 30 s of zeros, one spectrogram over all of it (so the
/// (max − 8) floor is the recording's), row-major [n_mels, frames]. Returns the features,
/// their frame count, and the frames that hold audio (`samples.len() / 160`).
pub fn log_mel_long(
    samples: &[f32],
    n_mels: usize,
    filters: Option<&MelFilters>,
) -> Result<(Vec<f32>, usize, usize)> {
    let total = samples.len() + N_SAMPLES;
    let frames = total / HOP_LENGTH;
    let features = log_mel_frames(samples, total, n_mels, filters)?;
    Ok((features, frames, samples.len() / HOP_LENGTH))
}

/// Frames `[start, start + 3000)` of a [n_mels, frames] spectrogram, zero-padded past its end
/// (openai's `pad_or_trim`), as one window [n_mels, 3000].
pub fn mel_window(features: &[f32], frames: usize, n_mels: usize, start: usize) -> Vec<f32> {
    let mut out = vec![0f32; n_mels * N_FRAMES];
    if start >= frames {
        return out;
    }
    let len = (frames - start).min(N_FRAMES);
    for m in 0..n_mels {
        let src = &features[m * frames + start..m * frames + start + len];
        out[m * N_FRAMES..m * N_FRAMES + len].copy_from_slice(src);
    }
    out
}

/// [`log_mel`] over `total` samples (the audio zero-padded or truncated to it): `total / 160`
/// frames.
fn log_mel_frames(
    samples: &[f32],
    total: usize,
    n_mels: usize,
    filters: Option<&MelFilters>,
) -> Result<Vec<f32>> {
    let n_frames = total / HOP_LENGTH;
    let owned;
    let filters = match filters {
        Some(f) => {
            ensure!(
                f.n_mels == n_mels,
                "mel filter bank has {} bands but {n_mels} were requested",
                f.n_mels
            );
            f
        }
        None => {
            owned = MelFilters::slaney(n_mels)?;
            &owned
        }
    };

    ensure!(
        total > N_FFT,
        "log-mel of {total} samples: at least {N_FFT} are needed"
    );
    // Centre padding: N_FFT/2 reflected samples on each side of the signal (the edge sample
    // itself is not repeated, as numpy/torch "reflect"). The signal is the audio zero-padded
    // or truncated to `total`; it is read in place (no padded copy of a whole recording).
    let pad = N_FFT / 2;
    let signal = |k: usize| samples.get(k).map_or(0.0, |&s| f64::from(s));
    let padded = |i: usize| {
        if i < pad {
            signal(pad - i)
        } else if i >= pad + total {
            signal(2 * total + pad - 2 - i)
        } else {
            signal(i - pad)
        }
    };
    // Frames whose samples all lie inside the audio read it directly.
    let inside = pad..pad + total.min(samples.len());

    let window: Vec<f64> = (0..N_FFT)
        .map(|n| 0.5 - 0.5 * (2.0 * std::f64::consts::PI * n as f64 / N_FFT as f64).cos())
        .collect();
    let fft = RealFftPlanner::<f64>::new().plan_fft_forward(N_FFT);

    // Frame-major mel energies [frames, n_mels], frames in parallel.
    const FRAMES_PER_TASK: usize = 64;
    let mut mel = vec![0f64; n_frames * n_mels];
    mel.par_chunks_mut(FRAMES_PER_TASK * n_mels)
        .enumerate()
        .try_for_each_init(
            || {
                (
                    fft.make_input_vec(),
                    fft.make_output_vec(),
                    fft.make_scratch_vec(),
                    vec![0f64; N_FREQS],
                )
            },
            |(input, spectrum, scratch, power), (task, out)| -> Result<()> {
                for (j, mel_frame) in out.chunks_exact_mut(n_mels).enumerate() {
                    let start = (task * FRAMES_PER_TASK + j) * HOP_LENGTH;
                    if inside.contains(&start) && start + N_FFT <= inside.end {
                        let s = &samples[start - pad..start - pad + N_FFT];
                        for ((x, &s), &w) in input.iter_mut().zip(s).zip(&window) {
                            *x = f64::from(s) * w;
                        }
                    } else {
                        for (i, (x, &w)) in input.iter_mut().zip(&window).enumerate() {
                            *x = padded(start + i) * w;
                        }
                    }
                    fft.process_with_scratch(input, spectrum, scratch)
                        .map_err(|e| anyhow::anyhow!("FFT failed: {e}"))?;
                    for (p, c) in power.iter_mut().zip(spectrum.iter()) {
                        *p = c.re * c.re + c.im * c.im;
                    }
                    for (m, value) in mel_frame.iter_mut().enumerate() {
                        let (lo, hi) = filters.ranges[m];
                        let row = &filters.weights[m * N_FREQS..(m + 1) * N_FREQS];
                        *value = row[lo..hi]
                            .iter()
                            .zip(&power[lo..hi])
                            .map(|(w, p)| w * p)
                            .sum();
                    }
                }
                Ok(())
            },
        )?;

    let mut logs = mel;
    for v in &mut logs {
        *v = v.max(1e-10).log10();
    }
    let floor = logs.iter().copied().fold(f64::NEG_INFINITY, f64::max) - 8.0;
    let mut features = vec![0f32; n_mels * n_frames];
    for (t, frame) in logs.chunks_exact(n_mels).enumerate() {
        for (m, &v) in frame.iter().enumerate() {
            features[m * n_frames + t] = ((v.max(floor) + 4.0) / 4.0) as f32;
        }
    }
    Ok(features)
}

/// Log-mel of audio of any length: consecutive 30-s windows (the last one zero-padded), each
/// [n_mels, 3000] as from [`log_mel`]. Empty audio gives one window of silence.
pub fn log_mel_windows(
    samples: &[f32],
    n_mels: usize,
    filters: Option<&MelFilters>,
) -> Result<Vec<Vec<f32>>> {
    if samples.is_empty() {
        return Ok(vec![log_mel(samples, n_mels, filters)?]);
    }
    let owned;
    let filters = match filters {
        Some(f) => f,
        None => {
            owned = MelFilters::slaney(n_mels)?;
            &owned
        }
    };
    samples
        .chunks(N_SAMPLES)
        .map(|window| log_mel(window, n_mels, Some(filters)))
        .collect()
}
