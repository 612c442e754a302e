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
