//! Encoders and packages for the verify tests: a synthetic-weight BC1S encoder, small
//! Builder programs and package saving.

use half::f16;
use milkit::ir::{
    ArrayDType, Bytes, DType, Description, Feature, Model, Opset, Tensor, Value, ValueType,
};
use milkit::ops::{Builder, In, V};
use milkit::package::save_package;
use milkit::report::PlacementReport;
use milkit::whisper::encoder::{build_encoder, EncoderAbi, EncoderDims};
use milkit::whisper::graph::WeightSource;
use std::path::{Path, PathBuf};

/// Deterministic synthetic weights for the encoder graph: shapes from the tensor name.
pub struct Synth {
    d: usize,
    ffn: usize,
    n_mels: usize,
}

impl WeightSource for Synth {
    fn f16(&self, name: &str) -> anyhow::Result<(Vec<usize>, Bytes)> {
        let (d, f) = (self.d, self.ffn);
        let shape = if name.ends_with("conv1.weight") {
            vec![d, self.n_mels, 3]
        } else if name.ends_with("conv2.weight") {
            vec![d, d, 3]
        } else if name.ends_with("embed_positions.weight") {
            vec![1500, d]
        } else if name.ends_with("fc1.weight") {
            vec![f, d]
        } else if name.ends_with("fc1.bias") {
            vec![f]
        } else if name.ends_with("fc2.weight") {
            vec![d, f]
        } else if name.ends_with("proj.weight") {
            vec![d, d]
        } else {
            vec![d]
        };
        let n: usize = shape.iter().product();
        let mut s = name.len() as u32;
        let v: Vec<f16> = (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                f16::from_f32(((s >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 0.1)
            })
            .collect();
        Ok((shape, Bytes::from_f16(&v)))
    }
}

pub const LAYERS: usize = 1;

pub fn tiny_encoder(abi: EncoderAbi) -> Model {
    let dims = EncoderDims {
        d_model: 64,
        layers: LAYERS,
        heads: 2,
        ffn: 128,
        n_mels: 80,
        n_ctx: 1500,
    };
    build_encoder(
        &dims,
        &Synth {
            d: 64,
            ffn: 128,
            n_mels: 80,
        },
        abi,
        Opset::Ios18,
        &mut |_, _| {},
    )
    .unwrap()
}

/// A one-function model from a builder, with its I/O features.
pub fn model(b: Builder, out: V, fin: Vec<Feature>, fout: Feature) -> Model {
    let opset = b.opset();
    let (inputs, block) = b.finish(&[(out, fout.name.as_str())]).unwrap();
    Model::single(
        opset,
        inputs,
        block,
        Description {
            inputs: fin,
            outputs: vec![fout],
            ..Default::default()
        },
    )
}

pub fn f16_tensor(shape: &[usize]) -> Value {
    let n: usize = shape.iter().product();
    Value::Tensor(Tensor::f16(
        shape,
        &(0..n)
            .map(|i| f16::from_f32((i % 7) as f32 * 0.01))
            .collect::<Vec<_>>(),
    ))
}

/// x [1, cin, 1, 8] → 1x1 conv with `cout` output channels, in `dtype`.
pub fn conv_net(cin: usize, cout: usize, dtype: ArrayDType) -> Model {
    let mut b = Builder::new(Opset::Ios18);
    let fin = Feature::new("x", dtype, &[1, cin, 1, 8]);
    let x = b.input("x", ValueType::Tensor(fin.tensor_type()));
    let w = match dtype {
        ArrayDType::F32 => Value::Tensor(Tensor::f32(&[cout, cin, 1, 1], &vec![0.01; cout * cin])),
        _ => f16_tensor(&[cout, cin, 1, 1]),
    };
    let wv = b.konst("head_weight", w);
    let y = b
        .op1(
            "conv",
            "head",
            vec![("x", (&x).into()), ("weight", In::V(wv))],
        )
        .unwrap();
    model(b, y, vec![fin], Feature::new("y", dtype, &[1, cout, 1, 8]))
}

pub fn save(m: &Model, dir: &Path, name: &str) -> PathBuf {
    let p = dir.join(name);
    save_package(m, &p, false, &mut |_| {}).unwrap();
    p
}

pub fn rows<'a>(p: &'a PlacementReport, op_type: &str) -> Vec<&'a milkit::report::PlacementRow> {
    p.ops.iter().filter(|r| r.op_type == op_type).collect()
}

pub fn receipt_stub() -> milkit::report::Receipt {
    milkit::report::Receipt {
        tool: "milkit".into(),
        version: "test".into(),
        command_line: vec![],
        package: String::new(),
        digests: milkit::report::Digests {
            model_mlmodel: String::new(),
            weight_bin: None,
            package: String::new(),
        },
        files: vec![],
    }
}

/// int4 data [cout, cin] with per-block scales (block `block` along the input axis), inline.
pub fn int4_weight(b: &mut Builder, cout: usize, cin: usize, block: usize) -> V {
    let data = Tensor::new(
        DType::I4,
        vec![cout, cin],
        Bytes::from_vec(vec![0x21; cout * cin / 2]),
    )
    .unwrap();
    let scale = Tensor::f16(
        &[cout, cin / block],
        &vec![f16::from_f32(0.01); cout * cin / block],
    );
    b.op1(
        "constexpr_blockwise_shift_scale",
        "w_q",
        vec![
            ("data", In::Inline(Value::Tensor(data))),
            ("scale", In::Inline(Value::Tensor(scale))),
        ],
    )
    .unwrap()
}
