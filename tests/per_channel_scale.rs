//! Palettization with per-output-channel scales (`--per-channel-scale`): the two-op chain
//! (`constexpr_lut_to_dense` → `constexpr_blockwise_shift_scale`) is accepted by the
//! validator, decodes bit for bit as coremltools materializes it, lowers the error of weights
//! whose rows differ in magnitude, runs in the interpreter exactly like its dense decode, and
//! is refused below iOS18.

mod common;

use common::milkit;
use common::programs::{f32s, host, ints, model, tin};
use common::rng::Rng;
use half::f16;
use milkit::ir::{Arg, DType, Model, Opset, Tensor as ITensor, Value};
use milkit::ops::{Builder, In};
use milkit::passes::compress::{compress, Method, Selection};
use milkit::passes::lut::{palettize, LutConfig, LutGranularity, LutMode};
use milkit::passes::quant::relative_rms_error;
use milkit::runtime::Session;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::Path;

fn lut4(mode: LutMode, pcs: bool) -> LutConfig {
    LutConfig {
        mode,
        nbits: 4,
        granularity: LutGranularity::PerGroupedChannel(16),
        per_channel_scale: pcs,
        cluster_dim: 1,
    }
}

/// A weight [32, 24, 3] whose output rows span a factor of ~180 in magnitude (within every
/// group of 16 rows), with a different distribution shape per row.
fn uneven_rows() -> (Vec<f16>, Vec<usize>) {
    let shape = vec![32usize, 24, 3];
    let rest = 24 * 3;
    let mut r = Rng(7);
    let mut w = Vec::with_capacity(32 * rest);
    for row in 0..32 {
        let mag = 2f32.powf((row % 16) as f32 / 2.0 - 4.0);
        let skew = 1.0 + (row % 5) as f32;
        for _ in 0..rest {
            let v = r.next();
            w.push(f16::from_f32(mag * v.signum() * v.abs().powf(skew)));
        }
    }
    (w, shape)
}

#[test]
fn channel_scales_lower_the_error_of_uneven_rows() {
    let (w, shape) = uneven_rows();
    for mode in [LutMode::Kmeans, LutMode::Uniform] {
        let plain = palettize(&w, &shape, &lut4(mode, false), None).unwrap();
        let scaled = palettize(&w, &shape, &lut4(mode, true), None).unwrap();
        let (e0, e1) = (
            relative_rms_error(&w, &plain.decode().unwrap()).unwrap(),
            relative_rms_error(&w, &scaled.decode().unwrap()).unwrap(),
        );
        eprintln!("{mode:?}: relative RMS error {e0:.4} without, {e1:.4} with channel scales");
        assert!(e1 < 0.8 * e0, "{mode:?}: {e1} not below {e0}");
        // The record's error is the error of the chained decode.
        assert_eq!(scaled.rel_rms_error(&w).unwrap(), e1);
        // One exact fp16 scale per row: the row's largest magnitude.
        let s = scaled.row_scale.as_ref().unwrap();
        assert_eq!(scaled.row_scale_shape(), vec![32, 1, 1]);
        for (row, s) in w.chunks(72).zip(s) {
            let m = row.iter().map(|v| v.to_f32().abs()).fold(0f32, f32::max);
            assert_eq!(s.to_f32(), m);
        }
    }
    // An all-zero row gets the scale 1 (not a division by zero).
    let mut z = w.clone();
    z[..72].iter_mut().for_each(|v| *v = f16::ZERO);
    let p = palettize(&z, &shape, &lut4(LutMode::Kmeans, true), None).unwrap();
    assert_eq!(p.row_scale.as_ref().unwrap()[0], f16::ONE);
    let d = p.decode().unwrap();
    assert!(d.iter().all(|v| v.is_finite()));
    assert!(p.rel_rms_error(&z).unwrap() < 0.2);
}

#[test]
fn calibrated_weights_are_scaled_back_to_the_original_error() {
    // Equal importance with channel scales: the k-means weighs each normalized row by s², so
    // it minimizes the original weight's error and beats the unweighted fit in normalized
    // space (coremltools' objective) on that measure.
    let (w, shape) = uneven_rows();
    let ones = vec![1f32; 72];
    let cfg = lut4(LutMode::Kmeans, true);
    let unweighted = palettize(&w, &shape, &cfg, None).unwrap();
    let weighted = palettize(&w, &shape, &cfg, Some(&ones)).unwrap();
    let (eu, ew) = (
        unweighted.rel_rms_error(&w).unwrap(),
        weighted.rel_rms_error(&w).unwrap(),
    );
    eprintln!("channel scales: error {eu:.4} unweighted, {ew:.4} with s²-scaled importance");
    assert!(ew < eu, "{ew} not below {eu}");
    // Both keep the same scales; only the tables and indices differ.
    assert_eq!(unweighted.row_scale, weighted.row_scale);
}

/// A conv on an fp16 input with `weight` (shape [32, 24, 3]), as an iOS18 model.
fn conv_model(weight: &[f16], opset: Opset) -> Model {
    let mut b = Builder::new(opset);
    let x = b.input("x", tin(DType::F16, &[1, 24, 20]));
    let wv = b.konst(
        "conv_weight",
        Value::Tensor(ITensor::f16(&[32, 24, 3], weight)),
    );
    let y = b
        .op1(
            "conv",
            "y",
            vec![
                ("x", x.into()),
                ("weight", wv.into()),
                ("strides", ints(&[1])),
                ("pad_type", In::C(Value::str("same"))),
            ],
        )
        .unwrap();
    model(b, &[(y, "y")])
}

#[test]
fn runtime_runs_the_chain_like_its_dense_decode() {
    let (w, shape) = uneven_rows();
    let cfg = lut4(LutMode::Kmeans, true);
    let mut m = conv_model(&w, Opset::Ios18);
    let sel = Selection {
        weight_threshold: 0,
        ..Selection::default()
    };
    let out = compress(&mut m, &Method::Palettize(cfg), &sel).unwrap();
    assert_eq!(out.compressed.len(), 1);
    assert_eq!(out.compressed[0].mode, "lut4-kmeans-g16-channel-scale");
    // 4-bit indices + two tables of 16 fp16 entries + one fp16 scale per row.
    assert_eq!(
        out.compressed[0].bytes_after,
        (32 * 72 / 2 + 2 * 16 * 2 + 32 * 2) as u64
    );
    let types: Vec<&str> = m
        .program
        .main()
        .unwrap()
        .block
        .operations
        .iter()
        .map(|o| o.op_type.as_str())
        .filter(|t| *t != "const")
        .collect();
    assert_eq!(
        types,
        [
            "constexpr_lut_to_dense",
            "constexpr_blockwise_shift_scale",
            "conv"
        ]
    );
    // The reference: the same conv on the decoded weight as a plain fp16 constant.
    let dense = palettize(&w, &shape, &cfg, None).unwrap().decode().unwrap();
    let reference = conv_model(&dense, Opset::Ios18);
    let mut r = Rng(11);
    let xs: Vec<f32> = r
        .vec(24 * 20)
        .into_iter()
        .map(|v| f16::from_f32(v).to_f32())
        .collect();
    let x = host(&xs, &[1, 24, 20])
        .to_dtype(candle_core::DType::F16)
        .unwrap();
    let run = |m: Model| {
        let mut s = Session::from_model(m).unwrap();
        f32s(&s.predict(&[("x", x.clone())]).unwrap()[0].1)
    };
    let (got, want) = (run(m), run(reference));
    assert_eq!(got.len(), 32 * 20);
    assert_eq!(got, want, "the chain decodes differently in the runtime");
}

/// A linear layer with `weight` [32, 72]: the shape whose LUT4 weights the runtime keeps
/// packed; with channel scales it falls back to the dense fp16 decode.
fn linear_model(weight: &[f16]) -> Model {
    let mut b = Builder::new(Opset::Ios18);
    let x = b.input("x", tin(DType::F16, &[5, 72]));
    let wv = b.konst("fc_weight", Value::Tensor(ITensor::f16(&[32, 72], weight)));
    let y = b
        .op1("linear", "y", vec![("x", x.into()), ("weight", wv.into())])
        .unwrap();
    model(b, &[(y, "y")])
}

#[test]
fn runtime_linear_with_the_chain_equals_its_dense_decode() {
    let (w, _) = uneven_rows();
    let cfg = lut4(LutMode::Kmeans, true);
    let mut m = linear_model(&w);
    let sel = Selection {
        weight_threshold: 0,
        ..Selection::default()
    };
    compress(&mut m, &Method::Palettize(cfg), &sel).unwrap();
    let dense = palettize(&w, &[32, 72], &cfg, None)
        .unwrap()
        .decode()
        .unwrap();
    let mut r = Rng(12);
    let x = host(&r.vec(5 * 72), &[5, 72])
        .to_dtype(candle_core::DType::F16)
        .unwrap();
    let run = |m: Model| {
        let mut s = Session::from_model(m).unwrap();
        f32s(&s.predict(&[("x", x.clone())]).unwrap()[0].1)
    };
    let (got, want) = (run(m), run(linear_model(&dense)));
    assert_eq!(got.len(), 5 * 32);
    assert_eq!(got, want, "the chain decodes differently in the runtime");
}

#[test]
fn refused_below_ios18_and_for_quantization() {
    let (w, _) = uneven_rows();
    let mut m = conv_model(&w, Opset::Ios17);
    let sel = Selection {
        weight_threshold: 0,
        ..Selection::default()
    };
    let err = compress(
        &mut m,
        &Method::Palettize(lut4(LutMode::Kmeans, true)),
        &sel,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("--per-channel-scale") && err.contains("iOS18"),
        "{err}"
    );
    let o = milkit()
        .args(["compress", "x.mlpackage", "--out", "y.mlpackage"])
        .args(["--quantize", "int4", "--per-channel-scale"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let msg = String::from_utf8_lossy(&o.stderr);
    assert!(
        msg.contains("--per-channel-scale applies to --palettize"),
        "{msg}"
    );
}

fn ok(o: &std::process::Output) -> serde_json::Value {
    assert!(
        o.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap_or(serde_json::Value::Null)
}

/// sha256 of the fp16 bytes of every constexpr output, decoded here from the stored parts:
/// table look-up, then `fp16(x · s)` with the row's scale.
fn milkit_decodes(m: &Model) -> BTreeMap<String, String> {
    let mut dense: BTreeMap<String, (Vec<usize>, Vec<f16>)> = BTreeMap::new();
    for op in m.program.main().unwrap().block.walk() {
        let inline = |k: &str| match op.arg(k) {
            Some(Arg::Value(Value::Tensor(t))) => t.clone(),
            _ => panic!("{}: input {k} not inline", op.name),
        };
        let (shape, vals) = match op.op_type.as_str() {
            "constexpr_lut_to_dense" => {
                let (idx, lut) = (inline("indices"), inline("lut"));
                let codes = milkit::passes::subbyte::unpack_bits(
                    &idx.data,
                    idx.dtype.bits() as u32,
                    idx.num_elements(),
                )
                .unwrap();
                let d = milkit::passes::lut::decode_lut(
                    &codes,
                    &idx.shape,
                    &lut.data.to_f16_vec(),
                    &lut.shape,
                )
                .unwrap();
                (idx.shape.clone(), d)
            }
            "constexpr_blockwise_shift_scale" => {
                let Some(Arg::Var(src)) = op.arg("data") else {
                    panic!("{}: data is not the table's output", op.name)
                };
                let (shape, data) = dense[src].clone();
                let scale = inline("scale");
                assert!(op.arg("offset").is_none());
                assert_eq!(scale.shape[0], shape[0]);
                assert!(scale.shape[1..].iter().all(|&d| d == 1));
                let s = scale.data.to_f16_vec();
                let rest = data.len() / shape[0];
                let v = data
                    .iter()
                    .enumerate()
                    .map(|(i, x)| f16::from_f32(x.to_f32() * s[i / rest].to_f32()))
                    .collect();
                (shape, v)
            }
            _ => continue,
        };
        dense.insert(op.outputs[0].name.clone(), (shape, vals));
    }
    dense
        .into_iter()
        .map(|(k, (_, v))| {
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            (k, format!("{:x}", Sha256::digest(&bytes)))
        })
        .collect()
}

/// The same digests from coremltools' loader and `materialized_val_inference` (which
/// materializes the table first for the scale op).
fn coremltools_decodes(pkg: &Path) -> Option<BTreeMap<String, String>> {
    let py = common::python()?;
    let script = r#"
import sys, json, hashlib, os, warnings, logging
warnings.filterwarnings("ignore"); logging.disable(logging.WARNING)
import numpy as np
import coremltools as ct
from coremltools.converters.mil.frontend.milproto.load import load
p = sys.argv[1]
spec = ct.utils.load_spec(p)
prog = load(spec, spec.specificationVersion, os.path.join(p, "Data", "com.apple.CoreML", "weights"))
out = {}
for op in prog.functions["main"].operations:
    if op.op_type.startswith("constexpr_"):
        v = np.ascontiguousarray(op.materialized_val_inference().astype(np.float16))
        out[op.outputs[0].name] = hashlib.sha256(v.tobytes()).hexdigest()
print(json.dumps(out))
"#;
    let o = std::process::Command::new(py)
        .arg("-c")
        .arg(script)
        .arg(pkg)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "coremltools decode failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let s = String::from_utf8_lossy(&o.stdout);
    let line = s.lines().rev().find(|l| l.starts_with('{')).unwrap();
    Some(serde_json::from_str(line).unwrap())
}

#[test]
fn tiny_en_encoder_lut4_with_channel_scales() {
    let Some(fx) = common::fixtures() else { return };
    let model_dir = fx.join("models/whisper-tiny.en");
    let dir = tempfile::tempdir().unwrap();
    let fp16 = dir.path().join("fp16.mlpackage");
    let export = milkit()
        .args(["export", "--quiet", "--component", "encoder"])
        .args(["--abi", "whispercpp", "--model"])
        .arg(&model_dir)
        .arg("--out")
        .arg(&fp16)
        .output()
        .unwrap();
    ok(&export);
    let lut = |extra: &[&str], out: &Path| {
        ok(&milkit()
            .args(["compress", "--quiet", "--json", "--palettize", "kmeans"])
            .args(["--nbits", "4", "--group-size", "16"])
            .args(extra)
            .arg(&fp16)
            .arg("--out")
            .arg(out)
            .output()
            .unwrap())
    };
    let (plain_pkg, pcs_pkg) = (
        dir.path().join("lut4.mlpackage"),
        dir.path().join("lut4-pcs.mlpackage"),
    );
    let plain = lut(&[], &plain_pkg);
    let pcs = lut(&["--per-channel-scale"], &pcs_pkg);
    let (e0, e1) = (
        plain["mean_rel_rms_error"].as_f64().unwrap(),
        pcs["mean_rel_rms_error"].as_f64().unwrap(),
    );
    eprintln!(
        "tiny.en encoder LUT4 k-means g16 mean relative RMS error: {e0:.4} without, {e1:.4} \
         with per-channel scales; stored bytes {} vs {}",
        plain["bytes_after"], pcs["bytes_after"]
    );
    assert!(e1.is_finite() && e1 > 0.0 && e1 < 0.2, "{e1}");
    let mode = pcs["mode"].as_str().unwrap();
    assert!(mode.ends_with("-channel-scale"), "{mode}");

    let m = milkit::package::load_package(&pcs_pkg).unwrap();
    let count = |t: &str| common::count_ops(&m, t);
    assert_eq!(count("constexpr_lut_to_dense"), 26);
    assert_eq!(count("constexpr_blockwise_shift_scale"), 26);
    // verify reads the chain and still counts 26 table ops.
    let v = milkit()
        .args(["verify", "--json"])
        .arg(&pcs_pkg)
        .output()
        .unwrap();
    let vj = ok(&v);
    let counts = &vj["constexpr"]["counts"];
    assert_eq!(counts["constexpr_lut_to_dense"], 26, "{counts}");
    assert_eq!(counts["constexpr_blockwise_shift_scale"], 26, "{counts}");
    common::validate(&pcs_pkg);
    if let Some(theirs) = coremltools_decodes(&pcs_pkg) {
        let ours = milkit_decodes(&m);
        assert_eq!(ours.len(), 52);
        assert_eq!(ours, theirs, "decode differs from coremltools'");
    }
}

#[test]
fn recipe_table_takes_the_flag() {
    let Some(fx) = common::fixtures() else { return };
    let dir = tempfile::tempdir().unwrap();
    let hf = fx.join("models/whisper-tiny.en");
    let out =
        common::export_encoder_recipe(dir.path(), "whispercpp", "per_channel_scale = true", &hf);
    let m = milkit::package::load_package(&out.join("encoder.mlpackage")).unwrap();
    assert_eq!(common::count_ops(&m, "constexpr_blockwise_shift_scale"), 26);
}
