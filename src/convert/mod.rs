//! The conversion pipeline: from an opened Whisper checkpoint
//! ([`crate::whisper::checkpoint::Checkpoint`]) to Core ML packages — the audio-side models
//! (`export`), the decoder-side ones (`decoder_export`), whole WhisperKit folders and
//! compression while writing (`bundle`, described by `compress`) — and the declarative recipes (`models/*.toml`,
//! `recipe`) that list them. Whisper's graphs, audio, tokenizer and decoding rules stay in
//! `crate::whisper`; this module only drives them.
pub mod bundle;
pub mod compress;
pub mod decoder_export;
pub mod export;
pub mod recipe;
