//! `milkit export --recipe`: every component of a models/*.toml recipe into one folder,
//! through the library's folder writer (atomic as a whole).

use super::export_args::{parse_target, report_folder, ExportArgs};
use super::progress;
use anyhow::{bail, Result};
use clap::ValueEnum;
use milkit::convert::bundle::{write_folder, Part, PartSpec, MODEL_FILES};
use milkit::convert::decoder_export::DecoderExport;
use milkit::convert::recipe::{Recipe, RecipeCompression};
use milkit::whisper::checkpoint::Checkpoint;
use milkit::whisper::decoder::CrossKv;
use milkit::whisper::encoder::EncoderAbi;
use std::path::{Path, PathBuf};

fn enum_arg<T: ValueEnum>(what: &str, s: &str) -> Result<T> {
    T::from_str(s, true).map_err(|_| anyhow::anyhow!("recipe: unknown {what} `{s}`"))
}

/// A recipe's [compress] table as the CLI flags it stands for.
/// `calibration`: the `--calibration` files of the command line; each component takes the one
/// measured on it.
fn recipe_flags(
    c: &RecipeCompression,
    calibration: &[PathBuf],
) -> Result<super::compress::CompressFlags> {
    Ok(super::compress::CompressFlags {
        palettize: c
            .palettize
            .as_deref()
            .map(|s| enum_arg("palettize mode", s))
            .transpose()?,
        nbits: c.nbits.unwrap_or(4),
        quantize: c
            .quantize
            .as_deref()
            .map(|s| enum_arg("quantize dtype", s))
            .transpose()?,
        granularity: c
            .granularity
            .as_deref()
            .map(|s| enum_arg("granularity", s))
            .transpose()?,
        group_size: c.group_size.unwrap_or(16),
        block_size: c.block_size.unwrap_or(32),
        asymmetric: c.asymmetric,
        op_types: c
            .op_types
            .clone()
            .unwrap_or_else(|| vec!["conv".into(), "linear".into()]),
        op_names: c.op_names.clone().unwrap_or_default(),
        weight_threshold: c.weight_threshold.unwrap_or(2048),
        skip_indivisible: c.skip_indivisible,
        head_only: c.head_only,
        per_channel_scale: c.per_channel_scale,
        outlier_grouping: c.outlier_grouping,
        target_bits: c.target_bits,
        calibration: calibration.to_vec(),
    })
}

/// The build specs of a recipe's components, checked before anything is built.
pub fn recipe_parts(
    recipe: &Recipe,
    path: &Path,
    calibration: &[PathBuf],
) -> Result<Vec<(String, PartSpec)>> {
    let mut parts = Vec::new();
    for c in &recipe.components {
        let part = Part::parse(&c.component)?;
        let compression = match &c.compress {
            None => None,
            Some(cc) => {
                let flags = recipe_flags(cc, calibration)?;
                // Statistics measured on the encoder serve the encoder, and so on.
                let measured_on = match part {
                    Part::Encoder => Some("encoder"),
                    Part::Decoder => Some("decoder"),
                    _ => None,
                };
                let found = flags.compression_for(measured_on)?;
                match found {
                    Some(x) => Some(x),
                    None => bail!(
                        "{}: component `{}` has a [compress] table without palettize or quantize",
                        path.display(),
                        c.file
                    ),
                }
            }
        };
        let spec = PartSpec {
            part,
            abi: EncoderAbi::parse(&c.abi)?,
            opset: parse_target(&c.target)?,
            decoder: DecoderExport {
                stateful: c.stateful,
                cross_kv: c
                    .cross_kv
                    .as_deref()
                    .map(CrossKv::parse)
                    .transpose()?
                    .unwrap_or(CrossKv::InGraph),
                head_chunks: c.head_chunks.unwrap_or(1),
                per_head_alignment: c.per_head_alignment,
            },
            compression,
        };
        parts.push((c.file.clone(), spec));
    }
    Ok(parts)
}

/// Exports every component of a recipe into the directory `--out`, atomically as a whole.
pub fn run(a: &ExportArgs, model: &Path, path: &Path) -> Result<u8> {
    let recipe = Recipe::from_file(path)?;
    let parts = recipe_parts(&recipe, path, &a.compress.calibration)?;
    let copy: &[(&str, bool)] = if recipe.copy_model_files {
        &MODEL_FILES
    } else {
        &[]
    };
    let sp = progress::spinner("exporting", a.quiet);
    let ckpt = Checkpoint::open(model)?;
    let report = write_folder(&ckpt, &a.out, &parts, copy, a.force, &mut |msg| {
        sp.set_message(msg.to_string())
    })?;
    sp.finish_and_clear();
    report_folder(&report, a.json, a.quiet)?;
    if !a.quiet {
        eprintln!(
            "wrote {} ({} packages, recipe {})",
            a.out.display(),
            parts.len(),
            recipe.name
        );
    }
    Ok(0)
}
