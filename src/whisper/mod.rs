//! The Whisper knowledge: checkpoint loading (opened once, [`checkpoint::Checkpoint`]),
//! synthetic checkpoints, graph construction for each component, audio front end, tokenizer,
//! decoding rules and loop. The conversion pipeline that drives the graph builders from a
//! checkpoint into packages and folders is the `convert` module.
pub mod audio;
pub mod checkpoint;
pub mod config;
pub mod decoder;
pub mod decoder_parts;
pub mod decoder_prefill;
pub mod decoder_spec;
pub mod encoder;
pub mod file_reads;
pub mod generate;
pub mod graph;
pub mod head_pad;
pub mod mel;
pub mod synth;
pub mod synth_tokenizer;
pub mod timing;
pub mod tokenizer;
pub mod weights;
pub mod wer;
