//! The interpreter: coremltools' Whisper encoder packages against PyTorch (PSNR), and small
//! programs built with `ops::Builder` against independently computed expectations (naive
//! loops written here, in f64), including a stateful program run twice.

mod common;

use half::f16;
use milkit::ir::{
    ArrayDType, DType, Description, Feature, Function, Model, Opset, Program, Tensor as ITensor,
    TensorType, Value, ValueType,
};
use milkit::ops::{Builder, In, V};
use milkit::runtime::{io, Session, Tensor};
use std::time::Instant;

// ---------- helpers ----------

/// Deterministic pseudo-random numbers in [-1, 1).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }
}

fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_dtype(candle_core::DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
}

fn host(v: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape, &candle_core::Device::Cpu).unwrap()
}

fn tin(dtype: DType, shape: &[usize]) -> ValueType {
    ValueType::tensor(dtype, shape)
}

fn c(v: Value) -> In {
    In::C(v)
}

fn ints(v: &[i32]) -> In {
    In::C(Value::i32s(v))
}

fn model(b: Builder, outs: &[(V, &str)]) -> Model {
    let opset = b.opset();
    let (inputs, block) = b.finish(outs).unwrap();
    let mut program = Program::default();
    program.functions.insert(
        "main".into(),
        Function {
            inputs,
            opset,
            block,
        },
    );
    Model {
        spec_version: opset.spec_version(),
        description: Description::default(),
        program,
    }
}

/// Builds, runs once, returns the outputs in order.
fn run(b: Builder, outs: &[(V, &str)], inputs: &[(&str, Tensor)]) -> Vec<Tensor> {
    let mut s = Session::from_model(model(b, outs)).unwrap();
    s.predict(inputs)
        .unwrap()
        .into_iter()
        .map(|(_, t)| t)
        .collect()
}

fn assert_close(got: &[f32], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (*g as f64 - w).abs() <= tol * (1.0 + w.abs()),
            "{what}[{i}]: got {g}, want {w}"
        );
    }
}

fn psnr(reference: &[f32], out: &[f32]) -> f64 {
    let peak = reference.iter().fold(0f64, |m, v| m.max(v.abs() as f64));
    let mse = reference
        .iter()
        .zip(out)
        .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
        .sum::<f64>()
        / reference.len() as f64;
    20.0 * (peak / mse.sqrt()).log10()
}

// ---------- (a) real packages ----------

#[test]
fn coremltools_encoders_match_pytorch() {
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
        let t0 = Instant::now();
        let mut s = Session::load(&pkg).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        let load = t0.elapsed();
        let t1 = Instant::now();
        let out = s
            .predict(&[("logmel_data", feats.clone())])
            .unwrap_or_else(|e| panic!("{name}: {e:#}"));
        let first = t1.elapsed();
        let t2 = Instant::now();
        s.enable_profiling(true);
        let out2 = s.predict(&[("logmel_data", feats.clone())]).unwrap();
        let second = t2.elapsed();
        if name.ends_with("fp16") {
            for (op, n, d) in s.profile() {
                println!("  {op:>24} {n:4} calls {d:10.2?}");
            }
        }
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0, "output");
        assert_eq!(out[0].1.dims(), &[1, 1500, 384]);
        assert_eq!(f32s(&out[0].1), f32s(&out2[0].1), "{name}: two runs differ");
        let refp = fx.join(format!("coremltools/{name}.reference.safetensors"));
        let want = io::read_safetensors(&refp, "encoder_output").unwrap();
        let p = psnr(&f32s(&want), &f32s(&out[0].1));
        println!("{name}: PSNR {p:.2} dB; load {load:.2?}, first predict {first:.2?}, second {second:.2?}");
        assert!(p >= 35.0, "{name}: PSNR {p:.2} dB < 35");
    }
}

// ---------- (b) ops ----------

#[test]
fn matmul_with_transposes_and_batch_broadcast_matches_naive() {
    let mut r = Lcg(1);
    let (xa, ya) = (r.vec(2 * 3 * 5 * 4), r.vec(3 * 6 * 5));
    let mut b = Builder::new(Opset::Ios15);
    let x = b.input("x", tin(DType::F32, &[2, 3, 5, 4])); // transposed: [.., 4, 5]
    let y = b.input("y", tin(DType::F32, &[3, 6, 5])); // transposed: [3, 5, 6]
    let z = b
        .op1(
            "matmul",
            "z",
            vec![
                ("x", x.into()),
                ("y", y.into()),
                ("transpose_x", c(Value::bool_scalar(true))),
                ("transpose_y", c(Value::bool_scalar(true))),
            ],
        )
        .unwrap();
    let out = run(
        b,
        &[(z, "z")],
        &[
            ("x", host(&xa, &[2, 3, 5, 4])),
            ("y", host(&ya, &[3, 6, 5])),
        ],
    );
    assert_eq!(out[0].dims(), &[2, 3, 4, 6]);
    let mut want = vec![0f64; 2 * 3 * 4 * 6];
    for a in 0..2 {
        for h in 0..3 {
            for i in 0..4 {
                for j in 0..6 {
                    want[((a * 3 + h) * 4 + i) * 6 + j] = (0..5)
                        .map(|k| {
                            xa[((a * 3 + h) * 5 + k) * 4 + i] as f64
                                * ya[(h * 6 + j) * 5 + k] as f64
                        })
                        .sum();
                }
            }
        }
    }
    assert_close(&f32s(&out[0]), &want, 1e-5, "matmul");
}

#[test]
fn fp16_linear_rounds_an_fp32_accumulation_once() {
    let mut r = Lcg(2);
    let (k, n) = (300, 7);
    let (xa, wa, ba) = (r.vec(2 * k), r.vec(n * k), r.vec(n));
    let h = |v: &[f32]| v.iter().map(|&x| f16::from_f32(x)).collect::<Vec<_>>();
    let mut b = Builder::new(Opset::Ios15);
    let x = b.input("x", tin(DType::F16, &[2, k]));
    let w = b.konst("w", Value::Tensor(ITensor::f16(&[n, k], &h(&wa))));
    let bias = b.konst("b", Value::Tensor(ITensor::f16(&[n], &h(&ba))));
    let y = b
        .op1(
            "linear",
            "y",
            vec![("x", x.into()), ("weight", w.into()), ("bias", bias.into())],
        )
        .unwrap();
    // fp32 data for an fp16 input: converted at the boundary.
    let out = run(b, &[(y, "y")], &[("x", host(&xa, &[2, k]))]);
    assert_eq!(out[0].dtype(), candle_core::DType::F16);
    let q = |v: f32| f16::from_f32(v).to_f32() as f64;
    let mut worst = 0f64;
    for i in 0..2 {
        for j in 0..n {
            let exact = (0..k)
                .map(|t| q(xa[i * k + t]) * q(wa[j * k + t]))
                .sum::<f64>()
                + q(ba[j]);
            let got = f32s(&out[0])[i * n + j] as f64;
            // One fp16 rounding of a (near) exact sum: within half an fp16 ulp (+ f32 noise).
            let ulp = f16::from_f64(exact).to_f64().abs().max(6.1e-5) * 2f64.powi(-10);
            worst = worst.max((got - exact).abs() / ulp);
        }
    }
    assert!(worst <= 0.51, "worst error {worst} fp16 ulps");
}

/// Direct convolution; arguments as MIL spells them: strides, dilations, pads
/// [top, bottom, left, right], groups.
#[allow(clippy::too_many_arguments)]
fn conv_naive(
    x: &[f32],
    xs: [usize; 4],
    w: &[f32],
    ws: [usize; 4],
    bias: &[f32],
    s: [usize; 2],
    d: [usize; 2],
    p: [usize; 4],
    g: usize,
) -> (Vec<f64>, [usize; 4]) {
    let [n, ci, h, wi] = xs;
    let [o, cg, kh, kw] = ws;
    let ho = (h + p[0] + p[1] - d[0] * (kh - 1) - 1) / s[0] + 1;
    let wo = (wi + p[2] + p[3] - d[1] * (kw - 1) - 1) / s[1] + 1;
    let og = o / g;
    let mut out = vec![0f64; n * o * ho * wo];
    for b in 0..n {
        for oc in 0..o {
            let grp = oc / og;
            for y in 0..ho {
                for xx in 0..wo {
                    let mut acc = bias[oc] as f64;
                    for c in 0..cg {
                        for i in 0..kh {
                            for j in 0..kw {
                                let iy = (y * s[0] + i * d[0]) as isize - p[0] as isize;
                                let ix = (xx * s[1] + j * d[1]) as isize - p[2] as isize;
                                if iy >= 0 && ix >= 0 && (iy as usize) < h && (ix as usize) < wi {
                                    let cin = grp * cg + c;
                                    acc += x[((b * ci + cin) * h + iy as usize) * wi + ix as usize]
                                        as f64
                                        * w[((oc * cg + c) * kh + i) * kw + j] as f64;
                                }
                            }
                        }
                    }
                    out[((b * o + oc) * ho + y) * wo + xx] = acc;
                }
            }
        }
    }
    (out, [n, o, ho, wo])
}

#[test]
fn conv2d_groups_strides_dilations_custom_pad_match_naive() {
    let mut r = Lcg(3);
    let (xs, ws) = ([2, 4, 7, 9], [6, 2, 3, 2]);
    let (xa, wa, ba) = (
        r.vec(xs.iter().product()),
        r.vec(ws.iter().product()),
        r.vec(6),
    );
    let mut b = Builder::new(Opset::Ios15);
    let x = b.input("x", tin(DType::F32, &xs));
    let w = b.konst("w", Value::Tensor(ITensor::f32(&ws, &wa)));
    let bias = b.konst("b", Value::Tensor(ITensor::f32(&[6], &ba)));
    let y = b
        .op1(
            "conv",
            "y",
            vec![
                ("x", x.into()),
                ("weight", w.into()),
                ("bias", bias.into()),
                ("strides", ints(&[2, 1])),
                ("dilations", ints(&[1, 2])),
                ("pad_type", c(Value::str("custom"))),
                ("pad", ints(&[1, 0, 2, 1])),
                ("groups", In::C(Value::i32_scalar(2))),
            ],
        )
        .unwrap();
    let out = run(b, &[(y, "y")], &[("x", host(&xa, &xs))]);
    let (want, shape) = conv_naive(&xa, xs, &wa, ws, &ba, [2, 1], [1, 2], [1, 0, 2, 1], 2);
    assert_eq!(out[0].dims(), &shape);
    assert_close(&f32s(&out[0]), &want, 1e-5, "conv2d");
}

#[test]
fn conv1d_same_padding_stride2_and_pointwise_match_naive() {
    let mut r = Lcg(4);
    let (xa, wa, w1) = (r.vec(3 * 11), r.vec(5 * 3 * 3), r.vec(4 * 5));
    let mut b = Builder::new(Opset::Ios15);
    let x = b.input("x", tin(DType::F32, &[1, 3, 11]));
    let w = b.konst("w", Value::Tensor(ITensor::f32(&[5, 3, 3], &wa)));
    let y = b
        .op1(
            "conv",
            "y",
            vec![
                ("x", x.into()),
                ("weight", w.into()),
                ("strides", ints(&[2])),
                ("pad_type", c(Value::str("same"))),
            ],
        )
        .unwrap();
    let wp = b.konst("wp", Value::Tensor(ITensor::f32(&[4, 5, 1], &w1)));
    let z = b
        .op1(
            "conv",
            "z",
            vec![("x", In::from(&y)), ("weight", wp.into())],
        )
        .unwrap();
    let yi = b.op1("identity", "yi", vec![("x", y.into())]).unwrap();
    let out = run(
        b,
        &[(yi, "y_out"), (z, "z")],
        &[("x", host(&xa, &[1, 3, 11]))],
    );
    // "same" with stride 2 over 11: output 6, total pad (6-1)*2+3-11 = 2 → 1 before, 1 after.
    let (want, shape) = conv_naive(
        &xa,
        [1, 3, 1, 11],
        &wa,
        [5, 3, 1, 3],
        &[0.0; 5],
        [1, 2],
        [1, 1],
        [0, 0, 1, 1],
        1,
    );
    assert_eq!(shape, [1, 5, 1, 6]);
    assert_eq!(out[0].dims(), &[1, 5, 6]);
    assert_close(&f32s(&out[0]), &want, 1e-5, "conv1d same");
    let yv: Vec<f32> = want.iter().map(|&v| v as f32).collect();
    let (want_z, _) = conv_naive(
        &yv,
        [1, 5, 1, 6],
        &w1,
        [4, 5, 1, 1],
        &[0.0; 4],
        [1, 1],
        [1, 1],
        [0; 4],
        1,
    );
    assert_close(&f32s(&out[1]), &want_z, 1e-5, "pointwise conv");
}

#[test]
fn softmax_layer_norm_and_gelu_match_formulas() {
    let mut r = Lcg(5);
    let xa: Vec<f32> = r.vec(2 * 4 * 3).iter().map(|v| v * 5.0).collect();
    let (ga, ba) = (r.vec(4), r.vec(4));
    let mut b = Builder::new(Opset::Ios15);
    let x = b.input("x", tin(DType::F32, &[2, 4, 3]));
    let s = b
        .op1(
            "softmax",
            "s",
            vec![("x", In::from(&x)), ("axis", In::C(Value::i32_scalar(-1)))],
        )
        .unwrap();
    let g = b.konst("g", Value::Tensor(ITensor::f32(&[4], &ga)));
    let bt = b.konst("bt", Value::Tensor(ITensor::f32(&[4], &ba)));
    let ln = b
        .op1(
            "layer_norm",
            "ln",
            vec![
                ("x", In::from(&x)),
                ("axes", ints(&[1])),
                ("gamma", g.into()),
                ("beta", bt.into()),
                ("epsilon", c(Value::f32_scalar(1e-5))),
            ],
        )
        .unwrap();
    let ge = b
        .op1(
            "gelu",
            "ge",
            vec![("x", In::from(&x)), ("mode", c(Value::str("EXACT")))],
        )
        .unwrap();
    let gt = b
        .op1(
            "gelu",
            "gt",
            vec![
                ("x", x.into()),
                ("mode", c(Value::str("TANH_APPROXIMATION"))),
            ],
        )
        .unwrap();
    let out = run(
        b,
        &[(s, "s"), (ln, "ln"), (ge, "ge"), (gt, "gt")],
        &[("x", host(&xa, &[2, 4, 3]))],
    );
    let sm = f32s(&out[0]);
    for row in sm.chunks(3) {
        assert!(
            (row.iter().sum::<f32>() - 1.0).abs() < 1e-6,
            "softmax row sums to {}",
            row.iter().sum::<f32>()
        );
    }
    let want_s: Vec<f64> = xa
        .chunks(3)
        .flat_map(|r| {
            let z: f64 = r.iter().map(|v| (*v as f64).exp()).sum();
            r.iter()
                .map(move |v| (*v as f64).exp() / z)
                .collect::<Vec<_>>()
        })
        .collect();
    assert_close(&sm, &want_s, 1e-6, "softmax");
    let mut want_ln = vec![0f64; 24];
    for a in 0..2 {
        for k in 0..3 {
            let col: Vec<f64> = (0..4).map(|c| xa[(a * 4 + c) * 3 + k] as f64).collect();
            let m = col.iter().sum::<f64>() / 4.0;
            let var = col.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / 4.0;
            for c in 0..4 {
                want_ln[(a * 4 + c) * 3 + k] =
                    (col[c] - m) / (var + 1e-5).sqrt() * ga[c] as f64 + ba[c] as f64;
            }
        }
    }
    assert_close(&f32s(&out[1]), &want_ln, 1e-5, "layer_norm");
    // erf by its Taylor series (converges well for |x| ≤ 5 in f64).
    let erf = |x: f64| {
        let (mut term, mut sum, mut n) = (x, x, 0.0);
        while term.abs() > 1e-17 {
            n += 1.0;
            term *= -x * x / n;
            sum += term / (2.0 * n + 1.0);
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    };
    let want_ge: Vec<f64> = xa
        .iter()
        .map(|&v| 0.5 * v as f64 * (1.0 + erf(v as f64 / 2f64.sqrt())))
        .collect();
    assert_close(&f32s(&out[2]), &want_ge, 1e-5, "gelu exact");
    let want_gt: Vec<f64> = xa
        .iter()
        .map(|&v| {
            let v = v as f64;
            0.5 * v
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v.powi(3))).tanh())
        })
        .collect();
    assert_close(&f32s(&out[3]), &want_gt, 1e-5, "gelu tanh");
}

#[test]
fn einsum_attention_forms_match_naive() {
    let mut r = Lcg(6);
    // "bchq,bkhc->bkhq" with b=1, c=4, h=2, q=3, k=5.
    let (a1, b1) = (r.vec(4 * 2 * 3), r.vec(5 * 2 * 4));
    // "nchw,nwhu->nchu" with n=2, c=3, h=2, w=4, u=5.
    let (a2, b2) = (r.vec(2 * 3 * 2 * 4), r.vec(2 * 4 * 2 * 5));
    let mut b = Builder::new(Opset::Ios15);
    let x1 = b.input("x1", tin(DType::F32, &[1, 4, 2, 3]));
    let y1 = b.input("y1", tin(DType::F32, &[1, 5, 2, 4]));
    let x2 = b.input("x2", tin(DType::F32, &[2, 3, 2, 4]));
    let y2 = b.input("y2", tin(DType::F32, &[2, 4, 2, 5]));
    let e1 = b
        .op1(
            "einsum",
            "e1",
            vec![
                ("values", In::Vs(vec![x1, y1])),
                ("equation", c(Value::str("bchq,bkhc->bkhq"))),
            ],
        )
        .unwrap();
    let e2 = b
        .op1(
            "einsum",
            "e2",
            vec![
                ("values", In::Vs(vec![x2, y2])),
                ("equation", c(Value::str("nchw,nwhu->nchu"))),
            ],
        )
        .unwrap();
    let out = run(
        b,
        &[(e1, "e1"), (e2, "e2")],
        &[
            ("x1", host(&a1, &[1, 4, 2, 3])),
            ("y1", host(&b1, &[1, 5, 2, 4])),
            ("x2", host(&a2, &[2, 3, 2, 4])),
            ("y2", host(&b2, &[2, 4, 2, 5])),
        ],
    );
    let mut w1 = vec![0f64; 5 * 2 * 3];
    for k in 0..5 {
        for h in 0..2 {
            for q in 0..3 {
                w1[(k * 2 + h) * 3 + q] = (0..4)
                    .map(|cc| a1[(cc * 2 + h) * 3 + q] as f64 * b1[(k * 2 + h) * 4 + cc] as f64)
                    .sum();
            }
        }
    }
    assert_eq!(out[0].dims(), &[1, 5, 2, 3]);
    assert_close(&f32s(&out[0]), &w1, 1e-5, "einsum bchq,bkhc");
    let mut w2 = vec![0f64; 2 * 3 * 2 * 5];
    for n in 0..2 {
        for cc in 0..3 {
            for h in 0..2 {
                for u in 0..5 {
                    w2[((n * 3 + cc) * 2 + h) * 5 + u] = (0..4)
                        .map(|w| {
                            a2[((n * 3 + cc) * 2 + h) * 4 + w] as f64
                                * b2[((n * 4 + w) * 2 + h) * 5 + u] as f64
                        })
                        .sum();
                }
            }
        }
    }
    assert_close(&f32s(&out[1]), &w2, 1e-5, "einsum nchw,nwhu");
}

// ---------- compressed weights ----------

fn u_tensor(
    dtype: DType,
    bdt: milkit::package::blob::BlobDType,
    shape: &[usize],
    codes: &[u8],
) -> Value {
    let packed = milkit::package::blob::pack_sub_byte(bdt, codes).unwrap();
    Value::Tensor(ITensor::new(dtype, shape.to_vec(), milkit::ir::Bytes::from_vec(packed)).unwrap())
}

fn f16_tensor(shape: &[usize], v: &[f32]) -> Value {
    Value::Tensor(ITensor::f16(
        shape,
        &v.iter().map(|&x| f16::from_f32(x)).collect::<Vec<_>>(),
    ))
}

#[test]
fn ios18_lut_and_blockwise_decode_match_scalar_loops() {
    use milkit::package::blob::{pack_i4, BlobDType};
    let mut r = Lcg(7);
    let codes: Vec<u8> = (0..24)
        .map(|_| ((r.next() + 1.0) * 8.0) as u8 % 16)
        .collect();
    let lut: Vec<f32> = r
        .vec(2 * 3 * 16)
        .iter()
        .map(|v| f16::from_f32(*v).to_f32())
        .collect();
    let vcodes: Vec<u8> = (0..6).map(|_| ((r.next() + 1.0) * 2.0) as u8 % 4).collect();
    let vlut: Vec<f32> = r
        .vec(8)
        .iter()
        .map(|v| f16::from_f32(*v).to_f32())
        .collect();
    let data: Vec<i8> = (0..32)
        .map(|_| ((r.next() * 8.0).floor() as i8).clamp(-8, 7))
        .collect();
    let offs: Vec<i8> = vec![-1, 0, 3, -8];
    let scale: Vec<f32> = r
        .vec(4)
        .iter()
        .map(|v| f16::from_f32(*v).to_f32())
        .collect();

    let mut b = Builder::new(Opset::Ios18);
    let grouped = b
        .op1(
            "constexpr_lut_to_dense",
            "grouped",
            vec![
                (
                    "indices",
                    In::Inline(u_tensor(DType::U4, BlobDType::U4, &[4, 6], &codes)),
                ),
                ("lut", In::Inline(f16_tensor(&[2, 3, 16, 1], &lut))),
            ],
        )
        .unwrap();
    let vector = b
        .op1(
            "constexpr_lut_to_dense",
            "vector",
            vec![
                (
                    "indices",
                    In::Inline(u_tensor(DType::U2, BlobDType::U2, &[2, 3], &vcodes)),
                ),
                ("lut", In::Inline(f16_tensor(&[1, 1, 4, 2], &vlut))),
                ("vector_axis", In::Inline(Value::i32_scalar(0))),
            ],
        )
        .unwrap();
    let bytes = |v: &[i8]| milkit::ir::Bytes::from_vec(pack_i4(v).unwrap());
    let block = b
        .op1(
            "constexpr_blockwise_shift_scale",
            "block",
            vec![
                (
                    "data",
                    In::Inline(Value::Tensor(
                        ITensor::new(DType::I4, vec![4, 8], bytes(&data)).unwrap(),
                    )),
                ),
                ("scale", In::Inline(f16_tensor(&[2, 2], &scale))),
                (
                    "offset",
                    In::Inline(Value::Tensor(
                        ITensor::new(DType::I4, vec![2, 2], bytes(&offs)).unwrap(),
                    )),
                ),
            ],
        )
        .unwrap();
    // One decoded weight also feeds a runtime op (decoded once at load, used per call).
    let x = b.input("x", tin(DType::F16, &[1, 4]));
    let y = b
        .op1(
            "matmul",
            "y",
            vec![("x", x.into()), ("y", In::from(&block))],
        )
        .unwrap();
    let block = b
        .op1("identity", "block_id", vec![("x", block.into())])
        .unwrap();
    let out = run(
        b,
        &[
            (grouped, "grouped"),
            (vector, "vector"),
            (block, "block_out"),
            (y, "y"),
        ],
        &[("x", host(&[1.0, 0.0, 0.0, 0.0], &[1, 4]))],
    );

    let want_g: Vec<f64> = (0..24)
        .map(|k| {
            let (i, j) = (k / 6, k % 6);
            lut[((i / 2) * 3 + j / 2) * 16 + codes[k] as usize] as f64
        })
        .collect();
    assert_eq!(out[0].dtype(), candle_core::DType::F16);
    assert_close(&f32s(&out[0]), &want_g, 0.0, "grouped lut");
    assert_eq!(out[1].dims(), &[4, 3]);
    let want_v: Vec<f64> = (0..12)
        .map(|k| {
            let (o, j) = (k / 3, k % 3);
            vlut[vcodes[(o / 2) * 3 + j] as usize * 2 + o % 2] as f64
        })
        .collect();
    assert_close(&f32s(&out[1]), &want_v, 0.0, "vector lut");
    let want_b: Vec<f64> = (0..32)
        .map(|k| {
            let (i, j) = (k / 8, k % 8);
            let blk = (i / 2) * 2 + j / 4;
            f16::from_f64(scale[blk] as f64 * (data[k] as f64 - offs[blk] as f64)).to_f64()
        })
        .collect();
    assert_close(&f32s(&out[2]), &want_b, 0.0, "blockwise");
    assert_close(&f32s(&out[3]), &want_b[..8], 0.0, "row 0 through matmul");
}

#[test]
fn ios16_lut_and_affine_decode_match_scalar_loops() {
    use milkit::package::blob::BlobDType;
    let mut r = Lcg(8);
    let codes: Vec<u8> = (0..15)
        .map(|_| ((r.next() + 1.0) * 2.0) as u8 % 4)
        .collect();
    let packed = milkit::package::blob::pack_sub_byte(BlobDType::U2, &codes).unwrap();
    let lut = [0.5f32, -1.25, 2.0, 3.5];
    let q: Vec<u8> = (0..12).map(|i| (i * 21 % 256) as u8).collect();
    let (zp, sc) = ([3u8, 128, 7], [0.5f32, 0.25, -2.0]);
    let mut b = Builder::new(Opset::Ios16);
    let l = b
        .op1(
            "constexpr_lut_to_dense",
            "l",
            vec![
                ("lut", c(f16_tensor(&[4], &lut))),
                (
                    "indices",
                    c(Value::Tensor(
                        ITensor::new(
                            DType::U8,
                            vec![packed.len()],
                            milkit::ir::Bytes::from_vec(packed),
                        )
                        .unwrap(),
                    )),
                ),
                (
                    "shape",
                    c(Value::Tensor(
                        ITensor::new(
                            DType::U32,
                            vec![2],
                            milkit::ir::Bytes::from_vec(
                                [3u32, 5].iter().flat_map(|v| v.to_le_bytes()).collect(),
                            ),
                        )
                        .unwrap(),
                    )),
                ),
            ],
        )
        .unwrap();
    let a = b
        .op1(
            "constexpr_affine_dequantize",
            "a",
            vec![
                (
                    "quantized_data",
                    c(Value::Tensor(
                        ITensor::new(
                            DType::U8,
                            vec![3, 4],
                            milkit::ir::Bytes::from_vec(q.clone()),
                        )
                        .unwrap(),
                    )),
                ),
                (
                    "zero_point",
                    c(Value::Tensor(
                        ITensor::new(DType::U8, vec![3], milkit::ir::Bytes::from_vec(zp.to_vec()))
                            .unwrap(),
                    )),
                ),
                ("scale", c(Value::Tensor(ITensor::f32(&[3], &sc)))),
                ("axis", c(Value::i32_scalar(0))),
            ],
        )
        .unwrap();
    let out = run(b, &[(l, "l"), (a, "a")], &[]);
    assert_eq!(out[0].dims(), &[3, 5]);
    assert_close(
        &f32s(&out[0]),
        &codes
            .iter()
            .map(|&k| lut[k as usize] as f64)
            .collect::<Vec<_>>(),
        0.0,
        "lut16",
    );
    let want: Vec<f64> = (0..12)
        .map(|k| (q[k] as f64 - zp[k / 4] as f64) * sc[k / 4] as f64)
        .collect();
    assert_close(&f32s(&out[1]), &want, 1e-7, "affine");
}

// ---------- data movement and the rest ----------

/// Element of a row-major [2, 3, 4] array.
fn at(x: &[f32], i: usize, j: usize, k: usize) -> f64 {
    x[(i * 3 + j) * 4 + k] as f64
}

#[test]
fn slicing_gather_pad_and_shape_ops_match_index_loops() {
    let xa: Vec<f32> = (0..24).map(|v| v as f32 * 0.5 - 3.0).collect();
    let mut b = Builder::new(Opset::Ios15);
    let x = b.input("x", tin(DType::F32, &[2, 3, 4]));
    let xv = || In::from(&x);
    let s1 = b
        .op1(
            "slice_by_index",
            "s1",
            vec![
                ("x", xv()),
                ("begin", ints(&[0, 2, 3])),
                ("end", ints(&[2, 0, 0])),
                ("stride", ints(&[1, -1, -2])),
                (
                    "end_mask",
                    c(Value::Tensor(ITensor::bools(&[3], &[false, true, true]))),
                ),
            ],
        )
        .unwrap();
    let s2 = b
        .op1(
            "slice_by_index",
            "s2",
            vec![
                ("x", xv()),
                ("begin", ints(&[1, 0, 0])),
                ("end", ints(&[2, 3, 4])),
                (
                    "squeeze_mask",
                    c(Value::Tensor(ITensor::bools(&[3], &[true, false, false]))),
                ),
            ],
        )
        .unwrap();
    let g = b
        .op1(
            "gather",
            "g",
            vec![
                ("x", xv()),
                (
                    "indices",
                    c(Value::Tensor(ITensor::i32(&[2, 2], &[2, 0, -1, 1]))),
                ),
                ("axis", In::C(Value::i32_scalar(1))),
            ],
        )
        .unwrap();
    let p = b
        .op1(
            "pad",
            "p",
            vec![
                ("x", xv()),
                ("pad", ints(&[1, 1, 2, 1])),
                ("mode", c(Value::str("reflect"))),
            ],
        )
        .unwrap();
    let t = b
        .op1(
            "transpose",
            "t",
            vec![("x", xv()), ("perm", ints(&[2, 0, 1]))],
        )
        .unwrap();
    let rs = b
        .op1(
            "reshape",
            "rs",
            vec![("x", In::from(&t)), ("shape", ints(&[4, -1]))],
        )
        .unwrap();
    let sp = b
        .op(
            "split",
            "sp",
            vec![
                ("x", xv()),
                ("split_sizes", ints(&[1, 2])),
                ("axis", In::C(Value::i32_scalar(1))),
            ],
        )
        .unwrap();
    let cc = b
        .op1(
            "concat",
            "cc",
            vec![
                ("values", In::Vs(vec![sp[1].clone(), sp[0].clone()])),
                ("axis", In::C(Value::i32_scalar(1))),
            ],
        )
        .unwrap();
    let red = b
        .op1(
            "reduce_sum",
            "red",
            vec![
                ("x", xv()),
                ("axes", ints(&[0, 2])),
                ("keep_dims", c(Value::bool_scalar(true))),
            ],
        )
        .unwrap();
    let am = b
        .op1(
            "reduce_argmax",
            "am",
            vec![("x", xv()), ("axis", In::C(Value::i32_scalar(1)))],
        )
        .unwrap();
    let zero = b.konst("zero", Value::f32_scalar(0.0));
    let pos = b
        .op1("greater", "pos", vec![("x", xv()), ("y", In::from(&zero))])
        .unwrap();
    let neg = b
        .op1(
            "mul",
            "neg",
            vec![("x", xv()), ("y", c(Value::f32_scalar(-10.0)))],
        )
        .unwrap();
    let sel = b
        .op1(
            "select",
            "sel",
            vec![("cond", pos.into()), ("a", xv()), ("b", neg.into())],
        )
        .unwrap();
    let h = b
        .op1(
            "cast",
            "h",
            vec![("x", xv()), ("dtype", c(Value::str("fp16")))],
        )
        .unwrap();
    let tl = b
        .op1("tile", "tl", vec![("x", xv()), ("reps", ints(&[1, 1, 2]))])
        .unwrap();
    let outs = [
        (s1, "s1"),
        (s2, "s2"),
        (g, "g"),
        (p, "p"),
        (rs, "rs"),
        (cc, "cc"),
        (red, "red"),
        (am, "am"),
        (sel, "sel"),
        (h, "h"),
        (tl, "tl"),
    ];
    let o = run(b, &outs, &[("x", host(&xa, &[2, 3, 4]))]);

    let mut want = vec![];
    for i in 0..2 {
        for j in [2, 1, 0] {
            for k in [3, 1] {
                want.push(at(&xa, i, j, k));
            }
        }
    }
    assert_eq!(o[0].dims(), &[2, 3, 2]);
    assert_close(&f32s(&o[0]), &want, 0.0, "negative-stride slice");
    assert_eq!(o[1].dims(), &[3, 4]);
    assert_close(
        &f32s(&o[1]),
        &xa[12..].iter().map(|&v| v as f64).collect::<Vec<_>>(),
        0.0,
        "squeezed slice",
    );
    let idx = [2usize, 0, 2, 1];
    let want: Vec<f64> = (0..2)
        .flat_map(|i| {
            idx.iter()
                .flat_map(move |&j| (0..4).map(move |k| (i, j, k)))
        })
        .map(|(i, j, k)| at(&xa, i, j, k))
        .collect();
    assert_eq!(o[2].dims(), &[2, 2, 2, 4]);
    assert_close(&f32s(&o[2]), &want, 0.0, "gather");
    let refl = |i: isize, n: isize| if i < 0 { -i } else if i >= n { 2 * (n - 1) - i } else { i } as usize;
    let want: Vec<f64> = (0..2)
        .flat_map(|i| {
            (-1..4isize).flat_map(move |j| (-2..5isize).map(move |k| (i, refl(j, 3), refl(k, 4))))
        })
        .map(|(i, j, k)| at(&xa, i, j, k))
        .collect();
    assert_eq!(o[3].dims(), &[2, 5, 7]);
    assert_close(&f32s(&o[3]), &want, 0.0, "reflect pad");
    let want: Vec<f64> = (0..4)
        .flat_map(|k| (0..2).flat_map(move |i| (0..3).map(move |j| (i, j, k))))
        .map(|(i, j, k)| at(&xa, i, j, k))
        .collect();
    assert_eq!(o[4].dims(), &[4, 6]);
    assert_close(&f32s(&o[4]), &want, 0.0, "transpose+reshape");
    let want: Vec<f64> = (0..2)
        .flat_map(|i| {
            [1, 2, 0]
                .into_iter()
                .flat_map(move |j| (0..4).map(move |k| (i, j, k)))
        })
        .map(|(i, j, k)| at(&xa, i, j, k))
        .collect();
    assert_close(&f32s(&o[5]), &want, 0.0, "split+concat");
    let want: Vec<f64> = (0..3)
        .map(|j| {
            (0..2)
                .flat_map(|i| (0..4).map(move |k| (i, k)))
                .map(|(i, k)| at(&xa, i, j, k))
                .sum()
        })
        .collect();
    assert_eq!(o[6].dims(), &[1, 3, 1]);
    assert_close(&f32s(&o[6]), &want, 1e-6, "reduce_sum");
    assert_eq!(o[7].dtype(), candle_core::DType::I32);
    assert_eq!(
        o[7].flatten_all().unwrap().to_vec1::<i32>().unwrap(),
        vec![2; 8]
    );
    let want: Vec<f64> = xa
        .iter()
        .map(|&v| if v > 0.0 { v as f64 } else { v as f64 * -10.0 })
        .collect();
    assert_close(&f32s(&o[8]), &want, 0.0, "select");
    assert_eq!(o[9].dtype(), candle_core::DType::F16);
    let want: Vec<f64> = (0..2)
        .flat_map(|i| (0..3).flat_map(move |j| (0..8).map(move |k| (i, j, k % 4))))
        .map(|(i, j, k)| at(&xa, i, j, k))
        .collect();
    assert_close(&f32s(&o[10]), &want, 0.0, "tile");
}

#[test]
fn stateful_program_keeps_its_state_across_calls_and_packages() {
    let cache = ValueType::State(TensorType::new(DType::F16, &[1, 2, 6]));
    let mut b = Builder::new(Opset::Ios18);
    let st = b.input("cache", cache.clone());
    let x = b.input("x", tin(DType::F16, &[1, 2, 2]));
    let pos = b.input("pos", tin(DType::I32, &[1]));
    let s = b
        .op1("read_state", "s", vec![("input", st.clone().into())])
        .unwrap();
    let zz = b.konst("zz", Value::i32s(&[0, 0]));
    let begin = b
        .op1(
            "concat",
            "begin",
            vec![
                ("values", In::Vs(vec![zz, pos])),
                ("axis", In::C(Value::i32_scalar(0))),
            ],
        )
        .unwrap();
    let end = b
        .op1(
            "add",
            "end",
            vec![("x", In::from(&begin)), ("y", ints(&[1, 2, 2]))],
        )
        .unwrap();
    let u = b
        .op1(
            "slice_update",
            "u",
            vec![
                ("x", s.into()),
                ("update", x.into()),
                ("begin", begin.into()),
                ("end", end.into()),
            ],
        )
        .unwrap();
    let w = b
        .op1(
            "coreml_update_state",
            "w",
            vec![("state", st.into()), ("value", u.into())],
        )
        .unwrap();
    let snap = b.op1("identity", "snap", vec![("x", w.into())]).unwrap();
    let mut m = model(b, &[(snap, "snapshot")]);
    m.description = Description {
        inputs: vec![
            Feature::new("x", ArrayDType::F16, &[1, 2, 2]),
            Feature::new("pos", ArrayDType::I32, &[1]),
        ],
        states: vec![Feature::new("cache", ArrayDType::F16, &[1, 2, 6])],
        outputs: vec![Feature::new("snapshot", ArrayDType::F16, &[1, 2, 6])],
        ..Default::default()
    };
    // Through a package on disk, so states survive save → load too.
    let dir = tempfile::tempdir().unwrap();
    let pkg = dir.path().join("state.mlpackage");
    milkit::package::save_package(&m, &pkg, false, &mut |_| {}).unwrap();
    let mut sess = Session::load(&pkg).unwrap();
    let pos_t = |p: i32| Tensor::from_vec(vec![p], 1, &candle_core::Device::Cpu).unwrap();
    let x1 = host(&[1., 2., 3., 4.], &[1, 2, 2]);
    let x2 = host(&[5., 6., 7., 8.], &[1, 2, 2]);
    let o1 = sess.predict(&[("x", x1), ("pos", pos_t(0))]).unwrap();
    assert_eq!(
        f32s(&o1[0].1),
        vec![1., 2., 0., 0., 0., 0., 3., 4., 0., 0., 0., 0.]
    );
    let o2 = sess.predict(&[("pos", pos_t(2)), ("x", x2)]).unwrap();
    let want = vec![1., 2., 5., 6., 0., 0., 3., 4., 7., 8., 0., 0.];
    assert_eq!(f32s(&o2[0].1), want);
    assert_eq!(f32s(&sess.state("cache").unwrap()), want);
    sess.reset_states().unwrap();
    assert!(f32s(&sess.state("cache").unwrap())
        .iter()
        .all(|&v| v == 0.0));
}

#[test]
fn bad_inputs_and_unknown_ops_are_errors_not_panics() {
    let mk = || {
        let mut b = Builder::new(Opset::Ios15);
        let x = b.input("x", tin(DType::I32, &[2, 3]));
        let y = b
            .op1("add", "y", vec![("x", x.into()), ("y", ints(&[1, 2, 3]))])
            .unwrap();
        Session::from_model(model(b, &[(y, "y")])).unwrap()
    };
    let good = Tensor::from_vec(vec![1i32; 6], (2, 3), &candle_core::Device::Cpu).unwrap();
    let err = |r: anyhow::Result<Vec<(String, Tensor)>>| format!("{:#}", r.expect_err("an error"));
    assert!(err(mk().predict(&[])).contains("missing input `x`"));
    assert!(
        err(mk().predict(&[("x", good.clone()), ("z", good.clone())]))
            .contains("unknown input `z`")
    );
    let wrong = Tensor::from_vec(vec![1i32; 6], (3, 2), &candle_core::Device::Cpu).unwrap();
    assert!(err(mk().predict(&[("x", wrong)])).contains("expected"));
    assert!(
        err(mk().predict(&[("x", host(&[0.5; 6], &[2, 3]))])).contains("floats are not converted")
    );
    assert_eq!(
        f32s(&mk().predict(&[("x", good)]).unwrap()[0].1),
        vec![2., 3., 4., 2., 3., 4.]
    );

    let mut m = {
        let mut b = Builder::new(Opset::Ios15);
        let x = b.input("x", tin(DType::F32, &[2]));
        let y = b.op1("relu", "y", vec![("x", x.into())]).unwrap();
        model(b, &[(y, "y")])
    };
    m.program
        .functions
        .get_mut("main")
        .unwrap()
        .block
        .operations[0]
        .op_type = "frobnicate".into();
    let e = format!("{:#}", Session::from_model(m).err().expect("an error"));
    assert!(e.contains("frobnicate") && e.contains("CoreML5"), "{e}");
}

#[test]
fn every_op_definition_can_be_evaluated() {
    let missing: Vec<String> = milkit::ops::all()
        .filter(|d| d.eval.is_none())
        .map(|d| format!("{} ({:?})", d.name, d.since))
        .collect();
    assert!(missing.is_empty(), "ops without evaluation: {missing:?}");
}

// ---------- milkit's own BC1S encoder graph ----------

/// fp16 weights straight from the checkpoint's safetensors.
struct Checkpoint(Vec<u8>);

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

#[test]
fn milkit_bc1s_encoder_matches_pytorch_in_both_abis() {
    use milkit::whisper::encoder::{build_encoder, EncoderAbi, EncoderDims};
    let Some(fx) = common::fixtures() else { return };
    let ck =
        Checkpoint(std::fs::read(fx.join("models/whisper-tiny.en/model.safetensors")).unwrap());
    let dims = EncoderDims {
        d_model: 384,
        layers: 4,
        heads: 6,
        ffn: 1536,
        n_mels: 80,
        n_ctx: 1500,
    };
    let refs = fx.join("reference/tiny.en-jfk.safetensors");
    let feats = io::read_safetensors(&refs, "input_features").unwrap();
    let want = f32s(&io::read_safetensors(&refs, "encoder_output").unwrap());
    for abi in [EncoderAbi::WhisperCpp, EncoderAbi::WhisperKit] {
        let m = build_encoder(&dims, &ck, abi, Opset::Ios18, &mut |_, _| {}).unwrap();
        let mut s = Session::from_model(m).unwrap();
        let (input, x) = match abi {
            EncoderAbi::WhisperCpp => ("logmel_data", feats.clone()),
            EncoderAbi::WhisperKit => (
                "melspectrogram_features",
                feats.reshape((1, 80, 1, 3000)).unwrap(),
            ),
        };
        let t0 = Instant::now();
        let out = s.predict(&[(input, x)]).unwrap();
        let dt = t0.elapsed();
        // WhisperKit's output is [1, d, 1, S]: bring it to [1, S, d] to compare.
        let got = match abi {
            EncoderAbi::WhisperCpp => out[0].1.clone(),
            EncoderAbi::WhisperKit => out[0].1.squeeze(2).unwrap().transpose(1, 2).unwrap(),
        };
        assert_eq!(got.dims(), &[1, 1500, 384]);
        let p = psnr(&want, &f32s(&got));
        println!(
            "milkit BC1S encoder ({}): PSNR {p:.2} dB, predict {dt:.2?}",
            abi.name()
        );
        assert!(p >= 35.0, "{}: PSNR {p:.2} dB < 35", abi.name());
    }
}
