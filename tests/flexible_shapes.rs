//! Flexible input shapes as Core ML defines them: a description's per-dimension ranges or
//! enumerated shapes over a program input with `?` dimensions. Such a package saves, loads
//! (in milkit and in coremltools) and inspects with its flexibility intact; any shape inside the ranges or equal to an
//! enumerated one runs (checked against the arithmetic written here), any other is refused
//! naming the input, the shape and what is allowed; a description that contradicts the
//! program is refused at load.

mod common;

use milkit::ir::{
    ArrayDType, DType, Dim, Feature, Model, Opset, ShapeFlex, TensorType, Value, ValueType,
};
use milkit::ops::{Builder, In};
use milkit::runtime::{Session, Tensor};

/// y = x · 2 over an fp32 input of type `program` described as `feature`.
fn doubler(program: &[Dim], feature: Feature) -> Model {
    let mut b = Builder::new(Opset::Ios17);
    let x = b.input(
        "x",
        ValueType::Tensor(TensorType {
            dtype: DType::F32,
            shape: program.to_vec(),
        }),
    );
    let y = b
        .op1(
            "mul",
            "y",
            vec![("x", In::V(x)), ("y", In::C(Value::f32_scalar(2.0)))],
        )
        .unwrap();
    common::programs::described(
        b,
        &[(y, "y")],
        vec![feature],
        vec![Feature::new("y", ArrayDType::F32, &[1, 2, 3])],
    )
}

fn flexible(flex: ShapeFlex) -> Feature {
    Feature {
        flex,
        ..Feature::new("x", ArrayDType::F32, &[1, 2, 3])
    }
}

const SEQ: [Dim; 3] = [Dim::Fixed(1), Dim::Unknown, Dim::Fixed(3)];

fn ranges() -> ShapeFlex {
    ShapeFlex::Ranges(vec![(1, Some(1)), (1, Some(8)), (3, Some(3))])
}

/// Saves and loads again, so every case also goes through the package format.
fn reload(m: &Model) -> (Model, Session) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("flex.mlpackage");
    milkit::package::save_package(m, &p, false, &mut |_| {}).unwrap();
    coremltools_reads(&p, &m.description.inputs[0].flex);
    let back = milkit::package::load_package(&p).unwrap();
    let s = Session::load(&p).unwrap();
    (back, s)
}

/// coremltools loads the package, rebuilds its program (re-typing every op) and reads the
/// flexibility milkit wrote. (../shared/tools/validate_mlpackage.py wants every described
/// shape equal to the program's, which no flexible package has.)
fn coremltools_reads(p: &std::path::Path, flex: &ShapeFlex) {
    let Some(py) = common::python() else { return };
    let script = r#"
import sys, json, logging
logging.disable(logging.WARNING)
import coremltools as ct
from coremltools.converters.mil.frontend.milproto.load import load as milproto_load
m = ct.models.MLModel(sys.argv[1], skip_model_load=True)
spec = m.get_spec()
milproto_load(spec, specification_version=spec.specificationVersion, file_weights_dir=m.weights_dir)
a = spec.description.input[0].type.multiArrayType
kind = a.WhichOneof("ShapeFlexibility")
if kind == "shapeRange":
    print(json.dumps([[r.lowerBound, r.upperBound] for r in a.shapeRange.sizeRanges]))
elif kind == "enumeratedShapes":
    print(json.dumps([list(s.shape) for s in a.enumeratedShapes.shapes]))
else:
    print("null")
"#;
    let out = common::run_python(&py, script, &[p.as_os_str()]);
    let want = match flex {
        ShapeFlex::Fixed => serde_json::Value::Null,
        ShapeFlex::Ranges(r) => serde_json::json!(r
            .iter()
            .map(|&(lo, hi)| (lo as i64, hi.map_or(-1, |h| h as i64)))
            .collect::<Vec<_>>()),
        ShapeFlex::Enumerated(s) => serde_json::json!(s),
    };
    let got: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(got, want, "coremltools reads the flexibility");
}

fn ramp(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 1.0).collect();
    Tensor::from_vec(v, shape, &candle_core::Device::Cpu).unwrap()
}

fn doubled(s: &mut Session, shape: &[usize]) -> anyhow::Result<()> {
    let x = ramp(shape);
    let out = s.predict(&[("x", x.clone())])?;
    assert_eq!(out[0].1.dims(), shape);
    let got = common::programs::f32s(&out[0].1);
    let want: Vec<f32> = common::programs::f32s(&x).iter().map(|v| v * 2.0).collect();
    assert_eq!(got, want, "y = 2x at shape {shape:?}");
    Ok(())
}

#[test]
fn a_range_input_runs_every_shape_inside_its_bounds_and_refuses_the_others() {
    let m = doubler(&SEQ, flexible(ranges()));
    let (back, mut s) = reload(&m);
    assert_eq!(back.description.inputs[0].flex, ranges(), "round trip");
    for n in [1, 2, 5, 8] {
        doubled(&mut s, &[1, n, 3]).unwrap();
    }
    for bad in [vec![1, 9, 3], vec![1, 0, 3], vec![2, 2, 3]] {
        let e = format!("{:#}", doubled(&mut s, &bad).unwrap_err());
        assert!(
            e.contains("input `x`") && e.contains(&format!("{bad:?}")) && e.contains("1..=8"),
            "{bad:?}: {e}"
        );
    }
}

#[test]
fn an_unbounded_range_accepts_any_size_from_its_lower_bound() {
    let flex = ShapeFlex::Ranges(vec![(1, Some(1)), (2, None), (3, Some(3))]);
    let (_, mut s) = reload(&doubler(&SEQ, flexible(flex)));
    doubled(&mut s, &[1, 300, 3]).unwrap();
    let e = format!("{:#}", doubled(&mut s, &[1, 1, 3]).unwrap_err());
    assert!(e.contains("2.."), "{e}");
}

#[test]
fn enumerated_shapes_run_exactly_the_shapes_listed() {
    let flex = ShapeFlex::Enumerated(vec![vec![1, 2, 3], vec![1, 4, 3]]);
    let (back, mut s) = reload(&doubler(&SEQ, flexible(flex.clone())));
    assert_eq!(back.description.inputs[0].flex, flex);
    doubled(&mut s, &[1, 2, 3]).unwrap();
    doubled(&mut s, &[1, 4, 3]).unwrap();
    let e = format!("{:#}", doubled(&mut s, &[1, 3, 3]).unwrap_err());
    assert!(
        e.contains("[1, 3, 3]") && e.contains("[1, 2, 3] | [1, 4, 3]"),
        "{e}"
    );
}

#[test]
fn a_fixed_description_over_a_symbolic_program_input_takes_only_its_shape() {
    // Core ML's converters sometimes leave `?` where the description fixes the size.
    let (_, mut s) = reload(&doubler(
        &SEQ,
        Feature::new("x", ArrayDType::F32, &[1, 2, 3]),
    ));
    doubled(&mut s, &[1, 2, 3]).unwrap();
    assert!(doubled(&mut s, &[1, 4, 3]).is_err());
}

#[test]
fn a_description_letting_a_dimension_vary_that_the_program_fixes_is_refused() {
    let fixed = [Dim::Fixed(1), Dim::Fixed(2), Dim::Fixed(3)];
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.mlpackage");
    milkit::package::save_package(&doubler(&fixed, flexible(ranges())), &p, false, &mut |_| {})
        .unwrap();
    let e = format!("{:#}", milkit::package::load_package(&p).unwrap_err());
    assert!(
        e.contains("input `x`") && e.contains("accepting [1, 1..=8, 3]"),
        "{e}"
    );
}

#[test]
fn inspect_shows_what_a_flexible_input_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("flex.mlpackage");
    milkit::package::save_package(&doubler(&SEQ, flexible(ranges())), &p, false, &mut |_| {})
        .unwrap();
    let o = common::milkit().arg("inspect").arg(&p).output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(text.contains("accepts [1, 1..=8, 3]"), "{text}");
    let o = common::milkit()
        .arg("inspect")
        .arg(&p)
        .arg("--json")
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v["inputs"][0]["shape_range"],
        serde_json::json!([[1, 1], [1, 8], [3, 3]])
    );
}
