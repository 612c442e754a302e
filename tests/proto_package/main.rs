//! Tests of the Core ML protobuf types, the MIL blob storage, the package manifest and atomic
//! package output. Cross-checks against coremltools run when a Python with coremltools is
//! found (MILKIT_PYTHON, else `.venv/bin/python`, else `/work/venv/bin/python`); fixture
//! tests need MILKIT_FIXTURES (default `../shared`). Both skip with a message when absent,
//! unless MILKIT_REQUIRE_FIXTURES=1.

mod blob;
mod fsio;
mod manifest;
mod proto;

#[path = "../common/mod.rs"]
mod common;
pub use common::{fixtures, python, run_python};

use std::path::{Path, PathBuf};

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
