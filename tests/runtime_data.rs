//! Per-op tests of the interpreter, data: compressed-weight decoding (iOS16 and iOS18 LUTs,
//! blockwise and affine quantization) against scalar loops, and slicing / gather / pad /
//! shape ops against index loops.

mod common;

use common::programs::*;
use common::rng::Rng;
use half::f16;
use milkit::ir::{DType, Opset, Tensor as ITensor, Value, ValueType};
use milkit::ops::{Builder, In};

fn u_tensor(
    dtype: DType,
    bdt: milkit::package::blob::BlobDType,
    shape: &[usize],
    codes: &[u8],
) -> Value {
    let packed = milkit::package::blob::pack_sub_byte(bdt, codes).unwrap();
    Value::Tensor(ITensor::new(dtype, shape.to_vec(), milkit::ir::Bytes::from_vec(packed)).unwrap())
}

#[test]
fn ios18_lut_and_blockwise_decode_match_scalar_loops() {
    use milkit::package::blob::{pack_i4, BlobDType};
    let mut r = Rng(7);
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

/// A LUT4 weight whose codes and palettes are inline and which only feeds a 1x1 conv is
/// packed at load straight from its stored nibbles (`runtime::pack::fold_lut4_inline`):
/// the conv's output against float64 sums of the decoded weight times the input, with one
/// palette, one per 4 rows and one per row. Tolerance: the fp16 output's
/// one rounding (2⁻¹¹ relative) and f32 sums over 40 terms, within 1e-3 · (1 + |y|).
#[test]
fn inline_lut4_conv_weight_runs_from_its_stored_nibbles() {
    use milkit::package::blob::BlobDType;
    let mut r = Rng(23);
    let (n, k, m) = (16, 40, 50);
    for (groups, pal) in [(1usize, 16usize), (4, 16), (16, 16)] {
        let codes: Vec<u8> = (0..n * k)
            .map(|_| ((r.next() + 1.0) * 8.0) as u8 % pal as u8)
            .collect();
        let lut: Vec<f32> = r
            .vec(groups * pal)
            .iter()
            .map(|v| f16::from_f32(*v).to_f32())
            .collect();
        let x: Vec<f32> = r
            .vec(k * m)
            .iter()
            .map(|v| f16::from_f32(*v).to_f32())
            .collect();
        let mut b = Builder::new(Opset::Ios18);
        let xin = b.input("x", tin(DType::F16, &[1, k, 1, m]));
        let w = b
            .op1(
                "constexpr_lut_to_dense",
                "w",
                vec![
                    (
                        "indices",
                        In::Inline(u_tensor(DType::U4, BlobDType::U4, &[n, k, 1, 1], &codes)),
                    ),
                    (
                        "lut",
                        In::Inline(f16_tensor(&[groups, 1, 1, 1, pal, 1], &lut)),
                    ),
                ],
            )
            .unwrap();
        let y = b
            .op1(
                "conv",
                "y",
                vec![("x", xin.into()), ("weight", In::from(&w))],
            )
            .unwrap();
        let out = run(b, &[(y, "y")], &[("x", host(&x, &[1, k, 1, m]))]);
        let rpg = n / groups;
        let want: Vec<f64> = (0..n * m)
            .map(|i| {
                let (o, j) = (i / m, i % m);
                (0..k)
                    .map(|c| {
                        let wv = lut[(o / rpg) * pal + codes[o * k + c] as usize];
                        f64::from(wv) * f64::from(x[c * m + j])
                    })
                    .sum()
            })
            .collect();
        assert_eq!(out[0].dims(), &[1, n, 1, m]);
        let what = format!("{groups} palettes of {pal}");
        assert_close(&f32s(&out[0]), &want, 1e-3, &what);
    }
}

#[test]
fn ios16_lut_and_affine_decode_match_scalar_loops() {
    use milkit::package::blob::BlobDType;
    let mut r = Rng(8);
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

fn scalar(v: f32) -> milkit::runtime::Tensor {
    milkit::runtime::Tensor::from_vec(vec![v], &[] as &[usize], &candle_core::Device::Cpu).unwrap()
}

#[test]
fn concat_of_0d_values_makes_a_vector_and_other_axes_are_errors() {
    // coremltools' concat counts each 0-d value as one element of a vector (axis 0 or -1).
    for (axis, interleave) in [(0, false), (-1, false), (0, true)] {
        let mut b = Builder::new(Opset::Ios17);
        let a = b.input("a", tin(DType::F32, &[]));
        let bb = b.input("b", tin(DType::F32, &[]));
        let cc = b
            .op1(
                "concat",
                "cc",
                vec![
                    ("values", In::Vs(vec![a.clone(), bb.clone(), a])),
                    ("axis", In::C(Value::i32_scalar(axis))),
                    ("interleave", c(Value::bool_scalar(interleave))),
                ],
            )
            .unwrap();
        assert_eq!(b.ty(&cc).unwrap(), &tin(DType::F32, &[3]));
        let o = run(b, &[(cc, "cc")], &[("a", scalar(1.5)), ("b", scalar(-2.0))]);
        assert_eq!(o[0].dims(), &[3]);
        assert_close(&f32s(&o[0]), &[1.5, -2.0, 1.5], 0.0, "concat of 0-d values");
    }
    let mut b = Builder::new(Opset::Ios17);
    let a = b.input("a", tin(DType::F32, &[]));
    let bad = b.op1(
        "concat",
        "cc",
        vec![
            ("values", In::Vs(vec![a.clone(), a])),
            ("axis", In::C(Value::i32_scalar(1))),
        ],
    );
    let e = format!("{:#}", bad.unwrap_err());
    assert!(e.contains("0-d values on axis 1"), "{e}");
    let mut b = Builder::new(Opset::Ios17);
    let a = b.input("a", tin(DType::F32, &[]));
    let v = b.input("v", tin(DType::F32, &[2]));
    let bad = b.op1(
        "concat",
        "cc",
        vec![
            ("values", In::Vs(vec![a, v])),
            ("axis", In::C(Value::i32_scalar(0))),
        ],
    );
    assert!(bad.is_err(), "a 0-d value with a vector must be refused");
}

#[test]
fn tile_with_a_run_time_reps_has_its_shape_resolved_when_it_runs() {
    let mut b = Builder::new(Opset::Ios15);
    let x = b.input("x", tin(DType::F32, &[2, 3]));
    let reps = b.input("reps", tin(DType::I32, &[2]));
    let t = b
        .op1(
            "tile",
            "t",
            vec![("x", In::from(&x)), ("reps", In::from(&reps))],
        )
        .unwrap();
    assert_eq!(
        b.ty(&t).unwrap(),
        &ValueType::Tensor(milkit::ir::TensorType {
            dtype: DType::F32,
            shape: vec![milkit::ir::Dim::Unknown; 2],
        })
    );
    let xa: Vec<f32> = (1..=6).map(|v| v as f32).collect();
    let mut s = milkit::runtime::Session::from_model(model(b, &[(t, "t")])).unwrap();
    for (r, dims) in [([1, 1], [2, 3]), ([2, 1], [4, 3]), ([2, 3], [4, 9])] {
        let reps =
            milkit::runtime::Tensor::from_vec(r.to_vec(), &[2], &candle_core::Device::Cpu).unwrap();
        let o = s
            .predict(&[("x", host(&xa, &[2, 3])), ("reps", reps)])
            .unwrap();
        let o = &o[0].1;
        assert_eq!(o.dims(), &dims);
        let xr = &xa;
        let want: Vec<f64> = (0..dims[0])
            .flat_map(|i| (0..dims[1]).map(move |j| xr[(i % 2) * 3 + j % 3] as f64))
            .collect();
        assert_close(&f32s(o), &want, 0.0, &format!("tile by {r:?}"));
    }
    let reps =
        milkit::runtime::Tensor::from_vec(vec![2i32, -1], &[2], &candle_core::Device::Cpu).unwrap();
    let e = s
        .predict(&[("x", host(&xa, &[2, 3])), ("reps", reps)])
        .unwrap_err();
    assert!(format!("{e:#}").contains("negative tile count"), "{e:#}");
}
