//! Human-readable `verify` output: checks, op histograms, compressed weights and what they
//! feed, the positional embedding, the ABI, predicted (and measured) placement, the receipt's
//! digests, and the verdict.

use super::inspect::{grouped, histogram_text, weights_text};
use crate::report::{ComputeUnit, PlacementReport, PositionalStatus, VerifyReport};
use std::fmt::Write;

pub fn positional_status(s: PositionalStatus) -> &'static str {
    match s {
        PositionalStatus::Untouched => "untouched",
        PositionalStatus::Compressed => "compressed",
        PositionalStatus::NotFp16 => "not_fp16",
        PositionalStatus::Absent => "absent",
    }
}

/// `1234567` FLOPs → `1.23 M`.
pub fn si(x: u64) -> String {
    let v = x as f64;
    if v >= 1e9 {
        format!("{:.2} G", v / 1e9)
    } else if v >= 1e6 {
        format!("{:.2} M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.2} k", v / 1e3)
    } else {
        format!("{x} ")
    }
}

pub fn placement_text(out: &mut String, p: &PlacementReport) {
    let _ = writeln!(out, "  placement (predicted from documented rules, not measured unless a measured column is shown):");
    // Load-time rows (constants) are counted in the totals; the JSON report lists them.
    for r in p
        .ops
        .iter()
        .filter(|r| r.unit != ComputeUnit::LoadTime || r.measured.is_some())
    {
        let measured = match &r.measured {
            Some(m) => format!("  measured {:<4}", m.preferred),
            None => String::new(),
        };
        let _ = writeln!(
            out,
            "    predicted {:<9}{measured} {:<24} {:<40} {:>10}FLOP {:>10}B  [{}]",
            r.unit.label(),
            r.op_type,
            r.name,
            si(r.flops),
            si(r.bytes),
            r.rules.join(", ")
        );
    }
    let _ = writeln!(
        out,
        "  predicted totals (shares of run-time FLOPs / bytes):"
    );
    for t in &p.totals {
        if t.unit == ComputeUnit::LoadTime {
            let _ = writeln!(
                out,
                "    {:<9} {:>6} ops (materialised at load)",
                t.unit.label(),
                t.ops
            );
        } else {
            let _ = writeln!(
                out,
                "    {:<9} {:>6} ops {:>10}FLOP ({:5.1}%) {:>10}B ({:5.1}%)",
                t.unit.label(),
                t.ops,
                si(t.flops),
                100.0 * t.flops_share,
                si(t.bytes),
                100.0 * t.bytes_share
            );
        }
    }
    if let Some(m) = &p.measured {
        let _ = writeln!(
            out,
            "  measured by {}: {} ops matched, {} agree, {} disagree, {} unmatched",
            m.source, m.matched_ops, m.agree, m.disagree, m.unmatched
        );
    }
    let _ = writeln!(out, "  rules:");
    for r in &p.rules {
        let _ = writeln!(
            out,
            "    {:<20} → {:<9} {} (source: {})",
            r.id, r.effect, r.statement, r.source
        );
    }
}

/// Human-readable verify output.
pub fn format_verify(r: &VerifyReport) -> String {
    let mut out = String::new();
    let m = &r.model;
    let _ = writeln!(out, "verify {}", m.package);
    let _ = writeln!(
        out,
        "  specification version {}, opset {} ({})",
        m.spec_version, m.opset, m.target
    );
    if let Some(p) = m.user_defined.get(crate::ir::HEAD_PADDING_KEY) {
        let _ = writeln!(out, "  vocabulary head padded: {p}");
    }
    let _ = writeln!(out, "  checks:");
    for c in &r.checks {
        let mark = if c.ok { "ok  " } else { "FAIL" };
        let _ = writeln!(
            out,
            "    {mark} {:<22} expected {}; got {}",
            c.name, c.expected, c.actual
        );
    }
    histogram_text(&mut out, &m.functions);
    if !r.constexpr.ops.is_empty() {
        let counts: Vec<String> = r
            .constexpr
            .counts
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        let _ = writeln!(out, "  compressed weights: {}", counts.join(", "));
        for c in &r.constexpr.ops {
            let feeds: Vec<String> = c
                .feeds
                .iter()
                .map(|f| format!("{} `{}`", f.op_type, f.name))
                .collect();
            let shape: Vec<String> = c.output_shape.iter().map(|d| d.to_string()).collect();
            let _ = writeln!(
                out,
                "    {:<8} {} [{}] → {}",
                c.storage,
                c.name,
                shape.join(", "),
                if feeds.is_empty() {
                    "(unused)".to_string()
                } else {
                    feeds.join(", ")
                }
            );
        }
    }
    weights_text(&mut out, &m.weights);
    let pe = &r.positional_embedding;
    let _ = writeln!(
        out,
        "  positional embedding: {}",
        positional_status(pe.status)
    );
    for e in &pe.entries {
        let _ = writeln!(
            out,
            "    {} `{}` {} {:?}",
            e.op_type, e.name, e.dtype, e.shape
        );
    }
    if let Some(a) = &r.abi {
        let dims: Vec<String> = a.dims.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = writeln!(
            out,
            "  ABI {} ({}): {} {}",
            a.expected,
            a.component.as_deref().unwrap_or("unrecognised"),
            if a.ok { "ok" } else { "MISMATCH" },
            dims.join(" ")
        );
        for p in &a.problems {
            let _ = writeln!(out, "    - {p}");
        }
    }
    if let Some(p) = &r.placement {
        placement_text(&mut out, p);
    }
    let d = &r.receipt.digests;
    let _ = writeln!(out, "  sha256 model.mlmodel {}", d.model_mlmodel);
    let _ = writeln!(
        out,
        "  sha256 weight.bin    {}",
        d.weight_bin.as_deref().unwrap_or("(none)")
    );
    let _ = writeln!(out, "  sha256 package       {}", d.package);
    let _ = writeln!(
        out,
        "  milkit {}; {} files, {} bytes",
        r.receipt.version,
        m.files.len(),
        grouped(m.total_file_bytes)
    );
    if r.ok {
        let _ = writeln!(out, "OK: every check holds");
    } else {
        let _ = writeln!(out, "MISMATCH: {} check(s) failed:", r.mismatches.len());
        for x in &r.mismatches {
            let _ = writeln!(out, "  - {x}");
        }
    }
    out
}
