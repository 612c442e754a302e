//! Conversion recipes (`models/*.toml`): which components to export, with which ABI, target
//! and compression, written as files of one output directory.

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::path::Path;

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
    /// Decoder: also output each alignment head's cross-attention row (for word timings).
    #[serde(default)]
    pub per_head_alignment: bool,
    /// Compression of this component; absent = fp16.
    pub compress: Option<RecipeCompression>,
}

/// Compression settings, in the vocabulary of the CLI flags.
#[derive(Clone, Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RecipeCompression {
    pub palettize: Option<String>,
    pub nbits: Option<u32>,
    pub quantize: Option<String>,
    pub granularity: Option<String>,
    pub group_size: Option<usize>,
    pub block_size: Option<usize>,
    #[serde(default)]
    pub asymmetric: bool,
    pub op_types: Option<Vec<String>>,
    pub op_names: Option<Vec<String>>,
    pub weight_threshold: Option<usize>,
    #[serde(default)]
    pub skip_indivisible: bool,
    /// Decoder: compress only the vocabulary head (one op per head chunk).
    #[serde(default)]
    pub head_only: bool,
    /// Palettization: a per-output-channel fp16 scale before the tables (iOS18).
    #[serde(default)]
    pub per_channel_scale: bool,
    /// Grouped-channel palettization: reorder MLP hidden channels so rows sharing a table
    /// are alike (outlier-aware grouping; function-preserving).
    #[serde(default)]
    pub outlier_grouping: bool,
    /// Mixed precision: an average-bits budget over the component's selected weights (each
    /// weight at 2/3/4/6/8 bits, chosen on the `--calibration` statistics measured on this
    /// component when given).
    pub target_bits: Option<f64>,
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
