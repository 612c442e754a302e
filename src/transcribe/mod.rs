//! End-to-end transcription with the bundled runtime, over a folder laid out as WhisperKit
//! (and `milkit export --component all`) lays it out: `AudioEncoder.mlpackage`,
//! `TextDecoder.mlpackage` (cache I/O or stateful), optional `CrossKV.mlpackage`, optional
//! `MelSpectrogram.mlpackage`, and the model's `generation_config.json`, `tokenizer.json`,
//! optional `config.json` and `preprocessor_config.json`. Audio is cut in consecutive 30-s
//! windows; each is log-mel'd (Rust, or the mel package), encoded and greedily decoded with
//! the generation-config rules. Builds no graphs: uses `runtime` and the `whisper` pieces.

pub mod cost;
pub mod decoder;
pub mod output;

use crate::ir::{Dim, ValueType};
use crate::runtime::{Session, Tensor};
use crate::whisper::audio::{self, MelFilters, N_SAMPLES};
use crate::whisper::config::{GenerationConfig, WhisperConfig};
use crate::whisper::generate::GreedyRules;
use crate::whisper::tokenizer::Tokenizer;
use anyhow::{anyhow, bail, ensure, Context, Result};
use decoder::{CacheKind, Cross, TextDecoder};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// File names inside a models folder (WhisperKit's).
pub const ENCODER_FILE: &str = "AudioEncoder.mlpackage";
pub const DECODER_FILE: &str = "TextDecoder.mlpackage";
pub const CROSS_KV_FILE: &str = "CrossKV.mlpackage";
pub const MEL_FILE: &str = "MelSpectrogram.mlpackage";

/// Where the time of one transcription went.
#[derive(Clone, Debug, Default)]
pub struct Timings {
    pub mel: Duration,
    pub encoder: Duration,
    /// CrossKV model runs (zero without one).
    pub cross_kv: Duration,
    pub decoder: Duration,
    /// Decoder calls, prompt tokens included.
    pub decoder_steps: usize,
    /// Whole call, detokenization included.
    pub total: Duration,
}

impl Timings {
    fn add(&mut self, o: &Timings) {
        self.mel += o.mel;
        self.encoder += o.encoder;
        self.cross_kv += o.cross_kv;
        self.decoder += o.decoder;
        self.decoder_steps += o.decoder_steps;
    }
}

/// The result of one transcription.
#[derive(Clone, Debug)]
pub struct Transcript {
    /// The windows' texts concatenated, as the tokenizer renders them (Whisper's text
    /// usually starts with a space).
    pub text: String,
    /// Per 30-s window: generated tokens (prompt and end-of-text excluded) and their text.
    pub windows: Vec<(Vec<u32>, String)>,
    pub timings: Timings,
}

/// A models folder, loaded once and used for any number of files.
pub struct Transcriber {
    dir: PathBuf,
    encoder: Session,
    /// (input name, input shape) of the encoder.
    encoder_input: (String, Vec<usize>),
    cross_kv: Option<Session>,
    mel: Option<Session>,
    decoder: TextDecoder,
    n_mels: usize,
    filters: MelFilters,
    tokenizer: Tokenizer,
    rules: GreedyRules,
}

fn single_fixed_input(s: &Session, what: &str) -> Result<(String, Vec<usize>)> {
    let ins = s.inputs(None)?;
    ensure!(
        ins.len() == 1,
        "the {what} should take one input, takes {}",
        ins.len()
    );
    let (name, ty) = ins.into_iter().next().ok_or_else(|| anyhow!("no input"))?;
    let shape = match &ty {
        ValueType::Tensor(t) => t
            .shape
            .iter()
            .map(|d| match d {
                Dim::Fixed(n) => Ok(*n),
                _ => bail!("{what} input `{name}` has a flexible shape {t}"),
            })
            .collect::<Result<Vec<_>>>()?,
        o => bail!("{what} input `{name}` is {o}, not a tensor"),
    };
    Ok((name, shape))
}

fn load(dir: &Path, file: &str) -> Result<Session> {
    Session::load(&dir.join(file)).with_context(|| format!("loading {file}"))
}

/// A package run once per window: memoization (which pays off for the decoder's
/// per-window inputs) would only compare megabytes of input per call, and would make a
/// repeated window a cache hit, which benchmarks must not count.
fn load_once_per_window(dir: &Path, file: &str) -> Result<Session> {
    let mut s = load(dir, file)?;
    s.set_memoize(false);
    Ok(s)
}

impl Transcriber {
    /// Loads every package and json file of `dir` (see the module doc). The log-mel is
    /// computed in Rust (it matches Hugging Face's feature extractor to ~1e-5); a
    /// MelSpectrogram package in the folder is used only with [`Transcriber::open_with`].
    pub fn open(dir: &Path) -> Result<Transcriber> {
        Transcriber::open_with(dir, false)
    }

    /// [`Transcriber::open`]; with `mel_package`, the folder's MelSpectrogram.mlpackage (fp16,
    /// as WhisperKit runs it) makes the features when present.
    pub fn open_with(dir: &Path, mel_package: bool) -> Result<Transcriber> {
        ensure!(
            dir.is_dir(),
            "models folder {} does not exist (expected {ENCODER_FILE}, {DECODER_FILE}, \
             generation_config.json, tokenizer.json)",
            dir.display()
        );
        for need in [
            ENCODER_FILE,
            DECODER_FILE,
            "generation_config.json",
            "tokenizer.json",
        ] {
            ensure!(dir.join(need).exists(), "{} lacks {need}", dir.display());
        }
        let gen = GenerationConfig::from_file(&dir.join("generation_config.json"))?;
        let config_path = dir.join("config.json");
        if config_path.exists() {
            let cfg = WhisperConfig::from_file(&config_path)?;
            gen.validate(&cfg)
                .with_context(|| format!("{}: generation_config.json", dir.display()))?;
        }
        let rules = GreedyRules::new(&gen)
            .with_context(|| format!("{}: unusable generation_config.json", dir.display()))?;
        let tokenizer = Tokenizer::from_file(dir.join("tokenizer.json"))?;

        let encoder = load_once_per_window(dir, ENCODER_FILE)?;
        let encoder_input = single_fixed_input(&encoder, "audio encoder")
            .with_context(|| format!("{}", dir.join(ENCODER_FILE).display()))?;
        let n_mels = *encoder_input.1.get(1).ok_or_else(|| {
            anyhow!(
                "{}: encoder input shape {:?} has no mel axis",
                ENCODER_FILE,
                encoder_input.1
            )
        })?;
        ensure!(
            encoder_input.1.iter().product::<usize>() == n_mels * audio::N_FRAMES,
            "{ENCODER_FILE}: input `{}` {:?} does not hold {n_mels} mels × {} frames",
            encoder_input.0,
            encoder_input.1,
            audio::N_FRAMES
        );
        let decoder = TextDecoder::load(&dir.join(DECODER_FILE))?;
        let cross_kv = if decoder.wants_precomputed_cross() {
            ensure!(
                dir.join(CROSS_KV_FILE).exists(),
                "{}: the text decoder takes encoder_attn_key_cache, but {CROSS_KV_FILE} is missing",
                dir.display()
            );
            Some(load_once_per_window(dir, CROSS_KV_FILE)?)
        } else {
            None
        };
        let mel = if mel_package && dir.join(MEL_FILE).exists() {
            Some(load_once_per_window(dir, MEL_FILE)?)
        } else {
            None
        };
        let pre = dir.join("preprocessor_config.json");
        let filters = match pre
            .exists()
            .then(|| MelFilters::from_preprocessor_config(&pre))
            .transpose()?
            .flatten()
        {
            Some(f) => {
                ensure!(
                    f.n_mels() == n_mels,
                    "{}: {} mel filters, the encoder takes {n_mels}",
                    pre.display(),
                    f.n_mels()
                );
                f
            }
            None => MelFilters::slaney(n_mels)?,
        };
        Ok(Transcriber {
            dir: dir.to_path_buf(),
            encoder,
            encoder_input,
            cross_kv,
            mel,
            decoder,
            n_mels,
            filters,
            tokenizer,
            rules,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether the text decoder keeps its caches as Core ML states.
    pub fn stateful_decoder(&self) -> bool {
        self.decoder.kind() == CacheKind::State
    }

    pub fn uses_cross_kv(&self) -> bool {
        self.cross_kv.is_some()
    }

    pub fn uses_mel_package(&self) -> bool {
        self.mel.is_some()
    }

    /// Replaces the folder's text decoder (e.g. by an instrumented copy of it).
    pub fn set_decoder(&mut self, decoder: TextDecoder) {
        self.decoder = decoder;
    }

    /// The text decoder's session (its program, for byte counts).
    pub fn decoder_session(&self) -> &Session {
        self.decoder.session()
    }

    /// Starts (or stops) per-op timing in every package's session (see [`Session::profile`]).
    pub fn enable_profiling(&mut self, on: bool) {
        self.encoder.enable_profiling(on);
        self.decoder.session_mut().enable_profiling(on);
        for s in [self.cross_kv.as_mut(), self.mel.as_mut()]
            .into_iter()
            .flatten()
        {
            s.enable_profiling(on);
        }
    }

    /// (package, op type, calls, total time) since profiling was enabled, per package slowest
    /// op first.
    pub fn profile(&self) -> Vec<(&'static str, String, usize, std::time::Duration)> {
        let mut out = vec![];
        let parts = [
            ("MelSpectrogram", self.mel.as_ref()),
            ("AudioEncoder", Some(&self.encoder)),
            ("CrossKV", self.cross_kv.as_ref()),
            ("TextDecoder", Some(self.decoder.session())),
        ];
        for (name, s) in parts {
            for (op, n, t) in s.map(|s| s.profile()).unwrap_or_default() {
                out.push((name, op, n, t));
            }
        }
        out
    }

    /// Reads a WAV file (any rate, resampled to 16 kHz) and transcribes it.
    pub fn transcribe_file(&mut self, path: &Path) -> Result<Transcript> {
        let samples = audio::load_wav(path)?;
        self.transcribe(&samples)
            .with_context(|| format!("transcribing {}", path.display()))
    }

    /// Transcribes 16 kHz mono samples, in consecutive 30-s windows.
    pub fn transcribe(&mut self, samples: &[f32]) -> Result<Transcript> {
        let t0 = Instant::now();
        let mut timings = Timings::default();
        let mut windows = Vec::new();
        let chunks: Vec<&[f32]> = if samples.is_empty() {
            vec![samples]
        } else {
            samples.chunks(N_SAMPLES).collect()
        };
        for (i, chunk) in chunks.into_iter().enumerate() {
            let (tokens, t) = self
                .window(chunk)
                .with_context(|| format!("30-s window {i}"))?;
            timings.add(&t);
            let text = self.tokenizer.decode(&tokens, true);
            windows.push((tokens, text));
        }
        let text = windows.iter().map(|(_, t)| t.as_str()).collect();
        timings.total = t0.elapsed();
        Ok(Transcript {
            text,
            windows,
            timings,
        })
    }

    /// Log-mel of one window (≤ 30 s), row-major [n_mels, 3000].
    fn mel(&mut self, chunk: &[f32]) -> Result<Tensor> {
        let shape = self.encoder_input.1.clone();
        match &mut self.mel {
            None => {
                let m = audio::log_mel(chunk, self.n_mels, Some(&self.filters))?;
                Ok(Tensor::from_vec(m, shape, &candle_core::Device::Cpu)?)
            }
            Some(s) => {
                let (name, ishape) = single_fixed_input(s, "mel spectrogram model")?;
                let mut padded = chunk.to_vec();
                padded.resize(N_SAMPLES, 0.0);
                ensure!(
                    ishape.iter().product::<usize>() == N_SAMPLES,
                    "{MEL_FILE}: input `{name}` {ishape:?} does not hold {N_SAMPLES} samples"
                );
                let x = Tensor::from_vec(padded, ishape, &candle_core::Device::Cpu)?;
                let out = s
                    .predict(&[(name.as_str(), x)])
                    .with_context(|| format!("running {MEL_FILE}"))?;
                let (_, m) = out
                    .into_iter()
                    .next()
                    .ok_or_else(|| anyhow!("{MEL_FILE} has no output"))?;
                Ok(m.reshape(shape).with_context(|| {
                    format!("{MEL_FILE}: output does not fit the encoder input")
                })?)
            }
        }
    }

    /// One window: mel → encoder → (CrossKV) → greedy decoding; the generated tokens.
    fn window(&mut self, chunk: &[f32]) -> Result<(Vec<u32>, Timings)> {
        let mut t = Timings::default();
        let t0 = Instant::now();
        let mel = self.mel(chunk)?;
        t.mel = t0.elapsed();

        let t0 = Instant::now();
        let out = self
            .encoder
            .predict(&[(self.encoder_input.0.as_str(), mel)])
            .context("running the audio encoder")?;
        let (_, enc) = out
            .into_iter()
            .next()
            .ok_or_else(|| anyhow!("the audio encoder has no output"))?;
        // whisper.cpp's encoder ABI gives [1, 1500, d]; the decoder wants BC1S [1, d, 1, 1500].
        let enc = match enc.rank() {
            4 => enc,
            3 => enc.transpose(1, 2)?.unsqueeze(2)?.contiguous()?,
            r => bail!("the audio encoder output has rank {r}, expected 3 or 4"),
        };
        t.encoder = t0.elapsed();

        let cross = match &mut self.cross_kv {
            None => Cross::Encoder(enc),
            Some(s) => {
                let t0 = Instant::now();
                let out = s
                    .predict(&[("encoder_output_embeds", enc)])
                    .with_context(|| format!("running {CROSS_KV_FILE}"))?;
                let get = |n: &str| {
                    out.iter()
                        .find(|(k, _)| k == n)
                        .map(|(_, v)| v.clone())
                        .ok_or_else(|| anyhow!("{CROSS_KV_FILE} has no output `{n}`"))
                };
                let c = Cross::Precomputed {
                    key: get("encoder_attn_key_cache")?,
                    value: get("encoder_attn_value_cache")?,
                };
                t.cross_kv = t0.elapsed();
                c
            }
        };
        self.decoder.begin(cross)?;

        let t0 = Instant::now();
        let limit = self.rules.max_length().min(self.decoder.positions());
        let prompt_len = self.rules.initial_tokens().len();
        let mut fed = 0usize;
        let mut steps = 0usize;
        let decoder = &mut self.decoder;
        let mut last = Vec::new();
        let tokens = self.rules.greedy_limited(limit, |seq| {
            // Feed every token the cache has not seen; the logits after the last one count.
            while fed < seq.len() {
                last = decoder.step(seq[fed], fed)?;
                fed += 1;
                steps += 1;
            }
            Ok(std::mem::take(&mut last))
        })?;
        t.decoder = t0.elapsed();
        t.decoder_steps = steps;
        let mut generated = tokens[prompt_len..].to_vec();
        if generated.last().is_some_and(|&id| self.rules.is_eos(id)) {
            generated.pop();
        }
        Ok((generated, t))
    }
}
