//! The `milkit` command line. Owns no logic: parses arguments, calls the library, prints.

mod cli;

use clap::{CommandFactory, Parser, Subcommand};
use std::process::ExitCode;

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
    Export(cli::export::ExportArgs),
    /// Compress the weights of a package (LUT palettization or linear quantization).
    Compress(cli::compress::CompressArgs),
    /// Convert between containers: .mlpackage, .mlmodel or compiled .mlmodelc in;
    /// .mlpackage or .mlmodelc (model.mil text) out.
    Convert(cli::convert::ConvertArgs),
    /// Show what a package holds: spec version, opset, I/O, op histogram, weight bytes.
    Inspect(milkit::verify::cli::InspectArgs),
    /// Check a package's claims: op counts, LUT ops, ABI, opset, bytes, predicted placement;
    /// exit 0 when every expectation holds, 1 on mismatches, 2 when unreadable.
    Verify(milkit::verify::cli::VerifyArgs),
    /// Compile a package to .mlmodelc with `xcrun coremlc` (macOS only).
    Compile(milkit::verify::cli::CompileArgs),
    /// Write a random-weight Whisper checkpoint with real dimensions (tests, benchmarks).
    Synth(cli::synth::SynthArgs),
    /// Measure per-channel input statistics on real audio for data-aware compression.
    Calibrate(cli::calibrate::CalibrateArgs),
    /// Corpus word error rate of a models folder on a manifest of clips.
    Eval(cli::eval::EvalArgs),
    /// Go or kill for a compressed models folder against its baseline: package physics,
    /// placement, numerical parity, end to end; exit 0 go, 1 kill, 2 unusable input.
    Gate(cli::gate::GateArgs),
    /// Run a package with the bundled runtime: inputs from .npy/.safetensors, outputs to
    /// DIR/NAME.npy (DIR/NAME.k.npy with --repeat N); states kept across the predictions.
    Run(cli::run::RunArgs),
    /// Transcribe WAV files with a models folder (AudioEncoder/TextDecoder packages + json):
    /// one line of text per file.
    Transcribe(cli::transcribe::TranscribeArgs),
    /// Timing tables: `bench audio|export|compress|decode|gemm|whole` (docs/speed.md).
    Bench(cli::bench::BenchArgs),
    /// Print the command-line reference (docs/cli.md) as Markdown, generated from this
    /// definition.
    #[command(hide = true)]
    HelpMarkdown,
}

fn code(c: i32) -> u8 {
    u8::try_from(c).unwrap_or(2)
}

/// Large blocks (weights, caches) on huge pages where the kernel grants them on request.
#[global_allocator]
static ALLOC: milkit::alloc::HugePageHint = milkit::alloc::HugePageHint;

/// A closed stdout (`milkit inspect PKG --json | head -c 10`) ends the process the way it
/// ends `cat` or `ls`: by the default SIGPIPE action, quietly. Rust ignores SIGPIPE at start,
/// which turns the next write into an `EPIPE` error and `println!` into a panic ("failed
/// printing to stdout: Broken pipe"); restoring the default fixes it for every subcommand.
fn restore_sigpipe() {
    #[cfg(unix)]
    // SAFETY: called first thing in main, before any thread exists; SIG_DFL is always a
    // valid disposition for SIGPIPE.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> ExitCode {
    restore_sigpipe();
    milkit::alloc::one_arena();
    let cli = Cli::parse();
    let r = match cli.command {
        Command::Export(a) => cli::export::run(&a),
        Command::Compress(a) => cli::compress::run(&a),
        Command::Convert(a) => cli::convert::run(&a),
        Command::Inspect(a) => Ok(code(milkit::verify::cli::run_inspect(&a))),
        Command::Verify(a) => Ok(code(milkit::verify::cli::run_verify(&a))),
        Command::Compile(a) => Ok(code(milkit::verify::cli::run_compile(&a))),
        Command::Synth(a) => cli::synth::run(&a),
        Command::Run(a) => cli::run::run(&a),
        Command::Transcribe(a) => cli::transcribe::run(&a),
        Command::Bench(a) => cli::bench::run(&a),
        Command::Calibrate(a) => cli::calibrate::run(&a),
        Command::Eval(a) => cli::eval::run(&a),
        Command::Gate(a) => cli::gate::run(&a),
        Command::HelpMarkdown => {
            print!("{}", cli::reference::markdown(Cli::command()));
            Ok(0)
        }
    };
    match r {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
