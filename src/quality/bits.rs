//! Bits per compressed weight of a models folder: for every package, the elements its
//! `constexpr_*` ops decompress to and the bytes they store (indices, look-up tables, scales,
//! offsets — everything the package keeps for them), and the folder's average
//! `8 × stored bytes ÷ elements` over all packages together. This is the number a
//! whole-model budget such as "≤ 4.25 bits per compressed weight" is stated in. Weights a
//! mixed plan selected and kept fp16 (named under `milkit.kept_fp16`) count as compressed
//! at 16 bits: they are part of the plan's budget.

use crate::ir::{Model, Value};
use crate::package::load_package;
use crate::passes::compress::KEPT_FP16_KEY;
use crate::transcribe::{component, components};
use crate::verify::analysis::constant_data;
use anyhow::{Context, Result};
use std::path::Path;

pub use crate::report::{FolderBits, PackageBits};

fn avg(bytes: u64, elements: u64) -> Option<f64> {
    (elements > 0).then(|| 8.0 * bytes as f64 / elements as f64)
}

/// Counts one package.
pub fn package_bits(path: &Path) -> Result<PackageBits> {
    let model = load_package(path).with_context(|| format!("reading {}", path.display()))?;
    let w = constant_data(&model).weights;
    // Dense fp16 bytes count only final constexpr outputs (a compressed table feeding a LUT
    // op is part of that op's storage), so half of them is the compressed element count.
    let kept = kept_fp16_elements(&model).with_context(|| format!("reading {}", path.display()))?;
    let elements = w.compressed_dense_fp16_bytes / 2 + kept;
    let stored = w.compressed_stored_bytes + 2 * kept;
    Ok(PackageBits {
        package: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        compressed_elements: elements,
        compressed_stored_bytes: stored,
        avg_bits: avg(stored, elements),
    })
}

/// Elements of the weights the package's mixed plan kept fp16 (`KEPT_FP16_KEY`); each name
/// must be a constant of the program.
fn kept_fp16_elements(model: &Model) -> Result<u64> {
    let Some(names) = model.description.user_defined.get(KEPT_FP16_KEY) else {
        return Ok(0);
    };
    let mut total = 0u64;
    for name in names.split(',').filter(|n| !n.is_empty()) {
        let t = model
            .program
            .functions
            .values()
            .flat_map(|f| &f.block.operations)
            .find(|op| op.name == name)
            .and_then(|op| match op.const_val() {
                Some(Value::Tensor(t)) => Some(t),
                _ => None,
            })
            .with_context(|| {
                format!("`{KEPT_FP16_KEY}` names `{name}`, which is no constant of the program")
            })?;
        total += t.num_elements() as u64;
    }
    Ok(total)
}

/// Counts every component directly inside `dir` (sorted by name): each `.mlpackage`, or
/// the compiled `.mlmodelc` where the package is absent.
pub fn folder_bits(dir: &Path) -> Result<FolderBits> {
    let paths: Vec<_> = components(dir)?
        .iter()
        .map(|name| component(dir, name))
        .collect();
    let packages = paths
        .iter()
        .map(|p| package_bits(p))
        .collect::<Result<Vec<_>>>()?;
    let compressed_elements = packages.iter().map(|p| p.compressed_elements).sum();
    let compressed_stored_bytes = packages.iter().map(|p| p.compressed_stored_bytes).sum();
    Ok(FolderBits {
        packages,
        compressed_elements,
        compressed_stored_bytes,
        avg_bits: avg(compressed_stored_bytes, compressed_elements),
    })
}

impl FolderBits {
    /// One line per compressed package and the folder total.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        for p in self.packages.iter().filter(|p| p.compressed_elements > 0) {
            s += &format!(
                "{:.3} bits/weight  {:>10} weights  {:>10} bytes  {}\n",
                p.avg_bits.unwrap_or(0.0),
                p.compressed_elements,
                p.compressed_stored_bytes,
                p.package
            );
        }
        match self.avg_bits {
            Some(b) => {
                s += &format!(
                    "{b:.3} bits per compressed weight over the folder ({} weights, {} bytes)\n",
                    self.compressed_elements, self.compressed_stored_bytes
                )
            }
            None => s += "no compressed weights in the folder\n",
        }
        s
    }
}
