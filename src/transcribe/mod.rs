//! End-to-end transcription with the bundled runtime, over a folder laid out as WhisperKit
//! (and `milkit export --component all`) lays it out: `AudioEncoder.mlpackage`,
//! `TextDecoder.mlpackage` (cache I/O or stateful), optional `CrossKV.mlpackage`, optional
//! `MelSpectrogram.mlpackage`, optional `TextDecoderContextPrefill.mlpackage` (used only when
//! asked: [`OpenOptions::prefill`]), each of which may be the compiled `.mlmodelc` instead, as
//! WhisperKit's Hub repositories ship them, and the model's `generation_config.json`, `tokenizer.json`,
//! optional `config.json` and `preprocessor_config.json`. Decodes as openai-whisper's
//! `transcribe()` does — language detection, timestamps and segments, temperature fallback,
//! no-speech skipping, sequential long-form seeking, an optional previous-text prompt — using
//! only the packages' inputs and outputs, so argmax's packages run as milkit's do. The rules
//! live in `whisper::generate`; this module drives the runtime's sessions with them and builds
//! no graphs.

pub mod cost;
pub mod decoder;
pub mod output;
pub mod speech;

use crate::ir::{Dim, ValueType};
use crate::report::{AudioInfo, TranscriptionResult, TranscriptionSegment, WordTiming};
pub use crate::runtime::precision::Compute;
use crate::runtime::{Session, Tensor};
use crate::whisper::audio::{self, MelFilters, HOP_LENGTH, N_FRAMES, N_SAMPLES, SAMPLE_RATE};
use crate::whisper::config::{GenerationConfig, WhisperConfig};
use crate::whisper::decoder_prefill::PrefillSpec;
use crate::whisper::generate::{
    compression_ratio, DecodingRules, Pass, PassOptions, Rng, Search, Sequences, Task,
    TIME_PRECISION,
};
use crate::whisper::timing::{word_timestamps, Word};
use crate::whisper::tokenizer::Tokenizer;
use anyhow::{anyhow, bail, ensure, Context, Result};
use decoder::{CacheKind, Cross, Prefill, SequenceCaches, TextDecoder};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// File names inside a models folder (WhisperKit's).
pub const ENCODER_FILE: &str = "AudioEncoder.mlpackage";
pub const DECODER_FILE: &str = "TextDecoder.mlpackage";
pub const CROSS_KV_FILE: &str = "CrossKV.mlpackage";
pub const MEL_FILE: &str = "MelSpectrogram.mlpackage";
pub const PREFILL_FILE: &str = "TextDecoderContextPrefill.mlpackage";

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
    /// Of `decoder`: the time inside the decoder model's calls (the rest is the decoding
    /// rules: logit filters, timestamp rules, sampling).
    pub decoder_calls: Duration,
    /// Of `decoder_calls`: the first call of each decoding pass (and of each language detection),
    /// which also runs what a decoder computes once per window — a WhisperKit decoder's
    /// cross-attention K/V projection of the encoder output, reused by the pass's later
    /// calls (`runtime::memo`).
    pub decoder_first: Duration,
    /// How many first calls `decoder_first` holds.
    pub decoder_passes: usize,
    /// Each of the decoder model's other calls (`decoder_calls` − `decoder_first`), in
    /// order: the steady per-token times whose median `bench audio` sets against the
    /// bandwidth floor's median pass.
    pub warm_calls: Vec<Duration>,
    /// Whole call, detokenization included.
    pub total: Duration,
}

/// How to decode: openai-whisper's `transcribe()` options, with its defaults.
#[derive(Clone, Debug)]
pub struct TranscribeOptions {
    /// A language code (`de`), or None to detect it (multilingual models) / English.
    pub language: Option<String>,
    pub task: Task,
    /// Timestamp tokens and segments (on by default, as openai-whisper and WhisperKit).
    pub timestamps: bool,
    /// Word start/end times from the decoder's `alignment_heads_weights`.
    pub word_timestamps: bool,
    /// Tried in order; the next one when a window fails the thresholds below.
    pub temperatures: Vec<f32>,
    /// A window whose text compresses better than this (gzip) is decoded again.
    pub compression_ratio_threshold: Option<f64>,
    /// A window whose average token log-probability is below this is decoded again.
    pub logprob_threshold: Option<f64>,
    /// A window is silent when its no-speech probability is above this and its average
    /// log-probability is below `logprob_threshold`.
    pub no_speech_threshold: Option<f64>,
    /// Feed the previous window's text as the prompt (off by default, as Hugging Face).
    pub condition_on_previous_text: bool,
    /// Tokens fed as the first window's prompt (`--initial-prompt`).
    pub initial_prompt: Vec<u32>,
    /// Seed of the sampler used at temperatures above 0.
    pub seed: u64,
    /// Beam search at temperature 0 and best-of sampling above (greedy and one sample by
    /// default, as openai-whisper's `transcribe()`).
    pub search: Search,
    /// How a window shorter than 30 s is filled out to the encoder's 3000 frames.
    pub mel_padding: MelPadding,
}

/// How the log-mel of audio shorter than a window is filled out to 30 s (3000 frames). The
/// two agree on every frame that holds audio; they differ past its end, and there the
/// encoder sees different input: on a 1-s clip of a constant near-zero level, tiny.en reads
/// " you" after audio padding and nothing after feature padding, as faster-whisper does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum MelPadding {
    /// The audio is zero-padded to 30 s before its log-mel is taken: Hugging Face's
    /// `WhisperFeatureExtractor` and WhisperKit, whose outputs the references hold.
    #[default]
    Audio,
    /// The log-mel of the audio is padded with zero features: openai-whisper's and
    /// faster-whisper's `pad_or_trim` of the spectrogram (long recordings' last windows are
    /// padded so in either mode).
    Features,
}

impl Default for TranscribeOptions {
    fn default() -> Self {
        TranscribeOptions {
            language: None,
            task: Task::Transcribe,
            timestamps: true,
            word_timestamps: false,
            temperatures: vec![0.0, 0.2, 0.4, 0.6, 0.8, 1.0],
            compression_ratio_threshold: Some(2.4),
            logprob_threshold: Some(-1.0),
            no_speech_threshold: Some(0.6),
            condition_on_previous_text: false,
            initial_prompt: vec![],
            seed: 0,
            search: Search::default(),
            mel_padding: MelPadding::default(),
        }
    }
}

impl TranscribeOptions {
    /// Greedy, no timestamps, no fallback and no silence skipping: Hugging Face's
    /// `generate()` defaults, which the reference transcripts were made with.
    pub fn greedy_no_timestamps() -> Self {
        TranscribeOptions {
            timestamps: false,
            temperatures: vec![0.0],
            compression_ratio_threshold: None,
            logprob_threshold: None,
            no_speech_threshold: None,
            ..TranscribeOptions::default()
        }
    }
}

/// One segment, as openai-whisper's result lists them.
#[derive(Clone, Debug, PartialEq)]
pub struct Segment {
    pub id: usize,
    /// Start of the window it was decoded in, in mel frames (10 ms).
    pub seek: usize,
    pub start: f64,
    pub end: f64,
    pub text: String,
    /// Its tokens, timestamp tokens included.
    pub tokens: Vec<u32>,
    pub temperature: f32,
    pub avg_logprob: f64,
    pub compression_ratio: f64,
    pub no_speech_prob: f64,
    /// Word timings (with `word_timestamps`; empty otherwise).
    pub words: Vec<Word>,
}

/// One decoded 30-s window.
#[derive(Clone, Debug)]
pub struct Window {
    /// Its start, in mel frames.
    pub seek: usize,
    /// The pass that was kept (after any fallback).
    pub pass: Pass,
    /// Decoding passes run (1 without fallback).
    pub passes: usize,
    /// Skipped as silence (no segment from it).
    pub silent: bool,
    /// `alignment_heads_weights` rows of the kept pass, one per decoder call (prompt
    /// included), when word timestamps were asked for.
    pub alignment: Vec<Vec<f32>>,
}

/// `mel` ([.., 3000], frames last) with every frame from `from` on set to zero.
fn zero_frames_from(mel: &Tensor, from: usize) -> Result<Tensor> {
    let keep: Vec<f32> = (0..N_FRAMES)
        .map(|i| f32::from(u8::from(i < from)))
        .collect();
    let mask = Tensor::from_vec(keep, N_FRAMES, mel.device())?.to_dtype(mel.dtype())?;
    Ok(mel.broadcast_mul(&mask)?)
}

/// The result of one transcription.
#[derive(Clone, Debug)]
pub struct Transcript {
    /// The segments' texts concatenated, as the tokenizer renders them (Whisper's text
    /// usually starts with a space).
    pub text: String,
    /// The language decoded with (given or detected); None on an English-only model.
    pub language: Option<String>,
    /// Detected language probabilities, best first (empty when the language was given).
    pub language_probs: Vec<(String, f64)>,
    pub segments: Vec<Segment>,
    pub windows: Vec<Window>,
    pub timings: Timings,
    /// What the transcribed file held (None when samples were given directly).
    pub audio: Option<AudioInfo>,
}

impl Transcript {
    /// openai-whisper's result layout (`--output-format json`); `language` is "en" for an
    /// English-only model.
    pub fn to_result(&self, word_timestamps: bool) -> TranscriptionResult {
        TranscriptionResult {
            text: self.text.clone(),
            language: self.language.clone().unwrap_or_else(|| "en".into()),
            segments: self
                .segments
                .iter()
                .map(|s| TranscriptionSegment {
                    id: s.id as u64,
                    seek: s.seek as u64,
                    start: s.start,
                    end: s.end,
                    text: s.text.clone(),
                    tokens: s.tokens.clone(),
                    temperature: f64::from(s.temperature),
                    avg_logprob: s.avg_logprob,
                    compression_ratio: s.compression_ratio,
                    no_speech_prob: s.no_speech_prob,
                    words: word_timestamps.then(|| {
                        s.words
                            .iter()
                            .map(|w| WordTiming {
                                word: w.word.clone(),
                                start: w.start,
                                end: w.end,
                                probability: w.probability,
                            })
                            .collect()
                    }),
                })
                .collect(),
            audio: self.audio.clone(),
        }
    }
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
    /// The context prefill and the prefix tokens it covers, when asked for.
    prefill: Option<(Prefill, PrefillSpec)>,
    n_mels: usize,
    filters: MelFilters,
    tokenizer: Tokenizer,
    rules: DecodingRules,
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

/// The path of a component of a models folder: `NAME.mlpackage`, or where only the
/// compiled model is there (as WhisperKit's Hub repositories ship them), `NAME.mlmodelc`.
pub fn component(dir: &Path, file: &str) -> PathBuf {
    let p = dir.join(file);
    if p.exists() {
        return p;
    }
    let c = p.with_extension("mlmodelc");
    if c.exists() {
        c
    } else {
        p
    }
}

/// The components of a models folder, sorted: every `NAME.mlpackage` folder, and every
/// `NAME.mlmodelc` whose package is absent, each named `NAME.mlpackage` ([`component`]
/// gives its path).
pub fn components(dir: &Path) -> Result<Vec<String>> {
    ensure!(
        dir.is_dir(),
        "models folder {} does not exist",
        dir.display()
    );
    let mut out = vec![];
    for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let p = e
            .with_context(|| format!("reading {}", dir.display()))?
            .path();
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if let Some(stem) = name
            .strip_suffix(".mlpackage")
            .or_else(|| name.strip_suffix(".mlmodelc"))
            .filter(|_| p.is_dir())
        {
            out.push(format!("{stem}.mlpackage"));
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

fn load(dir: &Path, file: &str, compute: Compute) -> Result<Session> {
    let path = component(dir, file);
    decoder::load_session(&path, compute).with_context(|| format!("loading {}", path.display()))
}

/// A package run once per window: memoization (which pays off for the decoder's
/// per-window inputs) would only compare megabytes of input per call, and would make a
/// repeated window a cache hit, which benchmarks must not count.
fn load_once_per_window(dir: &Path, file: &str, compute: Compute) -> Result<Session> {
    let mut s = load(dir, file, compute)?;
    s.set_memoize(false);
    Ok(s)
}

/// How [`Transcriber::open_with`] loads a folder.
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenOptions {
    /// Make the features with the folder's MelSpectrogram.mlpackage (fp16, as WhisperKit runs
    /// it) when present, instead of milkit's Rust log-mel.
    pub mel_package: bool,
    /// Compute precision of every package ([`Compute::Fp32`]: an evaluation mode against
    /// float32 references; [`Compute::Bf16`]: a faster one on bf16 products; neither is
    /// what a device computes).
    pub compute: Compute,
    /// Take the self-attention caches of the language and task tokens from the folder's
    /// TextDecoderContextPrefill, as WhisperKit does, instead of feeding those tokens to the
    /// decoder: one or two decoder calls fewer per decoding pass. `<|startoftranscript|>`
    /// is still fed (the no-speech probability is read from its logits), as is the
    /// prompt's last token (the first logits come from it); a pass with a previous-text
    /// prompt uses no prefill, as in WhisperKit, nor does one that times words (that
    /// needs every position's alignment row). The prefill's caches do not depend on the
    /// audio (an estimate), so results can differ from the decoding without it.
    pub prefill: bool,
}

impl Transcriber {
    /// Loads every package and json file of `dir` (see the module doc). The log-mel is
    /// computed in Rust (it matches Hugging Face's feature extractor to ~1e-5); a
    /// MelSpectrogram package in the folder is used only with [`Transcriber::open_with`].
    pub fn open(dir: &Path) -> Result<Transcriber> {
        Transcriber::open_with(dir, &OpenOptions::default())
    }

    /// [`Transcriber::open`] with [`OpenOptions`].
    pub fn open_with(dir: &Path, o: &OpenOptions) -> Result<Transcriber> {
        let (mel_package, compute) = (o.mel_package, o.compute);
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
            ensure!(
                component(dir, need).exists(),
                "{} lacks {need}{}",
                dir.display(),
                match need {
                    "tokenizer.json" => {
                        " (folders from argmaxinc/whisperkit-coreml leave it out; WhisperKit \
                         fetches it from the checkpoint's repository: put that repository's \
                         tokenizer.json, e.g. openai/whisper-tiny.en's, beside the models)"
                    }
                    n if n.ends_with(".mlpackage") => " (or its compiled .mlmodelc)",
                    _ => "",
                }
            );
        }
        let gen = GenerationConfig::from_file(&dir.join("generation_config.json"))?;
        let config_path = dir.join("config.json");
        if config_path.exists() {
            let cfg = WhisperConfig::from_file(&config_path)?;
            gen.validate(&cfg)
                .with_context(|| format!("{}: generation_config.json", dir.display()))?;
        }
        let tokenizer = Tokenizer::from_file(dir.join("tokenizer.json"))?;
        let rules = DecodingRules::new(&gen, Some(&tokenizer))
            .with_context(|| format!("{}: unusable generation_config.json", dir.display()))?;

        let encoder = load_once_per_window(dir, ENCODER_FILE, compute)?;
        let encoder_input = single_fixed_input(&encoder, "audio encoder")
            .with_context(|| format!("{}", component(dir, ENCODER_FILE).display()))?;
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
        let decoder = TextDecoder::load_with(&component(dir, DECODER_FILE), compute)?;
        let cross_kv = if decoder.wants_precomputed_cross() {
            ensure!(
                component(dir, CROSS_KV_FILE).exists(),
                "{}: the text decoder takes encoder_attn_key_cache, but {CROSS_KV_FILE} is missing",
                dir.display()
            );
            Some(load_once_per_window(dir, CROSS_KV_FILE, compute)?)
        } else {
            None
        };
        let prefill = if o.prefill {
            let path = component(dir, PREFILL_FILE);
            ensure!(
                path.exists(),
                "{} lacks {PREFILL_FILE} (or its compiled .mlmodelc), which the prefill needs",
                dir.display()
            );
            ensure!(
                decoder.kind() == CacheKind::Io,
                "{}: the prefill fills host-side caches, and this text decoder keeps its caches \
                 as Core ML states",
                dir.display()
            );
            let spec = PrefillSpec::from_generation_config(&gen)
                .with_context(|| format!("{}: generation_config.json", dir.display()))?;
            let p = Prefill::load_with(&path, compute)?;
            ensure!(
                p.channels() == decoder.channels() && p.positions() <= decoder.positions(),
                "{}: the prefill's caches have {} channels and {} positions, the text decoder's \
                 {} and {}",
                path.display(),
                p.channels(),
                p.positions(),
                decoder.channels(),
                decoder.positions()
            );
            Some((p, spec))
        } else {
            None
        };
        let mel = if mel_package && component(dir, MEL_FILE).exists() {
            Some(load_once_per_window(dir, MEL_FILE, compute)?)
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
            prefill,
            n_mels,
            filters,
            tokenizer,
            rules,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Alignment heads per row of the decoder's alignment output: their number when the
    /// package has milkit's per-head output, 1 for WhisperKit's mean.
    pub fn alignment_heads(&self) -> usize {
        self.decoder.alignment_heads()
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

    pub fn uses_prefill(&self) -> bool {
        self.prefill.is_some()
    }

    /// With a context prefill: writes the caches of the prompt positions it can stand in
    /// for into the decoder's (after `begin`) and returns them, the positions not to feed.
    /// Those are the language and task tokens of a prompt that starts with
    /// `<|startoftranscript|> <|lang|> <|task|>`, short of its last token.
    fn prefill_window(&mut self, opts: &PassOptions) -> Result<std::ops::Range<usize>> {
        let Some((prefill, spec)) = &mut self.prefill else {
            return Ok(0..0);
        };
        let sot_seq = self
            .rules
            .sot_sequence(opts.language, opts.task, opts.timestamps)?;
        let prompt = self.rules.prompt(&sot_seq, &opts.previous);
        let t = &prompt.tokens;
        let end = prefill.positions().min(t.len().saturating_sub(1));
        if prompt.sot_index != 0 || end < 2 || t[0] as usize != spec.sot {
            return Ok(0..0);
        }
        // The prefill's rows are `spec.prefix(row)`: this prompt's first three tokens.
        let language = t[1] as usize;
        let task = match t.get(2).map(|&x| x as usize) {
            Some(x) if x == spec.transcribe => 0,
            Some(x) if x == spec.translate => 1,
            _ => return Ok(0..0),
        };
        if !(spec.first_language..spec.first_language + spec.languages).contains(&language) {
            return Ok(0..0);
        }
        let (key, value) = prefill.caches(task, language as u32)?;
        self.decoder.prefill(&key, &value, 1..end)?;
        Ok(1..end)
    }

    /// Replaces the folder's text decoder (e.g. by an instrumented copy of it).
    pub fn set_decoder(&mut self, decoder: TextDecoder) {
        self.decoder = decoder;
    }

    /// The text decoder's session (its program, for byte counts).
    pub fn decoder_session(&self) -> &Session {
        self.decoder.session()
    }

    /// Every package's session: encoder, decoder, and the CrossKV and mel ones the folder
    /// has.
    fn sessions_mut(&mut self) -> impl Iterator<Item = &mut Session> {
        [
            Some(&mut self.encoder),
            Some(self.decoder.session_mut()),
            self.cross_kv.as_mut(),
            self.mel.as_mut(),
        ]
        .into_iter()
        .flatten()
    }

    /// Starts (or stops) per-op timing in every package's session (see [`Session::profile`]).
    pub fn enable_profiling(&mut self, on: bool) {
        self.sessions_mut().for_each(|s| s.enable_profiling(on));
    }

    /// Profiles per op (`op_type name`) instead of per op type, in every package.
    pub fn profile_each_op(&mut self, each: bool) {
        self.sessions_mut().for_each(|s| s.profile_each_op(each));
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

    /// The decoding rules of the folder's generation config.
    pub fn rules(&self) -> &DecodingRules {
        &self.rules
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Checks options against the model before any audio is read: the language code (an
    /// English-only model takes only `en`), translation only where the model has a task slot.
    pub fn check_options(&self, opts: &TranscribeOptions) -> Result<Option<u32>> {
        let language = match opts.language.as_deref() {
            None | Some("auto") => None,
            Some(code) => self.rules.language_token(code)?,
        };
        if opts.task == Task::Translate {
            ensure!(
                self.rules.has_task(),
                "this model is English-only: it cannot translate (--task translate)"
            );
        }
        ensure!(
            !opts.temperatures.is_empty(),
            "at least one temperature is needed"
        );
        for &t in &opts.temperatures {
            ensure!(
                t.is_finite() && t >= 0.0,
                "temperature {t} is not a finite number ≥ 0"
            );
        }
        opts.search.check()?;
        if opts.word_timestamps {
            ensure!(
                self.decoder.has_alignment_output(),
                "word timestamps need the TextDecoder's `alignment_heads_weights` output, which \
                 this package lacks (milkit exports it when generation_config.json names \
                 alignment_heads)"
            );
        }
        Ok(language)
    }

    /// Reads an audio file (any supported format and rate, resampled to 16 kHz) and
    /// transcribes it with the default options.
    pub fn transcribe_file(&mut self, path: &Path) -> Result<Transcript> {
        self.transcribe_file_with(path, &TranscribeOptions::default())
    }

    /// Reads an audio file and transcribes it with `opts`.
    pub fn transcribe_file_with(
        &mut self,
        path: &Path,
        opts: &TranscribeOptions,
    ) -> Result<Transcript> {
        let (samples, info) = audio::load_audio_info(path)?;
        let mut t = self
            .transcribe_with(&samples, opts)
            .with_context(|| format!("transcribing {}", path.display()))?;
        t.audio = Some(info);
        Ok(t)
    }

    /// Transcribes 16 kHz mono samples with the default options.
    pub fn transcribe(&mut self, samples: &[f32]) -> Result<Transcript> {
        self.transcribe_with(samples, &TranscribeOptions::default())
    }

    /// Language probabilities of the first 30 s of `samples`, best first (openai's
    /// `detect_language`); an error on an English-only model.
    pub fn detect_language(&mut self, samples: &[f32]) -> Result<Vec<(String, f64)>> {
        ensure!(
            self.rules.is_multilingual(),
            "this model is English-only: it has no language to detect"
        );
        let (_, cross) = self.encode_window(samples)?;
        Ok(self
            .language_probs(cross, &mut Timings::default())?
            .into_iter()
            .map(|(c, _, p)| (c, p))
            .collect())
    }

    /// Transcribes 16 kHz mono samples. Audio of 30 s or less is one window (Hugging Face's
    /// short-form decoding: the reference transcripts); longer audio is decoded sequentially
    /// as openai-whisper does: each window starts where the last complete segment of the one
    /// before ended (the end of the window when it closed with a single timestamp), so no word
    /// is lost at a window edge; without timestamps, windows follow each other every 30 s.
    pub fn transcribe_with(
        &mut self,
        samples: &[f32],
        opts: &TranscribeOptions,
    ) -> Result<Transcript> {
        let t0 = Instant::now();
        let mut timings = Timings::default();
        let mut language = self.check_options(opts)?;
        let mut language_probs = Vec::new();
        let content_frames = samples.len() / HOP_LENGTH;
        let single = samples.len() <= N_SAMPLES;
        // Long audio: one spectrogram of the whole recording (openai's), sliced per window.
        let long = if single || self.mel.is_some() {
            None
        } else {
            let t = Instant::now();
            let (f, frames, _) = audio::log_mel_long(samples, self.n_mels, Some(&self.filters))?;
            timings.mel += t.elapsed();
            Some((f, frames))
        };
        let mut rng = Rng::new(opts.seed);
        let mut all_tokens: Vec<u32> = opts.initial_prompt.clone();
        let mut prompt_reset_since = 0usize;
        let mut segments: Vec<Segment> = Vec::new();
        let mut windows: Vec<Window> = Vec::new();
        let mut seek = 0usize;
        let limit = self.rules.max_length().min(self.decoder.positions());
        loop {
            if seek >= content_frames {
                break;
            }
            let window_index = windows.len();
            let time_offset = (seek * HOP_LENGTH) as f64 / f64::from(SAMPLE_RATE);
            let segment_size = N_FRAMES.min(content_frames - seek);
            let segment_duration = (segment_size * HOP_LENGTH) as f64 / f64::from(SAMPLE_RATE);
            let mel = match &long {
                Some((f, frames)) => {
                    let w = audio::mel_window(f, *frames, self.n_mels, seek);
                    Tensor::from_vec(w, self.encoder_input.1.clone(), &candle_core::Device::Cpu)?
                }
                None => {
                    let from = seek * HOP_LENGTH;
                    let to = (from + N_SAMPLES).min(samples.len());
                    let mel = self.mel_of_samples(&samples[from..to], &mut timings)?;
                    match opts.mel_padding {
                        MelPadding::Features if segment_size < N_FRAMES => {
                            zero_frames_from(&mel, segment_size)?
                        }
                        _ => mel,
                    }
                }
            };
            let cross = self
                .encode(mel, &mut timings)
                .with_context(|| format!("window {window_index} at {time_offset:.2} s"))?;
            if language.is_none() && self.rules.is_multilingual() {
                let probs = self.language_probs(cross.clone(), &mut timings)?;
                language = probs.first().map(|p| p.1);
                language_probs = probs.into_iter().map(|(c, _, p)| (c, p)).collect();
            }
            let pass_opts = PassOptions {
                language,
                task: opts.task,
                timestamps: opts.timestamps,
                temperature: 0.0,
                previous: all_tokens[prompt_reset_since..].to_vec(),
                limit,
            };
            let (pass, passes, alignment, ratio) = self
                .decode_with_fallback(&cross, pass_opts, opts, &mut rng, &mut timings)
                .with_context(|| format!("window {window_index} at {time_offset:.2} s"))?;
            let no_speech = pass.no_speech_prob.unwrap_or(0.0);
            let silent = opts.no_speech_threshold.is_some_and(|thr| no_speech > thr)
                && !opts
                    .logprob_threshold
                    .is_some_and(|thr| pass.avg_logprob > thr);
            let next_seek;
            if silent {
                next_seek = seek + segment_size;
            } else {
                let (pieces, advance) = self.split_segments(&pass.tokens, single, segment_size);
                next_seek = if single {
                    content_frames.max(seek + 1)
                } else {
                    seek + advance.max(1)
                };
                let mut words = if opts.word_timestamps {
                    self.window_words(&pass, &alignment, segment_size, time_offset, language)
                        .with_context(|| format!("word timestamps of window {window_index}"))?
                } else {
                    vec![]
                }
                .into_iter()
                .peekable();
                for (tokens, start, end) in pieces {
                    // The words whose tokens lie in this piece (words hold text tokens only).
                    let n_text = tokens
                        .iter()
                        .filter(|&&t| !self.tokenizer.is_special(t))
                        .count();
                    let mut seg_words = Vec::new();
                    let mut taken = 0;
                    while taken < n_text {
                        let Some(w) = words.next() else { break };
                        taken += w.tokens.len();
                        seg_words.push(w);
                    }
                    let start = time_offset + start.unwrap_or(0.0);
                    let end = time_offset + end.unwrap_or(segment_duration);
                    let text = self.tokenizer.decode(&tokens, true);
                    all_tokens.extend_from_slice(&tokens);
                    // openai empties instantaneous and blank segments; they are dropped here.
                    if start == end || text.trim().is_empty() {
                        continue;
                    }
                    segments.push(Segment {
                        id: segments.len(),
                        seek,
                        start,
                        end,
                        text,
                        tokens,
                        temperature: pass.temperature,
                        avg_logprob: pass.avg_logprob,
                        compression_ratio: ratio,
                        no_speech_prob: no_speech,
                        words: seg_words,
                    });
                }
                if !opts.condition_on_previous_text || pass.temperature > 0.5 {
                    prompt_reset_since = all_tokens.len();
                }
            }
            windows.push(Window {
                seek,
                pass,
                passes,
                silent,
                alignment,
            });
            seek = next_seek;
        }
        let text = segments.iter().map(|s| s.text.as_str()).collect();
        timings.total = t0.elapsed();
        Ok(Transcript {
            text,
            language: language.and_then(|id| self.rules.language_code(id).map(str::to_string)),
            language_probs,
            segments,
            windows,
            timings,
            audio: None,
        })
    }

    /// Segments of one window's tokens, as openai-whisper cuts them: at every pair of
    /// consecutive timestamps, times relative to the window (None: the window's start/end).
    /// Returns the pieces and how far (in mel frames) the next window starts. Text after the
    /// last complete segment is dropped when the audio goes on (the next window decodes it
    /// again), kept in a single window.
    #[allow(clippy::type_complexity)]
    fn split_segments(
        &self,
        tokens: &[u32],
        single: bool,
        segment_size: usize,
    ) -> (Vec<(Vec<u32>, Option<f64>, Option<f64>)>, usize) {
        let secs = |t: u32| self.rules.timestamp_seconds(t);
        let is_ts: Vec<bool> = tokens.iter().map(|&t| self.rules.is_timestamp(t)).collect();
        let n = tokens.len();
        let single_ending = n >= 2 && !is_ts[n - 2] && is_ts[n - 1];
        let consecutive: Vec<usize> = (1..n).filter(|&i| is_ts[i - 1] && is_ts[i]).collect();
        if consecutive.is_empty() {
            // No complete pair: one segment for the window, ending at its last timestamp if
            // that is past the start.
            let end = tokens
                .iter()
                .rev()
                .find_map(|&t| secs(t))
                .filter(|&e| e > 0.0);
            let start = tokens.first().and_then(|&t| secs(t));
            return (vec![(tokens.to_vec(), start, end)], segment_size);
        }
        let mut slices = consecutive;
        if single_ending || single {
            slices.push(n);
        }
        let mut pieces = Vec::new();
        let mut last = 0;
        for cur in slices {
            if cur <= last {
                continue;
            }
            let piece = &tokens[last..cur];
            let start = secs(piece[0]);
            let end = piece.iter().rev().find_map(|&t| secs(t));
            let end = if is_ts[cur - 1] { end } else { None };
            pieces.push((piece.to_vec(), start, end));
            last = cur;
        }
        let advance = if single_ending || single {
            segment_size
        } else {
            // The last complete segment's closing timestamp, in frames (2 per timestamp step).
            let ts = tokens[last - 1];
            let steps = secs(ts).map(|s| (s / TIME_PRECISION).round() as usize);
            steps.map(|s| s * 2).unwrap_or(segment_size)
        };
        (pieces, advance)
    }

    /// Word timings of one window's kept pass from its alignment rows (the rows of the
    /// `<|startofprev|>` context left out); none when the decoder has no alignment output.
    fn window_words(
        &self,
        pass: &Pass,
        rows: &[Vec<f32>],
        segment_size: usize,
        time_offset: f64,
        language: Option<u32>,
    ) -> Result<Vec<Word>> {
        if rows.is_empty() || pass.tokens.is_empty() {
            return Ok(vec![]);
        }
        let sot_index = pass
            .prompt
            .iter()
            .position(|&t| t == self.rules.sot())
            .context("the prompt has no <|startoftranscript|>")?;
        let prompt_len = pass.prompt.len() - sot_index;
        let mut fed: Vec<u32> = pass.prompt[sot_index..]
            .iter()
            .chain(&pass.tokens)
            .copied()
            .collect();
        // A pass cut by the length limit never fed its last token: no row for it.
        let usable = rows.len().saturating_sub(sot_index).min(fed.len());
        ensure!(
            usable > prompt_len,
            "{} alignment rows for a {}-token prompt",
            rows.len(),
            pass.prompt.len()
        );
        fed.truncate(usable);
        let rows = &rows[sot_index..sot_index + usable];
        let probs = &pass.probs[..usable - prompt_len];
        let lang = language.and_then(|l| self.rules.language_code(l));
        word_timestamps(
            &self.tokenizer,
            &fed,
            prompt_len,
            probs,
            rows,
            self.decoder.alignment_heads(),
            segment_size,
            time_offset,
            lang,
        )
    }

    /// Decodes at each temperature in turn until a pass passes openai's thresholds (or the
    /// last temperature). Returns the kept pass, how many passes ran, its attention rows and
    /// its text's compression ratio.
    fn decode_with_fallback(
        &mut self,
        cross: &Cross,
        mut pass_opts: PassOptions,
        opts: &TranscribeOptions,
        rng: &mut Rng,
        t: &mut Timings,
    ) -> Result<(Pass, usize, Vec<Vec<f32>>, f64)> {
        let mut runs = 0;
        let mut kept = None;
        for &temperature in &opts.temperatures {
            pass_opts.temperature = temperature;
            let (pass, rows) = self.decode_pass(
                cross,
                &pass_opts,
                &opts.search,
                opts.word_timestamps,
                rng,
                t,
            )?;
            runs += 1;
            let text = self.tokenizer.decode(&pass.tokens, true);
            let ratio = compression_ratio(text.trim());
            let mut fallback = opts
                .compression_ratio_threshold
                .is_some_and(|thr| ratio > thr)
                || opts
                    .logprob_threshold
                    .is_some_and(|thr| pass.avg_logprob < thr);
            let silence = opts
                .no_speech_threshold
                .is_some_and(|thr| pass.no_speech_prob.unwrap_or(0.0) > thr)
                && opts
                    .logprob_threshold
                    .is_some_and(|thr| pass.avg_logprob < thr);
            if silence {
                fallback = false;
            }
            kept = Some((pass, rows, ratio));
            if !fallback {
                break;
            }
        }
        let (pass, rows, ratio) = kept.context("no temperature to decode at")?;
        Ok((pass, runs, rows, ratio))
    }

    /// One decoding pass over an encoded window, with `search`'s rules (beam search,
    /// best-of). A search over several sequences captures no alignment rows: the kept
    /// sequence is fed again afterwards with capture on (the same positions and tokens give
    /// the same rows), instead of carrying every beam's rows along.
    fn decode_pass(
        &mut self,
        cross: &Cross,
        opts: &PassOptions,
        search: &Search,
        alignment: bool,
        rng: &mut Rng,
        t: &mut Timings,
    ) -> Result<(Pass, Vec<Vec<f32>>)> {
        let t0 = Instant::now();
        self.decoder.begin(cross.clone())?;
        let capture = alignment && self.decoder.has_alignment_output();
        let many = search.width(opts.temperature) > 1;
        // Word timings need every fed position's alignment row: no prefill then.
        let prefilled = if capture {
            0..0
        } else {
            self.prefill_window(opts)?
        };
        self.decoder.capture_alignment(capture && !many);
        let mut seqs = WindowSequences::new(&mut self.decoder, prefilled);
        // The decoding loop runs on a pool worker with the others kept awake through the
        // rules between calls: each decoder call's `Session::predict` then enters the pool
        // inline, and its first parallel loops find the other workers awake, instead of
        // injecting its jobs from this thread (~23 µs a call on tiny.en) and waking
        // workers that slept through the rules. Greedy passes over jfk, alternating in
        // one process (30 each way): medians 86–199 µs a token less in 5 of 7 runs, 26
        // and 52 more in two, of ~3.7–4.5 ms.
        let rules = &self.rules;
        let mut pass = crate::runtime::on_awake_pool(|| rules.search(opts, search, rng, &mut seqs));
        if let (Ok(p), true, true) = (&pass, capture, many) {
            // The kept sequence's rows: its prompt and tokens, the last one only when it
            // was fed (a sequence cut by the length limit never fed it).
            let mut fed: Vec<u32> = p.prompt.iter().chain(&p.tokens).copied().collect();
            if !p.finished {
                fed.pop();
            }
            seqs.decoder.begin(cross.clone())?;
            seqs.decoder.capture_alignment(true);
            seqs.caches = SequenceCaches::default();
            seqs.capture = true;
            let replay = crate::runtime::on_awake_pool(|| {
                fed.iter()
                    .enumerate()
                    .try_for_each(|(pos, &tok)| seqs.step(0, tok, pos).map(drop))
            });
            if let Err(e) = replay {
                pass = Err(e.context("feeding the kept sequence again for its alignment"));
            }
        }
        let rows = std::mem::take(&mut seqs.rows);
        let (steps, first, calls, warm) = (seqs.steps, seqs.first, seqs.calls, seqs.warm);
        self.decoder.capture_alignment(false);
        t.decoder += t0.elapsed();
        t.decoder_steps += steps;
        t.decoder_calls += calls;
        t.decoder_first += first;
        t.decoder_passes += (steps > 0) as usize;
        t.warm_calls.extend(warm);
        Ok((pass?, rows))
    }

    /// Language probabilities from the logits at `<|startoftranscript|>`, best first.
    fn language_probs(&mut self, cross: Cross, t: &mut Timings) -> Result<Vec<(String, u32, f64)>> {
        let t0 = Instant::now();
        self.decoder.begin(cross)?;
        let ts = Instant::now();
        let logits = self.decoder.step(self.rules.sot(), 0)?;
        let call = ts.elapsed();
        t.decoder += t0.elapsed();
        t.decoder_steps += 1;
        t.decoder_calls += call;
        t.decoder_first += call;
        t.decoder_passes += 1;
        let probs = self.rules.language_probs(&logits);
        ensure!(
            !probs.is_empty(),
            "the decoder's logits cover no language token"
        );
        Ok(probs)
    }

    /// Log-mel of one window (≤ 30 s of samples, zero-padded), shaped as the encoder input.
    fn mel_of_samples(&mut self, chunk: &[f32], t: &mut Timings) -> Result<Tensor> {
        let t0 = Instant::now();
        let shape = self.encoder_input.1.clone();
        let out = match &mut self.mel {
            None => {
                let m = audio::log_mel(chunk, self.n_mels, Some(&self.filters))?;
                Tensor::from_vec(m, shape, &candle_core::Device::Cpu)?
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
                m.reshape(shape)
                    .with_context(|| format!("{MEL_FILE}: output does not fit the encoder input"))?
            }
        };
        t.mel += t0.elapsed();
        Ok(out)
    }

    /// Encoder (and CrossKV) on one window's log-mel: the decoder's cross-attention source.
    fn encode(&mut self, mel: Tensor, t: &mut Timings) -> Result<Cross> {
        let enc = self.encoder_output(mel, t)?;
        self.cross_of(enc, t)
    }

    /// The encoder's output for one window's log-mel, as BC1S [1, d, 1, 1500].
    fn encoder_output(&mut self, mel: Tensor, t: &mut Timings) -> Result<Tensor> {
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
        t.encoder += t0.elapsed();
        Ok(enc)
    }

    /// The decoder's cross-attention source for an encoder output (the CrossKV model's
    /// outputs when the folder has one).
    fn cross_of(&mut self, enc: Tensor, t: &mut Timings) -> Result<Cross> {
        match &mut self.cross_kv {
            None => Ok(Cross::Encoder(enc)),
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
                t.cross_kv += t0.elapsed();
                Ok(c)
            }
        }
    }

    /// Encodes the first 30 s of `samples`: the encoder output (BC1S [1, d, 1, 1500]) and
    /// the decoder's cross-attention source.
    pub fn encode_window(&mut self, samples: &[f32]) -> Result<(Tensor, Cross)> {
        let mut t = Timings::default();
        let mel = self.mel_of_samples(&samples[..samples.len().min(N_SAMPLES)], &mut t)?;
        let enc = self.encoder_output(mel, &mut t)?;
        let cross = self.cross_of(enc.clone(), &mut t)?;
        Ok((enc, cross))
    }

    /// The encoder input's shape (one window's log-mel, e.g. [1, 80, 1, 3000]).
    pub fn encoder_input_shape(&self) -> &[usize] {
        &self.encoder_input.1
    }

    /// Encodes one window's log-mel, given as the encoder's input tensor: the encoder output
    /// (BC1S) and the decoder's cross-attention source.
    pub fn encode_mel(&mut self, mel: Tensor) -> Result<(Tensor, Cross)> {
        let mut t = Timings::default();
        let enc = self.encoder_output(mel, &mut t)?;
        let cross = self.cross_of(enc.clone(), &mut t)?;
        Ok((enc, cross))
    }

    /// The decoder's cross-attention source for an encoder output (BC1S), through this
    /// folder's CrossKV model when it has one.
    pub fn cross_for(&mut self, enc: Tensor) -> Result<Cross> {
        self.cross_of(enc, &mut Timings::default())
    }

    /// One greedy pass (`opts`' language, task and timestamps; temperature 0) over an
    /// encoded window.
    pub fn greedy_pass(&mut self, cross: &Cross, opts: &TranscribeOptions) -> Result<Pass> {
        let language = self.check_options(opts)?;
        let mut t = Timings::default();
        let language = match language {
            Some(l) => Some(l),
            None if self.rules.is_multilingual() => self
                .language_probs(cross.clone(), &mut t)?
                .first()
                .map(|p| p.1),
            None => None,
        };
        let pass_opts = PassOptions {
            language,
            task: opts.task,
            timestamps: opts.timestamps,
            temperature: 0.0,
            previous: vec![],
            limit: self.rules.max_length().min(self.decoder.positions()),
        };
        let (pass, _) = self.decode_pass(
            cross,
            &pass_opts,
            &Search::default(),
            false,
            &mut Rng::new(0),
            &mut t,
        )?;
        Ok(pass)
    }

    /// Feeds `fed` from position 0 (teacher forcing) and returns the logits after each token.
    pub fn teacher_force(&mut self, cross: &Cross, fed: &[u32]) -> Result<Vec<Vec<f32>>> {
        self.decoder.begin(cross.clone())?;
        // On an awake pool, as the decoding pass (see `decode_pass`): back-to-back calls
        // read 41–195 µs a token less in three alternating runs on tiny.en.
        let decoder = &mut self.decoder;
        crate::runtime::on_awake_pool(|| {
            fed.iter()
                .enumerate()
                .map(|(pos, &tok)| decoder.step(tok, pos))
                .collect()
        })
    }
}

/// One window's decoder as the [`Sequences`] of a search: a cache per sequence, the
/// positions a context prefill wrote (not fed), the alignment rows when captured, and the
/// decoder calls' timings.
struct WindowSequences<'a> {
    decoder: &'a mut TextDecoder,
    caches: SequenceCaches,
    prefilled: std::ops::Range<usize>,
    capture: bool,
    rows: Vec<Vec<f32>>,
    steps: usize,
    first: Duration,
    calls: Duration,
    warm: Vec<Duration>,
}

impl<'a> WindowSequences<'a> {
    fn new(decoder: &'a mut TextDecoder, prefilled: std::ops::Range<usize>) -> Self {
        WindowSequences {
            capture: decoder.capturing_alignment(),
            decoder,
            caches: SequenceCaches::default(),
            prefilled,
            rows: Vec::new(),
            steps: 0,
            first: Duration::ZERO,
            calls: Duration::ZERO,
            warm: Vec::new(),
        }
    }
}

impl Sequences for WindowSequences<'_> {
    fn step(&mut self, seq: usize, token: u32, pos: usize) -> Result<Vec<f32>> {
        if self.prefilled.contains(&pos) {
            // The prefill wrote this position; its logits are not read (it is neither
            // `<|startoftranscript|>` nor the prompt's last token).
            return Ok(vec![]);
        }
        self.caches.select(self.decoder, seq)?;
        let ts = Instant::now();
        let logits = self.decoder.step(token, pos)?;
        let dt = ts.elapsed();
        self.calls += dt;
        if self.steps == 0 {
            self.first = dt;
        } else {
            self.warm.push(dt);
        }
        self.steps += 1;
        if self.capture {
            self.rows
                .push(self.decoder.take_alignment().unwrap_or_default());
        }
        Ok(logits)
    }

    fn reorder(&mut self, sources: &[usize]) -> Result<()> {
        self.caches.reorder(self.decoder, sources)
    }
}
