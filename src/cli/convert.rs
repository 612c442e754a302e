//! `milkit convert`: a model from one container to another. A package (`.mlpackage` or
//! `.mlmodel`) or a compiled `.mlmodelc` folder in; an `.mlpackage`, or an `.mlmodelc`
//! folder (`model.mil`, `weights/weight.bin`, `metadata.json`), out. Written to a temporary
//! path and renamed; an existing output is replaced only with `--force`.

use anyhow::{bail, Result};
use clap::Args;
use milkit::package::fsio::write_package_atomically;
use milkit::package::mil_write::write_compiled_dir;
use milkit::package::{load_package, save_package};
use std::path::PathBuf;

#[derive(Args)]
pub struct ConvertArgs {
    /// The model to read: an .mlpackage, .mlmodel or compiled .mlmodelc folder.
    pub input: PathBuf,
    /// The output: an .mlpackage, or an .mlmodelc folder (model.mil text, weights,
    /// metadata.json and coremldata.bin; the program as written, not optimised as Apple's
    /// compiler does, and not checked against Core ML).
    #[arg(long)]
    pub out: PathBuf,
    /// Replace an existing output.
    #[arg(long)]
    pub force: bool,
}

pub fn run(a: &ConvertArgs) -> Result<u8> {
    let mut m = load_package(&a.input)?;
    match a.out.extension().and_then(|e| e.to_str()) {
        Some("mlpackage") => {
            // Compiled models may declare a later specification version than their
            // functions' opset (WhisperKit-era compilers write 9 for iOS16 programs);
            // coremltools refuses such a package, so it declares what its opsets need.
            let needs = m
                .program
                .functions
                .values()
                .map(|f| f.opset.spec_version())
                .max()
                .unwrap_or(m.spec_version);
            if m.spec_version > needs {
                eprintln!(
                    "note: specification version {} lowered to {needs}, the one its functions' \
                     opset needs",
                    m.spec_version
                );
                m.spec_version = needs;
            }
            save_package(&m, &a.out, a.force, &mut |_| {})?;
        }
        Some("mlmodelc") => {
            write_package_atomically(&a.out, a.force, |dir| write_compiled_dir(&m, dir))?;
        }
        _ => bail!(
            "{}: the output must end in .mlpackage or .mlmodelc",
            a.out.display()
        ),
    }
    eprintln!("{} → {}", a.input.display(), a.out.display());
    Ok(0)
}
