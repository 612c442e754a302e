//! From an opened checkpoint ([`Checkpoint`]) to the audio-side MIL models: checks the
//! checkpoint for the component, maps config dimensions to graph dimensions, and feeds
//! weights (or the mel filter bank) to the graph builders.

use super::checkpoint::Checkpoint;
use super::config::WhisperConfig;
use super::encoder::{build_encoder, EncoderAbi, EncoderDims};
use super::graph::WeightSource;
use super::mel::build_mel;
use super::weights::{Component, WhisperWeights};
use crate::ir::{Bytes, Model, Opset};
use anyhow::{Context, Result};

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

/// Names `m` after the checkpoint it was built from (the `milkit.source` metadata).
pub fn tag(mut m: Model, ckpt: &Checkpoint) -> Model {
    m.description
        .user_defined
        .insert("milkit.source".into(), ckpt.source_name());
    m
}

/// Builds the encoder model of a checkpoint.
pub fn export_encoder(
    ckpt: &Checkpoint,
    abi: EncoderAbi,
    opset: Opset,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Model> {
    let w = ckpt.checked_weights(Component::Encoder)?;
    let m = build_encoder(
        &EncoderDims::from_config(ckpt.config()),
        w,
        abi,
        opset,
        progress,
    )
    .with_context(|| format!("building the encoder of {}", ckpt.dir().display()))?;
    Ok(tag(m, ckpt))
}

/// Builds the MelSpectrogram model of a checkpoint (see [`Checkpoint::mel_filters`]).
pub fn export_mel(ckpt: &Checkpoint, opset: Opset) -> Result<Model> {
    let m = build_mel(ckpt.mel_filters()?, opset)
        .with_context(|| format!("building the mel spectrogram of {}", ckpt.dir().display()))?;
    Ok(tag(m, ckpt))
}
