//! Encoder export end to end through the CLI: real tiny.en (both ABIs) and synthetic
//! checkpoints; exact op counts and ABIs; the conformance validator accepts every package;
//! export is byte-reproducible; bad inputs fail clearly with nothing left at the target.

mod common;
use common::milkit;
use milkit::ir::{ArrayDType, Model};
use milkit::package::load_package;
use std::collections::BTreeMap;
use std::path::Path;

fn histogram(m: &Model) -> BTreeMap<String, usize> {
    let mut h = BTreeMap::new();
    for op in m.program.main().unwrap().block.walk() {
        *h.entry(op.op_type.clone()).or_insert(0) += 1;
    }
    h
}

fn export(model: &Path, abi: &str, out: &Path, extra: &[&str]) -> std::process::Output {
    milkit()
        .args([
            "export",
            "--component",
            "encoder",
            "--quiet",
            "--abi",
            abi,
            "--model",
        ])
        .arg(model)
        .arg("--out")
        .arg(out)
        .args(extra)
        .output()
        .unwrap()
}

fn ok(o: &std::process::Output) {
    assert!(
        o.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn tiny_en_encoder_both_abis() {
    let Some(fx) = common::fixtures() else { return };
    let model = fx.join("models/whisper-tiny.en");
    let dir = tempfile::tempdir().unwrap();
    for (abi, inp, out, in_shape, out_shape, dt) in [
        (
            "whispercpp",
            "logmel_data",
            "output",
            vec![1, 80, 3000],
            vec![1, 1500, 384],
            ArrayDType::F32,
        ),
        (
            "whisperkit",
            "melspectrogram_features",
            "encoder_output_embeds",
            vec![1, 80, 1, 3000],
            vec![1, 384, 1, 1500],
            ArrayDType::F16,
        ),
    ] {
        let p = dir.path().join(format!("{abi}.mlpackage"));
        ok(&export(&model, abi, &p, &[]));
        let m = load_package(&p).unwrap();
        assert_eq!(m.spec_version, 9);
        let d = &m.description;
        assert_eq!((d.inputs.len(), d.outputs.len()), (1, 1));
        assert_eq!(
            (
                d.inputs[0].name.as_str(),
                &d.inputs[0].shape,
                d.inputs[0].dtype
            ),
            (inp, &in_shape, dt)
        );
        assert_eq!(
            (
                d.outputs[0].name.as_str(),
                &d.outputs[0].shape,
                d.outputs[0].dtype
            ),
            (out, &out_shape, dt)
        );
        let h = histogram(&m);
        assert_eq!(h.get("conv"), Some(&26), "{abi}: {h:?}");
        assert_eq!(h.get("softmax"), Some(&4));
        assert_eq!(h.get("linear"), None);
        if let Some(v) = common::validate(&p) {
            assert_eq!(v["spec_histogram"]["main"]["conv"], 26);
        }
    }
}

#[test]
fn export_is_byte_reproducible_and_refuses_overwrite() {
    let Some(fx) = common::fixtures() else { return };
    let model = fx.join("models/whisper-tiny.en");
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.mlpackage");
    let b = dir.path().join("b.mlpackage");
    ok(&export(&model, "whisperkit", &a, &[]));
    ok(&export(&model, "whisperkit", &b, &[]));
    for f in [
        "Manifest.json",
        "Data/com.apple.CoreML/model.mlmodel",
        "Data/com.apple.CoreML/weights/weight.bin",
    ] {
        assert_eq!(
            std::fs::read(a.join(f)).unwrap(),
            std::fs::read(b.join(f)).unwrap(),
            "{f} differs"
        );
    }
    // write → read → write is byte-identical too.
    let c = dir.path().join("c.mlpackage");
    milkit::package::save_package(&load_package(&a).unwrap(), &c, false, &mut |_| {}).unwrap();
    for f in [
        "Manifest.json",
        "Data/com.apple.CoreML/model.mlmodel",
        "Data/com.apple.CoreML/weights/weight.bin",
    ] {
        assert_eq!(
            std::fs::read(a.join(f)).unwrap(),
            std::fs::read(c.join(f)).unwrap(),
            "{f} differs after a round trip"
        );
    }
    let before = std::fs::read(a.join("Data/com.apple.CoreML/model.mlmodel")).unwrap();
    let o = export(&model, "whispercpp", &a, &[]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--force"));
    assert_eq!(
        std::fs::read(a.join("Data/com.apple.CoreML/model.mlmodel")).unwrap(),
        before
    );
    ok(&export(&model, "whispercpp", &a, &["--force"]));
    assert_ne!(
        std::fs::read(a.join("Data/com.apple.CoreML/model.mlmodel")).unwrap(),
        before
    );
}

fn synth(preset: &str, out: &Path) {
    let o = milkit()
        .args(["synth", "--quiet", "--preset", preset, "--out"])
        .arg(out)
        .output()
        .unwrap();
    ok(&o);
}

#[test]
fn synthetic_tiny_and_turbo_encoders() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = dir.path().join("tiny");
    synth("tiny", &tiny);
    let p = dir.path().join("tiny.mlpackage");
    ok(&export(&tiny, "whisperkit", &p, &[]));
    let h = histogram(&load_package(&p).unwrap());
    assert_eq!(h.get("conv"), Some(&26));
    common::validate(&p);

    let turbo = dir.path().join("turbo");
    synth("large-v3-turbo", &turbo);
    let p = dir.path().join("turbo.mlpackage");
    ok(&export(&turbo, "whispercpp", &p, &[]));
    let m = load_package(&p).unwrap();
    let h = histogram(&m);
    assert_eq!(h.get("conv"), Some(&194), "{h:?}");
    assert_eq!(h.get("softmax"), Some(&32));
    assert_eq!(h.get("linear"), None);
    assert_eq!(m.description.inputs[0].shape, vec![1, 128, 3000]);
    if let Some(v) = common::validate(&p) {
        assert_eq!(v["spec_histogram"]["main"]["conv"], 194);
    }
}

/// Every refusal: clear message naming the file, non-zero exit, nothing at the target.
#[test]
fn bad_checkpoints_fail_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good");
    synth("tiny", &good);
    let copy = |name: &str| {
        let d = dir.path().join(name);
        std::fs::create_dir_all(&d).unwrap();
        for f in [
            "config.json",
            "generation_config.json",
            "preprocessor_config.json",
            "model.safetensors",
        ] {
            std::fs::copy(good.join(f), d.join(f)).unwrap();
        }
        d
    };
    let check = |ckpt: &Path, needle: &str, file: &str| {
        let out = dir.path().join(format!(
            "{}.mlpackage",
            ckpt.file_name().unwrap().to_string_lossy()
        ));
        let o = export(ckpt, "whisperkit", &out, &[]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success(),
            "{}: export should fail",
            ckpt.display()
        );
        assert!(!err.contains("panicked"), "panic: {err}");
        assert!(
            err.contains(needle),
            "{}: expected `{needle}` in: {err}",
            ckpt.display()
        );
        assert!(
            err.contains(file),
            "{}: expected the file `{file}` named in: {err}",
            ckpt.display()
        );
        assert!(!out.exists(), "something was left at {}", out.display());
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains(".milkit-tmp-"))
            .collect();
        assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
    };

    // Malformed config.json.
    let d = copy("badconfig");
    std::fs::write(d.join("config.json"), "{ not json").unwrap();
    check(&d, "config.json", "config.json");

    // Truncated safetensors.
    let d = copy("truncated");
    let st = d.join("model.safetensors");
    let bytes = std::fs::read(&st).unwrap();
    std::fs::write(&st, &bytes[..bytes.len() / 2]).unwrap();
    check(&d, "model.safetensors", "model.safetensors");

    // Header length larger than the file.
    let d = copy("hugeheader");
    let st = d.join("model.safetensors");
    let mut bytes = std::fs::read(&st).unwrap();
    bytes[..8].copy_from_slice(&(u64::MAX / 4).to_le_bytes());
    std::fs::write(&st, &bytes).unwrap();
    check(&d, "model.safetensors", "model.safetensors");
}

/// Rewrites a checkpoint's model.safetensors with one tensor dropped or reshaped.
fn edit_safetensors(dir: &Path, drop: Option<&str>, reshape: Option<(&str, Vec<usize>)>) {
    use safetensors::tensor::{Dtype, TensorView};
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut views = Vec::new();
    for (name, t) in st.tensors() {
        if Some(name.as_str()) == drop {
            continue;
        }
        let shape = match &reshape {
            Some((n, s)) if *n == name => s.clone(),
            _ => t.shape().to_vec(),
        };
        views.push((
            name.clone(),
            TensorView::new(Dtype::F16, shape, t.data()).unwrap(),
        ));
    }
    let out = safetensors::serialize(views, None).unwrap();
    std::fs::write(&path, out).unwrap();
}

/// A missing tensor and a wrong shape: clear errors naming the tensor and the file, no output.
#[test]
fn missing_tensor_and_wrong_shape_fail_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good");
    synth("tiny", &good);
    for (case, drop, reshape, needle) in [
        (
            "missing",
            Some("model.encoder.layers.1.fc1.weight"),
            None,
            "model.encoder.layers.1.fc1.weight",
        ),
        (
            "shape",
            None,
            Some(("model.encoder.layers.2.fc2.weight", vec![384 * 1536])),
            "model.encoder.layers.2.fc2.weight",
        ),
    ] {
        let d = dir.path().join(case);
        std::fs::create_dir_all(&d).unwrap();
        for f in [
            "config.json",
            "generation_config.json",
            "preprocessor_config.json",
            "model.safetensors",
        ] {
            std::fs::copy(good.join(f), d.join(f)).unwrap();
        }
        edit_safetensors(&d, drop, reshape);
        let out = dir.path().join(format!("{case}.mlpackage"));
        let o = export(&d, "whisperkit", &out, &[]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{case}: export should fail");
        assert!(!err.contains("panicked"), "{case}: panic: {err}");
        assert!(
            err.contains(needle) && err.contains("model.safetensors"),
            "{case}: {err}"
        );
        assert!(!out.exists(), "{case}: output left behind");
    }
}
