//! Subcommand implementations: argument structs and thin glue over the library.
pub mod bench;
pub mod bench_decode;
pub mod compress;
pub mod export;
pub mod progress;
pub mod synth;
