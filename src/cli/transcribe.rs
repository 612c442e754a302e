//! `milkit transcribe`: WAV files → text with the bundled runtime, one line per file on
//! stdout; timings only with `--verbose`, on stderr.

use anyhow::{Context, Result};
use clap::Args;
use milkit::transcribe::Transcriber;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
pub struct TranscribeArgs {
    /// WAV files (PCM 8/16/24/32-bit or float, any rate, mono or multichannel).
    #[arg(required = true)]
    pub audio: Vec<PathBuf>,
    /// Models folder: AudioEncoder.mlpackage, TextDecoder.mlpackage (cache I/O or stateful),
    /// optional CrossKV.mlpackage and MelSpectrogram.mlpackage, generation_config.json,
    /// tokenizer.json, optional config.json and preprocessor_config.json.
    #[arg(long)]
    pub models: PathBuf,
    /// Make the log-mel with the folder's MelSpectrogram.mlpackage (fp16, as WhisperKit does)
    /// instead of milkit's Rust front end (the default, which matches Hugging Face's).
    #[arg(long)]
    pub mel_package: bool,
    /// Timings and model details on stderr.
    #[arg(long, short)]
    pub verbose: bool,
}

pub fn run(a: &TranscribeArgs) -> Result<u8> {
    let t0 = Instant::now();
    let mut tr = Transcriber::open_with(&a.models, a.mel_package)
        .with_context(|| format!("opening models folder {}", a.models.display()))?;
    if a.verbose {
        eprintln!(
            "loaded {} in {:.0} ms (decoder: {}{}{})",
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
        );
    }
    for path in &a.audio {
        let r = tr.transcribe_file(path)?;
        println!("{}", r.text.trim());
        if a.verbose {
            let t = &r.timings;
            let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
            eprintln!(
                "{}: {} window(s), mel {:.0} ms, encoder {:.0} ms, cross K/V {:.0} ms, decoder {:.0} ms \
                 ({} steps, {:.2} ms/step), total {:.0} ms",
                path.display(),
                r.windows.len(),
                ms(t.mel),
                ms(t.encoder),
                ms(t.cross_kv),
                ms(t.decoder),
                t.decoder_steps,
                ms(t.decoder) / t.decoder_steps.max(1) as f64,
                ms(t.total)
            );
        }
    }
    if a.verbose {
        eprintln!("whole run {:.0} ms", t0.elapsed().as_secs_f64() * 1e3);
    }
    Ok(0)
}
