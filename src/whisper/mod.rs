//! The only Whisper-aware code: checkpoint loading, synthetic checkpoints, graph construction
//! for each component, audio front end, tokenizer, decoding loop.
pub mod audio;
pub mod bundle;
pub mod config;
pub mod decoder;
pub mod decoder_export;
pub mod decoder_parts;
pub mod decoder_prefill;
pub mod encoder;
pub mod export;
pub mod generate;
pub mod graph;
pub mod mel;
pub mod recipe;
pub mod synth;
pub mod timing;
pub mod tokenizer;
pub mod weights;
pub mod wer;
