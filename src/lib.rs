//! milkit: Hugging Face Whisper checkpoints → verified, compressed Core ML `mlprogram` packages,
//! and a Rust runtime that executes them.
//!
//! Module map: README.md, section Layout.

pub mod alloc;
pub mod audio;
pub mod convert;
pub mod fuzzing;
pub mod hub;
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
pub mod vad;
pub mod verify;
pub mod whisper;
