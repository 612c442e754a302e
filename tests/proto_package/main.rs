//! Tests of the Core ML protobuf types, the MIL blob storage, the package manifest and atomic
//! package output. Cross-checks against coremltools run when a Python with coremltools is
//! found (MILKIT_PYTHON, else `.venv/bin/python`, else `/work/venv/bin/python`); fixture
//! tests need MILKIT_FIXTURES (default `../shared`). Both skip with a message when absent,
//! unless MILKIT_REQUIRE_FIXTURES=1.

mod blob;
mod fsio;
mod manifest;
mod proto;

use std::path::{Path, PathBuf};
use std::process::Command;

fn require() -> bool {
    std::env::var("MILKIT_REQUIRE_FIXTURES").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// The shared fixtures directory, or `None` (after printing why) when tests may skip.
pub fn fixtures() -> Option<PathBuf> {
    let dir = match std::env::var_os("MILKIT_FIXTURES") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared"),
    };
    if dir.is_dir() {
        return Some(dir);
    }
    assert!(
        !require(),
        "fixtures not found at {} (MILKIT_REQUIRE_FIXTURES is set)",
        dir.display()
    );
    eprintln!("skipping: fixtures not found at {}", dir.display());
    None
}

/// A Python interpreter that can import coremltools, or `None` (after printing why).
pub fn python() -> Option<PathBuf> {
    let explicit = std::env::var_os("MILKIT_PYTHON").map(PathBuf::from);
    let candidates = match &explicit {
        Some(p) => vec![p.clone()],
        None => vec![
            Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python"),
            PathBuf::from("/work/venv/bin/python"),
        ],
    };
    for p in candidates {
        if !p.exists() {
            continue;
        }
        let ok = Command::new(&p)
            .args([
                "-c",
                "import coremltools.libmilstoragepython, coremltools.proto.Model_pb2",
            ])
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            return Some(p);
        }
        eprintln!("{} cannot import coremltools", p.display());
    }
    assert!(
        !require(),
        "no Python with coremltools found (MILKIT_REQUIRE_FIXTURES is set)"
    );
    eprintln!("skipping: no Python with coremltools (set MILKIT_PYTHON)");
    None
}

/// Runs `script` with `args`; panics with its stderr on failure, returns stdout.
pub fn run_python(python: &Path, script: &str, args: &[&std::ffi::OsStr]) -> String {
    let out = Command::new(python)
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("cannot run python");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "python failed:\n{stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The three coremltools-made packages in the fixtures.
pub fn fixture_packages(fixtures: &Path) -> Vec<PathBuf> {
    let dir = fixtures.join("coremltools");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "mlpackage"))
        .collect();
    v.sort();
    assert_eq!(v.len(), 3, "expected three packages in {}", dir.display());
    v
}
