//! Subcommand implementations: argument structs and thin glue over the library.
pub mod bench;
pub mod bench_compress;
pub mod calibrate;
pub mod compress;
pub mod export;
pub mod export_recipe;
pub mod progress;
pub mod synth;
