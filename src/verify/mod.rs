//! Verification as report data: op counts per function, type re-inference, opset
//! availability, compressed weights and their bytes, the positional-embedding check, the I/O
//! ABI check, predicted placement, receipts (digests), `inspect` and MIL text. Findings are
//! values in a [`VerifyReport`], never errors; only an unreadable package is an error.
//!
//! The analysis modules use `ir`, `ops` and `report` only. [`cli`] (argument structs and the
//! `verify` / `compile` / `inspect` commands) also uses `package` and `proto` to load packages;
//! it and [`coreml`] (xcrun) are the only parts that touch the outside world.

pub mod abi;
pub mod analysis;
pub mod cli;
pub mod coreml;
pub mod digest;
pub mod inspect;
pub mod mil_text;
pub mod placement;
pub mod text;

pub use abi::{check_abi, AbiKind};
pub use inspect::{format_inspect, inspect};
pub use mil_text::print_mil;
pub use text::format_verify;

use crate::ir::Model;
use crate::report::{Check, PositionalStatus, Receipt, VerifyReport};
use std::path::Path;

/// What to check beyond the checks that always run.
#[derive(Clone, Debug, Default)]
pub struct VerifyOptions {
    /// Expected number of `constexpr_lut_to_dense` ops (all functions).
    pub expect_lut_ops: Option<u64>,
    /// Expected (op type, count) pairs (all functions).
    pub expect_ops: Vec<(String, u64)>,
    pub expect_abi: Option<AbiKind>,
    /// Add the predicted placement.
    pub placement: bool,
}

fn check(name: &str, ok: bool, expected: impl Into<String>, actual: impl Into<String>) -> Check {
    Check {
        name: name.to_string(),
        ok,
        expected: expected.into(),
        actual: actual.into(),
    }
}

/// Verifies a model. `pkg_path` is where it was loaded from (for file sizes) and `receipt` its
/// digests (see [`digest::receipt`]). Always-on checks: types re-infer to the declared ones,
/// every op exists in its function's opset, function opsets fit the specification version, the
/// positional embedding (if any) is a plain fp16 const.
pub fn verify_model(
    model: &Model,
    pkg_path: &Path,
    opts: &VerifyOptions,
    receipt: Receipt,
) -> VerifyReport {
    let report = inspect(model, pkg_path);
    let consts = analysis::constant_data(model);
    let violations = analysis::opset_violations(model);
    let positional = analysis::positional_embedding(model);
    let mut checks = Vec::new();

    let type_problems = analysis::reinfer_types(model);
    checks.push(check(
        "types_reinferred",
        type_problems.is_empty(),
        "every op's inferred output types equal the declared types",
        if type_problems.is_empty() {
            "all equal".to_string()
        } else {
            type_problems.join("; ")
        },
    ));
    let opset_list: Vec<String> = report
        .functions
        .iter()
        .map(|f| format!("{} {}", f.name, f.opset))
        .collect();
    checks.push(check(
        "opset",
        violations.is_empty(),
        format!(
            "every op exists in its function's opset ({})",
            opset_list.join(", ")
        ),
        if violations.is_empty() {
            "all ops available".to_string()
        } else {
            violations
                .iter()
                .map(|v| match &v.available_since {
                    Some(s) => format!(
                        "`{}` ({}) is not in {} (needs {s})",
                        v.op_type, v.name, v.opset
                    ),
                    None => format!("`{}` ({}) is not a known op", v.op_type, v.name),
                })
                .collect::<Vec<_>>()
                .join("; ")
        },
    ));
    let spec = analysis::spec_version_problems(model);
    checks.push(check(
        "spec_version",
        spec.is_empty(),
        format!(
            "function opsets need at most specification version {}",
            model.spec_version
        ),
        if spec.is_empty() {
            "fits".to_string()
        } else {
            spec.join("; ")
        },
    ));
    let names: Vec<String> = positional
        .entries
        .iter()
        .map(|e| format!("{} {} ({})", e.op_type, e.name, e.dtype))
        .collect();
    checks.push(check(
        "positional_embedding",
        !matches!(
            positional.status,
            PositionalStatus::Compressed | PositionalStatus::NotFp16
        ),
        "positional embedding, if present, is a plain fp16 const",
        match positional.status {
            PositionalStatus::Absent => "none present".to_string(),
            s => format!("{}: {}", text::positional_status(s), names.join(", ")),
        },
    ));

    let abi = opts.expect_abi.map(|k| check_abi(&model.description, k));
    if let Some(a) = &abi {
        checks.push(check(
            "abi",
            a.ok,
            format!(
                "{} {} ABI",
                a.expected,
                a.component.as_deref().unwrap_or("encoder or decoder")
            ),
            if a.ok {
                "matches".to_string()
            } else {
                a.problems.join("; ")
            },
        ));
    }
    if let Some(n) = opts.expect_lut_ops {
        let got = analysis::count_ops(&report.functions, "constexpr_lut_to_dense");
        checks.push(check(
            "lut_ops",
            got == n,
            format!("{n} constexpr_lut_to_dense"),
            format!("{got}"),
        ));
    }
    for (t, n) in &opts.expect_ops {
        let got = analysis::count_ops(&report.functions, t);
        checks.push(check(
            &format!("ops.{t}"),
            got == *n,
            format!("{n} {t}"),
            format!("{got}"),
        ));
    }

    let mismatches: Vec<String> = checks
        .iter()
        .filter(|c| !c.ok)
        .map(|c| format!("{}: expected {}, got {}", c.name, c.expected, c.actual))
        .collect();
    VerifyReport {
        ok: mismatches.is_empty(),
        mismatches,
        checks,
        model: report,
        opset_violations: violations,
        constexpr: consts.constexpr,
        positional_embedding: positional,
        abi,
        placement: opts.placement.then(|| placement::predict(model)),
        receipt,
    }
}
