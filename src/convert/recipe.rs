//! Conversion recipes (`models/*.toml`): which components to export, with which ABI, target
//! and compression, written as files of one output directory; and their translation into
//! the build specs of [`super::bundle::write_folder`].

use super::bundle::{Component, ComponentSpec};
use super::compress::CompressFlags;
use super::decoder_export::DecoderExport;
use crate::ir::Opset;
use crate::whisper::decoder::CrossKv;
use crate::whisper::encoder::EncoderAbi;
use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// A whole conversion.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recipe {
    /// Short name, shown in messages.
    pub name: String,
    /// What the recipe is for.
    #[serde(default)]
    pub description: String,
    /// Also copy the checkpoint's config.json, generation_config.json, tokenizer.json (and
    /// preprocessor_config.json when present) into the output folder, as WhisperKit wants.
    #[serde(default)]
    pub copy_model_files: bool,
    #[serde(rename = "component")]
    pub components: Vec<RecipeComponent>,
    /// A quality target instead of fixed widths: `export --recipe --calibrate-on CLIPS`
    /// tries widths for the compressed components and keeps the fewest bits whose fidelity
    /// against fp16, measured on the held-back half of the clips, meets every bound here
    /// (`quality::target`).
    pub target: Option<QualityTarget>,
}

/// Bounds on a compressed folder's fidelity against the fp16 folder of the same recipe, as
/// `milkit eval --against` measures it; every bound given must hold. In a recipe the
/// `[target]` table; on the command line `--target-quality KEY=VALUE,...` with the same keys.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QualityTarget {
    /// Corpus WER against the reference texts, candidate minus fp16, in points.
    pub max_wer_delta: Option<f64>,
    /// Share of clips whose WER is not worse than fp16's (0–1).
    pub min_qoi: Option<f64>,
    /// WER of the candidate's transcripts against fp16's, in percent.
    pub max_wer_vs_fp16: Option<f64>,
    /// Mean teacher-forced next-token KL(fp16 ‖ candidate), nats.
    pub max_mean_kl: Option<f64>,
    /// Share of decoder positions where both pick the same token (0–1).
    pub min_top1: Option<f64>,
    /// Mean encoder-output PSNR against fp16, dB.
    pub min_encoder_psnr_db: Option<f64>,
    /// Try no plan with more nominal bits than this (default: every plan, fp16 included).
    pub max_bits: Option<f64>,
}

/// The items of a `KEY=VALUE,...` quality target (keys trimmed, values numbers), in order;
/// `example` shows the form in the error for an item without `=`.
pub fn target_items<'a>(text: &'a str, example: &str) -> Result<Vec<(&'a str, f64)>> {
    let mut out = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some((k, v)) = item.split_once('=') else {
            bail!("quality target `{item}` is not KEY=VALUE (e.g. {example})");
        };
        let v: f64 = v
            .trim()
            .parse()
            .with_context(|| format!("quality target `{item}`: not a number"))?;
        out.push((k.trim(), v));
    }
    Ok(out)
}

impl QualityTarget {
    /// Parses `KEY=VALUE,...` with the field names as keys.
    pub fn parse(text: &str) -> Result<QualityTarget> {
        let mut t = QualityTarget::default();
        for (k, v) in target_items(text, "max_wer_delta=0.5")? {
            let slot = match k {
                "max_wer_delta" => &mut t.max_wer_delta,
                "min_qoi" => &mut t.min_qoi,
                "max_wer_vs_fp16" => &mut t.max_wer_vs_fp16,
                "max_mean_kl" => &mut t.max_mean_kl,
                "min_top1" => &mut t.min_top1,
                "min_encoder_psnr_db" => &mut t.min_encoder_psnr_db,
                "max_bits" => &mut t.max_bits,
                other => bail!(
                    "unknown quality target `{other}` (max_wer_delta, min_qoi, max_wer_vs_fp16, max_mean_kl, min_top1, min_encoder_psnr_db, max_bits)"
                ),
            };
            *slot = Some(v);
        }
        if t.is_empty() {
            bail!("the quality target `{text}` sets no bound");
        }
        Ok(t)
    }

    /// No bound set (max_bits alone is no bound).
    pub fn is_empty(&self) -> bool {
        self.max_wer_delta.is_none()
            && self.min_qoi.is_none()
            && self.max_wer_vs_fp16.is_none()
            && self.max_mean_kl.is_none()
            && self.min_top1.is_none()
            && self.min_encoder_psnr_db.is_none()
    }

    /// The bounds as `KEY=VALUE,...` (what [`QualityTarget::parse`] reads).
    pub fn to_text(&self) -> String {
        [
            ("max_wer_delta", self.max_wer_delta),
            ("min_qoi", self.min_qoi),
            ("max_wer_vs_fp16", self.max_wer_vs_fp16),
            ("max_mean_kl", self.max_mean_kl),
            ("min_top1", self.min_top1),
            ("min_encoder_psnr_db", self.min_encoder_psnr_db),
            ("max_bits", self.max_bits),
        ]
        .iter()
        .filter_map(|(k, v)| v.map(|v| format!("{k}={v}")))
        .collect::<Vec<_>>()
        .join(",")
    }
}

/// One package of the recipe.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecipeComponent {
    /// `mel`, `encoder`, `decoder`, `crosskv` or `prefill`.
    pub component: String,
    /// Encoder I/O: `whispercpp` or `whisperkit` (default; the other components exist only
    /// in WhisperKit's form).
    #[serde(default = "default_abi")]
    pub abi: String,
    /// Deployment target, default `ios18`.
    #[serde(default = "default_target")]
    pub target: String,
    /// File name of the package inside the output directory.
    pub file: String,
    /// Decoder: self-attention caches as Core ML states (needs target ios18).
    #[serde(default)]
    pub stateful: bool,
    /// Decoder: `in-graph` (default) or `precomputed` cross-attention keys/values.
    pub cross_kv: Option<String>,
    /// Decoder: row chunks of the vocabulary head (default 1).
    pub head_chunks: Option<usize>,
    /// Decoder: also output each alignment head's cross-attention row (for word timings), as
    /// `export --component all` does; default true, `false` leaves the output out.
    pub per_head_alignment: Option<bool>,
    /// Compression of this component, as the CLI flags say it (the same type, names and
    /// defaults); absent = fp16.
    pub compress: Option<CompressFlags>,
    /// A compressed encoder or decoder: `export --recipe --calibrate-on` also measures each
    /// compressed weight's end-metric sensitivity curve at these widths (as `milkit calibrate
    /// --sensitivity-recipe` does), so that a mixed plan (`target_bits`) allocates its bits
    /// by it. Costs one pass over the statistics clips per weight and width.
    pub sensitivity_widths: Option<Vec<u32>>,
}

fn default_abi() -> String {
    "whisperkit".into()
}

fn default_target() -> String {
    "ios18".into()
}

impl Recipe {
    pub fn from_file(path: &Path) -> Result<Recipe> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read recipe {}", path.display()))?;
        let r: Recipe = toml::from_str(&text)
            .with_context(|| format!("{}: not a valid recipe", path.display()))?;
        if r.target.as_ref().is_some_and(QualityTarget::is_empty) {
            bail!("{}: the [target] table sets no bound", path.display());
        }
        if r.components.is_empty() {
            bail!("{}: the recipe lists no [[component]]", path.display());
        }
        for c in &r.components {
            if c.file.contains('/') || c.file.contains("..") || c.file.is_empty() {
                bail!(
                    "{}: component file `{}` must be a plain file name",
                    path.display(),
                    c.file
                );
            }
        }
        Ok(r)
    }
}

/// A deployment target by name: ios15..ios18 or macos12..macos15.
pub fn parse_target(s: &str) -> Result<Opset> {
    match Opset::from_target_name(s) {
        Some(o) => Ok(o),
        None => {
            bail!("unknown target `{s}`: use ios15, ios16, ios17 or ios18 (or macos12..macos15)")
        }
    }
}

/// The build specs of a recipe's components, checked before anything is built.
/// `calibration`: the `--calibration` files of the command line; each component takes the
/// one measured on it.
pub fn recipe_components(
    recipe: &Recipe,
    path: &Path,
    calibration: &[PathBuf],
) -> Result<Vec<(String, ComponentSpec)>> {
    let mut components = Vec::new();
    for c in &recipe.components {
        let component = Component::parse(&c.component)?;
        let compression = match &c.compress {
            None => None,
            Some(cc) => {
                let flags = CompressFlags {
                    calibration: calibration.to_vec(),
                    ..cc.clone()
                };
                // Statistics measured on the encoder serve the encoder, and so on.
                let measured_on = match component {
                    Component::Encoder => Some("encoder"),
                    Component::Decoder => Some("decoder"),
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
        let spec = ComponentSpec {
            component,
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
                per_head_alignment: c.per_head_alignment.unwrap_or(true),
            },
            compression,
        };
        components.push((c.file.clone(), spec));
    }
    Ok(components)
}
