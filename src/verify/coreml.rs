//! Apple's tools, only where they exist: `xcrun coremlc compile` for `milkit compile`, and a
//! small Swift script asking Core ML's MLComputePlan (macOS 14.4+) where each op runs, for
//! `verify --placement --measured`. Without `xcrun` on PATH nothing here pretends: callers
//! print [`XCRUN_UNAVAILABLE`] and exit 2.

use crate::report::{MeasuredPlacement, MeasuredSummary, PlacementReport};
use anyhow::{anyhow, bail, ensure, Context, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What `compile` and `--measured` print when they cannot run.
pub const XCRUN_UNAVAILABLE: &str = "xcrun is unavailable (not on PATH): compiling a package and measuring placement need \
macOS with the Xcode command line tools (MLComputePlan needs macOS 14.4 or later); nothing was compiled or measured";

/// `xcrun` on PATH, if there is one.
pub fn find_xcrun() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("xcrun"))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    let Ok(m) = std::fs::metadata(p) else {
        return false;
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        m.is_file() && m.permissions().mode() & 0o111 != 0
    }
    #[cfg(not(unix))]
    {
        m.is_file()
    }
}

/// Runs `xcrun coremlc compile PKG TMP` and moves the produced `.mlmodelc` to `out`, replacing
/// an existing one only with `force`. Returns `out`.
pub fn compile_package(xcrun: &Path, pkg: &Path, out: &Path, force: bool) -> Result<PathBuf> {
    ensure!(pkg.is_dir(), "{} is not a package directory", pkg.display());
    if out.exists() && !force {
        bail!(
            "{} already exists; pass --force to replace it",
            out.display()
        );
    }
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent)
        .with_context(|| format!("cannot create {}", parent.display()))?;
    let tmp = parent.join(format!(".milkit-compile-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    let result = (|| -> Result<PathBuf> {
        let status = Command::new(xcrun)
            .args(["coremlc", "compile"])
            .arg(pkg)
            .arg(&tmp)
            .status()
            .with_context(|| format!("cannot run {} coremlc", xcrun.display()))?;
        ensure!(
            status.success(),
            "xcrun coremlc compile {} failed ({status})",
            pkg.display()
        );
        let produced = std::fs::read_dir(&tmp)
            .with_context(|| format!("cannot list {}", tmp.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|x| x == "mlmodelc"))
            .ok_or_else(|| anyhow!("coremlc produced no .mlmodelc in {}", tmp.display()))?;
        if out.exists() {
            std::fs::remove_dir_all(out)
                .with_context(|| format!("cannot remove the old {}", out.display()))?;
        }
        std::fs::rename(&produced, out)
            .with_context(|| format!("cannot move the compiled model to {}", out.display()))?;
        Ok(out.to_path_buf())
    })();
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

/// Swift script: compiles the package, loads MLComputePlan with all compute units, and prints
/// one JSON object per op: function, op_type, output (first output name), preferred device,
/// supported devices and MLComputePlan's relative cost.
pub const COMPUTE_PLAN_SWIFT: &str = r#"import CoreML
import Foundation

func fail(_ message: String, _ code: Int32) -> Never {
    FileHandle.standardError.write((message + "\n").data(using: .utf8)!)
    exit(code)
}

func quoted(_ s: String) -> String {
    let data = try! JSONSerialization.data(withJSONObject: [s], options: [])
    let text = String(data: data, encoding: .utf8)!
    return String(text.dropFirst().dropLast())
}

@available(macOS 14.4, *)
func deviceName(_ d: MLComputeDevice) -> String {
    switch d {
    case .cpu: return "CPU"
    case .gpu: return "GPU"
    case .neuralEngine: return "ANE"
    @unknown default: return "unknown"
    }
}

@available(macOS 14.4, *)
func report(_ plan: MLComputePlan, _ block: MLModelStructure.Program.Block, _ function: String) {
    for op in block.operations {
        let usage = plan.deviceUsage(for: op)
        let preferred = usage.map { deviceName($0.preferred) } ?? "none"
        let supported = (usage?.supported ?? []).map { quoted(deviceName($0)) }.joined(separator: ",")
        let cost = plan.estimatedCost(of: op).map { String($0.weight) } ?? "null"
        let output = op.outputs.first?.name ?? ""
        print("{\"function\":\(quoted(function)),\"op_type\":\(quoted(op.operatorName)),\"output\":\(quoted(output)),\"preferred\":\(quoted(preferred)),\"supported\":[\(supported)],\"cost\":\(cost)}")
        for b in op.blocks { report(plan, b, function) }
    }
}

guard CommandLine.arguments.count == 2 else { fail("usage: compute_plan.swift PACKAGE", 2) }
guard #available(macOS 14.4, *) else { fail("MLComputePlan needs macOS 14.4 or later", 4) }
do {
    let compiled = try await MLModel.compileModel(at: URL(fileURLWithPath: CommandLine.arguments[1]))
    let config = MLModelConfiguration()
    config.computeUnits = .all
    let plan = try await MLComputePlan.load(contentsOf: compiled, configuration: config)
    guard case let .program(program) = plan.modelStructure else { fail("the model is not an ML program", 3) }
    for (name, function) in program.functions { report(plan, function.block, name) }
} catch {
    fail("MLComputePlan failed: \(error)", 1)
}
"#;

/// Runs [`COMPUTE_PLAN_SWIFT`] with `xcrun swift` on a package; output → [`parse_plan_output`].
pub fn measure_placement(xcrun: &Path, pkg: &Path) -> Result<HashMap<String, MeasuredPlacement>> {
    let dir = tempfile_dir()?;
    let script = dir.join("compute_plan.swift");
    std::fs::write(&script, COMPUTE_PLAN_SWIFT)
        .with_context(|| format!("cannot write {}", script.display()))?;
    let out = Command::new(xcrun)
        .arg("swift")
        .arg(&script)
        .arg(pkg)
        .output();
    let _ = std::fs::remove_dir_all(&dir);
    let out = out.with_context(|| format!("cannot run {} swift", xcrun.display()))?;
    ensure!(
        out.status.success(),
        "the MLComputePlan script failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    parse_plan_output(&String::from_utf8_lossy(&out.stdout))
}

fn tempfile_dir() -> Result<PathBuf> {
    let d = std::env::temp_dir().join(format!("milkit-plan-{}", std::process::id()));
    std::fs::create_dir_all(&d).with_context(|| format!("cannot create {}", d.display()))?;
    Ok(d)
}

/// Parses the script's JSON lines into output name → measured placement.
pub fn parse_plan_output(stdout: &str) -> Result<HashMap<String, MeasuredPlacement>> {
    let mut map = HashMap::new();
    for (i, line) in stdout
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let v: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("MLComputePlan output line {}: not JSON", i + 1))?;
        let s = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_string);
        let output = s("output")
            .ok_or_else(|| anyhow!("MLComputePlan output line {}: no `output`", i + 1))?;
        if output.is_empty() {
            continue;
        }
        let supported = v
            .get("supported")
            .and_then(|x| x.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|d| d.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        map.insert(
            output,
            MeasuredPlacement {
                preferred: s("preferred").unwrap_or_else(|| "none".into()),
                supported,
                cost: v.get("cost").and_then(|x| x.as_f64()),
            },
        );
    }
    Ok(map)
}

/// Puts measured placements next to the predicted rows and counts agreement. Load-time rows
/// agree when MLComputePlan gives them no device.
pub fn attach_measured(
    report: &mut PlacementReport,
    measured: &HashMap<String, MeasuredPlacement>,
) {
    let (mut matched, mut agree, mut unmatched) = (0u64, 0u64, 0u64);
    for row in &mut report.ops {
        match measured.get(&row.output) {
            Some(m) => {
                matched += 1;
                let predicted = match row.unit {
                    crate::report::ComputeUnit::LoadTime => "none",
                    u => u.label(),
                };
                if m.preferred == predicted {
                    agree += 1;
                }
                row.measured = Some(m.clone());
            }
            None => unmatched += 1,
        }
    }
    report.measured = Some(MeasuredSummary {
        source: "MLComputePlan (Core ML, computeUnits = .all)".into(),
        matched_ops: matched,
        agree,
        disagree: matched - agree,
        unmatched,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plan_lines() {
        let text = "{\"function\":\"main\",\"op_type\":\"conv\",\"output\":\"y\",\"preferred\":\"ANE\",\"supported\":[\"CPU\",\"ANE\"],\"cost\":0.25}\n\
                    {\"function\":\"main\",\"op_type\":\"const\",\"output\":\"w\",\"preferred\":\"none\",\"supported\":[],\"cost\":null}\n";
        let m = parse_plan_output(text).unwrap();
        assert_eq!(m["y"].preferred, "ANE");
        assert_eq!(m["y"].supported, vec!["CPU", "ANE"]);
        assert_eq!(m["y"].cost, Some(0.25));
        assert_eq!(m["w"].cost, None);
        assert!(parse_plan_output("not json").is_err());
    }

    #[test]
    fn the_swift_script_prints_the_fields_the_parser_reads() {
        for k in [
            "\\\"function\\\"",
            "\\\"op_type\\\"",
            "\\\"output\\\"",
            "\\\"preferred\\\"",
            "\\\"supported\\\"",
            "\\\"cost\\\"",
        ] {
            assert!(COMPUTE_PLAN_SWIFT.contains(k), "{k}");
        }
        assert!(COMPUTE_PLAN_SWIFT.contains("MLComputePlan.load(contentsOf:"));
    }
}
