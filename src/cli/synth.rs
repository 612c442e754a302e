//! `milkit synth`: a random-weight checkpoint with a real model's dimensions.

use anyhow::Result;
use clap::{Args, ValueEnum};
use milkit::whisper::config::Preset;
use milkit::whisper::synth::{synthesize, SynthDType};
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum DTypeArg {
    F16,
    F32,
    Bf16,
}

#[derive(Args)]
pub struct SynthArgs {
    /// Model size: tiny, base, small, medium, large-v3, large-v3-turbo.
    #[arg(long)]
    pub preset: String,
    /// Output directory (config.json, generation_config.json, preprocessor_config.json,
    /// model.safetensors).
    #[arg(long)]
    pub out: PathBuf,
    /// Seed of the deterministic random weights.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Storage dtype of the safetensors file.
    #[arg(long, value_enum, default_value = "f16")]
    pub dtype: DTypeArg,
    /// Replace an existing output directory.
    #[arg(long)]
    pub force: bool,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
}

pub fn run(a: &SynthArgs) -> Result<u8> {
    let preset: Preset = a.preset.parse()?;
    let dtype = match a.dtype {
        DTypeArg::F16 => SynthDType::F16,
        DTypeArg::F32 => SynthDType::F32,
        DTypeArg::Bf16 => SynthDType::BF16,
    };
    synthesize(preset, &a.out, a.seed, dtype, !a.quiet, a.force)?;
    if !a.quiet {
        eprintln!("wrote {}", a.out.display());
    }
    Ok(0)
}
