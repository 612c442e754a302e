//! Subcommand implementations: argument structs and thin glue over the library.
pub mod bench;
pub mod bench_audio;
pub mod bench_compress;
pub mod bench_decode;
pub mod bench_gemm;
pub mod bench_whole;
pub mod calibrate;
pub mod compress;
pub mod eval;
pub mod export;
pub mod export_args;
pub mod export_recipe;
pub mod gate;
pub mod progress;
pub mod run;
pub mod synth;
pub mod transcribe;
