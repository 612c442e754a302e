//! The `milkit` command line. Owns no logic: parses arguments, calls the library, prints.

mod cli;

use std::process::ExitCode;

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
    ExitCode::from(cli::main(std::env::args_os()))
}
