//! The only Whisper-aware code: checkpoint loading, synthetic checkpoints, graph construction
//! for each component, audio front end, tokenizer, decoding loop.
pub mod audio;
pub mod bundle;
pub mod checkpoint;
pub mod config;
pub mod decoder;
pub mod decoder_export;
pub mod decoder_parts;
pub mod decoder_prefill;
pub mod decoder_spec;
pub mod encoder;
pub mod export;
pub mod file_reads;
pub mod generate;
pub mod graph;
pub mod head_pad;
pub mod mel;
pub mod recipe;
pub mod synth;
pub mod synth_tokenizer;
pub mod timing;
pub mod tokenizer;
pub mod weights;
pub mod wer;
