//! From an opened checkpoint ([`Checkpoint`]) to the audio-side MIL models: checks the
//! checkpoint for the component and feeds its dimensions and weights (or its mel filter
//! bank) to the graph builders; every model is tagged with the checkpoint it came from.

use crate::ir::{Model, Opset};
use crate::whisper::checkpoint::Checkpoint;
use crate::whisper::encoder::{build_encoder, EncoderAbi, EncoderDims};
use crate::whisper::mel::build_mel;
use crate::whisper::weights::Component;
use anyhow::{Context, Result};

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
