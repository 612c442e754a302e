//! Control flow and lists end to end: a package coremltools' own MIL builder made
//! (`tests/coremltools_control_flow.py`: `cond`, `while_loop`, every list op) loaded and run
//! by milkit against float64 reference maths; milkit-saved `while_loop` packages accepted by
//! the shared validator; a loop that never ends stopped with an error naming it; branches
//! that disagree in type refused.

mod common;

use milkit::ir::{ArrayDType, Description, Feature, Model, Opset, TensorType, Value, ValueType};
use milkit::ops::{Builder, In, V};
use milkit::runtime::{Options, Session, Tensor};
use std::path::Path;

fn cpu() -> candle_core::Device {
    candle_core::Device::Cpu
}

fn f64s(t: &Tensor) -> Vec<f64> {
    t.to_dtype(candle_core::DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f64>()
        .unwrap()
}

/// fp32 closeness: |got − want| ≤ 1e-5 + 1e-4·|want|.
fn assert_close(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: {} values", got.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 + 1e-4 * w.abs(),
            "{what}[{i}]: got {g}, want {w}"
        );
    }
}

/// The float64 reference of the generator's program for inputs `x` (2 × 3) and `n`.
fn reference(x: &[f64], n: usize) -> Vec<(&'static str, Vec<f64>)> {
    let mut acc = x.to_vec();
    let mut ls = vec![vec![0.0; 6]; 4];
    for slot in ls.iter_mut().take(n) {
        acc = acc.iter().zip(x).map(|(a, x)| a * 1.5 + x).collect();
        *slot = acc.clone();
    }
    let y: Vec<f64> = if acc.iter().sum::<f64>() > 0.0 {
        acc.iter().map(|a| a * 2.0).collect()
    } else {
        acc.iter().map(|a| a - 1.0).collect()
    };
    let g = [ls[0].clone(), ls[1].clone()].concat();
    vec![
        ("y", y),
        ("g", g),
        ("i", vec![n as f64]),
        ("r", acc[..3].to_vec()),
        ("len", vec![2.0]),
    ]
}

#[test]
fn a_coremltools_made_package_with_cond_while_loop_and_lists_runs_as_its_reference() {
    let Some(py) = common::python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let pkg = dir.path().join("cf.mlpackage");
    let gen = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/coremltools_control_flow.py");
    let out = std::process::Command::new(py)
        .arg(&gen)
        .arg(&pkg)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "generator failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut s = Session::load(&pkg).unwrap();
    let xv: Vec<f64> = vec![0.5, -1.25, 2.0, 0.75, -0.5, 1.0];
    for (sign, n) in [(1.0, 3usize), (-1.0, 0), (-1.0, 4), (1.0, 1)] {
        let x: Vec<f64> = xv.iter().map(|v| v * sign).collect();
        let xt = Tensor::from_vec(
            x.iter().map(|&v| v as f32).collect::<Vec<_>>(),
            (2, 3),
            &cpu(),
        )
        .unwrap();
        let nt = Tensor::from_vec(vec![n as i32], 1, &cpu()).unwrap();
        let got = s.predict(&[("x", xt), ("n", nt)]).unwrap();
        for (name, want) in reference(&x, n) {
            let t = &got
                .iter()
                .find(|(k, _)| k == name)
                .unwrap_or_else(|| panic!("no output {name}"))
                .1;
            assert_close(&format!("{name} (n = {n}, sign {sign})"), &f64s(t), &want);
        }
    }
}

/// A model of one main function built by `b`, its outputs renamed to `outs`' names.
fn model(b: Builder, outs: &[(V, &str)], opset: Opset) -> Model {
    let types: Vec<TensorType> = outs
        .iter()
        .map(|(v, _)| b.ty(v).unwrap().as_tensor().unwrap().clone())
        .collect();
    let (inputs, block) = b.finish(outs).unwrap();
    let array = |t: &TensorType| match t.dtype {
        milkit::ir::DType::F16 => ArrayDType::F16,
        milkit::ir::DType::F32 => ArrayDType::F32,
        _ => ArrayDType::I32,
    };
    let mut desc = Description::default();
    for i in &inputs {
        let t = i.ty.as_tensor().unwrap();
        desc.inputs
            .push(Feature::new(&i.name, array(t), &t.fixed_shape().unwrap()));
    }
    for ((_, n), t) in outs.iter().zip(&types) {
        desc.outputs
            .push(Feature::new(n, array(t), &t.fixed_shape().unwrap()));
    }
    Model::single(opset, inputs, block, desc)
}

/// `while k < bound: k += step; acc = acc + x` over an fp32 [3] input `x`, from (0, x).
fn counting_loop(step: i32) -> Model {
    let mut b = Builder::new(Opset::Ios15);
    let x = b.input("x", ValueType::tensor(milkit::ir::DType::F32, &[3]));
    // Core ML function inputs have rank ≥ 1: the bound comes as [1] and is squeezed.
    let n = b.input("bound", ValueType::tensor(milkit::ir::DType::I32, &[1]));
    let bound = b
        .op1("squeeze", "bound_scalar", vec![("x", In::V(n))])
        .unwrap();
    let k0 = b.konst("k0", Value::i32_scalar(0));
    let ti = ValueType::tensor(milkit::ir::DType::I32, &[]);
    let tx = ValueType::tensor(milkit::ir::DType::F32, &[3]);
    let c = b
        .block(&[("k", ti.clone()), ("acc", tx.clone())], |b, v| {
            Ok(vec![b.op1(
                "less",
                "more",
                vec![("x", In::V(v[0].clone())), ("y", In::V(bound.clone()))],
            )?])
        })
        .unwrap();
    let xb = x.clone();
    let body = b
        .block(&[("k", ti), ("acc", tx)], |b, v| {
            let k = b.op1(
                "add",
                "step",
                vec![
                    ("x", In::V(v[0].clone())),
                    ("y", In::C(Value::i32_scalar(step))),
                ],
            )?;
            let a = b.op1(
                "add",
                "plus_x",
                vec![("x", In::V(v[1].clone())), ("y", In::V(xb))],
            )?;
            Ok(vec![k, a])
        })
        .unwrap();
    let o = b
        .op_with_blocks(
            "while_loop",
            "count",
            vec![("loop_vars", In::Vs(vec![k0, x]))],
            vec![c, body],
        )
        .unwrap();
    model(
        b,
        &[(o[0].clone(), "k"), (o[1].clone(), "acc")],
        Opset::Ios15,
    )
}

fn feeds(bound: i32) -> Vec<(&'static str, Tensor)> {
    vec![
        (
            "x",
            Tensor::from_vec(vec![0.5f32, -1.0, 2.0], 3, &cpu()).unwrap(),
        ),
        ("bound", Tensor::new(&[bound], &cpu()).unwrap()),
    ]
}

#[test]
fn a_saved_while_loop_package_round_trips_and_passes_the_validator() {
    let dir = tempfile::tempdir().unwrap();
    let pkg = dir.path().join("loop.mlpackage");
    let m = counting_loop(1);
    milkit::package::save_package(&m, &pkg, false, &mut |_| {}).unwrap();
    let back = milkit::package::load_package(&pkg).unwrap();
    assert_eq!(
        back.program, m.program,
        "the program changed on a round trip"
    );
    let mut s = Session::load(&pkg).unwrap();
    let got = s.predict(&feeds(7)).unwrap();
    assert_eq!(f64s(&got[0].1), vec![7.0]);
    assert_close("acc", &f64s(&got[1].1), &[4.0, -8.0, 16.0]);
    if let Some(report) = common::validate(&pkg) {
        assert_eq!(report["ok"], serde_json::Value::Bool(true), "{report}");
    }
}

#[test]
fn a_while_loop_that_never_ends_stops_at_the_bound_naming_the_op() {
    // The counter never moves: the condition stays true.
    let opts = Options {
        max_loop_iterations: 2000,
        ..Options::default()
    };
    let mut s = Session::from_model_with(counting_loop(0), &opts).unwrap();
    let t0 = std::time::Instant::now();
    let e = format!("{:#}", s.predict(&feeds(1)).unwrap_err());
    assert!(
        e.contains("while_loop") && e.contains("`count`") && e.contains("2000 iterations"),
        "{e}"
    );
    let dt = t0.elapsed();
    eprintln!(
        "2000 iterations stopped after {dt:.2?} ({:.1} µs per iteration)",
        dt.as_secs_f64() * 1e6 / 2000.0
    );
    assert!(dt.as_secs() < 30, "took {dt:?}");
    // The same package with a bound that is reached runs.
    let mut s = Session::from_model_with(counting_loop(1), &opts).unwrap();
    assert_eq!(f64s(&s.predict(&feeds(2000)).unwrap()[0].1), vec![2000.0]);
}

#[test]
fn cond_branches_of_different_types_are_refused_naming_both() {
    let mut b = Builder::new(Opset::Ios15);
    let p = b.input("p", ValueType::tensor(milkit::ir::DType::Bool, &[]));
    let t = b
        .block(&[], |b, _| {
            Ok(vec![b.konst(
                "a",
                Value::Tensor(milkit::ir::Tensor::f32(&[2], &[1.0, 2.0])),
            )])
        })
        .unwrap();
    let f = b
        .block(&[], |b, _| Ok(vec![b.konst("b", Value::f32_scalar(1.0))]))
        .unwrap();
    let e = format!(
        "{:#}",
        b.op_with_blocks("cond", "pick", vec![("pred", In::V(p))], vec![t, f])
            .unwrap_err()
    );
    assert!(
        e.contains("cond") && e.contains("true branch") && e.contains("false branch"),
        "{e}"
    );
}

#[test]
fn a_saved_package_with_lists_passes_the_validator_and_runs() {
    let mut b = Builder::new(Opset::Ios15);
    let x = b.input("x", ValueType::tensor(milkit::ir::DType::F32, &[3]));
    let dims = vec![b.konst("elem_dim", Value::i32_scalar(3))];
    let ls = b
        .op1(
            "make_list",
            "ls",
            vec![
                ("init_length", In::C(Value::i32_scalar(2))),
                ("dynamic_length", In::C(Value::bool_scalar(true))),
                ("elem_shape", In::Vs(dims)),
                ("dtype", In::C(Value::str("fp32"))),
            ],
        )
        .unwrap();
    let ls = b
        .op1(
            "list_write",
            "put",
            vec![
                ("ls", In::V(ls)),
                ("index", In::C(Value::i32_scalar(2))),
                ("value", In::V(x)),
            ],
        )
        .unwrap();
    let n = b
        .op1("list_length", "n", vec![("ls", In::V(ls.clone()))])
        .unwrap();
    let g = b
        .op1(
            "list_gather",
            "g",
            vec![("ls", In::V(ls)), ("indices", In::C(Value::i32s(&[2, 0])))],
        )
        .unwrap();
    let n1 = b
        .op1(
            "reshape",
            "n1",
            vec![("x", In::V(n)), ("shape", In::C(Value::i32s(&[1])))],
        )
        .unwrap();
    let m = model(b, &[(g, "g"), (n1, "length")], Opset::Ios15);
    let dir = tempfile::tempdir().unwrap();
    let pkg = dir.path().join("lists.mlpackage");
    milkit::package::save_package(&m, &pkg, false, &mut |_| {}).unwrap();
    let mut s = Session::load(&pkg).unwrap();
    let x = Tensor::from_vec(vec![0.5f32, -1.0, 2.0], 3, &cpu()).unwrap();
    let got = s.predict(&[("x", x)]).unwrap();
    assert_eq!(f64s(&got[0].1), vec![0.5, -1.0, 2.0, 0.0, 0.0, 0.0]);
    assert_eq!(f64s(&got[1].1), vec![3.0]);
    if let Some(report) = common::validate(&pkg) {
        assert_eq!(report["ok"], serde_json::Value::Bool(true), "{report}");
    }
}
