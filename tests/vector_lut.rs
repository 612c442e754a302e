//! Vector palettization (`--cluster-dim 2|4`: the iOS18 `constexpr_lut_to_dense` with
//! `vector_axis` 0, one index per `cluster_dim` consecutive output channels): the tables
//! decode to the float64 reconstruction from indices and entries, coremltools re-types the
//! written package and decodes it to the same weights (through its loader and through an
//! independent numpy reference), the interpreter runs it exactly like its dense decode, and
//! weights the vector size does not tile, targets below iOS18 and uniform tables are refused
//! with messages that say what to change.

mod common;

use common::milkit;
use common::programs::{f32s, host, model, tin};
use common::rng::Rng;
use half::f16;
use milkit::ir::{Arg, ArrayDType, DType, Feature, Model, Opset, Tensor as ITensor, Value};
use milkit::ops::Builder;
use milkit::passes::compress::{compress, Method, Selection};
use milkit::passes::lut::{palettize, LutConfig, LutGranularity, LutMode};
use milkit::passes::quant::relative_rms_error;
use milkit::runtime::Session;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::Path;

fn vec_lut(nbits: u32, cluster_dim: usize, granularity: LutGranularity) -> LutConfig {
    LutConfig {
        mode: LutMode::Kmeans,
        nbits,
        granularity,
        per_channel_scale: false,
        cluster_dim,
    }
}

/// A weight of `shape` with rows of different scales and correlated neighbouring rows (so
/// vectors along the output channels carry structure a vector table can use).
fn weight(shape: &[usize], seed: u64) -> Vec<f16> {
    let rest: usize = shape[1..].iter().product();
    let mut r = Rng(seed);
    let base = r.vec(rest);
    let mut w = Vec::new();
    for row in 0..shape[0] {
        let mag = 0.5 + (row % 5) as f32 * 0.25;
        for b in &base {
            w.push(f16::from_f32(mag * (0.6 * b + 0.4 * r.next())));
        }
    }
    w
}

/// The dense weight from indices and table in float64, written out from the layout alone:
/// row `o` at input position `j` takes component `o % cd` of entry `indices[o / cd, j]` of
/// table `o / rows_per_table`.
fn reconstruct(shape: &[usize], indices: &[u8], lut: &[f16], lut_shape: &[usize]) -> Vec<f64> {
    let r = shape.len();
    let (tables, entries, cd) = (lut_shape[0], lut_shape[r], lut_shape[r + 1]);
    assert!(lut_shape[1..r].iter().all(|&d| d == 1), "{lut_shape:?}");
    let rest: usize = shape[1..].iter().product();
    let rows_per_table = shape[0] / tables;
    let mut out = Vec::with_capacity(shape[0] * rest);
    for o in 0..shape[0] {
        for j in 0..rest {
            let code = usize::from(indices[(o / cd) * rest + j]);
            assert!(code < entries);
            let t = o / rows_per_table;
            out.push(lut[(t * entries + code) * cd + o % cd].to_f64());
        }
    }
    out
}

#[test]
fn vector_tables_decode_to_the_float64_reconstruction() {
    let shape = [32usize, 24, 3];
    let w = weight(&shape, 3);
    for (nbits, cd, g) in [
        (4, 2, LutGranularity::PerTensor),
        (6, 2, LutGranularity::PerGroupedChannel(16)),
        (8, 4, LutGranularity::PerTensor),
        (3, 4, LutGranularity::PerGroupedChannel(8)),
    ] {
        let cfg = vec_lut(nbits, cd, g);
        let p = palettize(&w, &shape, &cfg, None).unwrap();
        let tables = match g {
            LutGranularity::PerTensor => 1,
            LutGranularity::PerGroupedChannel(n) => 32 / n,
        };
        assert_eq!(p.lut_shape, vec![tables, 1, 1, 1 << nbits, cd]);
        assert_eq!(p.indices_shape(), vec![32 / cd, 24, 3]);
        assert_eq!(p.indices.len(), 32 * 72 / cd);
        let want = reconstruct(&shape, &p.indices, &p.lut, &p.lut_shape);
        let got: Vec<f64> = p.decode().unwrap().iter().map(|v| v.to_f64()).collect();
        // A table look-up: exact (tolerance 0).
        assert_eq!(got, want, "nbits {nbits} cd {cd} {g:?}");
        // Each vector takes its nearest entry (squared distance, ties to the lower index).
        let (entries, rest) = (1usize << nbits, 72);
        for (v, &code) in p.indices.iter().enumerate() {
            let (rv, j) = (v / rest, v % rest);
            let t = rv * cd / (32 / tables);
            let dist = |e: usize| -> f64 {
                (0..cd)
                    .map(|c| {
                        let x = w[(rv * cd + c) * rest + j].to_f64();
                        (x - p.lut[(t * entries + e) * cd + c].to_f64()).powi(2)
                    })
                    .sum()
            };
            let best = (0..entries).map(dist).fold(f64::INFINITY, f64::min);
            // The scan runs in f32; allow its rounding.
            assert!(dist(usize::from(code)) <= best * (1.0 + 1e-5) + 1e-12);
        }
        let err = relative_rms_error(&w, &p.decode().unwrap()).unwrap();
        assert_eq!(p.rel_rms_error(&w).unwrap(), err);
        assert!(err > 0.0 && err < 0.5, "{err}");
        // Seeded: the same weight gives the same tables.
        assert_eq!(palettize(&w, &shape, &cfg, None).unwrap(), p);
    }
}

#[test]
fn more_bits_per_vector_lower_the_error() {
    let shape = [64usize, 96];
    let w = weight(&shape, 5);
    let err = |nbits, cd| {
        let p = palettize(
            &w,
            &shape,
            &vec_lut(nbits, cd, LutGranularity::PerTensor),
            None,
        )
        .unwrap();
        relative_rms_error(&w, &p.decode().unwrap()).unwrap()
    };
    let (e4, e6, e8) = (err(4, 2), err(6, 2), err(8, 2));
    eprintln!("cluster_dim 2, per tensor: 4 bits {e4:.4}, 6 bits {e6:.4}, 8 bits {e8:.4}");
    assert!(e8 < e6 && e6 < e4, "{e4} {e6} {e8}");
}

/// A linear layer with `weight` [32, 72].
fn linear_model(weight: &[f16], opset: Opset) -> Model {
    let mut b = Builder::new(opset);
    let x = b.input("x", tin(DType::F16, &[5, 72]));
    let wv = b.konst("fc_weight", Value::Tensor(ITensor::f16(&[32, 72], weight)));
    let y = b
        .op1("linear", "y", vec![("x", x.into()), ("weight", wv.into())])
        .unwrap();
    model(b, &[(y, "y")])
}

fn sel() -> Selection {
    Selection {
        weight_threshold: 0,
        ..Selection::default()
    }
}

#[test]
fn a_tiny_model_with_cluster_dim_2_runs_like_its_dense_decode() {
    let w = weight(&[32, 72], 9);
    let cfg = vec_lut(4, 2, LutGranularity::PerGroupedChannel(16));
    let mut m = linear_model(&w, Opset::Ios18);
    let out = compress(&mut m, &Method::Palettize(cfg), &sel()).unwrap();
    assert_eq!(out.compressed.len(), 1);
    assert_eq!(out.compressed[0].mode, "lut4x2-kmeans-g16");
    // 4-bit indices for 32·72/2 vectors + two tables of 16 entries × 2 fp16 + vector_axis.
    assert_eq!(
        out.compressed[0].bytes_after,
        (32 * 72 / 2 / 2 + 2 * 16 * 2 * 2 + 4) as u64
    );
    let op = m
        .program
        .main()
        .unwrap()
        .block
        .operations
        .iter()
        .find(|o| o.op_type == "constexpr_lut_to_dense")
        .unwrap();
    match op.arg("vector_axis") {
        Some(Arg::Value(Value::Tensor(t))) => {
            assert_eq!((t.dtype, t.to_i64_vec().unwrap()), (DType::I32, vec![0]))
        }
        other => panic!("vector_axis is {other:?}"),
    }
    match op.arg("indices") {
        Some(Arg::Value(Value::Tensor(t))) => {
            assert_eq!((t.dtype, t.shape.clone()), (DType::U4, vec![16, 72]))
        }
        other => panic!("indices are {other:?}"),
    }
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
    let (got, want) = (run(m), run(linear_model(&dense, Opset::Ios18)));
    assert_eq!(got.len(), 5 * 32);
    assert_eq!(
        got, want,
        "the vector table decodes differently in the runtime"
    );
}

#[test]
fn weights_the_vector_size_does_not_tile_are_refused() {
    // 30 output channels: 4 does not divide them (per tensor), and a group of 6 rows is not
    // a whole number of 4-row vectors.
    let w = weight(&[30, 72], 1);
    let mut b = Builder::new(Opset::Ios18);
    let x = b.input("x", tin(DType::F16, &[5, 72]));
    let wv = b.konst("odd_weight", Value::Tensor(ITensor::f16(&[30, 72], &w)));
    let y = b
        .op1("linear", "y", vec![("x", x.into()), ("weight", wv.into())])
        .unwrap();
    let m = model(b, &[(y, "y")]);
    for (g, want) in [
        (
            LutGranularity::PerTensor,
            "does not divide the 30 output channels",
        ),
        (
            LutGranularity::PerGroupedChannel(6),
            "does not divide the group size 6",
        ),
    ] {
        let err = compress(&mut m.clone(), &Method::Palettize(vec_lut(4, 4, g)), &sel())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("odd_weight") && err.contains("--cluster-dim 4") && err.contains(want),
            "{err}"
        );
    }
    // The library call says the same about the shape.
    let err = palettize(
        &w,
        &[30, 72],
        &vec_lut(4, 4, LutGranularity::PerTensor),
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("cluster_dim 4") && err.contains("[30, 72]"),
        "{err}"
    );
    // Below iOS18 there is no vector table.
    let err = compress(
        &mut linear_model(&weight(&[32, 72], 2), Opset::Ios17),
        &Method::Palettize(vec_lut(4, 2, LutGranularity::PerTensor)),
        &sel(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("--cluster-dim 2") && err.contains("iOS18"),
        "{err}"
    );
    // The flags: uniform tables are scalar; 3 is no vector size.
    for (extra, want) in [
        (
            &["--palettize", "uniform", "--cluster-dim", "2"][..],
            "takes --palettize kmeans",
        ),
        (
            &["--palettize", "kmeans", "--cluster-dim", "3"][..],
            "is not 1, 2 or 4",
        ),
        (
            &["--quantize", "int4", "--cluster-dim", "2"][..],
            "applies to --palettize kmeans",
        ),
    ] {
        let o = milkit()
            .args(["compress", "x.mlpackage", "--out", "y.mlpackage"])
            .args(extra)
            .output()
            .unwrap();
        assert!(!o.status.success());
        let msg = String::from_utf8_lossy(&o.stderr);
        assert!(msg.contains(want), "{extra:?}: {msg}");
    }
}

fn ok(o: &std::process::Output) -> serde_json::Value {
    assert!(
        o.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap_or(serde_json::Value::Null)
}

/// sha256 of the fp16 bytes of every `constexpr_lut_to_dense` output, from milkit's decode
/// of the stored parts.
fn milkit_decodes(m: &Model) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for op in m.program.main().unwrap().block.walk() {
        if op.op_type != "constexpr_lut_to_dense" {
            continue;
        }
        let inline = |k: &str| match op.arg(k) {
            Some(Arg::Value(Value::Tensor(t))) => t.clone(),
            _ => panic!("{}: input {k} not inline", op.name),
        };
        let (idx, lut) = (inline("indices"), inline("lut"));
        let codes = milkit::passes::subbyte::unpack_bits(
            &idx.data,
            idx.dtype.bits() as u32,
            idx.num_elements(),
        )
        .unwrap();
        let axis = inline("vector_axis").to_i64_vec().unwrap()[0];
        let (d, _) = milkit::ops::decode_lut_vector(
            &codes,
            &idx.shape,
            &lut.data.to_f16_vec(),
            &lut.shape,
            axis,
        )
        .unwrap();
        let bytes: Vec<u8> = d.iter().flat_map(|x| x.to_le_bytes()).collect();
        out.insert(
            op.outputs[0].name.clone(),
            format!("{:x}", Sha256::digest(&bytes)),
        );
    }
    out
}

/// The same digests from coremltools: its loader's `materialized_val_inference`, checked
/// in the script against a numpy reconstruction written from the op's definition (swap the
/// vector axis last, gather, split the entries' components out along it).
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
    if op.op_type != "constexpr_lut_to_dense":
        continue
    v = np.ascontiguousarray(op.materialized_val_inference().astype(np.float16))
    idx = op.indices.val.astype(np.int64)
    lut = op.lut.val
    ax = int(op.vector_axis.val)
    r = idx.ndim
    tables, entries, cd = lut.shape[0], lut.shape[r], lut.shape[r + 1]
    rows = idx.shape[0] // tables
    ref = np.zeros((idx.shape[0] * cd,) + idx.shape[1:], dtype=np.float64)
    flat = lut.reshape(tables, entries, cd).astype(np.float64)
    for rv in range(idx.shape[0]):
        for c in range(cd):
            ref[rv * cd + c] = flat[rv // rows, idx[rv], c]
    assert ax == 0, ax
    assert v.shape == ref.shape, (v.shape, ref.shape)
    assert np.array_equal(v.astype(np.float64), ref), op.name
    out[op.outputs[0].name] = hashlib.sha256(v.tobytes()).hexdigest()
print(json.dumps(out))
"#;
    let s = common::run_python(&py, script, &[pkg.as_os_str()]);
    let line = s.lines().rev().find(|l| l.starts_with('{')).unwrap();
    Some(serde_json::from_str(line).unwrap())
}

#[test]
fn conformance_vector_tables_written_by_milkit_decode_as_coremltools_decodes_them() {
    let dir = tempfile::tempdir().unwrap();
    let (fp16, out) = (
        dir.path().join("fp16.mlpackage"),
        dir.path().join("vec.mlpackage"),
    );
    // Two linear layers of different widths, compressed with 2- and 4-value entries.
    let w1 = weight(&[32, 72], 21);
    let w2 = weight(&[64, 32], 22);
    let mut b = Builder::new(Opset::Ios18);
    let x = b.input("x", tin(DType::F16, &[5, 72]));
    let k1 = b.konst("fc1_weight", Value::Tensor(ITensor::f16(&[32, 72], &w1)));
    let h = b
        .op1("linear", "h", vec![("x", x.into()), ("weight", k1.into())])
        .unwrap();
    let k2 = b.konst("fc2_weight", Value::Tensor(ITensor::f16(&[64, 32], &w2)));
    let y = b
        .op1("linear", "y", vec![("x", h.into()), ("weight", k2.into())])
        .unwrap();
    let m = common::programs::described(
        b,
        &[(y, "y")],
        vec![Feature::new("x", ArrayDType::F16, &[5, 72])],
        vec![Feature::new("y", ArrayDType::F16, &[5, 64])],
    );
    milkit::package::save_package(&m, &fp16, false, &mut |_| {}).unwrap();
    for (cd, g) in [("2", "16"), ("4", "32")] {
        let rep = ok(&milkit()
            .args([
                "compress",
                "--quiet",
                "--json",
                "--force",
                "--palettize",
                "kmeans",
            ])
            .args(["--nbits", "6", "--cluster-dim", cd, "--group-size", g])
            .args(["--weight-threshold", "0"])
            .arg(&fp16)
            .arg("--out")
            .arg(&out)
            .output()
            .unwrap());
        assert_eq!(rep["mode"], format!("lut6x{cd}-kmeans-g{g}"), "{rep}");
        let v = ok(&milkit()
            .args(["verify", "--json"])
            .arg(&out)
            .output()
            .unwrap());
        assert_eq!(v["constexpr"]["counts"]["constexpr_lut_to_dense"], 2, "{v}");
        let kind = format!("lut6x{cd}");
        assert_eq!(
            v["model"]["weights"]["by_storage"][kind.as_str()]["tensors"],
            2,
            "{}",
            v["model"]["weights"]
        );
        common::validate(&out);
        let loaded = milkit::package::load_package(&out).unwrap();
        let ours = milkit_decodes(&loaded);
        assert_eq!(ours.len(), 2);
        if let Some(theirs) = coremltools_decodes(&out) {
            assert_eq!(
                ours, theirs,
                "cluster_dim {cd}: decode differs from coremltools'"
            );
        }
    }
}

#[test]
fn a_recipe_takes_cluster_dim() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.toml");
    std::fs::write(
        &path,
        "name = \"v\"\n\n[[component]]\ncomponent = \"encoder\"\nfile = \"e.mlpackage\"\n\n\
         [component.compress]\npalettize = \"kmeans\"\nnbits = 8\ncluster_dim = 2\n\
         granularity = \"per-tensor\"\n",
    )
    .unwrap();
    let r = milkit::convert::recipe::Recipe::from_file(&path).unwrap();
    let flags = r.components[0].compress.clone().unwrap();
    assert_eq!(flags.cluster_dim, 2);
    match flags.method().unwrap() {
        Some(Method::Palettize(c)) => {
            assert_eq!((c.nbits, c.cluster_dim), (8, 2));
            assert_eq!(c.granularity, LutGranularity::PerTensor);
        }
        other => panic!("{other:?}"),
    }
}
