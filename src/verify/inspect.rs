//! `inspect`: what a package holds (specification version, opset, I/O features, states, op
//! histograms, constant bytes by storage kind, file sizes) as report data and as text.

use super::analysis::{constant_data, histograms};
use super::digest::file_sizes;
use crate::ir::{Feature, Model, Opset, ShapeFlex};
use crate::report::{FunctionOps, InspectReport, TensorInfo, WeightSummary};
use std::fmt::Write;
use std::path::Path;

pub fn tensor_info(f: &Feature) -> TensorInfo {
    let dims = |s: &[usize]| s.iter().map(|&d| d as u64).collect::<Vec<_>>();
    TensorInfo {
        name: f.name.clone(),
        dtype: f.type_name(),
        shape: dims(&f.shape),
        shape_range: match &f.flex {
            ShapeFlex::Ranges(r) => Some(
                r.iter()
                    .map(|&(lo, hi)| (lo as u64, hi.map_or(-1, |h| h as i64)))
                    .collect(),
            ),
            _ => None,
        },
        enumerated_shapes: match &f.flex {
            ShapeFlex::Enumerated(s) => Some(s.iter().map(|s| dims(s)).collect()),
            _ => None,
        },
    }
}

/// Inspects a loaded model; `pkg_path` is the package directory it came from (for file sizes;
/// files that cannot be read are left out).
pub fn inspect(model: &Model, pkg_path: &Path) -> InspectReport {
    let opset = model
        .program
        .functions
        .values()
        .map(|f| f.opset)
        .max()
        .or_else(|| Opset::from_spec_version(model.spec_version));
    let d = &model.description;
    let files = file_sizes(pkg_path);
    InspectReport {
        package: pkg_path.display().to_string(),
        spec_version: model.spec_version,
        opset: opset
            .map(|o| o.opset_name().to_string())
            .unwrap_or_default(),
        target: opset
            .map(|o| o.target_name().to_string())
            .unwrap_or_default(),
        inputs: d.inputs.iter().map(tensor_info).collect(),
        outputs: d.outputs.iter().map(tensor_info).collect(),
        states: d.states.iter().map(tensor_info).collect(),
        short_description: d.short_description.clone(),
        user_defined: d.user_defined.clone(),
        functions: histograms(model),
        weights: constant_data(model).weights,
        total_file_bytes: files.iter().map(|f| f.bytes).sum(),
        files,
    }
}

/// `12345678` → `12,345,678`.
pub fn grouped(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn features(out: &mut String, label: &str, list: &[TensorInfo]) {
    if list.is_empty() {
        let _ = writeln!(out, "  {label}: none");
        return;
    }
    let _ = writeln!(out, "  {label}:");
    let list_dims = |s: &[u64]| {
        s.iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    for t in list {
        let mut flex = String::new();
        if let Some(r) = &t.shape_range {
            let dims: Vec<String> = r
                .iter()
                .map(|&(lo, hi)| match hi {
                    -1 => format!("{lo}.."),
                    hi if hi == lo as i64 => lo.to_string(),
                    hi => format!("{lo}..={hi}"),
                })
                .collect();
            flex = format!("  accepts [{}]", dims.join(", "));
        }
        if let Some(e) = &t.enumerated_shapes {
            let shapes: Vec<String> = e.iter().map(|s| format!("[{}]", list_dims(s))).collect();
            flex = format!("  accepts {}", shapes.join(" | "));
        }
        let _ = writeln!(
            out,
            "    {:<28} {:<6} [{}]{flex}",
            t.name,
            t.dtype,
            list_dims(&t.shape)
        );
    }
}

/// `add 9, cast 2, ...` per function.
pub fn histogram_text(out: &mut String, functions: &[FunctionOps]) {
    for f in functions {
        let _ = writeln!(
            out,
            "  function {} ({}): {} ops",
            f.name, f.opset, f.total_ops
        );
        let items: Vec<String> = f.ops.iter().map(|(k, v)| format!("{k} {v}")).collect();
        // Wrap at about 100 columns.
        let mut line = String::from("   ");
        for it in items {
            if line.len() + it.len() + 2 > 100 {
                let _ = writeln!(out, "{}", line.trim_end_matches(','));
                line = String::from("   ");
            }
            line.push(' ');
            line.push_str(&it);
            line.push(',');
        }
        let _ = writeln!(out, "{}", line.trim_end_matches(','));
    }
}

pub fn weights_text(out: &mut String, w: &WeightSummary) {
    let _ = writeln!(out, "  constant data by storage kind:");
    for (k, s) in &w.by_storage {
        let _ = writeln!(
            out,
            "    {:<16} {:>6} tensors {:>16} bytes",
            k,
            s.tensors,
            grouped(s.bytes)
        );
    }
    let _ = writeln!(
        out,
        "    {:<16} {:>6}         {:>16} bytes",
        "total",
        "",
        grouped(w.total_bytes)
    );
    match w.compression_ratio {
        Some(r) => {
            let _ = writeln!(
                out,
                "    compressed weights: {} bytes stored for {} bytes of dense fp16 = {r:.2}x",
                grouped(w.compressed_stored_bytes),
                grouped(w.compressed_dense_fp16_bytes)
            );
        }
        None => {
            let _ = writeln!(out, "    no compressed (constexpr) weights");
        }
    }
}

/// Human-readable inspect output.
pub fn format_inspect(r: &InspectReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", r.package);
    let _ = writeln!(
        out,
        "  specification version {}, opset {} ({})",
        r.spec_version, r.opset, r.target
    );
    if !r.short_description.is_empty() {
        let _ = writeln!(out, "  description: {}", r.short_description);
    }
    for (k, v) in &r.user_defined {
        let _ = writeln!(out, "  {k}: {v}");
    }
    features(&mut out, "inputs", &r.inputs);
    features(&mut out, "outputs", &r.outputs);
    features(&mut out, "states", &r.states);
    histogram_text(&mut out, &r.functions);
    weights_text(&mut out, &r.weights);
    let _ = writeln!(out, "  files:");
    for f in &r.files {
        let _ = writeln!(out, "    {:<52} {:>16} bytes", f.path, grouped(f.bytes));
    }
    let _ = writeln!(
        out,
        "    {:<52} {:>16} bytes",
        "total",
        grouped(r.total_file_bytes)
    );
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn grouping() {
        assert_eq!(super::grouped(0), "0");
        assert_eq!(super::grouped(999), "999");
        assert_eq!(super::grouped(1000), "1,000");
        assert_eq!(super::grouped(16421952), "16,421,952");
    }
}
