//! `Compute::Fp32` (runtime::precision): the same package computed with every fp16 tensor
//! widened to float32. Checked on a hand-made program against float64 maths written here
//! (each fp16 rounding of the package's own precision is gone), and on coremltools' three
//! tiny.en encoders (fp16, LUT4 k-means, int4 per block) against PyTorch float32 run with
//! exactly the weights each package decodes to: widened, milkit lands far closer than the
//! fp16 package can.

mod common;

use common::programs::{f32s, psnr};
use half::f16;
use milkit::ir::{ArrayDType, DType, Description, Feature, Model, Opset};
use milkit::ir::{Tensor as IrTensor, Value, ValueType};
use milkit::ops::{Builder, In};
use milkit::runtime::precision::{promote_fp16, Compute};
use milkit::runtime::{io, Options, Session, Tensor};

/// y = cast(x, fp16) · w + b, then cast to fp16 again: x fp32 [4] in, y fp16 [4] out.
fn program() -> Model {
    let mut b = Builder::new(Opset::Ios17);
    let x = b.input("x", ValueType::tensor(DType::F32, &[4]));
    let h = b
        .op1(
            "cast",
            "h",
            vec![("x", In::V(x)), ("dtype", In::C(Value::str("fp16")))],
        )
        .unwrap();
    let w = IrTensor::f16(&[4], &W.map(f16::from_f32));
    let hw = b
        .op1(
            "mul",
            "hw",
            vec![("x", In::V(h)), ("y", In::C(Value::Tensor(w)))],
        )
        .unwrap();
    let bias = IrTensor::f16(&[4], &B.map(f16::from_f32));
    let s = b
        .op1(
            "add",
            "s",
            vec![("x", In::V(hw)), ("y", In::C(Value::Tensor(bias)))],
        )
        .unwrap();
    let y = b
        .op1(
            "cast",
            "y",
            vec![("x", In::V(s)), ("dtype", In::C(Value::str("fp16")))],
        )
        .unwrap();
    let (inputs, block) = b.finish(&[(y, "y")]).unwrap();
    Model::single(
        Opset::Ios17,
        inputs,
        block,
        Description {
            inputs: vec![Feature::new("x", ArrayDType::F32, &[4])],
            outputs: vec![Feature::new("y", ArrayDType::F16, &[4])],
            ..Default::default()
        },
    )
}

const X: [f32; 4] = [1.0001, 2049.0, 0.1, -3.3];
const W: [f32; 4] = [1.0, 1.0, 3.0, 0.7];
const B: [f32; 4] = [0.0004, 1.0, 0.2, 1e-3];

fn run(compute: Compute) -> Tensor {
    let opts = Options {
        compute,
        ..Default::default()
    };
    let mut s = Session::from_model_with(program(), &opts).unwrap();
    let x = Tensor::from_vec(X.to_vec(), 4, &candle_core::Device::Cpu).unwrap();
    s.predict(&[("x", x)]).unwrap().remove(0).1
}

#[test]
fn widened_programs_compute_in_float32_and_package_precision_rounds_every_op_to_fp16() {
    let r16 = |v: f64| f64::from(f16::from_f64(v));
    for i in 0..4 {
        // The weights are stored fp16: both modes use the stored (fp16-rounded) values.
        let (w, b) = (r16(W[i] as f64), r16(B[i] as f64));
        let x = X[i] as f64;
        // Package precision: x rounded to fp16, the product rounded, the sum rounded.
        let want16 = r16(r16(r16(x) * w) + b);
        // Widened: no fp16 rounding anywhere; float32 arithmetic.
        let want32 = x * w + b;
        let got16 = f32s(&run(Compute::Package))[i] as f64;
        let got32 = f32s(&run(Compute::Fp32))[i] as f64;
        assert_eq!(got16, want16, "element {i}: fp16 package precision");
        assert!(
            (got32 - want32).abs() <= 1e-6 * want32.abs().max(1.0),
            "element {i}: {got32} vs {want32}"
        );
        // The cases differ where fp16 cannot hold the value.
        if i < 2 {
            assert_ne!(got16, got32, "element {i}");
        }
    }
    assert_eq!(run(Compute::Fp32).dtype(), candle_core::DType::F32);
}

#[test]
fn promotion_widens_constants_casts_and_the_description() {
    let mut m = program();
    let p = promote_fp16(&mut m).unwrap();
    assert_eq!(p.constants, 2, "weights and bias");
    assert_eq!(p.dtype_args, 2, "both casts");
    assert_eq!(m.description.outputs[0].dtype, ArrayDType::F32);
    assert_eq!(m.description.inputs[0].dtype, ArrayDType::F32);
    for op in m.program.main().unwrap().block.walk() {
        for o in &op.outputs {
            let t = o.ty.as_tensor().unwrap();
            assert_ne!(t.dtype, DType::F16, "{}", op.name);
        }
    }
    let casts: Vec<String> = m
        .program
        .main()
        .unwrap()
        .block
        .walk()
        .iter()
        .filter(|o| o.op_type == "const")
        .filter_map(|o| o.const_val().and_then(|v| v.as_str()).map(str::to_string))
        .collect();
    assert_eq!(casts, ["fp32", "fp32"]);
    // Widening twice changes nothing more.
    assert_eq!(promote_fp16(&mut m).unwrap(), Default::default());
}

#[test]
fn coremltools_encoders_widened_land_far_closer_to_pytorch_float32() {
    let Some(fx) = common::fixtures() else { return };
    let feats = io::read_tensor(
        fx.join("reference/tiny.en-jfk.safetensors:input_features")
            .to_str()
            .unwrap(),
    )
    .unwrap();
    for name in [
        "tiny.en-encoder-fp16",
        "tiny.en-encoder-lut4-kmeans",
        "tiny.en-encoder-int4-block32",
    ] {
        let pkg = fx.join(format!("coremltools/{name}.mlpackage"));
        let want = io::read_safetensors(
            &fx.join(format!("coremltools/{name}.reference.safetensors")),
            "encoder_output",
        )
        .unwrap();
        let mut db = vec![];
        for compute in [Compute::Package, Compute::Fp32] {
            let opts = Options {
                compute,
                ..Default::default()
            };
            let mut s = Session::load_with(&pkg, &opts).unwrap();
            let out = s.predict(&[("logmel_data", feats.clone())]).unwrap();
            db.push(psnr(&f32s(&want), &f32s(&out[0].1)));
        }
        println!(
            "{name}: PSNR against PyTorch float32 {:.1} dB at package precision, {:.1} dB widened",
            db[0], db[1]
        );
        assert!(db[0] >= 35.0, "{name}: {:.1} dB", db[0]);
        assert!(db[1] >= db[0] + 20.0, "{name}: {db:?}");
    }
}
