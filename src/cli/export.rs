//! `milkit export`: checkpoint → .mlpackage.

use super::progress;
use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use milkit::ir::Opset;
use milkit::package::save_package;
use milkit::whisper::encoder::EncoderAbi;
use milkit::whisper::export::export_encoder;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ComponentArg {
    /// The audio encoder (log-mel → encoder states).
    Encoder,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum AbiArg {
    /// whisper.cpp's Core ML encoder: `logmel_data` fp32 [1, n_mels, 3000] → `output` fp32 [1, 1500, d].
    Whispercpp,
    /// WhisperKit's AudioEncoder: `melspectrogram_features` fp16 [1, n_mels, 1, 3000] →
    /// `encoder_output_embeds` fp16 [1, d, 1, 1500].
    Whisperkit,
}

#[derive(Args)]
pub struct ExportArgs {
    /// Hugging Face Whisper checkpoint directory (config.json + model.safetensors, sharded
    /// safetensors with an index, or pytorch_model.bin).
    #[arg(long)]
    pub model: PathBuf,
    /// Which part of the model to export.
    #[arg(long, value_enum, default_value = "encoder")]
    pub component: ComponentArg,
    /// I/O interface of the package.
    #[arg(long, value_enum, default_value = "whisperkit")]
    pub abi: AbiArg,
    /// Deployment target: ios15..ios18 (or macos12..macos15). Decides the opset and the
    /// specification version (iOS18 = spec 9).
    #[arg(long, default_value = "ios18")]
    pub target: String,
    /// Output .mlpackage path.
    #[arg(long)]
    pub out: PathBuf,
    /// Replace an existing output.
    #[arg(long)]
    pub force: bool,
    /// No progress bars.
    #[arg(long, short)]
    pub quiet: bool,
    /// Print the compression report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub compress: super::compress::CompressFlags,
    /// Print wall time and peak memory as JSON on stderr when done (used by `milkit bench`).
    #[arg(long, hide = true)]
    pub stats: bool,
}

pub fn parse_target(s: &str) -> Result<Opset> {
    match Opset::from_target_name(s) {
        Some(o) => Ok(o),
        None => bail!("unknown target `{s}`: use ios15, ios16, ios17 or ios18 (or macos12..macos15)"),
    }
}

pub fn run(a: &ExportArgs) -> Result<u8> {
    let t0 = Instant::now();
    let opset = parse_target(&a.target)?;
    if a.out.exists() && !a.force {
        bail!("{} already exists; pass --force to replace it", a.out.display());
    }
    let abi = match a.abi {
        AbiArg::Whispercpp => EncoderAbi::WhisperCpp,
        AbiArg::Whisperkit => EncoderAbi::WhisperKit,
    };
    let mut model = match a.component {
        ComponentArg::Encoder => {
            let pb = progress::bar(0, "building", a.quiet);
            let m = export_encoder(&a.model, abi, opset, &mut |i, n| {
                pb.set_length(n as u64);
                pb.set_position(i as u64);
            })?;
            pb.finish_and_clear();
            m
        }
    };
    super::compress::apply(&mut model, &a.compress, a.json, a.quiet)?;
    let total: u64 = weight_bytes(&model);
    let pb = progress::bytes_bar(total, "writing", a.quiet);
    let s = save_package(&model, &a.out, a.force, &mut |n| pb.inc(n))?;
    pb.finish_and_clear();
    if !a.quiet {
        eprintln!(
            "wrote {} ({} blobs, weight.bin {:.1} MB, model.mlmodel {} KB) in {:.1} s",
            a.out.display(),
            s.blobs,
            s.weight_bytes as f64 / 1e6,
            s.model_bytes / 1024,
            t0.elapsed().as_secs_f64()
        );
    }
    if a.stats {
        eprintln!(
            "{}",
            serde_json::json!({"wall_ms": t0.elapsed().as_secs_f64() * 1e3, "peak_rss_bytes": peak_rss_bytes()})
        );
    }
    Ok(0)
}

/// Bytes of all blob-bound constants (for the progress bar).
fn weight_bytes(m: &milkit::ir::Model) -> u64 {
    let mut n = 0;
    for f in m.program.functions.values() {
        for op in f.block.walk() {
            for v in op.attributes.values().chain(op.inputs.values().flatten().filter_map(|a| match a {
                milkit::ir::Arg::Value(v) => Some(v),
                _ => None,
            })) {
                if let milkit::ir::Value::Tensor(t) = v {
                    if milkit::package::convert::goes_to_blob(t) {
                        n += t.data.len() as u64;
                    }
                }
            }
        }
    }
    n
}

/// Peak resident set size of this process (Linux: VmHWM), if known.
pub fn peak_rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
