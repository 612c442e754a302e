//! `milkit run` through the binary: a small fp16 package fed from NumPy files (fp32 data for
//! an fp16 input, int32 for an fp16 mask, converted at the boundary) and from a safetensors
//! tensor; outputs come back as .npy files that NumPy reads and checks against its own
//! arithmetic; bad invocations fail with messages naming the input and the file; a stateful
//! two-function package run with `--repeat`, `--state`, `--save-states` and `--function`;
//! a multifunction package coremltools made, each function run; a classifier's label and
//! class → probability dictionary written as JSON.

mod common;

use milkit::ir::{
    ArrayDType, DType, Description, DictKey, Feature, FeatureKind, Function, Model, Opset, Program,
    Value, ValueType,
};
use milkit::ops::{Builder, In};
use std::path::{Path, PathBuf};
use std::process::Command;

/// y = x · mask + 1 (fp16 [2, 3]), s = reduce_sum(x, axis 1) (fp16 [2]).
fn package(dir: &Path) -> PathBuf {
    let mut b = Builder::new(Opset::Ios17);
    let x = b.input("x", ValueType::tensor(DType::F16, &[2, 3]));
    let m = b.input("mask", ValueType::tensor(DType::F16, &[2, 3]));
    let xm = b
        .op1("mul", "xm", vec![("x", In::V(x.clone())), ("y", In::V(m))])
        .unwrap();
    let y = b
        .op1(
            "add",
            "y",
            vec![("x", In::V(xm)), ("y", In::C(Value::f16_scalar(1.0)))],
        )
        .unwrap();
    let s = b
        .op1(
            "reduce_sum",
            "s",
            vec![
                ("x", In::V(x)),
                ("axes", In::C(Value::i32s(&[1]))),
                ("keep_dims", In::C(Value::bool_scalar(false))),
            ],
        )
        .unwrap();
    let (inputs, block) = b.finish(&[(y, "y"), (s, "s")]).unwrap();
    let m = Model::single(
        Opset::Ios17,
        inputs,
        block,
        Description {
            inputs: vec![
                Feature::new("x", ArrayDType::F16, &[2, 3]),
                Feature::new("mask", ArrayDType::F16, &[2, 3]),
            ],
            outputs: vec![
                Feature::new("y", ArrayDType::F16, &[2, 3]),
                Feature::new("s", ArrayDType::F16, &[2]),
            ],
            ..Default::default()
        },
    );
    let p = dir.join("small.mlpackage");
    milkit::package::save_package(&m, &p, false, &mut |_| {}).unwrap();
    p
}

fn python(code: &str, dir: &Path) -> String {
    let py = common::python().expect("python");
    let o = Command::new(py)
        .arg("-c")
        .arg(code)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn run_round_trips_numpy_with_boundary_conversions() {
    if common::python().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let pkg = package(d);
    python(
        "import numpy as np\n\
         np.save('x.npy', np.array([[0.5, -1.25, 3.0], [2.0, 0.125, -4.5]], dtype=np.float32))\n\
         np.save('mask.npy', np.array([[1, 0, 1], [0, 1, 1]], dtype=np.int32))\n",
        d,
    );
    let out = d.join("out");
    let o = common::milkit()
        .arg("run")
        .arg(&pkg)
        .arg("--input")
        .arg(format!("x={}", d.join("x.npy").display()))
        .arg("--input")
        .arg(format!("mask={}", d.join("mask.npy").display()))
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "run failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let report = python(
        "import numpy as np\n\
         x = np.load('x.npy').astype(np.float16); m = np.load('mask.npy').astype(np.float16)\n\
         y = np.load('out/y.npy'); s = np.load('out/s.npy')\n\
         assert y.dtype == np.float16 and y.shape == (2, 3), (y.dtype, y.shape)\n\
         assert s.dtype == np.float16 and s.shape == (2,), (s.dtype, s.shape)\n\
         assert np.array_equal(y, x * m + np.float16(1)), y\n\
         assert np.allclose(s.astype(np.float32), x.astype(np.float32).sum(1), atol=1e-3), s\n\
         print('ok')\n",
        d,
    );
    assert_eq!(report.trim(), "ok");

    // The same input from a safetensors tensor (f32 data, fp16 input): same y.
    let xs: Vec<u8> = [0.5f32, -1.25, 3.0, 2.0, 0.125, -4.5]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2, 3], &xs).unwrap();
    let st = d.join("in.safetensors");
    safetensors::serialize_to_file([("features", view)], None, &st).unwrap();
    let out2 = d.join("out2");
    let o = common::milkit()
        .arg("run")
        .arg(&pkg)
        .arg("--input")
        .arg(format!("x={}:features", st.display()))
        .arg("--input")
        .arg(format!("mask={}", d.join("mask.npy").display()))
        .arg("--out")
        .arg(&out2)
        .arg("--quiet")
        .arg("--profile")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        std::fs::read(out.join("y.npy")).unwrap(),
        std::fs::read(out2.join("y.npy")).unwrap()
    );
    // `--profile` (asked for, so printed even with --quiet, on stderr): the load, the one
    // prediction, and the op types with their calls.
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("load: ") && err.contains("prediction 0: "),
        "{err}"
    );
    assert!(err.contains("| reduce_sum | 1 | "), "{err}");
    assert!(
        o.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
}

/// `reduce_sum`'s calls in a `--profile` table.
fn reduce_sum_calls(stderr: &str) -> usize {
    let row = stderr
        .lines()
        .find(|l| l.starts_with("| reduce_sum | "))
        .unwrap_or_else(|| panic!("no reduce_sum row: {stderr}"));
    row.split('|').nth(2).unwrap().trim().parse().unwrap()
}

#[test]
fn with_no_memo_every_repeated_prediction_computes_every_op() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let pkg = package(d);
    let t = candle_core::Tensor::ones((2, 3), candle_core::DType::F32, &candle_core::Device::Cpu)
        .unwrap();
    let input = d.join("ones.npy");
    milkit::runtime::io::write_npy(&input, &t).unwrap();
    let calls = |extra: &[&str]| {
        let o = common::milkit()
            .arg("run")
            .arg(&pkg)
            .arg("--input")
            .arg(format!("x={}", input.display()))
            .arg("--input")
            .arg(format!("mask={}", input.display()))
            .args([
                "--out",
                d.join("out").to_str().unwrap(),
                "--quiet",
                "--profile",
            ])
            .args(["--repeat", "3"])
            .args(extra)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "{err}");
        reduce_sum_calls(&err)
    };
    // The same inputs three times: by default the later predictions reuse the sum.
    assert!(calls(&[]) < 3);
    assert_eq!(calls(&["--no-memo"]), 3);
}

#[test]
fn several_files_for_one_input_are_taken_in_turn_by_repeated_predictions() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let pkg = package(d);
    let cpu = candle_core::Device::Cpu;
    let write = |name: &str, v: f32| {
        let t = candle_core::Tensor::full(v, (2, 3), &cpu).unwrap();
        let p = d.join(format!("{name}.npy"));
        milkit::runtime::io::write_npy(&p, &t).unwrap();
        p
    };
    let (one, two) = (write("one", 1.0), write("two", 2.0));
    let out = d.join("out");
    let o = common::milkit()
        .arg("run")
        .arg(&pkg)
        .arg("--input")
        .arg(format!("x={}", one.display()))
        .arg("--input")
        .arg(format!("x={}", two.display()))
        .arg("--input")
        .arg(format!("mask={}", one.display()))
        .args([
            "--out",
            out.to_str().unwrap(),
            "--quiet",
            "--profile",
            "--repeat",
            "3",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    // y = x * mask + 1: predictions 0 and 2 read `one`, prediction 1 reads `two`.
    let y = |k: usize| {
        let path = out.join(format!("y.{k}.npy"));
        common::programs::f32s(&milkit::runtime::io::read_tensor(path.to_str().unwrap()).unwrap())
    };
    assert_eq!(y(0), vec![2.0; 6]);
    assert_eq!(y(1), vec![3.0; 6]);
    assert_eq!(y(2), vec![2.0; 6]);
    // The input changed every time: nothing was reused.
    assert_eq!(reduce_sum_calls(&err), 3, "{err}");
}

fn run_err(pkg: &Path, inputs: &[String], out: &Path) -> String {
    let mut c = common::milkit();
    c.arg("run").arg(pkg).arg("--out").arg(out);
    for i in inputs {
        c.arg("--input").arg(i);
    }
    let o = c.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(2), "expected failure: {err}");
    assert!(!err.contains("panicked"), "{err}");
    err
}

#[test]
fn run_errors_name_the_input_and_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let pkg = package(d);
    let out = d.join("out");
    let good = |name: &str, shape: &[usize]| {
        let t =
            candle_core::Tensor::zeros(shape, candle_core::DType::F32, &candle_core::Device::Cpu)
                .unwrap();
        let p = d.join(format!("{name}.npy"));
        milkit::runtime::io::write_npy(&p, &t).unwrap();
        p
    };
    let x = good("x", &[2, 3]);
    let wrong = good("wrong", &[3, 2]);
    let garbage = d.join("garbage.npy");
    std::fs::write(&garbage, b"not numpy").unwrap();
    let m = good("mask", &[2, 3]);
    let spec = |n: &str, p: &Path| format!("{n}={}", p.display());

    // Wrong shape: names the input and its file.
    let e = run_err(&pkg, &[spec("x", &wrong), spec("mask", &m)], &out);
    assert!(e.contains("`x`") && e.contains("wrong.npy"), "{e}");
    // Unreadable file.
    let e = run_err(&pkg, &[spec("x", &garbage), spec("mask", &m)], &out);
    assert!(e.contains("`x`") && e.contains("garbage.npy"), "{e}");
    // Missing input, unknown input, malformed spec, safetensors without a tensor name.
    let e = run_err(&pkg, &[spec("x", &x)], &out);
    assert!(e.contains("mask"), "{e}");
    let e = run_err(
        &pkg,
        &[spec("x", &x), spec("mask", &m), spec("z", &x)],
        &out,
    );
    assert!(e.contains("no input `z`") && e.contains("mask"), "{e}");
    let e = run_err(&pkg, &["x".into()], &out);
    assert!(e.contains("NAME=FILE"), "{e}");
    let e = run_err(
        &pkg,
        &[
            format!("x={}", d.join("a.safetensors").display()),
            spec("mask", &m),
        ],
        &out,
    );
    assert!(e.contains("a.safetensors"), "{e}");
    assert!(!out.exists(), "nothing written on failure");
}

/// `bench` is four subcommands, each with its own named flags; only `bench audio` takes a
/// positional (the WAV file).
#[test]
fn bench_subcommands_each_take_their_own_flags() {
    let help = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_milkit"))
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let text = help(&["bench", "--help"]);
    for sub in ["audio", "export", "compress", "decode", "gemm"] {
        assert!(
            text.contains(&format!("  {sub} ")),
            "bench --help lacks {sub}:\n{text}"
        );
    }
    for (sub, flags, usage) in [
        (
            "audio",
            &["--models", "--profile", "--profile-ops", "--runs"][..],
            "Usage: milkit bench audio [OPTIONS] --models <MODELS> <AUDIO>\n",
        ),
        (
            "export",
            &["--preset", "--runs"][..],
            "Usage: milkit bench export [OPTIONS]\n",
        ),
        (
            "compress",
            &["--only <ONLY>", "--only-turbo", "--python"][..],
            "Usage: milkit bench compress [OPTIONS]\n",
        ),
        (
            "decode",
            &["--only <ONLY>", "--isa", "--runs"][..],
            "Usage: milkit bench decode [OPTIONS]\n",
        ),
    ] {
        let text = help(&["bench", sub, "--help"]);
        for flag in flags {
            assert!(
                text.contains(flag),
                "bench {sub} --help lacks {flag}:\n{text}"
            );
        }
        assert!(text.contains(usage), "bench {sub}:\n{text}");
    }
}

/// `bench decode --only fp16 --runs 3 --json` on tiny.en: one row, the fp16 decoder,
/// its bytes per token (weights + cross K/V), and a ratio that is its time over its floor.
#[test]
fn decode_bench_reports_one_variant_against_its_floor() {
    let Some(fx) = common::fixtures() else { return };
    let out = Command::new(env!("CARGO_BIN_EXE_milkit"))
        .args(["bench", "decode", "--only", "fp16", "--runs", "3", "--json"])
        .arg("--model")
        .arg(fx.join("models/whisper-tiny.en"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let schema_path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/bench-decode.schema.json");
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&schema_path).unwrap()).unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let errors: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
    assert!(
        errors.is_empty(),
        "decode report violates its schema: {errors:?}"
    );
    let rows = v["rows"].as_array().unwrap();
    // One row per kernel level: the CPU's best, and AVX2 beside AVX-512.
    use milkit::kernels::gemv::Isa;
    let levels: &[&str] = match Isa::cpu() {
        Isa::Avx512 => &["avx512", "avx2"],
        Isa::Avx2 => &["avx2"],
        Isa::Portable => &["portable"],
    };
    assert_eq!(
        rows.len(),
        levels.len(),
        "--only fp16 keeps one variant: {v}"
    );
    for (r, l) in rows.iter().zip(levels) {
        assert_eq!(r["variant"], "fp16", "{v}");
        assert_eq!(r["isa"], *l, "{v}");
    }
    let r = &rows[0];
    let f = |k: &str| r[k].as_f64().unwrap();
    // tiny.en's decoder weights (incl. the 51864 × 384 head) are ~56 MB in fp16, and the
    // cross K/V 4 layers × 2 × 384 × 1500 fp16 values.
    assert_eq!(f("cross_kv_bytes"), (4 * 2 * 384 * 1500 * 2) as f64);
    assert!((50e6..70e6).contains(&f("weight_bytes")), "{r}");
    let floor = f("bytes_per_token") / (f("bandwidth_gbps") * 1e9) * 1e3;
    assert!((f("floor_ms_per_token") - floor).abs() < 1e-9 * floor.max(1.0));
    assert!((f("ratio") - f("ms_per_token") / floor).abs() < 1e-9 * f("ratio"));
    assert!(f("ms_per_token") > 0.0 && f("ratio") > 0.0, "{r}");
    let bad = Command::new(env!("CARGO_BIN_EXE_milkit"))
        .args(["bench", "decode", "--isa", "sse9", "--model"])
        .arg(fx.join("models/whisper-tiny.en"))
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("unknown kernel level `sse9`"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    let none = Command::new(env!("CARGO_BIN_EXE_milkit"))
        .args(["bench", "decode", "--only", "fp8", "--model"])
        .arg(fx.join("models/whisper-tiny.en"))
        .output()
        .unwrap();
    assert!(!none.status.success());
    assert!(
        String::from_utf8_lossy(&none.stderr).contains("no decode variant matches `fp8`"),
        "{}",
        String::from_utf8_lossy(&none.stderr)
    );
}

/// An iOS18 accumulator: state `acc` fp16 [3]; `main` does acc += x, `twice` acc += 2·x;
/// both output the new acc as `y`.
fn stateful_package(dir: &Path) -> PathBuf {
    let mut program = Program::default();
    for (fname, k) in [("main", 1.0f32), ("twice", 2.0)] {
        let mut b = Builder::new(Opset::Ios18);
        let acc = b.input(
            "acc",
            ValueType::State(milkit::ir::TensorType::new(DType::F16, &[3])),
        );
        let x = b.input("x", ValueType::tensor(DType::F16, &[3]));
        let cur = b
            .op1("read_state", "cur", vec![("input", In::V(acc.clone()))])
            .unwrap();
        let kx = b
            .op1(
                "mul",
                "kx",
                vec![("x", In::V(x)), ("y", In::C(Value::f16_scalar(k)))],
            )
            .unwrap();
        let sum = b
            .op1("add", "sum", vec![("x", In::V(cur)), ("y", In::V(kx))])
            .unwrap();
        let new = b
            .op1(
                "coreml_update_state",
                "new",
                vec![("state", In::V(acc)), ("value", In::V(sum))],
            )
            .unwrap();
        let y = b.op1("identity", "y", vec![("x", In::V(new))]).unwrap();
        let (inputs, block) = b.finish(&[(y, "y")]).unwrap();
        program.functions.insert(
            fname.into(),
            Function {
                inputs,
                opset: Opset::Ios18,
                block,
            },
        );
    }
    let m = Model {
        spec_version: Opset::Ios18.spec_version(),
        description: Description {
            inputs: vec![Feature::new("x", ArrayDType::F16, &[3])],
            outputs: vec![Feature::new("y", ArrayDType::F16, &[3])],
            states: vec![Feature::new("acc", ArrayDType::F16, &[3])],
            ..Default::default()
        },
        program,
    };
    let p = dir.join("acc.mlpackage");
    milkit::package::save_package(&m, &p, false, &mut |_| {}).unwrap();
    p
}

fn f32s(path: &Path) -> Vec<f32> {
    let t = milkit::runtime::io::read_tensor(path.to_str().unwrap()).unwrap();
    t.to_dtype(candle_core::DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

fn write_f32(path: &Path, v: &[f32]) {
    let t = candle_core::Tensor::from_vec(v.to_vec(), v.len(), &candle_core::Device::Cpu).unwrap();
    milkit::runtime::io::write_npy(path, &t).unwrap();
}

#[test]
fn repeat_shares_one_zeroed_state_across_predictions_and_saves_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let pkg = stateful_package(d);
    let x = [0.5f32, -1.0, 2.0];
    write_f32(&d.join("x.npy"), &x);
    let out = d.join("out");
    let o = common::milkit()
        .arg("run")
        .arg(&pkg)
        .arg("--input")
        .arg(format!("x={}", d.join("x.npy").display()))
        .args(["--repeat", "3", "--save-states", "--quiet", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Zero-initialised, then acc += x per prediction: prediction k sees (k + 1)·x.
    for k in 0..3 {
        let want: Vec<f32> = x.iter().map(|v| v * (k + 1) as f32).collect();
        assert_eq!(
            f32s(&out.join(format!("y.{k}.npy"))),
            want,
            "prediction {k}"
        );
    }
    assert!(!out.join("y.npy").exists());
    let last: Vec<f32> = x.iter().map(|v| v * 3.0).collect();
    assert_eq!(f32s(&out.join("states/acc.npy")), last);

    // An initial state from a file, another function, one prediction: today's names.
    let init = [10.0f32, 20.0, 30.0];
    write_f32(&d.join("init.npy"), &init);
    let out2 = d.join("out2");
    let o = common::milkit()
        .arg("run")
        .arg(&pkg)
        .arg("--input")
        .arg(format!("x={}", d.join("x.npy").display()))
        .arg("--state")
        .arg(format!("acc={}", d.join("init.npy").display()))
        .args(["--function", "twice", "--quiet", "--out"])
        .arg(&out2)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let want: Vec<f32> = init.iter().zip(&x).map(|(i, v)| i + 2.0 * v).collect();
    assert_eq!(f32s(&out2.join("y.npy")), want);
    assert!(!out2.join("states").exists());

    // A state the package lacks, and a function it lacks: clear errors.
    let o = common::milkit()
        .arg("run")
        .arg(&pkg)
        .arg("--input")
        .arg(format!("x={}", d.join("x.npy").display()))
        .arg("--state")
        .arg(format!("cache={}", d.join("init.npy").display()))
        .arg("--out")
        .arg(d.join("out3"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("no state `cache`") && err.contains("acc"),
        "{err}"
    );
    let o = common::milkit()
        .arg("run")
        .arg(&pkg)
        .args(["--function", "thrice", "--out"])
        .arg(d.join("out4"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("thrice") && err.contains("twice"), "{err}");

    // inspect lists both functions and the state.
    let o = common::milkit().arg("inspect").arg(&pkg).output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        text.contains("function main") && text.contains("function twice"),
        "{text}"
    );
    let states = text.split("states:").nth(1).unwrap_or("");
    assert!(states.trim_start().starts_with("acc"), "{text}");
}

/// A multifunction package as coremltools makes one (`save_multifunction`: each function's
/// interface under `description.functions`, none at the top level, a default function):
/// `plus` (x + 1, the default) and `times` (x · 2) on x fp32 [3]; `run` takes the default
/// without `--function` and either function with it; `inspect` lists both.
#[test]
fn a_coremltools_multifunction_package_runs_each_function() {
    if common::python().is_none() {
        eprintln!("skipped: no coremltools python");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    python(
        r#"
import logging, warnings
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
import numpy as np, coremltools as ct
from coremltools.converters.mil import Builder as mb
def make(name, op):
    @mb.program(input_specs=[mb.TensorSpec(shape=(3,))], opset_version=ct.target.iOS18)
    def p(x):
        return op(x)
    m = ct.convert(p, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS18,
                   compute_precision=ct.precision.FLOAT32, skip_model_load=True)
    m.save(name + ".mlpackage")
make("a", lambda x: mb.add(x=x, y=np.float32(1.0), name="y"))
make("b", lambda x: mb.mul(x=x, y=np.float32(2.0), name="y"))
desc = ct.utils.MultiFunctionDescriptor()
desc.add_function("a.mlpackage", src_function_name="main", target_function_name="plus")
desc.add_function("b.mlpackage", src_function_name="main", target_function_name="times")
desc.default_function_name = "plus"
ct.utils.save_multifunction(desc, "mf.mlpackage")
"#,
        d,
    );
    let pkg = d.join("mf.mlpackage");
    let x = [0.5f32, -1.0, 2.0];
    write_f32(&d.join("x.npy"), &x);
    for (function, want) in [
        (None, x.map(|v| v + 1.0)),
        (Some("plus"), x.map(|v| v + 1.0)),
        (Some("times"), x.map(|v| v * 2.0)),
    ] {
        let out = d.join(format!("out-{}", function.unwrap_or("default")));
        let mut c = common::milkit();
        c.arg("run")
            .arg(&pkg)
            .arg("--input")
            .arg(format!("x={}", d.join("x.npy").display()));
        if let Some(f) = function {
            c.args(["--function", f]);
        }
        let o = c.arg("--quiet").arg("--out").arg(&out).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(f32s(&out.join("y.npy")), want, "{function:?}");
    }
    let o = common::milkit().arg("inspect").arg(&pkg).output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        text.contains("function plus") && text.contains("function times"),
        "{text}"
    );
    // Saved back by milkit, the package keeps its per-function description.
    let m = milkit::package::load_package(&pkg).unwrap();
    assert_eq!(m.description.default_function, "plus");
    let keys: Vec<&str> = m.description.functions.keys().map(|k| k.as_str()).collect();
    assert_eq!(keys, ["plus", "times"]);
    let again = d.join("again.mlpackage");
    milkit::package::save_package(&m, &again, false, &mut |_| {}).unwrap();
    assert_eq!(
        milkit::package::load_package(&again).unwrap().description,
        m.description
    );
}

/// A classifier (iOS15): softmax of x fp32 [4], then `classify` with string classes (one
/// needing JSON escapes); outputs `label` and `label_probs` as coremltools names them.
fn classifier_package(dir: &Path, classes: &[&str]) -> PathBuf {
    let mut b = Builder::new(Opset::Ios15);
    let x = b.input("x", ValueType::tensor(DType::F32, &[4]));
    let p = b
        .op1(
            "softmax",
            "p",
            vec![("x", In::V(x)), ("axis", In::C(Value::i32_scalar(0)))],
        )
        .unwrap();
    let list = Value::List {
        elem: ValueType::Tensor(milkit::ir::TensorType::scalar(DType::Str)),
        values: classes.iter().map(|c| Value::str(c)).collect(),
    };
    let outs = b
        .op(
            "classify",
            "classify",
            vec![("probabilities", In::V(p)), ("classes", In::Inline(list))],
        )
        .unwrap();
    let (inputs, block) = b
        .finish(&[(outs[0].clone(), "label"), (outs[1].clone(), "label_probs")])
        .unwrap();
    let m = Model::single(
        Opset::Ios15,
        inputs,
        block,
        Description {
            inputs: vec![Feature::new("x", ArrayDType::F32, &[4])],
            outputs: vec![
                Feature::of_kind("label", FeatureKind::String),
                Feature::of_kind("label_probs", FeatureKind::Dict(DictKey::String)),
            ],
            predicted_feature: "label".into(),
            predicted_probabilities: "label_probs".into(),
            ..Default::default()
        },
    );
    let p = dir.join("classifier.mlpackage");
    milkit::package::save_package(&m, &p, false, &mut |_| {}).unwrap();
    p
}

#[test]
fn a_classifier_writes_its_label_and_probabilities_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let classes = ["cat", "say \"hi\"", "eel", "fox"];
    let pkg = classifier_package(d, &classes);
    let x = [0.3f32, 1.7, -0.4, 1.1];
    write_f32(&d.join("x.npy"), &x);
    let out = d.join("out");
    let o = common::milkit()
        .arg("run")
        .arg(&pkg)
        .arg("--input")
        .arg(format!("x={}", d.join("x.npy").display()))
        .args(["--repeat", "2", "--quiet", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // float64 softmax; the label is the class of the largest probability.
    let e: Vec<f64> = x.iter().map(|&v| (v as f64).exp()).collect();
    let sum: f64 = e.iter().sum();
    for k in 0..2 {
        let read = |n: &str| -> serde_json::Value {
            let p = out.join(format!("{n}.{k}.json"));
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
        };
        assert_eq!(read("label"), serde_json::json!("say \"hi\""));
        let probs = read("label_probs");
        let obj = probs.as_object().unwrap();
        assert_eq!(obj.len(), 4);
        for (c, v) in classes.iter().zip(&e) {
            let got = obj[*c].as_f64().unwrap();
            let want = v / sum;
            assert!(
                (got - want).abs() <= 1e-5 + 1e-4 * want,
                "{c}: {got} vs {want}"
            );
        }
        // In class order in the file.
        let text = std::fs::read_to_string(out.join(format!("label_probs.{k}.json"))).unwrap();
        let at: Vec<usize> = ["\"cat\"", "say", "\"eel\"", "\"fox\""]
            .iter()
            .map(|c| text.find(c).unwrap())
            .collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "{text}");
    }

    // inspect shows the label and dictionary outputs and the classes.
    let o = common::milkit()
        .arg("inspect")
        .arg(&pkg)
        .arg("--mil")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let outputs = text.split("outputs:").nth(1).unwrap_or("");
    assert!(
        outputs.contains("label ") && outputs.contains("string"),
        "{text}"
    );
    assert!(outputs.contains("dict<string, fp64>"), "{text}");
    assert!(
        text.contains("classify") && text.contains("list[\"cat\""),
        "{text}"
    );
}

/// `bench gemm --attention --only tiny --runs 1 --json`: the tiny encoder's self-attention,
/// its FLOPs counted as 4·heads·S²·d, each kernel's median within its range, the rates
/// derived from the medians.
#[test]
fn attention_bench_reports_panels_next_to_blocks() {
    let out = Command::new(env!("CARGO_BIN_EXE_milkit"))
        .args([
            "bench",
            "gemm",
            "--attention",
            "--only",
            "tiny",
            "--runs",
            "1",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v.as_array().unwrap();
    assert_eq!(rows.len(), 1, "{v}");
    let r = &rows[0];
    let f = |k: &str| r[k].as_f64().unwrap();
    let three = |k: &str| -> Vec<f64> {
        r[k].as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect()
    };
    assert_eq!((f("heads"), f("s"), f("d")), (6.0, 1500.0, 64.0), "{r}");
    assert_eq!(f("gflop"), 4.0 * 6.0 * 1500.0 * 1500.0 * 64.0 / 1e9);
    for k in ["blocks_ms", "panels_ms", "ratio"] {
        let t = three(k);
        assert!(t[0] > 0.0 && t[0] <= t[1] && t[1] <= t[2], "{k}: {r}");
    }
    let rate = f("gflop") / (three("panels_ms")[1] / 1e3);
    assert!((f("panels_gflops") - rate).abs() <= 1e-9 * rate, "{r}");
    // One pair: its ratio is the two times'.
    let ratio = three("panels_ms")[1] / three("blocks_ms")[1];
    assert!((three("ratio")[1] - ratio).abs() <= 1e-9 * ratio, "{r}");
}

/// `bench gemm --only tiny --runs 1 --json`: one row per tiny shape, its FLOPs counted as
/// 2·m·n·k and its rates and ratio derived from the times it reports.
#[test]
fn gemm_bench_reports_milkit_next_to_a_plain_gemm() {
    let out = Command::new(env!("CARGO_BIN_EXE_milkit"))
        .args(["bench", "gemm", "--only", "tiny", "--runs", "1", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v.as_array().unwrap();
    assert_eq!(rows.len(), 2, "{v}");
    for r in rows {
        let f = |k: &str| r[k].as_f64().unwrap();
        assert!(r["shape"].as_str().unwrap().contains("tiny"), "{r}");
        assert_eq!(f("gflop"), 2.0 * f("m") * f("n") * f("k") / 1e9);
        assert!(
            f("milkit_ms_median") > 0.0 && f("reference_ms_median") > 0.0,
            "{r}"
        );
        let ratio = f("milkit_ms_median") / f("reference_ms_median");
        assert!((f("ratio") - ratio).abs() <= 1e-9 * ratio, "{r}");
        let rate = f("gflop") / (f("milkit_ms_median") / 1e3);
        assert!((f("milkit_gflops") - rate).abs() <= 1e-9 * rate, "{r}");
    }
    let none = Command::new(env!("CARGO_BIN_EXE_milkit"))
        .args(["bench", "gemm", "--only", "nothing"])
        .output()
        .unwrap();
    assert!(!none.status.success());
    assert!(String::from_utf8_lossy(&none.stderr).contains("matches no shape"));
}
