//! Programs for the interpreter tests: building one with `ops::Builder` and running it in a
//! `Session`, host tensors, comparisons.

use half::f16;
use milkit::ir::{DType, Description, Model, Tensor as ITensor, Value, ValueType};
use milkit::ops::{Builder, In, V};
use milkit::runtime::{Session, Tensor};

pub fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_dtype(candle_core::DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
}

pub fn host(v: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape, &candle_core::Device::Cpu).unwrap()
}

pub fn tin(dtype: DType, shape: &[usize]) -> ValueType {
    ValueType::tensor(dtype, shape)
}

pub fn c(v: Value) -> In {
    In::C(v)
}

pub fn ints(v: &[i32]) -> In {
    In::C(Value::i32s(v))
}

pub fn model(b: Builder, outs: &[(V, &str)]) -> Model {
    let opset = b.opset();
    let (inputs, block) = b.finish(outs).unwrap();
    Model::single(opset, inputs, block, Description::default())
}

/// A single-function model of `b` returning `outs`, with a description of its I/O.
pub fn described(
    b: Builder,
    outs: &[(V, &str)],
    inputs: Vec<milkit::ir::Feature>,
    outputs: Vec<milkit::ir::Feature>,
) -> Model {
    let opset = b.opset();
    let (ins, block) = b.finish(outs).unwrap();
    let d = Description {
        inputs,
        outputs,
        ..Default::default()
    };
    Model::single(opset, ins, block, d)
}

/// Builds, runs once, returns the outputs in order.
pub fn run(b: Builder, outs: &[(V, &str)], inputs: &[(&str, Tensor)]) -> Vec<Tensor> {
    let mut s = Session::from_model(model(b, outs)).unwrap();
    s.predict(inputs)
        .unwrap()
        .into_iter()
        .map(|(_, t)| t)
        .collect()
}

pub fn assert_close(got: &[f32], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (*g as f64 - w).abs() <= tol * (1.0 + w.abs()),
            "{what}[{i}]: got {g}, want {w}"
        );
    }
}

pub fn psnr(reference: &[f32], out: &[f32]) -> f64 {
    let peak = reference.iter().fold(0f64, |m, v| m.max(v.abs() as f64));
    let mse = reference
        .iter()
        .zip(out)
        .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
        .sum::<f64>()
        / reference.len() as f64;
    20.0 * (peak / mse.sqrt()).log10()
}

pub fn f16_tensor(shape: &[usize], v: &[f32]) -> Value {
    Value::Tensor(ITensor::f16(
        shape,
        &v.iter().map(|&x| f16::from_f32(x)).collect::<Vec<_>>(),
    ))
}

/// fp16 weights straight from the checkpoint's safetensors.
pub struct Checkpoint(pub Vec<u8>);

impl milkit::whisper::graph::WeightSource for Checkpoint {
    fn f16(&self, name: &str) -> anyhow::Result<(Vec<usize>, milkit::ir::Bytes)> {
        let st = safetensors::SafeTensors::deserialize(&self.0)?;
        let t = st.tensor(name)?;
        anyhow::ensure!(
            t.dtype() == safetensors::Dtype::F16,
            "{name} is {:?}",
            t.dtype()
        );
        Ok((
            t.shape().to_vec(),
            milkit::ir::Bytes::from_vec(t.data().to_vec()),
        ))
    }
}
