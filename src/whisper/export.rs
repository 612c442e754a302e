//! From a Hugging Face checkpoint directory to MIL models: checks the checkpoint for the
//! component, maps config dimensions to graph dimensions, and feeds weights to the graph
//! builders.

use super::config::WhisperConfig;
use super::encoder::{build_encoder, EncoderAbi, EncoderDims};
use super::graph::WeightSource;
use super::weights::{Component, WhisperWeights};
use crate::ir::{Bytes, Model, Opset};
use anyhow::{Context, Result};
use std::path::Path;

impl WeightSource for WhisperWeights {
    fn f16(&self, name: &str) -> Result<(Vec<usize>, Bytes)> {
        let t = self.tensor_f16(name)?;
        Ok((t.shape, t.data))
    }
}

impl EncoderDims {
    pub fn from_config(c: &WhisperConfig) -> EncoderDims {
        EncoderDims {
            d_model: c.d_model,
            layers: c.encoder_layers,
            heads: c.encoder_attention_heads,
            ffn: c.encoder_ffn_dim,
            n_mels: c.num_mel_bins,
            n_ctx: c.max_source_positions,
        }
    }
}

/// Opens a checkpoint and checks that every tensor `component` needs is present and shaped.
pub fn open_checked(
    model_dir: &Path,
    component: Component,
) -> Result<(WhisperConfig, WhisperWeights)> {
    let (cfg, w) = WhisperWeights::open(model_dir)?;
    w.check(&cfg, component)?;
    Ok((cfg, w))
}

/// Builds the encoder model from a checkpoint directory.
pub fn export_encoder(
    model_dir: &Path,
    abi: EncoderAbi,
    opset: Opset,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Model> {
    let (cfg, w) = open_checked(model_dir, Component::Encoder)?;
    let mut m = build_encoder(&EncoderDims::from_config(&cfg), &w, abi, opset, progress)
        .with_context(|| format!("building the encoder of {}", model_dir.display()))?;
    m.description
        .user_defined
        .insert("milkit.source".into(), source_name(model_dir));
    Ok(m)
}

/// The checkpoint's directory name (not its full path, so outputs don't depend on where the
/// checkpoint lives).
pub fn source_name(model_dir: &Path) -> String {
    model_dir
        .canonicalize()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| model_dir.display().to_string())
}
