//! `milkit export --recipe`: every component of a models/*.toml recipe into one folder,
//! through the library's recipe translation and folder writer (atomic as a whole).

use super::export_args::{dir_bytes, report_folder, ExportArgs};
use super::progress;
use anyhow::Result;
use milkit::convert::bundle::{write_folder, MODEL_FILES};
use milkit::convert::recipe::{recipe_components, Recipe};
use milkit::whisper::checkpoint::Checkpoint;
use std::path::Path;
use std::time::Instant;

/// Exports every component of a recipe into the directory `--out`, atomically as a whole.
pub fn run(a: &ExportArgs, model: &Path, path: &Path) -> Result<u8> {
    let t0 = Instant::now();
    let recipe = Recipe::from_file(path)?;
    let components = recipe_components(&recipe, path, &a.compress.calibration)?;
    let copy: &[(&str, bool)] = if recipe.copy_model_files {
        &MODEL_FILES
    } else {
        &[]
    };
    let sp = progress::spinner("exporting", a.quiet);
    let ckpt = Checkpoint::open(model)?;
    let report = write_folder(&ckpt, &a.out, &components, copy, a.force, &mut |msg| {
        sp.set_message(msg.to_string())
    })?;
    sp.finish_and_clear();
    report_folder(&report, a.json, a.quiet, a.verbose)?;
    if !a.quiet {
        eprintln!(
            "wrote {} ({} packages, recipe {}, {:.1} MB) in {:.1} s",
            a.out.display(),
            components.len(),
            recipe.name,
            dir_bytes(&a.out) as f64 / 1e6,
            t0.elapsed().as_secs_f64()
        );
    }
    Ok(0)
}
