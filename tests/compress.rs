//! Compression end to end: op counts, byte ratios, the validator, bit-exact agreement of
//! milkit's decode with coremltools' materialization, error against coremltools' own k-means,
//! and every refusal.

mod common;
use common::milkit;
use milkit::ir::{Arg, DType, Model, Value};
use milkit::package::load_package;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::Path;

fn run(args: &[&str], paths: &[&Path]) -> std::process::Output {
    let mut c = milkit();
    c.args(args);
    for p in paths {
        c.arg(p);
    }
    c.output().unwrap()
}

fn ok(o: &std::process::Output) -> serde_json::Value {
    assert!(
        o.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap_or(serde_json::Value::Null)
}

fn weight_len(p: &Path) -> u64 {
    std::fs::metadata(p.join("Data/com.apple.CoreML/weights/weight.bin"))
        .unwrap()
        .len()
}

/// sha256 of each constexpr output as milkit decodes it (fp16 little-endian bytes).
fn milkit_decodes(m: &Model) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for op in m.program.main().unwrap().block.walk() {
        let inline = |k: &str| match op.arg(k) {
            Some(Arg::Value(Value::Tensor(t))) => t.clone(),
            _ => panic!("{}: input {k} not inline", op.name),
        };
        let dense = match op.op_type.as_str() {
            "constexpr_lut_to_dense" => {
                let idx = inline("indices");
                let lut = inline("lut");
                let nbits = idx.dtype.bits() as u32;
                let codes =
                    milkit::passes::subbyte::unpack_bits(&idx.data, nbits, idx.num_elements())
                        .unwrap();
                milkit::passes::lut::decode_lut(
                    &codes,
                    &idx.shape,
                    &lut.data.to_f16_vec(),
                    &lut.shape,
                )
                .unwrap()
            }
            "constexpr_blockwise_shift_scale" => {
                use milkit::passes::quant::{decode_blockwise, QuantValues};
                let data = inline("data");
                let scale = inline("scale");
                let vals = |t: &milkit::ir::Tensor| match t.dtype {
                    DType::I4 => QuantValues::Signed(
                        milkit::passes::subbyte::unpack_int4(&t.data, t.num_elements()).unwrap(),
                    ),
                    DType::U4 => QuantValues::Unsigned(
                        milkit::passes::subbyte::unpack_bits(&t.data, 4, t.num_elements()).unwrap(),
                    ),
                    DType::I8 => QuantValues::Signed(t.data.iter().map(|&b| b as i8).collect()),
                    _ => QuantValues::Unsigned(t.data.to_vec()),
                };
                let off = match op.arg("offset") {
                    Some(Arg::Value(Value::Tensor(t))) => Some(vals(t)),
                    _ => None,
                };
                decode_blockwise(
                    &vals(&data),
                    &data.shape,
                    &scale.data.to_f16_vec(),
                    &scale.shape,
                    off.as_ref(),
                )
                .unwrap()
            }
            _ => continue,
        };
        let bytes: Vec<u8> = dense.iter().flat_map(|x| x.to_le_bytes()).collect();
        out.insert(
            op.outputs[0].name.clone(),
            format!("{:x}", Sha256::digest(&bytes)),
        );
    }
    out
}

/// The same digests from coremltools' own loader and `materialized_val_inference`.
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
fn tiny_en_encoder_lut4_and_int4() {
    let Some(fx) = common::fixtures() else { return };
    let model = fx.join("models/whisper-tiny.en");
    let dir = tempfile::tempdir().unwrap();
    let fp16 = dir.path().join("fp16.mlpackage");
    ok(&run(
        &[
            "export",
            "--quiet",
            "--component",
            "encoder",
            "--abi",
            "whispercpp",
            "--model",
        ],
        &[&model, Path::new("--out"), &fp16],
    ));
    for mode in ["kmeans", "uniform"] {
        let out = dir.path().join(format!("lut4-{mode}.mlpackage"));
        // Compress while exporting: no fp16 intermediate.
        let rep = ok(&run(
            &[
                "export",
                "--quiet",
                "--json",
                "--abi",
                "whispercpp",
                "--palettize",
                mode,
                "--nbits",
                "4",
                "--granularity",
                "per-grouped-channel",
                "--group-size",
                "16",
                "--model",
            ],
            &[&model, Path::new("--out"), &out],
        ));
        let m = load_package(&out).unwrap();
        assert_eq!(
            common::count_ops(&m, "constexpr_lut_to_dense"),
            26,
            "{mode}"
        );
        let whole = weight_len(&fp16) as f64 / weight_len(&out) as f64;
        assert!(whole >= 3.2, "{mode}: weight.bin only {whole:.2}x smaller");
        let sel = rep["ratio"].as_f64().unwrap();
        assert!(
            sel >= 3.5,
            "{mode}: selected weights only {sel:.2}x smaller"
        );
        // The positional embedding stays a plain fp16 const.
        let f = m.program.main().unwrap();
        let pos = f
            .block
            .operations
            .iter()
            .find(|o| o.name == "embed_positions")
            .unwrap();
        assert_eq!(pos.op_type, "const");
        // The JSON report validates against its checked-in schema.
        let schema: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(
                Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/compress.schema.json"),
            )
            .unwrap(),
        )
        .unwrap();
        let v = jsonschema::validator_for(&schema).unwrap();
        let errors: Vec<String> = v.iter_errors(&rep).map(|e| e.to_string()).collect();
        assert!(
            errors.is_empty(),
            "compress report violates its schema: {errors:?}"
        );
        if mode == "kmeans" {
            // coremltools' own LUT4 k-means g16 on the same weights: mean relative RMS 0.1233.
            let err = rep["mean_rel_rms_error"].as_f64().unwrap();
            eprintln!(
                "milkit LUT4 k-means g16 mean relative RMS error: {err:.4} (coremltools 0.1233)"
            );
            assert!(err <= 0.1233, "{err}");
        }
        common::validate(&out);
        if let Some(theirs) = coremltools_decodes(&out) {
            assert_eq!(
                milkit_decodes(&m),
                theirs,
                "{mode}: decode differs from coremltools'"
            );
        }
    }
    // int4 per-block 32: conv1's 80 input channels are not divisible by 32 → refused, nothing written.
    let out = dir.path().join("int4.mlpackage");
    let o = run(
        &[
            "compress",
            "--quiet",
            "--quantize",
            "int4",
            "--granularity",
            "per-block",
            "--block-size",
            "32",
        ],
        &[&fp16, Path::new("--out"), &out],
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("conv1") && err.contains("80") && err.contains("--skip-indivisible"),
        "{err}"
    );
    assert!(!out.exists());
    // Opting in skips it, and says so.
    let rep = ok(&run(
        &[
            "compress",
            "--quiet",
            "--json",
            "--quantize",
            "int4",
            "--granularity",
            "per-block",
            "--block-size",
            "32",
            "--skip-indivisible",
        ],
        &[&fp16, Path::new("--out"), &out],
    ));
    assert_eq!(rep["skipped"].as_array().unwrap().len(), 1);
    let m = load_package(&out).unwrap();
    assert_eq!(common::count_ops(&m, "constexpr_blockwise_shift_scale"), 25);
    common::validate(&out);
    if let Some(theirs) = coremltools_decodes(&out) {
        assert_eq!(
            milkit_decodes(&m),
            theirs,
            "int4: decode differs from coremltools'"
        );
    }
    // Group size that does not divide the output channels.
    let out = dir.path().join("g7.mlpackage");
    let o = run(
        &[
            "compress",
            "--quiet",
            "--palettize",
            "kmeans",
            "--group-size",
            "7",
        ],
        &[&fp16, Path::new("--out"), &out],
    );
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("group size 7"));
    assert!(!out.exists());
}

#[test]
fn turbo_encoder_has_194_lut_ops() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("turbo");
    ok(&run(
        &["synth", "--quiet", "--preset", "large-v3-turbo", "--out"],
        &[&ck],
    ));
    let out = dir.path().join("turbo-lut4.mlpackage");
    // Uniform tables keep this test quick; k-means at this size is timed by `milkit bench`.
    ok(&run(
        &[
            "export",
            "--quiet",
            "--abi",
            "whisperkit",
            "--palettize",
            "uniform",
            "--nbits",
            "4",
            "--model",
        ],
        &[&ck, Path::new("--out"), &out],
    ));
    let m = load_package(&out).unwrap();
    assert_eq!(common::count_ops(&m, "constexpr_lut_to_dense"), 194);
    assert_eq!(common::count_ops(&m, "conv"), 194);
    common::validate(&out);
}

#[test]
fn recipe_exports_a_directory() {
    let Some(fx) = common::fixtures() else { return };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("hybrid");
    let recipe = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/whispercpp-hybrid.toml");
    ok(&run(
        &["export", "--quiet", "--recipe"],
        &[
            &recipe,
            Path::new("--model"),
            &fx.join("models/whisper-tiny.en"),
            Path::new("--out"),
            &out,
        ],
    ));
    let m = load_package(&out.join("encoder.mlpackage")).unwrap();
    assert_eq!(common::count_ops(&m, "constexpr_lut_to_dense"), 26);
    assert_eq!(m.description.inputs[0].name, "logmel_data");
}
