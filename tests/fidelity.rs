//! `milkit eval --against`: a folder against itself has zero KL, full agreement, an exact
//! encoder and no word changed; a folder whose encoder is int8-quantized differs from fp16
//! by a small positive KL and a finite PSNR; the JSON report follows its schema.

mod common;

use serde_json::Value;
use std::path::Path;

fn eval_against(cand: &Path, base: &Path, wavs: &[&Path]) -> Value {
    let mut cmd = common::milkit();
    cmd.args(["eval", "--json", "--models"])
        .arg(cand)
        .arg("--against")
        .arg(base)
        .arg("--audio");
    for w in wavs {
        cmd.arg(w);
    }
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let schema_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/fidelity.schema.json");
    let schema: Value =
        serde_json::from_str(&std::fs::read_to_string(schema_path).unwrap()).unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let errors: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "schema violations: {errors:?}");
    v
}

#[test]
fn a_folder_against_itself_and_against_an_int8_encoder() {
    let Some(fx) = common::fixtures() else { return };
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("fp16");
    let o = common::milkit()
        .args(["export", "--component", "all", "--model"])
        .arg(fx.join("models/whisper-tiny.en"))
        .arg("--out")
        .arg(&base)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let jfk = fx.join("audio/jfk.wav");
    let lj = fx.join("audio/ljspeech_LJ001-0001.wav");

    let same = eval_against(&base, &base, &[&jfk, &lj]);
    assert_eq!(same["mean_kl"].as_f64().unwrap(), 0.0);
    assert_eq!(same["top1_agreement"].as_f64().unwrap(), 1.0);
    assert_eq!(same["wer_vs_baseline"].as_f64().unwrap(), 0.0);
    assert!(same["qoi"].is_null(), "no reference texts, no QoI");
    for c in same["clips"].as_array().unwrap() {
        // Identical encoder outputs: no finite PSNR.
        assert!(c["encoder_psnr_db"].is_null(), "{c}");
        assert!((c["encoder_cosine"].as_f64().unwrap() - 1.0).abs() < 1e-12);
        assert!(c["positions"].as_u64().unwrap() > 10);
    }

    // The same folder with an int8 (per channel) encoder.
    let cand = dir.path().join("int8");
    std::fs::create_dir_all(&cand).unwrap();
    for e in std::fs::read_dir(&base).unwrap() {
        let e = e.unwrap();
        let to = cand.join(e.file_name());
        if e.file_name() == "AudioEncoder.mlpackage" {
            let o = common::milkit()
                .arg("compress")
                .arg(e.path())
                .arg("--out")
                .arg(&to)
                .args(["--quantize", "int8"])
                .output()
                .unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        } else if e.path().is_dir() {
            copy_dir(&e.path(), &to);
        } else {
            std::fs::copy(e.path(), &to).unwrap();
        }
    }
    let v = eval_against(&cand, &base, &[&jfk]);
    let kl = v["mean_kl"].as_f64().unwrap();
    assert!(kl > 0.0 && kl < 0.5, "int8 encoder: mean KL {kl}");
    let psnr = v["encoder_psnr_db"].as_f64().unwrap();
    assert!(psnr > 20.0, "int8 encoder PSNR {psnr}");
    assert!(v["top1_agreement"].as_f64().unwrap() > 0.8);
    println!("tiny.en int8 encoder vs fp16 on jfk: {v}");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.path().is_dir() {
            copy_dir(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), &dst).unwrap();
        }
    }
}
