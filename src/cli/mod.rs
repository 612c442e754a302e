//! The command line: the argument tree, the dispatch to each subcommand, and the
//! subcommand implementations (argument structs and thin glue over the library). Shared by
//! the `milkit` binary and the Python extension's `milkit` command (`python/`).
pub mod bench;
pub mod bench_audio;
pub mod bench_compress;
pub mod bench_decode;
pub mod bench_gemm;
pub mod bench_whole;
pub mod calibrate;
pub mod compress;
pub mod convert;
pub mod eval;
pub mod export;
pub mod export_args;
pub mod export_recipe;
pub mod gate;
pub mod progress;
pub mod reference;
pub mod run;
pub mod stats;
pub mod synth;
pub mod transcribe;

use clap::{CommandFactory, Parser, Subcommand};

/// Convert Hugging Face Whisper checkpoints into small, verified Core ML packages, and run
/// them anywhere.
///
/// Typical flow: `milkit export` a component (optionally compressing it), `milkit inspect`
/// or `milkit verify` the package, `milkit transcribe` audio with the bundled runtime.
#[derive(Parser)]
#[command(name = "milkit", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Export a Whisper component from a Hugging Face checkpoint as an .mlpackage.
    Export(export::ExportArgs),
    /// Compress the weights of a package (LUT palettization or linear quantization).
    Compress(compress::CompressArgs),
    /// Convert between containers: .mlpackage, .mlmodel or compiled .mlmodelc in;
    /// .mlpackage or .mlmodelc (model.mil text) out.
    Convert(convert::ConvertArgs),
    /// Show what a package holds: spec version, opset, I/O, op histogram, weight bytes.
    Inspect(milkit::verify::cli::InspectArgs),
    /// Check a package's claims: op counts, LUT ops, ABI, opset, bytes, predicted placement;
    /// exit 0 when every expectation holds, 1 on mismatches, 2 when unreadable.
    Verify(milkit::verify::cli::VerifyArgs),
    /// Compile a package to .mlmodelc with `xcrun coremlc` (macOS only).
    Compile(milkit::verify::cli::CompileArgs),
    /// Write a random-weight Whisper checkpoint with real dimensions (tests, benchmarks).
    Synth(synth::SynthArgs),
    /// Measure per-channel input statistics on real audio for data-aware compression.
    Calibrate(calibrate::CalibrateArgs),
    /// Corpus word error rate of a models folder on a manifest of clips.
    Eval(eval::EvalArgs),
    /// Go or kill for a compressed models folder against its baseline: package physics,
    /// placement, numerical parity, end to end; exit 0 go, 1 kill, 2 unusable input.
    Gate(gate::GateArgs),
    /// Run a package with the bundled runtime: inputs from .npy/.safetensors, outputs to
    /// DIR/NAME.npy (DIR/NAME.k.npy with --repeat N); states kept across the predictions.
    Run(run::RunArgs),
    /// Transcribe audio files with a models folder (AudioEncoder/TextDecoder packages + json):
    /// one line of text per file.
    Transcribe(transcribe::TranscribeArgs),
    /// Timing tables: `bench audio|export|compress|decode|gemm|whole` (docs/speed.md).
    Bench(bench::BenchArgs),
    /// Print the command-line reference (docs/cli.md) as Markdown, generated from this
    /// definition.
    #[command(hide = true)]
    HelpMarkdown,
}

fn code(c: i32) -> u8 {
    u8::try_from(c).unwrap_or(2)
}

/// Runs the command line `args` (the program name first, as `std::env::args_os` gives it)
/// and returns the exit status: 0 success, 1 a check that failed, 2 an error (printed to
/// stderr as `error: …`); `--help`, `--version` and usage errors print as clap prints them.
pub fn main<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            // Help and version go to stdout with status 0, usage errors to stderr with 2.
            let _ = e.print();
            return code(e.exit_code());
        }
    };
    let r = match cli.command {
        Command::Export(a) => export::run(&a),
        Command::Compress(a) => compress::run(&a),
        Command::Convert(a) => convert::run(&a),
        Command::Inspect(a) => Ok(code(milkit::verify::cli::run_inspect(&a))),
        Command::Verify(a) => Ok(code(milkit::verify::cli::run_verify(&a))),
        Command::Compile(a) => Ok(code(milkit::verify::cli::run_compile(&a))),
        Command::Synth(a) => synth::run(&a),
        Command::Run(a) => run::run(&a),
        Command::Transcribe(a) => transcribe::run(&a),
        Command::Bench(a) => bench::run(&a),
        Command::Calibrate(a) => calibrate::run(&a),
        Command::Eval(a) => eval::run(&a),
        Command::Gate(a) => gate::run(&a),
        Command::HelpMarkdown => {
            print!("{}", reference::markdown(Cli::command()));
            Ok(0)
        }
    };
    match r {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            2
        }
    }
}
