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
    #[serde(rename = "component")]
    pub components: Vec<RecipeComponent>,
}

/// One package of the recipe.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecipeComponent {
    /// `encoder` (more components as milkit learns them).
    pub component: String,
    /// `whispercpp` or `whisperkit`.
    pub abi: String,
    /// Deployment target, default `ios18`.
    #[serde(default = "default_target")]
    pub target: String,
    /// File name of the package inside the output directory.
    pub file: String,
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
