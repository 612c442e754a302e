//! `milkit export --recipe`: every component of a models/*.toml recipe into one folder,
//! through the library's recipe translation and folder writer (atomic as a whole); with
//! `--calibrate-on` the statistics it needs measured (and cached) first, and with a quality
//! target (`--target-quality` or the recipe's `[target]`) the plan chosen by
//! `quality::target`'s search.

use super::export_args::{dir_bytes, report_folder, ExportArgs};
use super::progress;
use anyhow::{Context, Result};
use milkit::convert::bundle::Compression;
use milkit::convert::bundle::{write_folder, Component, MODEL_FILES};
use milkit::convert::decoder_export::DecoderExport;
use milkit::convert::recipe::{recipe_components, QualityTarget, Recipe};
use milkit::passes::compress::Selection;
use milkit::passes::lut::lut_widths;
use milkit::quality::calibrate::{
    calibrate_decoder_with, calibrate_encoder_with, EncoderSensitivityRequest, SensitivityRequest,
};
use milkit::quality::eval::{default_normalization, read_manifest};
use milkit::quality::fidelity::FidelityInput;
use milkit::quality::target::{cache_key, checkpoint_digest, file_digest, split_clips, Search};
use milkit::whisper::checkpoint::Checkpoint;
use milkit::whisper::encoder::EncoderAbi;
use milkit::whisper::wer::Normalization;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Removes a scratch directory when dropped (also on errors).
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Exports every component of a recipe into the directory `--out`, atomically as a whole.
pub fn run(a: &ExportArgs, model: &Path, path: &Path) -> Result<u8> {
    let t0 = Instant::now();
    let mut recipe = Recipe::from_file(path)?;
    let target = match &a.target_quality {
        Some(t) => Some(QualityTarget::parse(t)?),
        None => recipe.target.clone(),
    };
    if target.is_some() && a.calibrate_on.is_empty() {
        anyhow::bail!(
            "{}: the recipe sets a quality target; give the clips to measure it on with --calibrate-on CLIPS...",
            path.display()
        );
    }
    if a.out.exists() && !a.force {
        anyhow::bail!(
            "{} already exists; pass --force to replace it",
            a.out.display()
        );
    }
    let ckpt = Checkpoint::open(model)?;
    let mut calibration = a.compress.calibration.clone();
    let sp = progress::spinner("exporting", a.quiet);
    if !a.calibrate_on.is_empty() {
        let (clips, norm) = read_clips(&a.calibrate_on)?;
        let (stats, held) = match target {
            Some(_) => split_clips(clips),
            None => (clips, vec![]),
        };
        let cache = cache_dir(a)?;
        let ckpt_digest = checkpoint_digest(model)?;
        let digests = |v: &[FidelityInput]| -> Result<String> {
            let mut d = v
                .iter()
                .map(|c| file_digest(&c.path))
                .collect::<Result<Vec<_>>>()?;
            d.sort();
            Ok(d.join(","))
        };
        let stats_digest = digests(&stats)?;
        for need in statistics_needed(&recipe, path)? {
            let (component, gram) = (need.component, need.gram);
            let sweep_key = need
                .sweep
                .as_ref()
                .map(|(c, d, w)| format!("{c:?}{d:?}{w:?}"))
                .unwrap_or_default();
            let gram_text = gram.to_string();
            let mut parts = vec![&ckpt_digest[..], &stats_digest, component, &gram_text];
            if need.sweep.is_some() {
                parts.push(&sweep_key);
            }
            let key = cache_key(&parts);
            let out = cache
                .join("statistics")
                .join(format!("{key}.{component}.st"));
            if out.is_file() {
                if !a.quiet {
                    eprintln!("{component} statistics: cached ({})", out.display());
                }
            } else {
                sp.set_message(format!(
                    "measuring {component} statistics{}",
                    if need.sweep.is_some() {
                        " and end-metric sensitivity"
                    } else {
                        ""
                    }
                ));
                let files: Vec<PathBuf> = stats.iter().map(|c| c.path.clone()).collect();
                let sel = Selection::default();
                let msg = |what: &str, d: usize, n: usize| format!("{what} {d}/{n}");
                let cal = if component == "encoder" {
                    calibrate_encoder_with(
                        model,
                        &files,
                        &sel,
                        gram,
                        need.sweep
                            .as_ref()
                            .map(|(c, _, w)| EncoderSensitivityRequest {
                                compression: c,
                                widths: w,
                            }),
                        &mut |d, n| sp.set_message(msg("encoder statistics", d, n)),
                        &mut |d, n| sp.set_message(msg("encoder sensitivity", d, n)),
                    )?
                } else {
                    calibrate_decoder_with(
                        model,
                        &files,
                        &sel,
                        gram,
                        need.sweep.as_ref().map(|(c, d, w)| SensitivityRequest {
                            compression: c,
                            decoder: *d,
                            widths: w,
                        }),
                        &mut |d, n| sp.set_message(msg("decoder statistics", d, n)),
                        &mut |d, n| sp.set_message(msg("decoder sensitivity", d, n)),
                    )?
                };
                std::fs::create_dir_all(out.parent().unwrap_or(&cache))
                    .with_context(|| format!("creating the cache folder {}", cache.display()))?;
                cal.save(&out, true)?;
            }
            calibration.push(out);
        }
        if let Some(t) = &target {
            let mut cal_digests = calibration
                .iter()
                .map(|p| file_digest(p))
                .collect::<Result<Vec<_>>>()?;
            cal_digests.sort();
            let part = cache_key(&[&ckpt_digest, &digests(&held)?, &cal_digests.join(",")]);
            let scratch = Scratch(scratch_beside(&a.out));
            let names = |v: &[FidelityInput]| v.iter().map(|c| c.name.clone()).collect::<Vec<_>>();
            let stats_names = names(&stats);
            let search = Search {
                ckpt: &ckpt,
                recipe: &recipe,
                recipe_path: path,
                calibration: &calibration,
                held_back: &held,
                statistics_clips: &stats_names,
                norm,
                target: t,
                scratch: &scratch.0,
                cache: Some((&cache, part)),
            };
            let (chosen, report) = search.run(&mut |m| sp.set_message(m.to_string()))?;
            drop(scratch);
            if !a.quiet {
                sp.suspend(|| eprint!("{}", report.to_text()));
            }
            recipe = chosen;
        }
    }
    let components = recipe_components(&recipe, path, &calibration)?;
    let copy: &[(&str, bool)] = if recipe.copy_model_files {
        &MODEL_FILES
    } else {
        &[]
    };
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

/// The clips of --calibrate-on (manifest lines keep their texts and languages) and the
/// normalisation their languages call for.
fn read_clips(items: &[PathBuf]) -> Result<(Vec<FidelityInput>, Normalization)> {
    let mut clips = Vec::new();
    let mut norm = Normalization::Ascii;
    for it in items {
        if it.extension().is_some_and(|e| e == "jsonl") {
            let lines = read_manifest(it)?;
            if default_normalization(&lines) == Normalization::Unicode {
                norm = Normalization::Unicode;
            }
            clips.extend(lines.into_iter().map(|c| FidelityInput {
                name: c.name,
                path: c.path,
                reference: c.text,
                language: c.language,
            }));
        } else {
            clips.push(FidelityInput {
                name: it.display().to_string(),
                path: it.clone(),
                reference: None,
                language: None,
            });
        }
    }
    anyhow::ensure!(!clips.is_empty(), "--calibrate-on: no clips");
    Ok((clips, norm))
}

/// What one component's statistics must hold.
struct Need {
    /// `encoder` or `decoder`.
    component: &'static str,
    /// Gram matrices (error feedback needs them).
    gram: bool,
    /// End-metric sensitivity: the component's compression, its decoder layout and widths.
    sweep: Option<(Compression, DecoderExport, Vec<u32>)>,
}

/// The statistics a recipe's compressed components need: Gram matrices where they round
/// with error feedback, sensitivity curves where they ask for them (`sensitivity_widths`).
fn statistics_needed(recipe: &Recipe, path: &Path) -> Result<Vec<Need>> {
    let mut out: Vec<Need> = Vec::new();
    for (rc, (_, spec)) in recipe
        .components
        .iter()
        .zip(recipe_components(recipe, path, &[])?)
    {
        let name = match spec.component {
            Component::Encoder => "encoder",
            Component::Decoder => "decoder",
            _ => {
                anyhow::ensure!(
                    rc.sensitivity_widths.is_none(),
                    "{}: component `{}` sets sensitivity_widths, which only a compressed encoder or decoder takes",
                    path.display(),
                    rc.file
                );
                continue;
            }
        };
        let Some(c) = &spec.compression else {
            anyhow::ensure!(
                rc.sensitivity_widths.is_none(),
                "{}: component `{}` sets sensitivity_widths but is not compressed",
                path.display(),
                rc.file
            );
            continue;
        };
        let gram = c.error_feedback.is_some();
        let sweep = match &rc.sensitivity_widths {
            None => None,
            Some(w) => {
                let w = lut_widths(w).map_err(|b| {
                    anyhow::anyhow!(
                        "{}: component `{}`: sensitivity width {b} is not one of 1, 2, 3, 4, 6, 8",
                        path.display(),
                        rc.file
                    )
                })?;
                anyhow::ensure!(
                    name == "decoder" || spec.abi == EncoderAbi::WhisperKit,
                    "{}: the encoder's sensitivity is measured on the `whisperkit` ABI, and `{}` uses `{}`",
                    path.display(),
                    rc.file,
                    spec.abi.name()
                );
                Some((c.clone(), spec.decoder, w))
            }
        };
        match out.iter_mut().find(|n| n.component == name) {
            Some(e) => {
                e.gram |= gram;
                anyhow::ensure!(
                    e.sweep.is_none() || sweep.is_none(),
                    "{}: two {name} components ask for sensitivity curves; statistics hold one set",
                    path.display()
                );
                if sweep.is_some() {
                    e.sweep = sweep;
                }
            }
            None => out.push(Need {
                component: name,
                gram,
                sweep,
            }),
        }
    }
    Ok(out)
}

fn cache_dir(a: &ExportArgs) -> Result<PathBuf> {
    if let Some(d) = &a.cache_dir {
        return Ok(d.clone());
    }
    if let Some(d) = std::env::var_os("MILKIT_CACHE") {
        return Ok(PathBuf::from(d));
    }
    let home = std::env::var_os("HOME")
        .context("no --cache-dir, MILKIT_CACHE or HOME to keep the measurements in")?;
    Ok(PathBuf::from(home).join(".cache/milkit/measure"))
}

/// A scratch folder beside the output, for the plans' folders.
fn scratch_beside(out: &Path) -> PathBuf {
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "out".into());
    out.with_file_name(format!(".{name}.milkit-search-{}", std::process::id()))
}
