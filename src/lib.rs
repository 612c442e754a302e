//! milkit: Hugging Face Whisper checkpoints → verified, compressed Core ML `mlprogram` packages,
//! and a Rust runtime that executes them.
//!
//! Module map (who may use whom) is in README.md and enforced by `tests/layering.rs`.

pub mod ir;
pub mod kernels;
pub mod ops;
pub mod package;
pub mod passes;
pub mod proto;
pub mod quality;
pub mod report;
pub mod runtime;
pub mod transcribe;
pub mod verify;
pub mod whisper;
