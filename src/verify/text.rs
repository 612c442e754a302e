//! Human-readable `verify` output: checks, op histograms, compressed weights and what they
//! feed, the positional embedding, the ABI, predicted (and measured) placement, the receipt's
//! digests, and the verdict. By default a summary that fits a screen (compressed weights and
//! placement counted per kind and unit, only material ops off the Neural Engine named,
//! constant data in two lines, nothing a passed check already says);
//! `--verbose` lists every compressed weight, the constant data by storage kind, every
//! file's digest and every op's predicted unit.

use super::inspect::{grouped, histogram_text, weights_text};
use crate::report::{ComputeUnit, PlacementReport, PositionalStatus, VerifyReport, WeightSummary};
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

/// Predicted placement. The summary: per unit its ops and shares of the run-time FLOPs and
/// bytes, then every material op predicted off the Neural Engine
/// ([`super::placement::MATERIAL_SHARE`]) with the rules that sent it there. `verbose` adds
/// every op's row and the whole rule table with sources.
pub fn placement_text(out: &mut String, p: &PlacementReport, verbose: bool) {
    let measured_note = if p.measured.is_some() {
        "measured units below"
    } else {
        "not measured"
    };
    let what = if verbose {
        "every op below"
    } else {
        "--verbose lists every op"
    };
    let _ = writeln!(
        out,
        "  placement, predicted from documented rules ({measured_note}; {what}); shares of run-time FLOPs / bytes:"
    );
    // The summary leaves out units no op is predicted on ("off the ANE" says so below).
    for t in p.totals.iter().filter(|t| verbose || t.ops > 0) {
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
    let (material, minor) = super::placement::off_ane(p);
    let pct = 100.0 * super::placement::MATERIAL_SHARE;
    if material.is_empty() && minor == 0 {
        let _ = writeln!(out, "  off the ANE: nothing");
    } else {
        let _ = writeln!(
            out,
            "  off the ANE: {} op(s) at ≥ {pct} % of their function's FLOPs or bytes (or of unknown shape){}",
            material.len(),
            if minor > 0 {
                format!(", {minor} smaller one(s) not named")
            } else {
                String::new()
            }
        );
        for o in &material {
            let _ = writeln!(
                out,
                "    {:<4} {:<20} {:<36} {:>10}FLOP ({:5.1}%) {:>10}B ({:5.1}%)  [{}]",
                o.row.unit.label(),
                o.row.op_type,
                o.row.name,
                si(o.row.flops),
                100.0 * o.flops_share,
                si(o.row.bytes),
                100.0 * o.bytes_share,
                o.deciding.join(", ")
            );
        }
        // What each named rule says, once.
        let mut named: Vec<&str> = Vec::new();
        for o in &material {
            for id in &o.deciding {
                if !named.contains(&id.as_str()) {
                    named.push(id);
                }
            }
        }
        for id in named {
            if let Some(r) = p.rules.iter().find(|r| r.id == id) {
                let _ = writeln!(out, "    rule {}: {}", r.id, r.statement);
            }
        }
    }
    if !verbose {
        return;
    }
    let _ = writeln!(
        out,
        "  every op (load-time constants counted above, listed in --json):"
    );
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
    let _ = writeln!(out, "  rules:");
    for r in &p.rules {
        let _ = writeln!(
            out,
            "    {:<20} → {:<9} {} (source: {})",
            r.id, r.effect, r.statement, r.source
        );
    }
}

/// Constant data in two lines: the total with each storage kind's bytes and tensors, and
/// the compression of the compressed weights (`weights_text` is the table).
fn weights_lines(out: &mut String, w: &WeightSummary) {
    let kinds: Vec<String> = w
        .by_storage
        .iter()
        .enumerate()
        .map(|(i, (k, s))| {
            let unit = if i == 0 { " tensors" } else { "" };
            format!("{k} {} ({}{unit})", grouped(s.bytes), s.tensors)
        })
        .collect();
    let _ = writeln!(
        out,
        "  constant data: {} bytes: {}",
        grouped(w.total_bytes),
        kinds.join(", ")
    );
    if let Some(r) = w.compression_ratio {
        let _ = writeln!(
            out,
            "  compression: {} bytes stored for {} bytes of dense fp16 = {r:.2}x",
            grouped(w.compressed_stored_bytes),
            grouped(w.compressed_dense_fp16_bytes)
        );
    }
}

/// Human-readable verify output: a summary; `verbose` also lists every compressed weight and
/// every op's predicted placement.
pub fn format_verify(r: &VerifyReport, verbose: bool) -> String {
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
        constexpr_text(&mut out, r, verbose);
    }
    if verbose {
        weights_text(&mut out, &m.weights);
    } else {
        weights_lines(&mut out, &m.weights);
    }
    // What a passed check already says (positional embedding, ABI) is repeated only with
    // `verbose`.
    let checked = |name: &str| !verbose && r.checks.iter().any(|c| c.name == name && c.ok);
    let pe = &r.positional_embedding;
    let entry = |e: &crate::report::PositionalEntry| {
        format!("{} `{}` {} {:?}", e.op_type, e.name, e.dtype, e.shape)
    };
    match pe.entries.as_slice() {
        _ if checked("positional_embedding") => {}
        [one] => {
            let _ = writeln!(
                out,
                "  positional embedding: {} ({})",
                positional_status(pe.status),
                entry(one)
            );
        }
        entries => {
            let _ = writeln!(
                out,
                "  positional embedding: {}",
                positional_status(pe.status)
            );
            for e in entries {
                let _ = writeln!(out, "    {}", entry(e));
            }
        }
    }
    if let Some(a) = r.abi.as_ref().filter(|a| !(a.ok && checked("abi"))) {
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
        placement_text(&mut out, p, verbose);
    }
    let d = &r.receipt.digests;
    if verbose {
        let _ = writeln!(out, "  sha256 model.mlmodel {}", d.model_mlmodel);
        let _ = writeln!(
            out,
            "  sha256 weight.bin    {}",
            d.weight_bin.as_deref().unwrap_or("(none)")
        );
    }
    let _ = writeln!(
        out,
        "  sha256 package       {} ({} files, {} bytes; milkit {})",
        d.package,
        m.files.len(),
        grouped(m.total_file_bytes),
        r.receipt.version
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

/// The compressed weights: counts by op type, storage and consumer, every unused one by name;
/// `verbose`: every one with its shape and the ops it feeds.
fn constexpr_text(out: &mut String, r: &VerifyReport, verbose: bool) {
    let counts: Vec<String> = r
        .constexpr
        .counts
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    if !verbose {
        let mut storage: std::collections::BTreeMap<&str, usize> = Default::default();
        let mut feeds: std::collections::BTreeMap<&str, usize> = Default::default();
        for c in &r.constexpr.ops {
            *storage.entry(c.storage.as_str()).or_default() += 1;
            for f in &c.feeds {
                *feeds.entry(f.op_type.as_str()).or_default() += 1;
            }
        }
        let list = |m: &std::collections::BTreeMap<&str, usize>| {
            m.iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = writeln!(
            out,
            "  compressed weights: {} ({}) feeding {}",
            counts.join(", "),
            list(&storage),
            if feeds.is_empty() {
                "nothing".to_string()
            } else {
                list(&feeds)
            }
        );
        for c in r.constexpr.ops.iter().filter(|c| c.feeds.is_empty()) {
            let _ = writeln!(out, "    {:<8} {} (unused)", c.storage, c.name);
        }
        return;
    }
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
