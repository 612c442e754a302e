//! The `verify`, `compile` and `inspect` commands: clap argument structs `main.rs` embeds, and
//! run functions returning the exit code. `verify`: 0 when every check holds, 1 with the list
//! of mismatches, 2 when the package cannot be read (or `--measured` cannot run). `compile`: 0,
//! or 2 when xcrun is unavailable or compiling fails. `inspect`: 0, or 2.
//!
//! This and [`super::coreml`] are the only parts of `verify` that use `package` (to load).

use super::abi::AbiKind;
use super::coreml::{
    attach_measured, compile_package, find_xcrun, measure_placement, XCRUN_UNAVAILABLE,
};
use super::{
    digest, format_inspect, format_verify, inspect, print_mil, verify_model, VerifyOptions,
};
use crate::ir::Opset;
use crate::ops;
use crate::package::mil_write::{write_program, Dialect, OffsetCounter};
use crate::package::{compiled, load_package, manifest::read_package};
use crate::proto::specification as spec;
use crate::report::{InspectReport, VerifyReport};
use anyhow::Result;
use prost::Message;
use std::io::Write;
use std::path::{Path, PathBuf};

pub const EXIT_OK: i32 = 0;
pub const EXIT_MISMATCH: i32 = 1;
pub const EXIT_UNREADABLE: i32 = 2;

/// One `--expect-ops` item, `type=N`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpCount {
    pub op_type: String,
    pub count: u64,
}

pub fn parse_op_count(s: &str) -> Result<OpCount, String> {
    let (t, n) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}`: expected TYPE=COUNT, e.g. conv=2"))?;
    let t = t.trim();
    if t.is_empty() {
        return Err(format!("`{s}`: empty op type"));
    }
    let count = n
        .trim()
        .parse::<u64>()
        .map_err(|e| format!("`{s}`: count is not a number ({e})"))?;
    Ok(OpCount {
        op_type: t.to_string(),
        count,
    })
}

/// `milkit verify PKG [--expect-lut-ops N] [--expect-ops type=N,...] [--expect-abi ABI]
/// [--placement [--measured]] [--json] [--verbose]`
#[derive(clap::Args, Clone, Debug)]
pub struct VerifyArgs {
    /// The .mlpackage to verify.
    pub package: PathBuf,
    /// Expected number of constexpr_lut_to_dense ops (all functions).
    #[arg(long, value_name = "N")]
    pub expect_lut_ops: Option<u64>,
    /// Expected op counts, TYPE=N, comma-separated or repeated (all functions).
    #[arg(long, value_name = "TYPE=N", value_delimiter = ',', value_parser = parse_op_count)]
    pub expect_ops: Vec<OpCount>,
    /// The I/O interface the package must present.
    #[arg(long, value_enum, value_name = "ABI")]
    pub expect_abi: Option<AbiKind>,
    /// Predict the compute unit of every op. Prints a summary: per unit (ANE, GPU, CPU) that
    /// has ops, its ops and shares of the run-time FLOPs and bytes, then every material op predicted off the
    /// Neural Engine by name with the rule that sent it there. Material: at least 0.1 % of its
    /// function's run-time FLOPs or bytes, or of unknown shape (no cost estimate); smaller
    /// ones are counted, not named. --verbose lists every op; --json has every op's row.
    #[arg(long)]
    pub placement: bool,
    /// Also ask Core ML's MLComputePlan (macOS 14.4+, needs xcrun); implies --placement.
    #[arg(long)]
    pub measured: bool,
    /// Print the JSON receipt (schemas/verify.schema.json) instead of text.
    #[arg(long)]
    pub json: bool,
    /// List every compressed weight with the ops it feeds, the digest of each file besides the
    /// package's and, with --placement, every unit (those with no ops too), every op's
    /// predicted unit and the rule table with sources (the default prints summaries).
    #[arg(long, short)]
    pub verbose: bool,
}

impl VerifyArgs {
    /// Arguments for verifying `package` with no expectations.
    pub fn new(package: impl Into<PathBuf>) -> VerifyArgs {
        VerifyArgs {
            package: package.into(),
            expect_lut_ops: None,
            expect_ops: vec![],
            expect_abi: None,
            placement: false,
            measured: false,
            json: false,
            verbose: false,
        }
    }
    pub fn options(&self) -> VerifyOptions {
        VerifyOptions {
            expect_lut_ops: self.expect_lut_ops,
            expect_ops: self
                .expect_ops
                .iter()
                .map(|o| (o.op_type.clone(), o.count))
                .collect(),
            expect_abi: self.expect_abi,
            placement: self.placement || self.measured,
        }
    }
}

/// `milkit compile PKG --out DIR.mlmodelc [--force]`
#[derive(clap::Args, Clone, Debug)]
pub struct CompileArgs {
    /// The .mlpackage to compile.
    pub package: PathBuf,
    /// Where the compiled model goes (a `.mlmodelc` directory).
    #[arg(long, value_name = "DIR.mlmodelc")]
    pub out: PathBuf,
    /// Replace an existing output.
    #[arg(long)]
    pub force: bool,
}

/// `milkit inspect PKG [--json] [--mil]`
#[derive(clap::Args, Clone, Debug)]
pub struct InspectArgs {
    /// The .mlpackage to inspect.
    pub package: PathBuf,
    /// Print the JSON report (schemas/inspect.schema.json).
    #[arg(long)]
    pub json: bool,
    /// Print the program as MIL text.
    #[arg(long)]
    pub mil: bool,
    /// Print the program as Apple's model.mil text (what a compiled model holds):
    /// program(1.3) for iOS17 and later, program(1.0) before; large constants as BLOBFILE
    /// references at the offsets `milkit convert --out X.mlmodelc` gives them.
    #[arg(long)]
    pub model_mil: bool,
}

/// A package, or a compiled `.mlmodelc` folder, opened for inspection or verification: a
/// compiled model whose weights are absent still opens (its notes say so).
pub struct Opened {
    pub model: crate::ir::Model,
    /// What the reader had to say: a compiled model's absent weights, and where its
    /// `metadata.json` and program disagree.
    pub notes: Vec<String>,
    model_file: PathBuf,
    weights_file: Option<PathBuf>,
}

/// Opens a package or a compiled model for reading (absent weights allowed).
pub fn open_model(path: &Path) -> Result<Opened> {
    if compiled::is_compiled(path) {
        let c = compiled::open_compiled(path)?;
        let mut notes = vec![format!(
            "compiled model: program read from model.mil (printer dialect program({}))",
            c.dialect
        )];
        if let Some(why) = &c.weights_absent {
            notes.push(format!(
                "the weights are absent ({why}): op counts, types and the interface are \
                 checked, weight values are not; `run` refuses this model"
            ));
        }
        notes.extend(c.warnings.iter().map(|w| format!("warning: {w}")));
        notes.extend(c.notes.iter().map(|n| format!("{n} (the program wins)")));
        return Ok(Opened {
            model: c.model,
            notes,
            model_file: c.program_file,
            weights_file: Some(c.weights_file),
        });
    }
    let model = load_package(path)?;
    if path.is_file() {
        // A single-file `.mlmodel`: every weight is inline.
        return Ok(Opened {
            model,
            notes: vec![],
            model_file: path.to_path_buf(),
            weights_file: None,
        });
    }
    let layout = read_package(path)?;
    Ok(Opened {
        model,
        notes: vec![],
        model_file: layout.model,
        weights_file: layout.weights_dir.as_ref().map(|d| d.join("weight.bin")),
    })
}

/// Loads and verifies a package; errors only when it cannot be read.
pub fn verify_package(
    path: &Path,
    opts: &VerifyOptions,
    command_line: &[String],
) -> Result<VerifyReport> {
    Ok(verify_opened(path, opts, command_line)?.0)
}

fn verify_opened(
    path: &Path,
    opts: &VerifyOptions,
    command_line: &[String],
) -> Result<(VerifyReport, Vec<String>)> {
    let o = open_model(path)?;
    let receipt = digest::receipt(path, &o.model_file, o.weights_file.as_deref(), command_line)?;
    Ok((verify_model(&o.model, path, opts, receipt), o.notes))
}

/// Loads a package and inspects it.
pub fn inspect_package(path: &Path) -> Result<(crate::ir::Model, InspectReport)> {
    let o = open_model(path)?;
    let report = inspect(&o.model, path);
    Ok((o.model, report))
}

/// The notes of an opened model as text lines, empty when there are none.
fn notes_text(notes: &[String]) -> String {
    if notes.is_empty() {
        return String::new();
    }
    let mut s = "  notes:\n".to_string();
    for n in notes {
        s += &format!("    - {n}\n");
    }
    s
}

/// Prints an error with its context chain, one cause per line.
pub fn print_error(err: &mut dyn Write, what: &str, e: &anyhow::Error) {
    let _ = writeln!(err, "error: {what}: {e}");
    for cause in e.chain().skip(1) {
        let _ = writeln!(err, "  caused by: {cause}");
    }
}

/// When a package does not load, lists from the raw program every op that its function's
/// opset (or the specification version) lacks, so that failure is named clearly even though
/// the loader stops at the first. `None` when the raw program cannot be read either.
pub fn raw_opset_findings(path: &Path) -> Option<Vec<String>> {
    let layout = read_package(path).ok()?;
    let bytes = std::fs::read(&layout.model).ok()?;
    let m = spec::Model::decode(bytes.as_slice()).ok()?;
    let Some(spec::model::Type::MlProgram(p)) = &m.r#type else {
        return None;
    };
    let max = Opset::from_spec_version(m.specification_version);
    let mut out = Vec::new();
    for (fname, f) in &p.functions {
        let Some(opset) = Opset::from_opset_name(&f.opset) else {
            out.push(format!("function `{fname}`: unknown opset `{}`", f.opset));
            continue;
        };
        if max.is_none_or(|mx| opset > mx) {
            out.push(format!(
                "function `{fname}`: opset {} needs specification version {}, the package declares {}",
                f.opset,
                opset.spec_version(),
                m.specification_version
            ));
        }
        let mut stack: Vec<&crate::proto::mil::Block> = f.block_specializations.values().collect();
        while let Some(b) = stack.pop() {
            for op in &b.operations {
                stack.extend(op.blocks.iter());
                if ops::lookup(&op.r#type, opset).is_some() {
                    continue;
                }
                let label = op.outputs.first().map(|o| o.name.as_str()).unwrap_or("?");
                out.push(match ops::earliest(&op.r#type) {
                    Some(d) => format!(
                        "op `{}` (output `{label}`) is not in opset {} ({}, specification {}) of function `{fname}`: it needs {} ({}) or later",
                        op.r#type,
                        opset.opset_name(),
                        opset.target_name(),
                        m.specification_version,
                        d.since.opset_name(),
                        d.since.target_name()
                    ),
                    None => format!("op `{}` (output `{label}`) is not an op milkit knows", op.r#type),
                });
            }
        }
    }
    Some(out)
}

fn unreadable(err: &mut dyn Write, path: &Path, e: &anyhow::Error) -> i32 {
    print_error(err, &format!("cannot read package {}", path.display()), e);
    if let Some(findings) = raw_opset_findings(path).filter(|f| !f.is_empty()) {
        let _ = writeln!(err, "opset check of the raw program:");
        for f in findings {
            let _ = writeln!(err, "  - {f}");
        }
    }
    EXIT_UNREADABLE
}

/// `verify` writing to the given streams; `command_line` goes into the receipt.
pub fn run_verify_to(
    args: &VerifyArgs,
    command_line: &[String],
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> i32 {
    let xcrun = if args.measured {
        match find_xcrun() {
            Some(x) => Some(x),
            None => {
                let _ = writeln!(err, "error: --measured: {XCRUN_UNAVAILABLE}");
                return EXIT_UNREADABLE;
            }
        }
    } else {
        None
    };
    let (mut report, notes) = match verify_opened(&args.package, &args.options(), command_line) {
        Ok(r) => r,
        Err(e) => return unreadable(err, &args.package, &e),
    };
    if let (Some(x), Some(p)) = (&xcrun, report.placement.as_mut()) {
        match measure_placement(x, &args.package) {
            Ok(m) => attach_measured(p, &m),
            Err(e) => {
                print_error(err, "cannot measure placement with MLComputePlan", &e);
                return EXIT_UNREADABLE;
            }
        }
    }
    let text = if args.json {
        match serde_json::to_string_pretty(&report) {
            Ok(s) => s + "\n",
            Err(e) => {
                print_error(err, "cannot serialize the report", &e.into());
                return EXIT_UNREADABLE;
            }
        }
    } else {
        format_verify(&report, args.verbose) + &notes_text(&notes)
    };
    if args.json {
        for n in &notes {
            let _ = writeln!(err, "note: {n}");
        }
    }
    if let Err(e) = out.write_all(text.as_bytes()) {
        print_error(err, "cannot print the report", &e.into());
        return EXIT_UNREADABLE;
    }
    if report.ok {
        EXIT_OK
    } else {
        if args.json {
            // The JSON lists them too; say why the exit code is 1 where people look.
            for m in &report.mismatches {
                let _ = writeln!(err, "mismatch: {m}");
            }
        }
        EXIT_MISMATCH
    }
}

/// `milkit verify`: exit code 0 / 1 / 2 (see the module doc).
pub fn run_verify(args: &VerifyArgs) -> i32 {
    let cl: Vec<String> = std::env::args().collect();
    run_verify_to(
        args,
        &cl,
        &mut std::io::stdout().lock(),
        &mut std::io::stderr().lock(),
    )
}

/// `compile` writing to the given streams.
pub fn run_compile_to(args: &CompileArgs, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let Some(xcrun) = find_xcrun() else {
        let _ = writeln!(err, "error: compile: {XCRUN_UNAVAILABLE}");
        return EXIT_UNREADABLE;
    };
    if let Err(e) = load_package(&args.package) {
        return unreadable(err, &args.package, &e);
    }
    match compile_package(&xcrun, &args.package, &args.out, args.force) {
        Ok(p) => {
            let _ = writeln!(out, "compiled {} → {}", args.package.display(), p.display());
            EXIT_OK
        }
        Err(e) => {
            print_error(err, "compile failed", &e);
            EXIT_UNREADABLE
        }
    }
}

/// `milkit compile`: runs `xcrun coremlc compile`; exit 2 without xcrun.
pub fn run_compile(args: &CompileArgs) -> i32 {
    run_compile_to(
        args,
        &mut std::io::stdout().lock(),
        &mut std::io::stderr().lock(),
    )
}

/// `inspect` writing to the given streams.
pub fn run_inspect_to(args: &InspectArgs, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let Opened { model, notes, .. } = match open_model(&args.package) {
        Ok(x) => x,
        Err(e) => return unreadable(err, &args.package, &e),
    };
    let report = inspect(&model, &args.package);
    let text = if args.json {
        match serde_json::to_string_pretty(&report) {
            Ok(s) => s + "\n",
            Err(e) => {
                print_error(err, "cannot serialize the report", &e.into());
                return EXIT_UNREADABLE;
            }
        }
    } else {
        format_inspect(&report) + &notes_text(&notes)
    };
    if args.json {
        for n in &notes {
            let _ = writeln!(err, "note: {n}");
        }
    }
    let mut ok = write!(out, "{text}").is_ok();
    if args.mil {
        ok &= write!(out, "{}", print_mil(&model)).is_ok();
    }
    if args.model_mil {
        let mut offsets = OffsetCounter::default();
        match write_program(
            &model.program,
            Dialect::for_program(&model.program),
            Some(&mut offsets),
        ) {
            Ok(text) => ok &= writeln!(out, "{text}").is_ok(),
            Err(e) => {
                print_error(err, "cannot print the program as model.mil", &e);
                return EXIT_UNREADABLE;
            }
        }
    }
    if ok {
        EXIT_OK
    } else {
        EXIT_UNREADABLE
    }
}

/// `milkit inspect`: exit 0, or 2 when the package cannot be read.
pub fn run_inspect(args: &InspectArgs) -> i32 {
    run_inspect_to(
        args,
        &mut std::io::stdout().lock(),
        &mut std::io::stderr().lock(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_counts_parse() {
        assert_eq!(
            parse_op_count("conv=2").unwrap(),
            OpCount {
                op_type: "conv".into(),
                count: 2
            }
        );
        assert!(parse_op_count("conv").is_err());
        assert!(parse_op_count("=2").is_err());
        assert!(parse_op_count("conv=x").is_err());
    }
}
