//! Bits per compressed weight of a models folder: for every package, the elements its
//! `constexpr_*` ops decompress to and the bytes they store (indices, look-up tables, scales,
//! offsets — everything the package keeps for them), and the folder's average
//! `8 × stored bytes ÷ elements` over all packages together. This is the number a
//! whole-model budget such as "≤ 4.25 bits per compressed weight" is stated in.

use crate::package::load_package;
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
    let elements = w.compressed_dense_fp16_bytes / 2;
    Ok(PackageBits {
        package: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        compressed_elements: elements,
        compressed_stored_bytes: w.compressed_stored_bytes,
        avg_bits: avg(w.compressed_stored_bytes, elements),
    })
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
