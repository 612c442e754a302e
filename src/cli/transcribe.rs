//! `milkit transcribe`: audio files → text with the bundled runtime, decoded as openai-whisper
//! does (language detection, timestamps, fallback, long-form, word timings). One line of
//! text per file on stdout, or openai-whisper's txt/json/srt/vtt files with
//! `--output-format`; timings only with `--verbose`, on stderr. A file that cannot be read or decoded
//! is reported on stderr and the others are still transcribed; the exit status is then 2.
//! With `--vad MODEL`, only the speech a Silero VAD model finds is transcribed.

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use milkit::transcribe::output::{write_all, OutputFormat};
use milkit::transcribe::{
    Compute, MelPadding, OpenOptions, TranscribeOptions, Transcriber, Transcript,
};
use milkit::vad::silero::Silero;
use milkit::vad::{speech_spans, VadOptions};
use milkit::whisper::generate::{Search, Task};
use milkit::whisper::tokenizer::Tokenizer;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// `--task`.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum TaskArg {
    /// Text in the spoken language.
    Transcribe,
    /// English text from speech in any language (multilingual models).
    Translate,
}

#[derive(Args)]
pub struct TranscribeArgs {
    /// Audio files, any rate and channel count: WAV (PCM 8/16/24/32-bit, float), FLAC, MP3,
    /// Ogg Vorbis, Opus (Ogg, WebM), M4A/MP4 (AAC, ALAC); decoded in-process, no ffmpeg.
    #[arg(required = true)]
    pub audio: Vec<PathBuf>,
    /// Models folder: AudioEncoder.mlpackage, TextDecoder.mlpackage (cache I/O or stateful),
    /// optional CrossKV.mlpackage and MelSpectrogram.mlpackage, generation_config.json,
    /// tokenizer.json, optional config.json and preprocessor_config.json.
    #[arg(long)]
    pub models: PathBuf,
    #[command(flatten)]
    pub decode: DecodeArgs,
    /// Print the 5 most likely languages of each file's first 30 s with their probabilities,
    /// and transcribe nothing.
    #[arg(long)]
    pub detect_language: bool,
    /// Word start/end times and probabilities, in the json output and as subtitle cue times.
    /// From the decoder's per-head `alignment_heads_weights_per_head` when the folder has it
    /// (each head normalised, as openai-whisper; `milkit export --component all` and recipes
    /// add it by default), else from WhisperKit's mean `alignment_heads_weights` (a few more
    /// words off by > 0.1 s).
    #[arg(long)]
    pub word_timestamps: bool,
    /// Write transcript files (openai-whisper's formats) as DIR/<audio file stem>.<format>;
    /// stdout then stays empty. `all` writes txt, json, srt and vtt.
    #[arg(long, value_enum)]
    pub output_format: Vec<OutputFormat>,
    /// Folder for --output-format files (created if missing).
    #[arg(long, default_value = ".")]
    pub output_dir: PathBuf,
    /// Replace existing output files.
    #[arg(long)]
    pub force: bool,
    /// Make the log-mel with the folder's MelSpectrogram.mlpackage (fp16, as WhisperKit does)
    /// instead of milkit's Rust front end (the default, which matches Hugging Face's).
    #[arg(long)]
    pub mel_package: bool,
    /// Take the language and task tokens' self-attention caches from the folder's
    /// TextDecoderContextPrefill, as WhisperKit does (multilingual models, cache-I/O
    /// decoders): one or two decoder calls fewer per window. Its caches are estimated
    /// without the audio, so the text can differ from the exact decoding (the default).
    #[arg(long)]
    pub prefill: bool,
    #[command(flatten)]
    pub vad: VadArgs,
    /// Timings and model details on stderr.
    #[arg(long, short)]
    pub verbose: bool,
}

/// Voice activity detection: faster-whisper's `vad_filter` and `vad_parameters`, with its
/// defaults.
#[derive(Args, Clone, Debug)]
pub struct VadArgs {
    /// Transcribe only the speech a Silero VAD Core ML model finds, times kept on the
    /// recording's timeline (faster-whisper's `vad_filter`). MODEL: a `.mlpackage` or
    /// `.mlmodelc` folder taking 576 samples a call (`silero-vad-unified-v6.0.0` and its
    /// quantized variants), or a Hugging Face Hub id `ORG/NAME[@REVISION][:FOLDER]`, e.g.
    /// `FluidInference/silero-vad-coreml` (FOLDER `silero-vad-unified-v6.0.0.mlmodelc` by
    /// default), fetched into the Hub cache.
    #[arg(long, value_name = "MODEL")]
    pub vad: Option<String>,
    /// A 32-ms window is speech when its VAD probability is at least this.
    #[arg(long, default_value_t = 0.5)]
    pub vad_threshold: f64,
    /// Below this a window is silence; between the two thresholds it continues what came
    /// before (default: --vad-threshold − 0.15, at least 0.01).
    #[arg(long)]
    pub vad_neg_threshold: Option<f64>,
    /// Speech spans this short or shorter are dropped.
    #[arg(long, default_value_t = 0)]
    pub vad_min_speech_duration_ms: u32,
    /// Speech spans longer than this are split at their last pause over 98 ms, else cut
    /// (`inf`: never).
    #[arg(long, default_value_t = f64::INFINITY)]
    pub vad_max_speech_duration_s: f64,
    /// Silence this long ends a speech span.
    #[arg(long, default_value_t = 2000)]
    pub vad_min_silence_duration_ms: u32,
    /// Audio kept on each side of a speech span.
    #[arg(long, default_value_t = 400)]
    pub vad_speech_pad_ms: u32,
}

impl VadArgs {
    /// The span rules' options, checked.
    pub fn options(&self) -> Result<VadOptions> {
        let o = VadOptions {
            threshold: self.vad_threshold,
            neg_threshold: self.vad_neg_threshold,
            min_speech_duration_ms: self.vad_min_speech_duration_ms,
            max_speech_duration_s: self.vad_max_speech_duration_s,
            min_silence_duration_ms: self.vad_min_silence_duration_ms,
            speech_pad_ms: self.vad_speech_pad_ms,
        };
        o.validate()?;
        Ok(o)
    }

    /// The VAD model (computed at `compute`) and options, when --vad is given.
    pub fn load(&self, compute: Compute, progress: bool) -> Result<Option<(Silero, VadOptions)>> {
        let Some(arg) = &self.vad else {
            return Ok(None);
        };
        let o = self.options()?;
        let path = milkit::vad::silero::resolve(arg, progress)?;
        Ok(Some((Silero::load_with(&path, compute)?, o)))
    }
}

/// Transcribes `samples`, only their speech when a VAD model is given.
pub fn transcribe_samples(
    tr: &mut Transcriber,
    samples: &[f32],
    opts: &TranscribeOptions,
    vad: Option<&mut (Silero, VadOptions)>,
) -> Result<Transcript> {
    match vad {
        None => tr.transcribe_with(samples, opts),
        Some((model, o)) => {
            let probs = model.probabilities(samples)?;
            let spans = speech_spans(&probs, samples.len(), o);
            tr.transcribe_spans(samples, &spans, opts)
        }
    }
}

/// How to decode (shared by `transcribe` and `eval`); openai-whisper's options and defaults.
#[derive(Args, Clone, Debug)]
pub struct DecodeArgs {
    /// Spoken language as a Whisper code (de, fr, ...), or `auto` to detect it from the first
    /// 30 s (multilingual models). English-only models take only `en`.
    #[arg(long, default_value = "auto")]
    pub language: String,
    /// transcribe, or translate into English (multilingual models).
    #[arg(long, value_enum, default_value = "transcribe")]
    pub task: TaskArg,
    /// Decode without timestamp tokens (one segment per 30-s window).
    #[arg(long)]
    pub no_timestamps: bool,
    /// Temperatures to decode at, tried in order when a window fails the thresholds below
    /// (comma-separated; one value turns the fallback off).
    #[arg(long, value_delimiter = ',', default_value = "0,0.2,0.4,0.6,0.8,1.0")]
    pub temperature: Vec<f32>,
    /// Decode a window again when its text's gzip compression ratio is above this.
    #[arg(long, default_value_t = 2.4)]
    pub compression_ratio_threshold: f64,
    /// Decode a window again when its average token log-probability is below this.
    #[arg(long, default_value_t = -1.0, allow_negative_numbers = true)]
    pub logprob_threshold: f64,
    /// Skip a window as silence when its no-speech probability is above this and its average
    /// log-probability is below --logprob-threshold.
    #[arg(long, default_value_t = 0.6)]
    pub no_speech_threshold: f64,
    /// Feed each window the text of the windows before it as a prompt.
    #[arg(long)]
    pub condition_on_previous_text: bool,
    /// Text fed as the first window's prompt (spelling, names, style).
    #[arg(long)]
    pub initial_prompt: Option<String>,
    /// Seed of the sampler used at temperatures above 0 (runs are reproducible).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Beam search with this many beams at temperature 0 (openai-whisper's rules; its CLI
    /// defaults to 5, its `transcribe()` and milkit to greedy decoding). Each beam is one
    /// decoder call per token.
    #[arg(long)]
    pub beam_size: Option<usize>,
    /// Beam search stops after round(beam size × patience) finished candidates (default 1.0;
    /// needs --beam-size).
    #[arg(long)]
    pub patience: Option<f64>,
    /// How beam and best-of candidates are ranked: by default their summed log-probability
    /// divided by their token count; with α in [0, 1], divided by ((5 + length) / 6)^α.
    #[arg(long)]
    pub length_penalty: Option<f64>,
    /// Independent samples at each temperature above 0, the best ranked kept (openai-whisper's
    /// CLI default is 5; milkit's is 1).
    #[arg(long)]
    pub best_of: Option<usize>,
    /// Precision milkit computes the packages in. `package`: their own types (fp16 for
    /// Whisper packages), as a device computes them. `fp32`: every fp16 tensor widened to
    /// float32, to compare with PyTorch float32 references without fp16 rounding (slower,
    /// twice the weight memory; not what a device computes). `bf16`: the package's types,
    /// the encoder's 1x1 convs and self-attention on bfloat16-rounded inputs with float32
    /// sums — a faster evaluation mode, less exact, not what a device computes; needs a CPU
    /// with AVX512-BF16 (an error elsewhere).
    #[arg(long, value_enum, default_value = "package")]
    pub compute: Compute,
    /// How audio shorter than 30 s is filled out to a window; `features` reads a near-silent
    /// clip as silence, as faster-whisper does, where `audio` may hear " you".
    #[arg(long, value_enum, default_value = "audio")]
    pub mel_padding: MelPadding,
}

impl DecodeArgs {
    /// The options for the models in `models` (an initial prompt is encoded with the
    /// folder's tokenizer.json, with a leading space as openai-whisper does).
    pub fn options(&self, models: &Path) -> Result<TranscribeOptions> {
        let initial_prompt = match &self.initial_prompt {
            Some(p) => Tokenizer::from_file(models.join("tokenizer.json"))?
                .encode(&format!(" {}", p.trim()))
                .context("encoding --initial-prompt")?,
            None => vec![],
        };
        Ok(TranscribeOptions {
            language: Some(self.language.clone()),
            task: match self.task {
                TaskArg::Transcribe => Task::Transcribe,
                TaskArg::Translate => Task::Translate,
            },
            timestamps: !self.no_timestamps,
            word_timestamps: false,
            temperatures: self.temperature.clone(),
            compression_ratio_threshold: Some(self.compression_ratio_threshold),
            logprob_threshold: Some(self.logprob_threshold),
            no_speech_threshold: Some(self.no_speech_threshold),
            condition_on_previous_text: self.condition_on_previous_text,
            initial_prompt,
            seed: self.seed,
            search: Search {
                beam_size: self.beam_size,
                patience: self.patience,
                length_penalty: self.length_penalty,
                best_of: self.best_of,
            },
            mel_padding: self.mel_padding,
        })
    }
}

pub fn run(a: &TranscribeArgs) -> Result<u8> {
    let t0 = Instant::now();
    let open = OpenOptions {
        mel_package: a.mel_package,
        compute: a.decode.compute,
        prefill: a.prefill,
    };
    // A VAD model that cannot be had fails before the models load.
    let mut vad = a.vad.load(a.decode.compute, true)?;
    let mut tr = Transcriber::open_with(&a.models, &open)
        .with_context(|| format!("opening models folder {}", a.models.display()))?;
    let mut opts = a.decode.options(&a.models)?;
    opts.word_timestamps = a.word_timestamps;
    // Options that cannot work with this model fail before any audio is read.
    tr.check_options(&opts)
        .with_context(|| format!("models folder {}", a.models.display()))?;
    if a.word_timestamps && tr.alignment_heads() == 1 && a.verbose {
        eprintln!(
            "word timings from the mean over the alignment heads (WhisperKit's output); \
             `milkit export --component all` (without --no-per-head-alignment) gives per-head \
             rows, which match openai-whisper more closely"
        );
    }
    if a.verbose {
        eprintln!(
            "loaded {} in {:.0} ms (decoder: {}{}{}{}; {})",
            a.models.display(),
            t0.elapsed().as_secs_f64() * 1e3,
            if tr.stateful_decoder() {
                "stateful"
            } else {
                "cache I/O"
            },
            if tr.uses_cross_kv() { ", CrossKV" } else { "" },
            if tr.uses_mel_package() {
                ", mel package"
            } else {
                ""
            },
            if tr.uses_prefill() {
                ", context prefill"
            } else {
                ""
            },
            if tr.rules().is_multilingual() {
                "multilingual"
            } else {
                "English-only"
            },
        );
    }
    let mut failed = 0usize;
    for path in &a.audio {
        let r = if a.detect_language {
            detect(&mut tr, path)
        } else {
            one_file(&mut tr, path, &opts, vad.as_mut(), a)
        };
        if let Err(e) = r {
            eprintln!("error: {}: {e:#}", path.display());
            failed += 1;
        }
    }
    if a.verbose {
        eprintln!("whole run {:.0} ms", t0.elapsed().as_secs_f64() * 1e3);
    }
    if failed > 0 {
        if a.audio.len() > 1 {
            eprintln!("{failed} of {} files failed", a.audio.len());
        }
        return Ok(2);
    }
    Ok(0)
}

fn detect(tr: &mut Transcriber, path: &Path) -> Result<()> {
    let samples = milkit::whisper::audio::load_audio(path)?;
    let probs = tr.detect_language(&samples)?;
    let top: Vec<String> = probs
        .iter()
        .take(5)
        .map(|(c, p)| format!("{c} {p:.4}"))
        .collect();
    println!("{}: {}", path.display(), top.join(", "));
    Ok(())
}

fn one_file(
    tr: &mut Transcriber,
    path: &Path,
    opts: &TranscribeOptions,
    vad: Option<&mut (Silero, VadOptions)>,
    a: &TranscribeArgs,
) -> Result<()> {
    let (samples, info) = milkit::whisper::audio::load_audio_info(path)?;
    let mut r = transcribe_samples(tr, &samples, opts, vad)
        .with_context(|| format!("transcribing {}", path.display()))?;
    r.audio = Some(info);
    if a.output_format.is_empty() {
        println!("{}", r.text.trim());
    } else {
        let stem = path
            .file_stem()
            .with_context(|| format!("{}: no file name to name the outputs by", path.display()))?
            .to_string_lossy()
            .into_owned();
        std::fs::create_dir_all(&a.output_dir)
            .with_context(|| format!("creating {}", a.output_dir.display()))?;
        let result = r.to_result(opts.word_timestamps);
        for p in write_all(&result, &a.output_dir, &stem, &a.output_format, a.force)? {
            eprintln!("wrote {}", p.display());
        }
    }
    if a.verbose {
        print_timings(path, &r);
    }
    Ok(())
}

fn print_timings(path: &Path, r: &Transcript) {
    let t = &r.timings;
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let passes: usize = r.windows.iter().map(|w| w.passes).sum();
    if let Some(a) = &r.audio {
        eprintln!(
            "{}: {} in {}, {} Hz, {} channel(s), {:.2} s{}",
            path.display(),
            a.codec,
            a.container,
            a.sample_rate,
            a.channels,
            a.duration_s,
            if a.skipped_packets > 0 {
                format!(", {} damaged packet(s) skipped", a.skipped_packets)
            } else {
                String::new()
            }
        );
    }
    eprintln!(
        "{}: {}{} window(s), {} pass(es), {} segment(s); mel {:.0} ms, encoder {:.0} ms, \
         cross K/V {:.0} ms, decoder {:.0} ms ({} steps, {:.2} ms/step), total {:.0} ms",
        path.display(),
        r.language
            .as_deref()
            .map(|l| format!("language {l}, "))
            .unwrap_or_default(),
        r.windows.len(),
        passes,
        r.segments.len(),
        ms(t.mel),
        ms(t.encoder),
        ms(t.cross_kv),
        ms(t.decoder),
        t.decoder_steps,
        ms(t.decoder) / t.decoder_steps.max(1) as f64,
        ms(t.total)
    );
}
