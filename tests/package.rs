//! Package reading and writing: packages coremltools made load with every op re-inferred;
//! write → read → write is byte-identical.

mod common;
use milkit::package::{load_package, save_package};

#[test]
fn loads_coremltools_packages() {
    let Some(fx) = common::fixtures() else { return };
    for name in [
        "tiny.en-encoder-fp16",
        "tiny.en-encoder-lut4-kmeans",
        "tiny.en-encoder-int4-block32",
    ] {
        let p = fx.join(format!("coremltools/{name}.mlpackage"));
        let m = load_package(&p).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        assert_eq!(m.spec_version, 9);
        let f = m.program.main().unwrap();
        assert_eq!(f.inputs[0].name, "logmel_data");
        let n = f.block.walk().len();
        assert!(n > 200, "{name}: {n} ops");
    }
}

#[test]
fn rewrite_is_byte_identical() {
    let Some(fx) = common::fixtures() else { return };
    let p = fx.join("coremltools/tiny.en-encoder-lut4-kmeans.mlpackage");
    let m = load_package(&p).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.mlpackage");
    let b = dir.path().join("b.mlpackage");
    save_package(&m, &a, false, &mut |_| {}).unwrap();
    let m2 = load_package(&a).unwrap();
    assert_eq!(m, m2);
    save_package(&m2, &b, false, &mut |_| {}).unwrap();
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
    common::validate(&a);
}

#[test]
fn a_single_file_ml_program_opens_like_its_package_and_other_model_types_are_named() {
    use milkit::ir::{ArrayDType, DType, Feature, Opset, Value, ValueType};
    use milkit::ops::{Builder, In};
    let mut b = Builder::new(Opset::Ios17);
    let x = b.input("x", ValueType::tensor(DType::F32, &[3]));
    let y = b
        .op1(
            "mul",
            "y",
            vec![("x", In::V(x)), ("y", In::C(Value::f32_scalar(3.0)))],
        )
        .unwrap();
    let m = common::programs::described(
        b,
        &[(y, "y")],
        vec![Feature::new("x", ArrayDType::F32, &[3])],
        vec![Feature::new("y", ArrayDType::F32, &[3])],
    );
    let dir = tempfile::tempdir().unwrap();
    let pkg = dir.path().join("p.mlpackage");
    save_package(&m, &pkg, false, &mut |_| {}).unwrap();
    // The specification alone: every constant of this program is inline.
    let file = dir.path().join("p.mlmodel");
    std::fs::copy(pkg.join("Data/com.apple.CoreML/model.mlmodel"), &file).unwrap();
    assert_eq!(load_package(&file).unwrap(), load_package(&pkg).unwrap());
    let mut s = milkit::runtime::Session::load(&file).unwrap();
    let x = milkit::runtime::Tensor::new(&[1.0f32, -2.0, 0.5], &candle_core::Device::Cpu).unwrap();
    let out = s.predict(&[("x", x)]).unwrap();
    assert_eq!(out[0].1.to_vec1::<f32>().unwrap(), vec![3.0, -6.0, 1.5]);
    // A specification of version 9 that holds no model at all: said so, naming the file
    // (tests/neural_network.rs names the other model types).
    let other = dir.path().join("empty.mlmodel");
    std::fs::write(&other, [0x08, 0x09]).unwrap();
    let e = format!("{:#}", load_package(&other).unwrap_err());
    assert!(
        e.contains("empty.mlmodel") && e.contains("names no model type"),
        "{e}"
    );
}

#[test]
fn a_declared_output_type_stands_where_it_only_knows_more_or_less_than_milkit_infers() {
    use milkit::ir::{
        ArrayDType, DType, Description, Dim, Feature, Model, Opset, TensorType, ValueType,
    };
    use milkit::ops::{Builder, In};
    // y = relu(x) over x [2, 3]; its declared type is then set to `declared`.
    let package = |declared: &[Dim], dir: &std::path::Path| {
        let mut b = Builder::new(Opset::Ios17);
        let x = b.input("x", ValueType::tensor(DType::F32, &[2, 3]));
        let y = b.op1("relu", "y", vec![("x", In::V(x))]).unwrap();
        let (inputs, mut block) = b.finish(&[(y, "y")]).unwrap();
        let op = block
            .operations
            .iter_mut()
            .find(|o| o.op_type == "relu")
            .unwrap();
        op.outputs[0].ty = ValueType::Tensor(TensorType {
            dtype: DType::F32,
            shape: declared.to_vec(),
        });
        let m = Model::single(
            Opset::Ios17,
            inputs,
            block,
            Description {
                inputs: vec![Feature::new("x", ArrayDType::F32, &[2, 3])],
                outputs: vec![Feature::new("y", ArrayDType::F32, &[2, 3])],
                ..Default::default()
            },
        );
        let p = dir.join("p.mlpackage");
        save_package(&m, &p, true, &mut |_| {}).unwrap();
        p
    };
    let dir = tempfile::tempdir().unwrap();
    let relu_type = |m: &Model| {
        let f = m.program.main().unwrap();
        f.block
            .operations
            .iter()
            .find(|o| o.op_type == "relu")
            .unwrap()
            .outputs[0]
            .ty
            .clone()
    };
    for declared in [
        vec![Dim::Unknown, Dim::Fixed(3)],
        vec![Dim::Fixed(2), Dim::Unknown],
    ] {
        let m = load_package(&package(&declared, dir.path())).unwrap();
        assert_eq!(
            relu_type(&m),
            ValueType::Tensor(TensorType {
                dtype: DType::F32,
                shape: declared
            })
        );
    }
    for contradiction in [vec![Dim::Fixed(2), Dim::Fixed(4)], vec![Dim::Fixed(6)]] {
        let e = format!(
            "{:#}",
            load_package(&package(&contradiction, dir.path())).unwrap_err()
        );
        assert!(e.contains("is declared") && e.contains("infers to"), "{e}");
    }
}
