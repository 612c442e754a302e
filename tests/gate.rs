//! `milkit gate` (issue 17): the rungs pass and fail with the right exit codes — a folder
//! against itself goes with identical outputs and a stable receipt that validates against
//! schemas/gate.schema.json; a LUT count off, a different decoder ABI and a palettized
//! positional embedding are killed at rung 1; an encoder whose numbers collapse (random
//! weights, same ABI) passes rungs 1–2 and is killed at rung 3; unusable input exits 2.

mod common;

use milkit::ir::{Arg, Bytes, DType, Operation, Tensor, Value};
use milkit::passes::lut::{palettize, LutConfig, LutGranularity, LutMode};
use serde_json::Value as Json;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::OnceLock;

fn export_all(model: &Path, out: &Path, extra: &[&str]) {
    let o = common::milkit()
        .args(["export", "--quiet", "--force", "--component", "all"])
        .args(extra)
        .arg("--model")
        .arg(model)
        .arg("--out")
        .arg(out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// The fp16 tiny.en folder, exported once per test run.
fn baseline(fx: &Path) -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("gate-baseline");
        export_all(&fx.join("models/whisper-tiny.en"), &dir, &[]);
        dir
    })
}

/// A copy of the baseline folder in `dir` (packages and json files).
fn copy_folder(from: &Path, to: &Path) {
    let o = std::process::Command::new("cp")
        .arg("-r")
        .arg(from)
        .arg(to)
        .output()
        .unwrap();
    assert!(o.status.success());
}

fn gate(candidate: &Path, baseline: &Path, fx: &Path, extra: &[&str]) -> Output {
    common::milkit()
        .arg("gate")
        .arg(candidate)
        .arg("--baseline")
        .arg(baseline)
        .arg("--audio")
        .arg(fx.join("audio/jfk.wav"))
        .args(["--json", "--quiet"])
        .args(extra)
        .output()
        .unwrap()
}

fn receipt(o: &Output) -> Json {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

/// Killed at `rung` with `needle` in its reasons.
fn killed_at(o: &Output, rung: u64, needle: &str) -> Json {
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r = receipt(o);
    assert_eq!(r["verdict"], "kill");
    assert_eq!(r["failed_rung"], rung, "{:#}", r["rungs"]);
    let reasons = r["rungs"][(rung - 1) as usize]["reasons"].to_string();
    assert!(reasons.contains(needle), "{reasons}");
    // Later rungs do not run without --all.
    for later in r["rungs"].as_array().unwrap().iter().skip(rung as usize) {
        assert_eq!(later["status"], "not_run");
    }
    r
}

#[test]
fn a_folder_gated_against_itself_goes_with_identical_outputs_and_a_stable_receipt() {
    let Some(fx) = common::fixtures() else { return };
    let base = baseline(&fx);
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join("copy");
    copy_folder(base, &copy);
    let o = gate(
        &copy,
        base,
        &fx,
        &["--smoke", fx.join("audio/jfk.wav").to_str().unwrap()],
    );
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r = receipt(&o);
    assert_eq!(r["verdict"], "go");
    assert!(r["failed_rung"].is_null());
    for rung in r["rungs"].as_array().unwrap() {
        assert_eq!(rung["status"], "pass", "{rung}");
    }
    // Identical packages: equal digests, no compressed weight, identical probes.
    for p in r["packages"].as_array().unwrap() {
        assert_eq!(p["abi_equal"], true);
        assert_eq!(p["baseline_sha256"], p["candidate_sha256"]);
    }
    let probes = r["parity"].as_array().unwrap();
    assert_eq!(probes.len(), 6, "three probes per component");
    for p in probes {
        assert!(p["snr_db"].is_null(), "{p}");
        assert_eq!(p["max_abs_error"], 0.0);
    }
    let e = &r["end_to_end"];
    assert_eq!(e["wer_regression_points"], 0.0);
    assert_eq!(e["timestamp_agreement"], 1.0);
    assert_eq!(e["no_speech_agreement"], true);
    assert_eq!(e["measured_against"], "baseline transcript");
    // The receipt validates and is the same on a second run.
    let schema: Json = serde_json::from_slice(
        &std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/gate.schema.json"))
            .unwrap(),
    )
    .unwrap();
    let v = jsonschema::validator_for(&schema).unwrap();
    let errors: Vec<String> = v.iter_errors(&r).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{errors:?}");
    let again = gate(
        &copy,
        base,
        &fx,
        &["--smoke", fx.join("audio/jfk.wav").to_str().unwrap()],
    );
    assert_eq!(receipt(&again), r, "the receipt is stable");
}

#[test]
fn a_lut4_folder_passes_physics_with_its_lut_count_and_is_killed_when_the_count_is_off() {
    let Some(fx) = common::fixtures() else { return };
    let base = baseline(&fx);
    let tmp = tempfile::tempdir().unwrap();
    let lut4 = tmp.path().join("lut4");
    let o = common::milkit()
        .args(["export", "--quiet", "--recipe"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("models/whisperkit-tiny-lut4.toml"))
        .arg("--model")
        .arg(fx.join("models/whisper-tiny.en"))
        .arg("--out")
        .arg(&lut4)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r = killed_at(
        &gate(&lut4, base, &fx, &["--expect-lut-ops", "25"]),
        1,
        "26 constexpr_lut_to_dense ops, expected 25",
    );
    let enc = r["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["package"] == "AudioEncoder.mlpackage")
        .unwrap()
        .clone();
    assert_eq!(enc["lut_ops"], 26);
    let ratio = enc["compression_ratio"].as_f64().unwrap();
    assert!((3.9..4.0).contains(&ratio), "{ratio}");
    // With the right count and every rung run: physics and placement pass and every
    // number of the later rungs is in the receipt.
    let o = gate(&lut4, base, &fx, &["--expect-lut-ops", "26", "--all"]);
    let r = receipt(&o);
    assert_eq!(r["rungs"][0]["status"], "pass", "{:#}", r["rungs"]);
    assert_eq!(r["rungs"][1]["status"], "pass", "{:#}", r["rungs"]);
    assert_eq!(r["parity"].as_array().unwrap().len(), 6);
    for p in r["parity"].as_array().unwrap() {
        let snr = p["snr_db"].as_f64().unwrap();
        assert!(snr > 3.0 && snr < 40.0, "{p}");
    }
    assert!(r["end_to_end"]["clips"].as_array().unwrap().len() == 1);
    // A demand of 5× the bytes fails the compression check.
    killed_at(
        &gate(&lut4, base, &fx, &["--min-compression", "5"]),
        1,
        "below 5.00×",
    );
}

#[test]
fn a_decoder_with_another_abi_is_killed_at_rung_one() {
    let Some(fx) = common::fixtures() else { return };
    let base = baseline(&fx);
    let tmp = tempfile::tempdir().unwrap();
    let cand = tmp.path().join("stateful");
    export_all(&fx.join("models/whisper-tiny.en"), &cand, &["--stateful"]);
    killed_at(
        &gate(&cand, base, &fx, &[]),
        1,
        "TextDecoder.mlpackage: input `key_cache` missing in the candidate",
    );
}

#[test]
fn a_palettized_positional_embedding_is_killed_at_rung_one() {
    let Some(fx) = common::fixtures() else { return };
    let base = baseline(&fx);
    let tmp = tempfile::tempdir().unwrap();
    let cand = tmp.path().join("pos");
    copy_folder(base, &cand);
    // Palettize the encoder's positional table by hand (milkit's compressor refuses to).
    let pkg = cand.join("AudioEncoder.mlpackage");
    let mut m = milkit::package::load_package(&pkg).unwrap();
    let f = m.program.functions.get_mut("main").unwrap();
    let op = f
        .block
        .operations
        .iter_mut()
        .find(|o| o.op_type == "const" && o.name.contains("embed_positions"))
        .expect("a positional table");
    let Some(Value::Tensor(t)) = op.attributes.get("val").cloned() else {
        panic!("not a tensor const");
    };
    let w = t.data.to_f16_vec();
    let cfg = LutConfig {
        mode: LutMode::Kmeans,
        nbits: 4,
        granularity: LutGranularity::PerTensor,
        per_channel_scale: false,
        cluster_dim: 1,
    };
    let p = palettize(&w, &t.shape, &cfg, None).unwrap();
    let idx = Tensor::new(
        DType::U4,
        t.shape.clone(),
        Bytes::from_vec(p.packed_indices().unwrap()),
    )
    .unwrap();
    let lut = Tensor::f16(&p.lut_shape, &p.lut);
    *op = Operation {
        op_type: "constexpr_lut_to_dense".into(),
        name: format!("{}_palettized", op.name),
        inputs: [
            ("indices".to_string(), vec![Arg::Value(Value::Tensor(idx))]),
            ("lut".to_string(), vec![Arg::Value(Value::Tensor(lut))]),
        ]
        .into_iter()
        .collect(),
        outputs: op.outputs.clone(),
        blocks: vec![],
        attributes: Default::default(),
    };
    std::fs::remove_dir_all(&pkg).unwrap();
    milkit::package::save_package(&m, &pkg, false, &mut |_| {}).unwrap();
    killed_at(
        &gate(&cand, base, &fx, &["--min-compression", "1"]),
        1,
        "AudioEncoder.mlpackage: the positional embedding is not a plain fp16 constant",
    );
}

#[test]
fn an_encoder_whose_numbers_collapse_passes_physics_and_is_killed_at_parity() {
    let Some(fx) = common::fixtures() else { return };
    let base = baseline(&fx);
    let tmp = tempfile::tempdir().unwrap();
    let cand = tmp.path().join("random-encoder");
    copy_folder(base, &cand);
    // The same architecture with random weights: an equal ABI, unrelated outputs.
    let synth = tmp.path().join("synth");
    let o = common::milkit()
        .args(["synth", "--quiet", "--preset", "tiny", "--out"])
        .arg(&synth)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let enc = cand.join("AudioEncoder.mlpackage");
    std::fs::remove_dir_all(&enc).unwrap();
    let o = common::milkit()
        .args(["export", "--quiet", "--component", "encoder", "--model"])
        .arg(&synth)
        .arg("--out")
        .arg(&enc)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r = killed_at(
        &gate(&cand, base, &fx, &[]),
        3,
        "encoder on the speech probe",
    );
    assert_eq!(r["rungs"][0]["status"], "pass");
    assert_eq!(r["rungs"][1]["status"], "pass");
    let speech = &r["parity"][0];
    assert!(speech["cosine"].as_f64().unwrap() < 0.5, "{speech}");
}

#[test]
fn unusable_input_exits_two_naming_it() {
    let Some(fx) = common::fixtures() else { return };
    let base = baseline(&fx);
    let o = gate(Path::new("/nonexistent/folder"), base, &fx, &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent/folder"));
    let o = common::milkit()
        .arg("gate")
        .arg(base)
        .arg("--baseline")
        .arg(base)
        .arg("--audio")
        .arg(fx.join("audio/no-such.wav"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no-such.wav"));
    let o = common::milkit()
        .arg("gate")
        .arg(base)
        .arg("--baseline")
        .arg(base)
        .args(["--audio", "x.wav", "--expect-lut-ops", "many"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("`many` is not a count"));
}
