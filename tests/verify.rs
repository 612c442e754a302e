//! `verify`, `inspect` and `compile` through the library functions the CLI calls (exit codes
//! 0 / 1 / 2): expectations, unreadable packages, opset findings, receipts against the
//! checked-in schemas, the packages coremltools wrote, and the text output (a summary by
//! default, every op with `--verbose`). Placement rules: `verify_placement.rs`.

mod common;

use clap::Parser;
use common::encoders::*;
use common::fixtures;
use milkit::ir::{ArrayDType, Opset, ValueType};
use milkit::ir::{Feature, Model, Value};
use milkit::ops::{Builder, In};
use milkit::report::{ComputeUnit, PositionalStatus, VerifyReport};
use milkit::verify::cli::{
    run_compile_to, run_inspect_to, run_verify_to, CompileArgs, InspectArgs, VerifyArgs,
};
use milkit::verify::coreml::find_xcrun;
use milkit::verify::{verify_model, VerifyOptions};
use milkit::whisper::encoder::EncoderAbi;
use std::path::Path;

#[derive(Parser)]
struct VerifyCli {
    #[command(flatten)]
    args: VerifyArgs,
}

/// Parses a verify command line exactly as `milkit verify` would.
fn args(line: &[&str]) -> VerifyArgs {
    let mut v = vec!["verify"];
    v.extend_from_slice(line);
    VerifyCli::try_parse_from(v)
        .unwrap_or_else(|e| panic!("{e}"))
        .args
}

/// Runs verify; returns (exit code, stdout, stderr).
fn verify(a: &VerifyArgs) -> (i32, String, String) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let cl = vec![
        "milkit".to_string(),
        "verify".to_string(),
        a.package.display().to_string(),
    ];
    let code = run_verify_to(a, &cl, &mut out, &mut err);
    (
        code,
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
    )
}

fn validator(name: &str) -> jsonschema::Validator {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("schemas")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    jsonschema::validator_for(&serde_json::from_str(&text).unwrap()).unwrap()
}

fn assert_valid(v: &jsonschema::Validator, doc: &serde_json::Value) {
    let errors: Vec<String> = v
        .iter_errors(doc)
        .map(|e| format!("{e} at {}", e.instance_path))
        .collect();
    assert!(errors.is_empty(), "schema violations: {errors:#?}");
}

#[test]
fn schemas_match_the_report_types() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas");
    for (name, text) in milkit::report::all_schemas() {
        let path = dir.join(name);
        if std::env::var("MILKIT_BLESS").is_ok_and(|v| v == "1") {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &text).unwrap();
        }
        let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            on_disk == text,
            "{} is out of date: regenerate with MILKIT_BLESS=1 cargo test --test verify",
            path.display()
        );
    }
}

#[test]
fn expectations_pass_and_fail_with_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let p = save(
        &tiny_encoder(EncoderAbi::WhisperKit),
        dir.path(),
        "enc.mlpackage",
    );
    let ps = p.to_str().unwrap();
    // Per layer: q, k, v, out, fc1, fc2 are 1x1 convs; plus the two stem convs. Two layer
    // norms per layer and a final one; one softmax per layer.
    let good = format!(
        "conv={},softmax={},layer_norm={}",
        2 + 6 * LAYERS,
        LAYERS,
        2 * LAYERS + 1
    );
    let (code, out, err) = verify(&args(&[
        ps,
        "--expect-ops",
        &good,
        "--expect-lut-ops",
        "0",
        "--expect-abi",
        "whisperkit",
    ]));
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("OK: every check holds"), "{out}");
    assert!(
        out.contains("ok   positional_embedding") && out.contains("got untouched"),
        "{out}"
    );

    let (code, out, _) = verify(&args(&[
        ps,
        "--expect-ops",
        "conv=3",
        "--expect-ops",
        "gelu=3",
        "--expect-lut-ops",
        "26",
    ]));
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!(
            "ops.conv: expected 3 conv, got {}",
            2 + 6 * LAYERS
        )),
        "{out}"
    );
    assert!(
        out.contains("lut_ops: expected 26 constexpr_lut_to_dense, got 0"),
        "{out}"
    );
    assert!(
        !out.contains("ops.gelu:"),
        "gelu=3 holds (2 stem + 1 per layer): {out}"
    );

    let (code, out, _) = verify(&args(&[ps, "--expect-abi", "whispercpp"]));
    assert_eq!(code, 1);
    assert!(out.contains("missing input `logmel_data`"), "{out}");
    assert!(VerifyCli::try_parse_from(["verify", ps, "--expect-ops", "conv"]).is_err());
}

#[test]
fn unreadable_packages_exit_2_with_the_error_chain() {
    let dir = tempfile::tempdir().unwrap();
    let (code, _, err) = verify(&VerifyArgs::new(dir.path().join("missing.mlpackage")));
    assert_eq!(code, 2);
    assert!(
        err.contains("cannot read package") && err.contains("no such file or folder"),
        "{err}"
    );

    let p = save(&conv_net(4, 8, ArrayDType::F16), dir.path(), "c.mlpackage");
    std::fs::write(
        p.join("Data/com.apple.CoreML/model.mlmodel"),
        b"\x08\x09garbage",
    )
    .unwrap();
    let (code, _, err) = verify(&VerifyArgs::new(&p));
    assert_eq!(code, 2);
    assert!(
        err.contains("caused by:"),
        "the context chain is printed: {err}"
    );
    let (mut o, mut e) = (Vec::new(), Vec::new());
    assert_eq!(
        run_inspect_to(
            &InspectArgs {
                package: p,
                json: false,
                mil: false,
                model_mil: false,
            },
            &mut o,
            &mut e
        ),
        2
    );
}

/// x [1, 4] fp16 with x[:, 0:2] replaced by `update`: `slice_update` exists from iOS18 only.
fn slice_update_net(opset: Opset) -> Model {
    let mut b = Builder::new(opset);
    let fin = Feature::new("x", ArrayDType::F16, &[1, 4]);
    let fu = Feature::new("update", ArrayDType::F16, &[1, 2]);
    let x = b.input("x", ValueType::Tensor(fin.tensor_type()));
    let u = b.input("update", ValueType::Tensor(fu.tensor_type()));
    let y = b
        .op1(
            "slice_update",
            "write",
            vec![
                ("x", (&x).into()),
                ("update", (&u).into()),
                ("begin", In::C(Value::i32s(&[0, 0]))),
                ("end", In::C(Value::i32s(&[1, 2]))),
            ],
        )
        .unwrap();
    model(
        b,
        y,
        vec![fin, fu],
        Feature::new("y", ArrayDType::F16, &[1, 4]),
    )
}

#[test]
fn an_ios18_op_in_a_spec7_package_is_named_with_its_opset() {
    let mut m = slice_update_net(Opset::Ios18);
    m.spec_version = 7;
    m.program.functions.get_mut("main").unwrap().opset = Opset::Ios16;
    let dir = tempfile::tempdir().unwrap();
    let p = save(&m, dir.path(), "old.mlpackage");
    let (code, out, err) = verify(&VerifyArgs::new(&p));
    assert_eq!(code, 2, "{out}");
    assert!(
        err.contains("slice_update") && err.contains("CoreML6"),
        "{err}"
    );
    assert!(err.contains("opset check of the raw program"), "{err}");
    assert!(err.contains("needs CoreML8 (ios18)"), "{err}");

    // The same finding as report data when the model is verified in memory.
    let r = verify_model(&m, &p, &VerifyOptions::default(), receipt_stub());
    assert!(!r.ok);
    let v = &r.opset_violations[0];
    assert_eq!(
        (v.op_type.as_str(), v.opset.as_str()),
        ("slice_update", "CoreML6")
    );
    assert_eq!(v.available_since.as_deref(), Some("CoreML8"));
    assert!(
        r.mismatches
            .iter()
            .any(|m| m.contains("`slice_update` (write) is not in CoreML6 (needs CoreML8)")),
        "{:?}",
        r.mismatches
    );

    // A compressed weight op of iOS18 in an iOS16 function, likewise.
    let mut b = Builder::new(Opset::Ios18);
    let fin = Feature::new("x", ArrayDType::F16, &[1, 64]);
    let x = b.input("x", ValueType::Tensor(fin.tensor_type()));
    let w = int4_weight(&mut b, 8, 64, 32);
    let y = b
        .op1(
            "linear",
            "proj",
            vec![("x", (&x).into()), ("weight", In::V(w))],
        )
        .unwrap();
    let mut m = model(b, y, vec![fin], Feature::new("y", ArrayDType::F16, &[1, 8]));
    m.program.functions.get_mut("main").unwrap().opset = Opset::Ios16;
    let r = verify_model(&m, &p, &VerifyOptions::default(), receipt_stub());
    assert!(r
        .opset_violations
        .iter()
        .any(|v| v.op_type == "constexpr_blockwise_shift_scale" && v.opset == "CoreML6"));
    // An op its opset lacks does not type-check there either.
    assert!(
        r.checks
            .iter()
            .any(|c| c.name == "types_reinferred" && !c.ok),
        "{:?}",
        r.checks
    );
}

fn json_of(code_out: (i32, String, String)) -> serde_json::Value {
    assert_eq!(code_out.0, 0, "{}\n{}", code_out.1, code_out.2);
    serde_json::from_str(&code_out.1).unwrap()
}

#[test]
fn receipts_validate_and_are_stable() {
    let v = validator("verify.schema.json");
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_encoder(EncoderAbi::WhisperCpp);
    let a = save(&m, dir.path(), "a.mlpackage");
    let b = save(&m, dir.path(), "b.mlpackage");
    let mut docs = Vec::new();
    for p in [&a, &b, &a] {
        let ps = p.to_str().unwrap();
        let doc = json_of(verify(&args(&[
            ps,
            "--json",
            "--placement",
            "--expect-abi",
            "whispercpp",
        ])));
        assert_valid(&v, &doc);
        docs.push(doc);
    }
    // The schema does reject malformed receipts.
    let mut bad = docs[0].clone();
    bad["ok"] = serde_json::json!("yes");
    assert!(!v.is_valid(&bad));
    bad = docs[0].clone();
    bad.as_object_mut().unwrap().remove("receipt");
    assert!(!v.is_valid(&bad));
    let r: VerifyReport = serde_json::from_value(docs[0].clone()).unwrap();
    assert!(r.ok && r.placement.is_some());
    assert_eq!(r.positional_embedding.status, PositionalStatus::Untouched);
    assert_eq!(r.receipt.version, env!("CARGO_PKG_VERSION"));
    assert_eq!(r.receipt.command_line[1], "verify");
    // Digests recomputed here from the files: sha256 of model.mlmodel, and the package digest
    // over the sorted `path\0sha256\n` lines.
    use sha2::{Digest, Sha256};
    let hex = |d: &[u8]| d.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let model_bytes = std::fs::read(a.join("Data/com.apple.CoreML/model.mlmodel")).unwrap();
    assert_eq!(
        r.receipt.digests.model_mlmodel,
        hex(&Sha256::digest(&model_bytes))
    );
    let mut paths = vec![
        "Manifest.json",
        "Data/com.apple.CoreML/model.mlmodel",
        "Data/com.apple.CoreML/weights/weight.bin",
    ];
    paths.sort();
    let mut h = Sha256::new();
    for p in &paths {
        h.update(
            format!(
                "{p}\0{}\n",
                hex(&Sha256::digest(std::fs::read(a.join(p)).unwrap()))
            )
            .as_bytes(),
        );
    }
    assert_eq!(r.receipt.digests.package, hex(&h.finalize()));
    // Same package → same report, apart from where it lives and how it was invoked.
    let strip = |mut d: serde_json::Value| {
        d["receipt"]["command_line"] = serde_json::Value::Null;
        d["receipt"]["package"] = serde_json::Value::Null;
        d["model"]["package"] = serde_json::Value::Null;
        d
    };
    assert_eq!(strip(docs[0].clone()), strip(docs[1].clone()));
    assert_eq!(docs[0], docs[2]);
    // A changed weight changes the weight and package digests, not the model's.
    let mut bytes = std::fs::read(b.join("Data/com.apple.CoreML/weights/weight.bin")).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(b.join("Data/com.apple.CoreML/weights/weight.bin"), bytes).unwrap();
    let (_, out, _) = verify(&args(&[b.to_str().unwrap(), "--json"]));
    let r2: VerifyReport = serde_json::from_str(&out).unwrap();
    assert_eq!(
        r2.receipt.digests.model_mlmodel,
        r.receipt.digests.model_mlmodel
    );
    assert_ne!(r2.receipt.digests.weight_bin, r.receipt.digests.weight_bin);
    assert_ne!(r2.receipt.digests.package, r.receipt.digests.package);
}

#[test]
fn inspect_reports_validate_and_print_mil() {
    let v = validator("inspect.schema.json");
    let dir = tempfile::tempdir().unwrap();
    let p = save(
        &tiny_encoder(EncoderAbi::WhisperKit),
        dir.path(),
        "k.mlpackage",
    );
    let run = |json: bool, mil: bool| {
        let (mut o, mut e) = (Vec::new(), Vec::new());
        let code = run_inspect_to(
            &InspectArgs {
                package: p.clone(),
                json,
                mil,
                model_mil: false,
            },
            &mut o,
            &mut e,
        );
        assert_eq!(code, 0, "{}", String::from_utf8_lossy(&e));
        String::from_utf8(o).unwrap()
    };
    let doc: serde_json::Value = serde_json::from_str(&run(true, false)).unwrap();
    assert_valid(&v, &doc);
    let r: milkit::report::InspectReport = serde_json::from_value(doc).unwrap();
    assert_eq!(
        (r.spec_version, r.opset.as_str(), r.target.as_str()),
        (9, "CoreML8", "ios18")
    );
    assert_eq!(r.inputs[0].name, "melspectrogram_features");
    assert_eq!(r.inputs[0].shape, vec![1, 80, 1, 3000]);
    let weight_bin = std::fs::metadata(p.join("Data/com.apple.CoreML/weights/weight.bin"))
        .unwrap()
        .len();
    assert!(r
        .files
        .iter()
        .any(|f| f.path.ends_with("weights/weight.bin") && f.bytes == weight_bin));
    // Every fp16 weight is stored: the positional embedding alone is 1500 × 64 × 2 bytes.
    assert!(r.weights.by_storage["fp16"].bytes >= 1500 * 64 * 2);
    let text = run(false, true);
    assert!(
        text.contains("melspectrogram_features") && text.contains("function main (CoreML8)"),
        "{text}"
    );
    assert!(
        text.contains("= conv[name=\"layers_0_fc1\"](")
            || text.contains("%layers_0_fc1: (tensor<fp16, [1, 128, 1, 1500]>) = conv("),
        "{text}"
    );
    assert!(
        text.contains(
            "func main<CoreML8>(%melspectrogram_features: tensor<fp16, [1, 80, 1, 3000]>)"
        ),
        "{text}"
    );
}

#[test]
fn compile_and_measured_say_xcrun_is_unavailable_off_macos() {
    if find_xcrun().is_some() {
        eprintln!("SKIP: xcrun is on PATH; this test covers machines without it");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = save(&conv_net(4, 8, ArrayDType::F16), dir.path(), "c.mlpackage");
    let out_dir = dir.path().join("c.mlmodelc");
    let (mut o, mut e) = (Vec::new(), Vec::new());
    let code = run_compile_to(
        &CompileArgs {
            package: p.clone(),
            out: out_dir.clone(),
            force: false,
        },
        &mut o,
        &mut e,
    );
    let err = String::from_utf8(e).unwrap();
    assert_eq!(code, 2);
    assert!(err.contains("xcrun is unavailable"), "{err}");
    assert!(!out_dir.exists() && o.is_empty());
    let (code, out, err) = verify(&args(&[p.to_str().unwrap(), "--placement", "--measured"]));
    assert_eq!(code, 2);
    assert!(
        err.contains("xcrun is unavailable") && out.is_empty(),
        "{err}"
    );
}

/// The names of the run-time ops (load-time constants left out) of `--placement --json`.
fn runtime_op_names(out: &str) -> Vec<String> {
    let r: VerifyReport = serde_json::from_str(out).unwrap();
    r.placement
        .unwrap()
        .ops
        .into_iter()
        .filter(|o| o.unit != ComputeUnit::LoadTime)
        .map(|o| o.name)
        .collect()
}

/// The per-op lines of `--verbose` output (`predicted UNIT TYPE NAME ...`), by op name.
fn listed_ops(out: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| l.trim_start().strip_prefix("predicted "))
        .filter_map(|l| l.split_whitespace().nth(2))
        .map(str::to_string)
        .collect()
}

#[test]
fn placement_prints_a_summary_by_default_and_every_op_with_verbose() {
    let dir = tempfile::tempdir().unwrap();
    let p = save(
        &tiny_encoder(EncoderAbi::WhisperKit),
        dir.path(),
        "enc.mlpackage",
    );
    let ps = p.to_str().unwrap();
    let (code, out, err) = verify(&args(&[ps, "--placement"]));
    assert_eq!(code, 0, "{out}\n{err}");
    let total = |text: &str, unit: &str| text.lines().any(|l| l.trim_start().starts_with(unit));
    for unit in ["ANE", "load-time"] {
        assert!(total(&out, unit), "no {unit} total: {out}");
    }
    // Units with no ops are left out of the summary, not of --verbose.
    for unit in ["GPU", "CPU"] {
        assert!(
            !total(&out, unit),
            "an empty {unit} total by default: {out}"
        );
    }
    assert!(out.contains("off the ANE: nothing"), "{out}");
    // One digest by default (the package's); every file's with --verbose.
    assert_eq!(out.matches("sha256 ").count(), 1, "{out}");
    assert!(out.contains("--verbose lists every op"), "{out}");
    assert!(listed_ops(&out).is_empty(), "per-op rows by default: {out}");
    assert!(
        !out.contains("(source:"),
        "the rule table by default: {out}"
    );

    let (code, verbose, _) = verify(&args(&[ps, "--placement", "--verbose"]));
    assert_eq!(code, 0);
    let names =
        runtime_op_names(&json_of(verify(&args(&[ps, "--placement", "--json"]))).to_string());
    assert!(names.len() > 10, "{names:?}");
    assert_eq!(listed_ops(&verbose), names, "{verbose}");
    assert!(verbose.contains("fp16_static") && verbose.contains("(source:"));
    for unit in ["ANE", "GPU", "CPU", "load-time"] {
        assert!(total(&verbose, unit), "no {unit} total: {verbose}");
    }
    assert_eq!(verbose.matches("sha256 ").count(), 3, "{verbose}");
    assert!(verbose.lines().count() > out.lines().count() + names.len());
}

#[test]
fn placement_names_every_material_op_off_the_ane_with_its_rule() {
    let dir = tempfile::tempdir().unwrap();
    // An unsplit 51,866-row vocabulary head: one conv, over the ANE's output-channel budget.
    let p = save(
        &conv_net(8, 51_866, ArrayDType::F16),
        dir.path(),
        "head.mlpackage",
    );
    let (code, out, err) = verify(&args(&[p.to_str().unwrap(), "--placement"]));
    assert_eq!(code, 0, "{out}\n{err}");
    let head = out
        .lines()
        .find(|l| l.contains(" head ") && l.trim_start().starts_with("GPU"))
        .unwrap_or_else(|| panic!("the head is not named off the ANE: {out}"));
    assert!(
        head.contains("(100.0%)") && head.contains("ane_output_channels"),
        "{head}"
    );
    assert!(
        out.contains(
            "rule ane_output_channels: a conv/conv_transpose/linear/matmul with more than 32,768"
        ),
        "{out}"
    );
    assert!(out.contains("off the ANE: 1 op(s)"), "{out}");
}

/// The README's main job verifies the tiny.en encoder of `models/whisperkit-tiny-lut4.toml`
/// (LUT4 k-means per 16 output channels) with `--placement`: a screenful, not a listing.
#[test]
fn the_main_jobs_verify_of_the_tiny_en_encoder_fits_in_30_lines() {
    let Some(fx) = fixtures() else { return };
    let dir = tempfile::tempdir().unwrap();
    let folder = common::export_encoder_recipe(
        dir.path(),
        "whisperkit",
        "",
        &fx.join("models/whisper-tiny.en"),
    );
    let pkg = folder.join("encoder.mlpackage");
    let run = |extra: &[&str]| {
        let o = common::milkit()
            .args([
                "verify",
                "--expect-lut-ops",
                "26",
                "--expect-abi",
                "whisperkit",
                "--placement",
            ])
            .args(extra)
            .arg(&pkg)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    };
    let out = run(&[]);
    assert!(
        out.lines().count() <= 30,
        "{} lines:\n{out}",
        out.lines().count()
    );
    assert!(out.ends_with("OK: every check holds\n"), "{out}");
    assert!(out.contains("off the ANE: nothing"), "{out}");
    assert!(
        out.contains("compressed weights: constexpr_lut_to_dense 26 (lut4 26) feeding conv 26"),
        "{out}"
    );
    let verbose = run(&["--verbose"]);
    let names = runtime_op_names(&run(&["--json"]));
    assert_eq!(names.len(), 78);
    assert_eq!(listed_ops(&verbose), names);
    // Every compressed weight is listed with the op it feeds.
    assert_eq!(
        verbose
            .lines()
            .filter(|l| l.trim_start().starts_with("lut4 ") && l.contains("→ conv `"))
            .count(),
        26
    );
}

/// README of the fixtures: main-block op counts as serialized by coremltools.
const FP16_OPS: &str = "add=9,cast=2,const=150,conv=2,gelu=6,layer_norm=9,linear=24,matmul=8,mul=4,reshape=16,softmax=4,transpose=17";

#[test]
fn coremltools_packages_verify_with_their_real_histograms() {
    let Some(fx) = fixtures() else { return };
    let ct = fx.join("coremltools");
    let with = |extra: &[(&str, &str)]| {
        let mut m: std::collections::BTreeMap<String, String> = FP16_OPS
            .split(',')
            .map(|kv| kv.split_once('=').unwrap())
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        for (k, v) in extra {
            m.insert(k.to_string(), v.to_string());
        }
        m.iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    let cases = [
        ("tiny.en-encoder-fp16", with(&[]), 16_421_952u64),
        (
            "tiny.en-encoder-lut4-kmeans",
            with(&[("constexpr_lut_to_dense", "26"), ("const", "124")]),
            5_034_176,
        ),
        (
            "tiny.en-encoder-int4-block32",
            with(&[("constexpr_blockwise_shift_scale", "25"), ("const", "125")]),
            5_594_752,
        ),
    ];
    let v = validator("verify.schema.json");
    for (name, ops, weight_bytes) in cases {
        let p = ct.join(format!("{name}.mlpackage"));
        let ps = p.to_str().unwrap();
        let lut = if name.contains("lut4") { "26" } else { "0" };
        let (code, out, err) = verify(&args(&[
            ps,
            "--expect-ops",
            &ops,
            "--expect-lut-ops",
            lut,
            "--expect-abi",
            "whispercpp",
            "--json",
            "--placement",
        ]));
        assert_eq!(code, 0, "{name}: {err}\n{out}");
        let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_valid(&v, &doc);
        let r: VerifyReport = serde_json::from_value(doc).unwrap();
        assert_eq!(
            r.positional_embedding.status,
            PositionalStatus::Untouched,
            "{name}"
        );
        assert_eq!(r.positional_embedding.entries[0].shape, vec![1500, 384]);
        let wb = r
            .model
            .files
            .iter()
            .find(|f| f.path.ends_with("weight.bin"))
            .unwrap();
        assert_eq!(
            wb.bytes, weight_bytes,
            "{name}: weight.bin size from the fixtures README"
        );
        let p = r.placement.as_ref().unwrap();
        match name {
            "tiny.en-encoder-lut4-kmeans" => {
                // README: on the linear/conv weights alone fp16/lut4 is 3.97x.
                let ratio = r.model.weights.compression_ratio.unwrap();
                assert!((ratio - 3.97).abs() < 0.01, "{ratio}");
                assert_eq!(r.model.weights.by_storage["lut4"].tensors, 26);
                assert!(r.constexpr.ops.iter().all(|c| c
                    .feeds
                    .iter()
                    .any(|f| f.op_type == "linear" || f.op_type == "conv")));
                assert!(rows(p, "linear").iter().all(
                    |r| r.unit == ComputeUnit::Ane && r.rules.contains(&"lut_keeps_ane".into())
                ));
            }
            "tiny.en-encoder-int4-block32" => {
                assert_eq!(r.model.weights.by_storage["int4_blockwise"].tensors, 25);
                assert!(rows(p, "linear").iter().all(|r| r.unit == ComputeUnit::Cpu));
            }
            _ => {
                assert!(r.constexpr.ops.is_empty() && r.model.weights.compression_ratio.is_none());
                assert!(rows(p, "linear").iter().all(|r| r.unit == ComputeUnit::Ane));
            }
        }
        // whisper.cpp's fp32 I/O: the two casts are predicted off the ANE.
        assert!(rows(p, "cast").iter().all(|r| r.unit == ComputeUnit::Gpu));
        let (code, out, _) = verify(&args(&[ps, "--expect-ops", "linear=23"]));
        assert_eq!(code, 1);
        assert!(
            out.contains("ops.linear: expected 23 linear, got 24"),
            "{out}"
        );
    }
}
