//! Per-op tests of the interpreter, maths: programs built with `ops::Builder` and run in a
//! `Session`, against naive loops written here in f64 (matmul, linear, convolution,
//! softmax / layer norm / GELU, einsum, fused attention).

mod common;

use common::programs::*;
use common::rng::Rng;
use half::f16;
use milkit::ir::{DType, Opset, Tensor as ITensor, Value};
use milkit::ops::{Builder, In};
use milkit::runtime::Session;

#[test]
fn matmul_with_transposes_and_batch_broadcast_matches_naive() {
    let mut r = Rng(1);
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
    let mut r = Rng(2);
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
    let mut r = Rng(3);
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
    let mut r = Rng(4);
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

/// `layer_norm(x, axes = [1], gamma, beta, epsilon = 1e-5)` named `ln`.
fn layer_norm_over_axis_1(
    b: &mut Builder,
    x: &milkit::ops::V,
    gamma: &[f32],
    beta: &[f32],
) -> milkit::ops::V {
    let g = b.konst("g", Value::Tensor(ITensor::f32(&[gamma.len()], gamma)));
    let bt = b.konst("bt", Value::Tensor(ITensor::f32(&[beta.len()], beta)));
    b.op1(
        "layer_norm",
        "ln",
        vec![
            ("x", In::from(x)),
            ("axes", ints(&[1])),
            ("gamma", g.into()),
            ("beta", bt.into()),
            ("epsilon", c(Value::f32_scalar(1e-5))),
        ],
    )
    .unwrap()
}

#[test]
fn softmax_layer_norm_and_gelu_match_formulas() {
    let mut r = Rng(5);
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
    let ln = layer_norm_over_axis_1(&mut b, &x, &ga, &ba);
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
    let mut r = Rng(6);
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

#[test]
fn fused_attention_matches_op_by_op_and_naive() {
    use milkit::runtime::{fusion::FUSED, Options};
    let (h, m, n, k, d) = (2, 40, 37, 8, 3);
    let mut r = Rng(9);
    let (qa, ka, va) = (r.vec(h * m * k), r.vec(h * n * k), r.vec(h * n * d));
    let ma: Vec<f32> = (0..m * n)
        .map(|i| {
            if (i % n) > (i / n) + 5 {
                -30000.0
            } else {
                r.next()
            }
        })
        .collect();
    let build = || {
        let mut b = Builder::new(Opset::Ios16);
        let q = b.input("q", tin(DType::F16, &[1, h, m, k]));
        let kk = b.input("k", tin(DType::F16, &[1, h, n, k]));
        let v = b.input("v", tin(DType::F16, &[1, h, n, d]));
        let vt = b.input("vt", tin(DType::F16, &[1, h, d, n]));
        let mask = b.konst("mask", f16_tensor(&[1, 1, m, n], &ma));
        let t = |v: bool| c(Value::bool_scalar(v));
        let s = b
            .op1(
                "matmul",
                "s",
                vec![
                    ("x", In::from(&q)),
                    ("y", In::from(&kk)),
                    ("transpose_x", t(false)),
                    ("transpose_y", t(true)),
                ],
            )
            .unwrap();
        let sm = b
            .op1("add", "sm", vec![("x", s.into()), ("y", mask.into())])
            .unwrap();
        let p = b
            .op1(
                "softmax",
                "p",
                vec![("x", sm.into()), ("axis", In::C(Value::i32_scalar(-1)))],
            )
            .unwrap();
        let o = b
            .op1("matmul", "o", vec![("x", p.into()), ("y", v.into())])
            .unwrap();
        // Second chain, values on the left (milkit's BC1S form): vt @ pᵀ → [1, h, d, m].
        let s2 = b
            .op1(
                "matmul",
                "s2",
                vec![("x", q.into()), ("y", kk.into()), ("transpose_y", t(true))],
            )
            .unwrap();
        let p2 = b
            .op1(
                "softmax",
                "p2",
                vec![("x", s2.into()), ("axis", In::C(Value::i32_scalar(3)))],
            )
            .unwrap();
        let o2 = b
            .op1(
                "matmul",
                "o2",
                vec![("x", vt.into()), ("y", p2.into()), ("transpose_y", t(true))],
            )
            .unwrap();
        let oi = b.op1("identity", "oi", vec![("x", o.into())]).unwrap();
        model(b, &[(oi, "out1"), (o2, "out2")])
    };
    let vt: Vec<f32> = (0..h * d * n)
        .map(|i| va[(i / (d * n)) * n * d + (i % n) * d + (i / n) % d])
        .collect();
    let inputs = [
        ("q", host(&qa, &[1, h, m, k])),
        ("k", host(&ka, &[1, h, n, k])),
        ("v", host(&va, &[1, h, n, d])),
        ("vt", host(&vt, &[1, h, d, n])),
    ];
    let mut fused = Session::from_model_with(
        build(),
        &Options {
            fuse_attention: true,
            ..Options::default()
        },
    )
    .unwrap();
    fused.enable_profiling(true);
    let of = fused.predict(&inputs).unwrap();
    assert_eq!(
        fused.profile().iter().find(|p| p.0 == FUSED).map(|p| p.1),
        Some(2),
        "both chains fused"
    );
    let mut plain = Session::from_model_with(
        build(),
        &Options {
            fuse_attention: false,
            ..Options::default()
        },
    )
    .unwrap();
    let op = plain.predict(&inputs).unwrap();
    // Naive f64 attention on fp16-rounded inputs.
    let q16 = |v: f32| f16::from_f32(v).to_f64();
    let mut want = vec![0f64; h * m * d];
    for hh in 0..h {
        for i in 0..m {
            let s: Vec<f64> = (0..n)
                .map(|j| {
                    (0..k)
                        .map(|t| q16(qa[(hh * m + i) * k + t]) * q16(ka[(hh * n + j) * k + t]))
                        .sum::<f64>()
                        + q16(ma[i * n + j])
                })
                .collect();
            let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = s.iter().map(|v| (v - mx).exp()).sum();
            for c2 in 0..d {
                want[(hh * m + i) * d + c2] = (0..n)
                    .map(|j| (s[j] - mx).exp() / z * q16(va[(hh * n + j) * d + c2]))
                    .sum();
            }
        }
    }
    assert_close(&f32s(&of[0].1), &want, 4e-3, "fused vs naive");
    assert_close(&f32s(&op[0].1), &want, 4e-3, "op-by-op vs naive");
    let a: Vec<f64> = f32s(&op[1].1).iter().map(|&v| v as f64).collect();
    assert_eq!(of[1].1.dims(), &[1, h, d, m]);
    assert_close(
        &f32s(&of[1].1),
        &a,
        4e-3,
        "fused vs op-by-op (values on the left)",
    );
}

/// A decode step's cross attention whose probabilities are also read later (a decoder's
/// alignment heads): still fused, the probabilities come out as a second output, and both
/// equal op-by-op evaluation.
#[test]
fn fused_decode_attention_hands_out_probabilities() {
    use milkit::runtime::{fusion::FUSED, Options};
    let (h, n, k, d) = (3, 50, 8, 8);
    let mut r = Rng(21);
    let (qa, ka, va) = (r.vec(h * k), r.vec(h * k * n), r.vec(h * d * n));
    let build = || {
        let mut b = Builder::new(Opset::Ios16);
        let q = b.input("q", tin(DType::F16, &[1, h, k, 1]));
        let kk = b.input("k", tin(DType::F16, &[1, h, k, n]));
        let v = b.input("v", tin(DType::F16, &[1, h, d, n]));
        let t = |v: bool| c(Value::bool_scalar(v));
        let s = b
            .op1(
                "matmul",
                "s",
                vec![
                    ("x", In::from(&q)),
                    ("y", In::from(&kk)),
                    ("transpose_x", t(true)),
                ],
            )
            .unwrap();
        let p = b
            .op1(
                "softmax",
                "p",
                vec![("x", s.into()), ("axis", In::C(Value::i32_scalar(-1)))],
            )
            .unwrap();
        let o = b
            .op1(
                "matmul",
                "o",
                vec![
                    ("x", v.into()),
                    ("y", p.clone().into()),
                    ("transpose_y", t(true)),
                ],
            )
            .unwrap();
        let later = b.op1("identity", "later", vec![("x", p.into())]).unwrap();
        model(b, &[(o, "context"), (later, "probs")])
    };
    let inputs = [
        ("q", host(&qa, &[1, h, k, 1])),
        ("k", host(&ka, &[1, h, k, n])),
        ("v", host(&va, &[1, h, d, n])),
    ];
    let run = |fuse: bool| {
        let mut s = Session::from_model_with(
            build(),
            &Options {
                fuse_attention: fuse,
                ..Options::default()
            },
        )
        .unwrap();
        s.enable_profiling(true);
        let out = s.predict(&inputs).unwrap();
        let fused = s.profile().iter().any(|p| p.0 == FUSED);
        (out, fused)
    };
    let (of, was_fused) = run(true);
    let (op, _) = run(false);
    assert!(
        was_fused,
        "the chain with a second reader of its probabilities fuses"
    );
    for (i, what) in [(0, "context"), (1, "probabilities")] {
        assert_eq!(of[i].1.dims(), op[i].1.dims(), "{what} shape");
        let want: Vec<f64> = f32s(&op[i].1).iter().map(|&v| v as f64).collect();
        assert_close(&f32s(&of[i].1), &want, 2e-3, what);
    }
}

/// BC1S shapes: layer_norm over the channel axis of `[2, C, 1, 1]` and softmax over axis 1
/// of `[2, C, 1]` (the rows are contiguous behind unit axes, so the kernels take them
/// without a permutation) against the formulas.
#[test]
fn norms_over_channels_of_bc1s_tensors_match_formulas() {
    let mut r = Rng(8);
    let c_n = 6;
    let xa: Vec<f32> = r.vec(2 * c_n).iter().map(|v| v * 3.0).collect();
    let (ga, ba) = (r.vec(c_n), r.vec(c_n));
    let mut b = Builder::new(Opset::Ios15);
    let x = b.input("x", tin(DType::F32, &[2, c_n, 1, 1]));
    let ln = layer_norm_over_axis_1(&mut b, &x, &ga, &ba);
    let x3 = b
        .op1(
            "reshape",
            "x3",
            vec![("x", x.into()), ("shape", ints(&[2, c_n as i32, 1]))],
        )
        .unwrap();
    let s = b
        .op1(
            "softmax",
            "s",
            vec![("x", x3.into()), ("axis", In::C(Value::i32_scalar(1)))],
        )
        .unwrap();
    let out = run(
        b,
        &[(ln, "ln"), (s, "s")],
        &[("x", host(&xa, &[2, c_n, 1, 1]))],
    );
    let mut want_ln = vec![];
    let mut want_s = vec![];
    for row in xa.chunks(c_n) {
        let v: Vec<f64> = row.iter().map(|&e| e as f64).collect();
        let m = v.iter().sum::<f64>() / c_n as f64;
        let var = v.iter().map(|e| (e - m) * (e - m)).sum::<f64>() / c_n as f64;
        for (i, e) in v.iter().enumerate() {
            want_ln.push((e - m) / (var + 1e-5).sqrt() * ga[i] as f64 + ba[i] as f64);
        }
        let z: f64 = v.iter().map(|e| e.exp()).sum();
        want_s.extend(v.iter().map(|e| e.exp() / z));
    }
    assert_close(&f32s(&out[0]), &want_ln, 1e-5, "layer_norm over channels");
    assert_close(&f32s(&out[1]), &want_s, 1e-6, "softmax over channels");
}

/// scatter of data [2, 3] with `indices` [i0, 0] (axis 0, mode update) at `opset`, with
/// `validate` as its `validate_indices` (iOS17) when given.
fn scatter_at(opset: Opset, i0: i32, validate: Option<bool>) -> anyhow::Result<Vec<f32>> {
    let mut b = Builder::new(opset);
    let data = b.input("data", tin(DType::F32, &[2, 3]));
    let updates = b.input("updates", tin(DType::F32, &[2, 3]));
    let mut ins = vec![
        ("data", In::V(data)),
        ("indices", ints(&[i0, 0])),
        ("updates", In::V(updates)),
        ("mode", c(Value::str("update"))),
    ];
    if let Some(v) = validate {
        ins.push(("validate_indices", c(Value::bool_scalar(v))));
    }
    let y = b.op1("scatter", "y", ins)?;
    let mut s = Session::from_model(model(b, &[(y, "y")]))?;
    let out = s.predict(&[
        ("data", host(&[1., 2., 3., 4., 5., 6.], &[2, 3])),
        ("updates", host(&[5., 6., 7., 8., 9., 10.], &[2, 3])),
    ])?;
    Ok(f32s(&out[0].1))
}

#[test]
fn scatter_indices_out_of_range_are_errors_unless_ios17_validation_is_off() {
    // In range: row 1 ← [5, 6, 7], then row 0 ← [8, 9, 10].
    assert_eq!(
        scatter_at(Opset::Ios17, 1, Some(true)).unwrap(),
        vec![8., 9., 10., 5., 6., 7.]
    );
    // Before iOS17 a negative index counts from the end; from iOS17 on it is out of range.
    assert_eq!(
        scatter_at(Opset::Ios15, -1, None).unwrap(),
        vec![8., 9., 10., 5., 6., 7.]
    );
    let e = format!(
        "{:#}",
        scatter_at(Opset::Ios17, -1, Some(true)).unwrap_err()
    );
    assert!(e.contains("index -1 is out of range"), "{e}");
    for (opset, validate) in [(Opset::Ios15, None), (Opset::Ios17, Some(true))] {
        let e = format!("{:#}", scatter_at(opset, 10, validate).unwrap_err());
        assert!(e.contains("index 10 out of range"), "{e}");
    }
    // validate_indices false (iOS17's default): Core ML leaves the result undefined; the
    // update at the bad index is dropped, the others applied.
    for (i0, validate) in [(10, Some(false)), (10, None), (-1, Some(false)), (-1, None)] {
        assert_eq!(
            scatter_at(Opset::Ios17, i0, validate).unwrap(),
            vec![8., 9., 10., 4., 5., 6.]
        );
    }
}

#[test]
fn strided_slices_and_gathers_read_strided_views_as_their_elements() {
    use candle_core::{Device, Tensor};
    use milkit::kernels::index::{strided_slice, take, Span};
    // x[i, j] = 10 i + j over [4, 6], read through its transpose (a strided view).
    let v: Vec<f32> = (0..24).map(|k| (10 * (k / 6) + k % 6) as f32).collect();
    let xt = Tensor::from_vec(v, (4, 6), &Device::Cpu)
        .unwrap()
        .t()
        .unwrap();
    assert!(!xt.is_contiguous());
    // Rows 1..4 of the transpose (narrowed), every second column from 0.
    let spans = [
        Span {
            start: 1,
            step: 1,
            len: 3,
        },
        Span {
            start: 0,
            step: 2,
            len: 2,
        },
    ];
    let y = strided_slice(&xt, &spans).unwrap();
    // xt[r, c] = x[c, r] = 10 c + r.
    let want: Vec<Vec<f32>> = (1..4).map(|r| vec![r as f32, (20 + r) as f32]).collect();
    assert_eq!(y.to_vec2::<f32>().unwrap(), want);
    let g = take(&xt, &[5, -6], &[2], 0).unwrap();
    assert_eq!(
        g.to_vec2::<f32>().unwrap(),
        vec![vec![5.0, 15.0, 25.0, 35.0], vec![0.0, 10.0, 20.0, 30.0]]
    );
}
