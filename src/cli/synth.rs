//! `milkit synth`: a random-weight checkpoint with a real model's dimensions.

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use milkit::whisper::config::Preset;
use milkit::whisper::synth::{synthesize_with, SynthDType, SynthOptions};
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum DTypeArg {
    F16,
    F32,
    Bf16,
}

#[derive(Args)]
pub struct SynthArgs {
    /// Model size: tiny, base, small, medium, large-v3, large-v3-turbo, distil-large-v3.
    #[arg(long)]
    pub preset: String,
    /// Output directory (config.json, generation_config.json, preprocessor_config.json,
    /// tokenizer.json, model.safetensors).
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
    /// Override the preset's encoder layers (small checkpoints of a preset's layout, for
    /// tests).
    #[arg(long)]
    pub encoder_layers: Option<usize>,
    /// Override the preset's decoder layers. The generation config keeps the preset's
    /// alignment heads, as distilled checkpoints do; export drops those past the layers.
    #[arg(long)]
    pub decoder_layers: Option<usize>,
    /// Override d_model (must be a multiple of the heads).
    #[arg(long)]
    pub d_model: Option<usize>,
    /// Override the attention heads of encoder and decoder.
    #[arg(long)]
    pub heads: Option<usize>,
    /// Override the MLP width of encoder and decoder.
    #[arg(long)]
    pub ffn_dim: Option<usize>,
}

pub fn run(a: &SynthArgs) -> Result<u8> {
    let preset: Preset = a.preset.parse()?;
    let dtype = match a.dtype {
        DTypeArg::F16 => SynthDType::F16,
        DTypeArg::F32 => SynthDType::F32,
        DTypeArg::Bf16 => SynthDType::BF16,
    };
    let mut cfg = preset.config();
    let overrides = [
        (&mut cfg.encoder_layers, a.encoder_layers),
        (&mut cfg.decoder_layers, a.decoder_layers),
        (&mut cfg.d_model, a.d_model),
    ];
    for (field, v) in overrides {
        if let Some(v) = v {
            *field = v;
        }
    }
    if let Some(h) = a.heads {
        cfg.encoder_attention_heads = h;
        cfg.decoder_attention_heads = h;
    }
    if let Some(f) = a.ffn_dim {
        cfg.encoder_ffn_dim = f;
        cfg.decoder_ffn_dim = f;
    }
    let opts = SynthOptions {
        seed: a.seed,
        dtype,
        progress: !a.quiet,
        force: a.force,
    };
    synthesize_with(&cfg, Some(&preset.generation_config()), &a.out, &opts)
        .with_context(|| format!("synth --preset {preset}"))?;
    if !a.quiet {
        eprintln!("wrote {}", a.out.display());
    }
    Ok(0)
}
