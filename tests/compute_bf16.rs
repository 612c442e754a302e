//! `--compute bf16` (`runtime::precision::Compute::Bf16`, `kernels::gemm::gemm_bf16`): the
//! bf16 micro-kernel against float64 sums of the bf16-rounded operands written here, the
//! error that names AVX512-BF16 where the CPU lacks it (the detection injected as
//! "absent"), and tiny.en's BC1S encoder computed with bf16 products against the PyTorch
//! float32 reference (a PSNR floor, next to the fp16 package's own).

mod common;

use common::programs::{f32s, psnr, Checkpoint};
use half::{bf16, f16};
use milkit::kernels::gemm::{self, Act, Out};
use milkit::kernels::PackedWeight;
use milkit::runtime::precision::Compute;
use milkit::runtime::{io, Options, Session};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % 20001) as f32 / 10000.0 - 1.0
    }
}

/// `v` rounded to bfloat16 (nearest, ties to even), as a float64.
fn b(v: f32) -> f64 {
    bf16::from_f32(v).to_f64()
}

/// `y[r, j] = bias[r] + Σ_c w(r, c)·x(c, j)` in float64, and `Σ |terms|`.
fn sums(
    (n, k, m): (usize, usize, usize),
    w: &dyn Fn(usize, usize) -> f64,
    x: &dyn Fn(usize, usize) -> f64,
    bias: Option<&[f32]>,
) -> (Vec<f64>, Vec<f64>) {
    let (mut y, mut mag) = (vec![0f64; n * m], vec![0f64; n * m]);
    for r in 0..n {
        for j in 0..m {
            let b0 = bias.map_or(0.0, |b| f64::from(b[r]));
            let (mut s, mut a) = (b0, b0.abs());
            for c in 0..k {
                let p = w(r, c) * x(c, j);
                s += p;
                a += p.abs();
            }
            y[r * m + j] = s;
            mag[r * m + j] = a;
        }
    }
    (y, mag)
}

/// The tolerance of one element: products of bf16 values are exact in f32, so only the f32
/// sums' order is free — 1e-5 of the magnitude sum (k ≤ 1100 terms: k·2⁻²⁴ ≤ 6.6e-5 is
/// the worst case, random signs stay far below) plus 1e-6 — and an fp16 output's one
/// rounding (half an fp16 ulp: 2⁻¹¹ relative, 2⁻²⁵ among subnormals).
fn tolerance(want: f64, mag: f64, fp16: bool) -> f64 {
    let mut tol = 1e-5 * mag + 1e-6;
    if fp16 {
        tol += want.abs() * 2f64.powi(-11) + 2f64.powi(-25);
    }
    tol
}

#[test]
fn bf16_gemm_matches_float64_sums_of_the_bf16_rounded_operands() {
    if !gemm::bf16_cpu() {
        // The kernel cannot run here: it must say so, never fall back.
        let p = PackedWeight::from_f32(&[2, 2], vec![1.0; 4]).unwrap();
        let mut y = vec![0f32; 2];
        let e = gemm::gemm_bf16(&p, Act::F32(&[1.0, 1.0]), 1, 1, None, Out::F32(&mut y));
        assert!(format!("{:#}", e.unwrap_err()).contains("AVX512-BF16"));
        eprintln!("this CPU lacks AVX512-BF16: only the error is checked");
        return;
    }
    let mut rng = Rng(11);
    // (n, k, m): a single element; an odd depth (the last pair half zero); tile edges in
    // rows (13, 37) and columns (50, 97); depths past one pass of 512 pairs (1100: two
    // passes, 1025: two, odd); more rows than one task (100).
    for &(n, k, m) in &[
        (1, 1, 1),
        (13, 7, 50),
        (37, 600, 97),
        (100, 64, 48),
        (9, 1100, 17),
        (5, 1025, 33),
    ] {
        let ldx = m + 3;
        let x16: Vec<f16> = (0..k * ldx).map(|_| f16::from_f32(rng.next())).collect();
        let x32: Vec<f32> = (0..k * ldx).map(|_| rng.next()).collect();
        let bias: Vec<f32> = (0..n).map(|_| rng.next()).collect();
        let w16: Vec<f16> = (0..n * k).map(|_| f16::from_f32(rng.next())).collect();
        let w32: Vec<f32> = (0..n * k).map(|_| rng.next()).collect();
        let mut forms = vec![
            (
                "w f16",
                PackedWeight::from_f16(&[n, k, 1, 1], w16.clone()).unwrap(),
                w16.iter().map(|v| v.to_f32()).collect::<Vec<f32>>(),
            ),
            (
                "w f32",
                PackedWeight::from_f32(&[n, k], w32.clone()).unwrap(),
                w32.clone(),
            ),
        ];
        // 4-bit forms (even depths): a LUT4 weight with a palette per row (each row's own
        // group), its bf16 pairs read from the codes; an int4 one per row, decoded first.
        if k % 2 == 0 {
            let (lut, codes) = lut4_parts(&mut rng, n, k);
            let dense = (0..n * k).map(|i| lut[(i / k) * 16 + codes[i] as usize]);
            forms.push((
                "w lut4",
                PackedWeight::lut4(&[n, k, 1, 1], &codes, lut.clone()).unwrap(),
                dense.collect(),
            ));
            let scale: Vec<f32> = (0..n).map(|_| rng.next() * 0.1).collect();
            let zero = vec![8f32; n];
            let int4 = PackedWeight::int4(&[n, k], &codes, scale.clone(), zero, k).unwrap();
            let dense = (0..n * k).map(|i| scale[i / k] * (f32::from(codes[i]) - 8.0));
            forms.push(("w int4", int4, dense.collect()));
        }
        // The largest error against the unrounded operands, over the tolerance: bf16
        // rounding must show (else this would be testing the f32 kernel).
        let mut unrounded_excess = 0f64;
        for (form, p, wv) in &forms {
            for (xname, act) in [("x f16", Act::F16(&x16)), ("x f32", Act::F32(&x32))] {
                let xv = |c: usize, j: usize| match act {
                    Act::F16(v) => v[c * ldx + j].to_f32(),
                    Act::F32(v) => v[c * ldx + j],
                };
                for bias in [Some(bias.as_slice()), None] {
                    let want = sums(
                        (n, k, m),
                        &|r, c| b(wv[r * k + c]),
                        &|c, j| b(xv(c, j)),
                        bias,
                    );
                    let exact = sums(
                        (n, k, m),
                        &|r, c| f64::from(wv[r * k + c]),
                        &|c, j| f64::from(xv(c, j)),
                        bias,
                    );
                    let what =
                        format!("{form} [{n}×{k}]·[{k}×{m}] {xname} bias {}", bias.is_some());
                    let y32 = products_within_tolerance(&what, p, act, ldx, m, bias, &want);
                    for ((y, e), mag) in y32.iter().zip(&exact.0).zip(&exact.1) {
                        let off = (f64::from(*y) - e).abs();
                        unrounded_excess = unrounded_excess.max(off / tolerance(*e, *mag, false));
                    }
                }
            }
        }
        if k >= 7 {
            assert!(
                unrounded_excess > 10.0,
                "[{n}×{k}]·[{k}×{m}]: within {unrounded_excess:.2}× the f32 tolerance of the \
                 unrounded sums: no bf16 rounding seen"
            );
        }
    }
}

/// A product whose bf16 input panels pass 4 MiB (k = 2048: 1024 pairs × 1104 columns × 4
/// bytes = 4.5 MB) runs its tasks over groups of panels (here 10, 10 and 3; turbo's fc2
/// takes this path): every element still matches float64 sums of the bf16-rounded
/// operands, within [`tolerance`] (random signs: the f32 sums' error grows about as √k, far
/// below 1e-5 of the magnitude sum at k = 2048), for fp16 and LUT4 weights, an fp16 and an
/// f32 output, and a last panel of 4 columns (m = 1060).
#[test]
fn bf16_gemm_over_groups_of_panels_matches_float64_sums() {
    if !gemm::bf16_cpu() {
        eprintln!("this CPU lacks AVX512-BF16: checked by the test above");
        return;
    }
    let mut rng = Rng(23);
    let (n, k, m) = (19, 2048, 1060);
    let x16: Vec<f16> = (0..k * m).map(|_| f16::from_f32(rng.next())).collect();
    let bias: Vec<f32> = (0..n).map(|_| rng.next()).collect();
    let w16: Vec<f16> = (0..n * k).map(|_| f16::from_f32(rng.next())).collect();
    let (lut, codes) = lut4_parts(&mut rng, n, k);
    let forms = [
        (
            "w f16",
            PackedWeight::from_f16(&[n, k, 1, 1], w16.clone()).unwrap(),
            w16.iter().map(|v| v.to_f32()).collect::<Vec<f32>>(),
        ),
        (
            "w lut4",
            PackedWeight::lut4(&[n, k, 1, 1], &codes, lut.clone()).unwrap(),
            (0..n * k)
                .map(|i| lut[(i / k) * 16 + codes[i] as usize])
                .collect(),
        ),
    ];
    for (form, p, wv) in &forms {
        let want = sums(
            (n, k, m),
            &|r, c| b(wv[r * k + c]),
            &|c, j| b(x16[c * m + j].to_f32()),
            Some(&bias),
        );
        let what = format!("{form} [{n}×{k}]·[{k}×{m}]");
        products_within_tolerance(&what, p, Act::F16(&x16), m, m, Some(&bias), &want);
    }
}

/// `p`'s product with `act` (`ldx` columns a row, `m` used) into fp16 and into f32, every
/// element of both within [`tolerance`] of `want` (float64 sums of the bf16-rounded
/// operands, and their magnitudes); the f32 output, for further checks.
fn products_within_tolerance(
    what: &str,
    p: &PackedWeight,
    act: Act,
    ldx: usize,
    m: usize,
    bias: Option<&[f32]>,
    want: &(Vec<f64>, Vec<f64>),
) -> Vec<f32> {
    let len = want.0.len();
    let mut y16 = vec![f16::ZERO; len];
    gemm::gemm_bf16(p, act, ldx, m, bias, Out::F16(&mut y16)).unwrap();
    let mut y32 = vec![0f32; len];
    gemm::gemm_bf16(p, act, ldx, m, bias, Out::F32(&mut y32)).unwrap();
    for i in 0..len {
        let (w, mag) = (want.0[i], want.1[i]);
        for (out, got, fp16) in [
            ("f16", y16[i].to_f64(), true),
            ("f32", f64::from(y32[i]), false),
        ] {
            let (err, tol) = ((got - w).abs(), tolerance(w, mag, fp16));
            assert!(
                err <= tol,
                "{what} → {out}: element {i} (row {}, column {}): {got} vs {w} (err {err:e}, \
                 tolerance {tol:e})",
                i / m,
                i % m
            );
        }
    }
    y32
}

/// A palette of 16 fp16 values per row of `n` and `n·k` random codes.
fn lut4_parts(rng: &mut Rng, n: usize, k: usize) -> (Vec<f32>, Vec<u8>) {
    let lut = (0..n * 16)
        .map(|_| f16::from_f32(rng.next()).to_f32())
        .collect();
    let codes = (0..n * k)
        .map(|_| ((rng.next() + 1.0) * 8.0) as u8 % 16)
        .collect();
    (lut, codes)
}

/// `gemm::w_rows_bf16` (a weight's rows as bf16 pairs, straight from the packed form where
/// the CPU has AVX512-BF16) equals, bit for bit, the pairs of the rows decoded to f32 and
/// rounded by the `half` crate (nearest, ties to even): fp16 and f32 weights, a LUT4 one
/// with a palette per group of 3 rows, row lengths with and without a 32-value tail, and
/// row ranges that start inside a group.
#[test]
fn bf16_weight_rows_equal_the_rounded_decoded_rows() {
    if !gemm::bf16_cpu() {
        eprintln!("this CPU lacks AVX512-BF16: the packers are not reached here");
        return;
    }
    let mut rng = Rng(29);
    for &(n, k) in &[(6usize, 2usize), (9, 64), (12, 70), (6, 1282)] {
        let (lut16, codes) = lut4_parts(&mut rng, n, k);
        // One palette per group of 3 rows: the first n/3 palettes.
        let lut = lut16[..n / 3 * 16].to_vec();
        let w16: Vec<f16> = (0..n * k).map(|_| f16::from_f32(rng.next())).collect();
        let w32: Vec<f32> = (0..n * k).map(|_| rng.next() * 1e3).collect();
        let forms = [
            ("f16", PackedWeight::from_f16(&[n, k], w16).unwrap()),
            ("f32", PackedWeight::from_f32(&[n, k], w32).unwrap()),
            ("lut4", PackedWeight::lut4(&[n, k], &codes, lut).unwrap()),
        ];
        let k2 = k.div_ceil(2);
        for (form, p) in &forms {
            for (r0, rows) in [(0, n), (1, n - 1), (4, 2)] {
                let mut got = vec![0u32; rows * k2];
                gemm::w_rows_bf16(p, r0, rows, &mut got);
                let mut dense = vec![0f32; rows * k];
                p.rows_f32(r0, &mut dense);
                let bits = |c: usize, r: usize| match c < k {
                    true => u32::from(bf16::from_f32(dense[r * k + c]).to_bits()),
                    false => 0,
                };
                for (i, &word) in got.iter().enumerate() {
                    let (r, c2) = (i / k2, i % k2);
                    let want = bits(2 * c2, r) | bits(2 * c2 + 1, r) << 16;
                    assert_eq!(
                        word, want,
                        "{form} [{n}×{k}] rows {r0}+{rows}: row {r} pair {c2}"
                    );
                }
            }
        }
    }
}

/// `conv` of x fp16 `[1, k, 1, m]` with a constant fp16 weight `[n, k, 1, 1]`.
fn conv_model(n: usize, k: usize, m: usize) -> milkit::ir::Model {
    use milkit::ir::{DType, Description, Model, Opset, Tensor as ITensor, Value, ValueType};
    use milkit::ops::{Builder, In};
    let mut b = Builder::new(Opset::Ios18);
    let x = b.input("x", ValueType::tensor(DType::F16, &[1, k, 1, m]));
    let w: Vec<f16> = (0..n * k).map(|i| f16::from_f32(i as f32 / 64.0)).collect();
    let y = b
        .op1(
            "conv",
            "proj",
            vec![
                ("x", In::V(x)),
                (
                    "weight",
                    In::C(Value::Tensor(ITensor::f16(&[n, k, 1, 1], &w))),
                ),
            ],
        )
        .unwrap();
    let (inputs, block) = b.finish(&[(y, "y")]).unwrap();
    Model::single(Opset::Ios18, inputs, block, Description::default())
}

/// `conv` of x fp16 `[1, c, 1, w]` with a constant fp16 weight `[o, c, 1, 3]` and bias,
/// stride `stride` along the width, one column of zero padding each side (a Whisper
/// encoder's stem conv, small).
fn stem_model(
    (o, c, w): (usize, usize, usize),
    stride: i32,
    weight: &[f16],
    bias: &[f16],
) -> milkit::ir::Model {
    use milkit::ir::{DType, Description, Model, Opset, Tensor as ITensor, Value, ValueType};
    use milkit::ops::{Builder, In};
    let mut b = Builder::new(Opset::Ios18);
    let x = b.input("x", ValueType::tensor(DType::F16, &[1, c, 1, w]));
    let y = b
        .op1(
            "conv",
            "stem",
            vec![
                ("x", In::V(x)),
                (
                    "weight",
                    In::C(Value::Tensor(ITensor::f16(&[o, c, 1, 3], weight))),
                ),
                ("bias", In::C(Value::Tensor(ITensor::f16(&[o], bias)))),
                ("strides", In::C(Value::i32s(&[1, stride]))),
                ("pad_type", In::C(Value::str("custom"))),
                ("pad", In::C(Value::i32s(&[0, 0, 1, 1]))),
            ],
        )
        .unwrap();
    let (inputs, block) = b.finish(&[(y, "y")]).unwrap();
    Model::single(Opset::Ios18, inputs, block, Description::default())
}

/// The stem's 3-wide convs under `--compute bf16` (im2col columns through the bf16 GEMM):
/// float64 sums of the bf16-rounded weight and inputs plus the bias, rounded once to fp16,
/// within [`tolerance`]; padding and stride as the op says; the package precision's conv
/// is exact in its products (f32 sums of fp16 values) and must stay so.
#[test]
fn bf16_stem_conv_matches_float64_sums_of_the_bf16_rounded_operands() {
    if !gemm::bf16_cpu() {
        return; // the session refuses to load: checked by the test below
    }
    let mut rng = Rng(29);
    // 70 input channels (k = 210: a pair count of 105, odd), 13 output channels (a partial
    // tile), 101 frames (stride 1: 101 outputs, stride 2: 51; partial panels).
    let (o, c, w) = (13, 70, 101);
    let weight: Vec<f16> = (0..o * c * 3).map(|_| f16::from_f32(rng.next())).collect();
    let bias: Vec<f16> = (0..o).map(|_| f16::from_f32(rng.next())).collect();
    let x: Vec<f16> = (0..c * w).map(|_| f16::from_f32(rng.next())).collect();
    let xt =
        candle_core::Tensor::from_vec(x.clone(), (1, c, 1, w), &candle_core::Device::Cpu).unwrap();
    for stride in [1usize, 2] {
        let wo = (w + 2 - 3) / stride + 1;
        for compute in [Compute::Bf16, Compute::Package] {
            let round = |v: f16| match compute {
                Compute::Bf16 => b(v.to_f32()),
                _ => v.to_f64(),
            };
            let bias32: Vec<f32> = bias.iter().map(|v| v.to_f32()).collect();
            let conv = |round: &dyn Fn(f16) -> f64| {
                sums(
                    (o, c * 3, wo),
                    &|r, kk| round(weight[r * c * 3 + kk]),
                    &|kk, j| {
                        let (ch, kj) = (kk / 3, kk % 3);
                        match (j * stride + kj).checked_sub(1) {
                            Some(ix) if ix < w => round(x[ch * w + ix]),
                            _ => 0.0,
                        }
                    },
                    Some(&bias32),
                )
            };
            let (want, exact) = (conv(&round), conv(&|v: f16| v.to_f64()));
            let opts = Options {
                compute,
                ..Default::default()
            };
            let model = stem_model((o, c, w), stride as i32, &weight, &bias);
            let mut s = Session::from_model_with(model, &opts).unwrap();
            let out = s.predict(&[("x", xt.clone())]).unwrap();
            let y = &out[0].1;
            assert_eq!(y.dims(), &[1, o, 1, wo], "stride {stride}");
            let got = f32s(y);
            let mut excess = 0f64;
            for (i, &g) in got.iter().enumerate() {
                let (wv, mag) = (want.0[i], want.1[i]);
                let tol = tolerance(wv, mag, true);
                assert!(
                    (f64::from(g) - wv).abs() <= tol,
                    "{compute:?} stride {stride}: element {i}: {g} vs {wv} (tolerance {tol:e})"
                );
                excess = excess.max((f64::from(g) - exact.0[i]).abs() / tol);
            }
            // bf16 rounding must show against the unrounded operands (else this would be
            // testing the f32 path); the package's own conv stays within its tolerance.
            match compute {
                Compute::Bf16 => assert!(excess > 10.0, "stride {stride}: {excess:.2}"),
                _ => assert!(excess <= 1.0, "stride {stride}: {excess:.2}"),
            }
        }
    }
}

#[test]
fn bf16_compute_names_avx512_bf16_where_the_cpu_lacks_it() {
    // Detection injected as absent: the error names the missing instructions.
    let e = Compute::Bf16.require(false).unwrap_err();
    let msg = format!("{e:#}");
    assert!(msg.contains("--compute bf16"), "{msg}");
    assert!(msg.contains("AVX512-BF16"), "{msg}");
    assert!(msg.contains("avx512_bf16"), "{msg}");
    assert!(Compute::Bf16.require(true).is_ok());
    // The other precisions need nothing of the kind.
    for c in [Compute::Package, Compute::Fp32] {
        assert!(c.require(false).is_ok(), "{c:?}");
    }
    assert!(format!("{:#}", gemm::require_bf16(false).unwrap_err()).contains("AVX512-BF16"));
    // On this machine a session asks the real detection: it loads exactly where the CPU
    // has the feature, and otherwise refuses with the same message.
    let model = conv_model(4, 8, 60);
    let opts = Options {
        compute: Compute::Bf16,
        ..Default::default()
    };
    match Session::from_model_with(model, &opts) {
        Ok(_) => assert!(gemm::bf16_cpu()),
        Err(e) => {
            assert!(!gemm::bf16_cpu());
            assert!(format!("{e:#}").contains("AVX512-BF16"), "{e:#}");
        }
    }
}

const FLOOR_DB: f64 = 60.3;

/// tiny.en's BC1S encoder (WhisperKit ABI: fp16 data, every projection a 1x1 conv on the
/// packed fp16 weight) on jfk.wav's features, against PyTorch float32's encoder output:
/// the package's own precision and bf16 products (the 1x1 convs, the two 3-wide stem
/// convs and the self-attention's two products). Measured here (AMD EPYC Zen 4): 79.2 dB
/// fp16, 66.4 dB bf16 (68.3 dB with the 1x1 convs alone, 67.0 dB with attention too).
/// The floor is 60.3 dB: the measurement less 6 dB of margin
/// (another CPU's summation order may move it a little; a wrong rounding or pairing would
/// cost tens of dB).
#[test]
fn bf16_encoder_stays_above_its_psnr_floor_against_pytorch_float32() {
    use milkit::ir::Opset;
    use milkit::whisper::encoder::{build_encoder, EncoderAbi, EncoderDims};
    let Some(fx) = common::fixtures() else { return };
    if !gemm::bf16_cpu() {
        eprintln!("this CPU lacks AVX512-BF16: --compute bf16 cannot run here");
        return;
    }
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
    let feats = feats.reshape((1, 80, 1, 3000)).unwrap();
    let want = f32s(&io::read_safetensors(&refs, "encoder_output").unwrap());
    let mut db = vec![];
    for compute in [Compute::Package, Compute::Bf16] {
        let m = build_encoder(
            &dims,
            &ck,
            EncoderAbi::WhisperKit,
            Opset::Ios18,
            &mut |_, _| {},
        )
        .unwrap();
        let opts = Options {
            compute,
            ..Default::default()
        };
        let mut s = Session::from_model_with(m, &opts).unwrap();
        let out = s
            .predict(&[("melspectrogram_features", feats.clone())])
            .unwrap();
        // [1, d, 1, S] → [1, S, d], as the reference lies.
        let got = out[0].1.squeeze(2).unwrap().transpose(1, 2).unwrap();
        assert_eq!(got.dims(), &[1, 1500, 384]);
        db.push(psnr(&want, &f32s(&got)));
    }
    println!(
        "tiny.en encoder vs PyTorch float32: {:.2} dB at package precision (fp16), {:.2} dB \
         with bf16 products",
        db[0], db[1]
    );
    assert!(db[1] >= FLOOR_DB, "bf16: {:.2} dB < {FLOOR_DB}", db[1]);
    // bf16 inputs carry 8 bits of mantissa against fp16's 11: never closer than fp16.
    assert!(db[1] < db[0], "{db:?}");
}

fn milkit(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_milkit"))
        .args(args)
        .output()
        .unwrap()
}

/// `milkit bench gemm ARGS --runs 1 --compute bf16 --json`'s one row; `None` where the CPU
/// lacks AVX512-BF16, after checking that the bench refused, naming the feature.
fn bf16_bench_row(args: &[&str]) -> Option<serde_json::Value> {
    let mut all = vec!["bench", "gemm"];
    all.extend_from_slice(args);
    all.extend(["--runs", "1", "--compute", "bf16", "--json"]);
    let out = milkit(&all);
    if !gemm::bf16_cpu() {
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("AVX512-BF16"));
        return None;
    }
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v.as_array().unwrap();
    assert_eq!(rows.len(), 1, "{v}");
    Some(rows[0].clone())
}

/// `bench gemm --compute bf16`: the bf16 conv timed next to the fp16 conv and the plain
/// GEMM, its rate and ratio derived from its own times, its output within bf16's reach of
/// the fp16 conv's; where the CPU lacks AVX512-BF16, the error naming it.
#[test]
fn gemm_bench_times_bf16_next_to_the_fp16_conv_and_the_plain_gemm() {
    let Some(r) = bf16_bench_row(&["--only", "attention"]) else {
        return;
    };
    let (r, b) = (&r, &r["bf16"]);
    let f = |o: &serde_json::Value, k: &str| o[k].as_f64().unwrap();
    assert!(
        f(b, "ms_median") > 0.0 && f(r, "reference_ms_median") > 0.0,
        "{r}"
    );
    let ratio = f(b, "ms_median") / f(r, "reference_ms_median");
    assert!((f(b, "ratio") - ratio).abs() <= 1e-9 * ratio, "{r}");
    let rate = f(r, "gflop") / (f(b, "ms_median") / 1e3);
    assert!((f(b, "gflops") - rate).abs() <= 1e-9 * rate, "{r}");
    // bf16 inputs (8-bit mantissas) against fp16 (11): well above 40 dB on this random
    // data (68 dB measured), far from the fp16 conv's own rounding (which would be ∞).
    let db = f(b, "psnr_db");
    assert!(db > 40.0 && db < 100.0, "{db}");
    // Without the option the rows carry no bf16 column.
    let plain = milkit(&[
        "bench",
        "gemm",
        "--only",
        "attention",
        "--runs",
        "1",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&plain.stdout).unwrap();
    assert!(v[0].get("bf16").is_none(), "{v}");
}

/// `bench gemm --attention --compute bf16`: the panels on bf16 products timed next to the
/// f32 panels, their rate and ratio derived from their own times, their output within
/// bf16's reach of the f32 panels'.
#[test]
fn attention_bench_times_the_bf16_panels_next_to_the_f32_panels() {
    let Some(r) = bf16_bench_row(&["--attention", "--only", "tiny"]) else {
        return;
    };
    let (r, b) = (&r, &r["bf16"]);
    let three = |o: &serde_json::Value, k: &str| -> Vec<f64> {
        o[k].as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect()
    };
    let (ms, panels) = (three(b, "ms"), three(r, "panels_ms"));
    assert!(ms[0] > 0.0 && ms[0] <= ms[1] && ms[1] <= ms[2], "{r}");
    let rate = r["gflop"].as_f64().unwrap() / (ms[1] / 1e3);
    assert!(
        (b["gflops"].as_f64().unwrap() - rate).abs() <= 1e-9 * rate,
        "{r}"
    );
    // One round: its ratio is the two times'.
    let ratio = ms[1] / panels[1];
    assert!((three(b, "ratio")[1] - ratio).abs() <= 1e-9 * ratio, "{r}");
    // bf16 operands (8-bit mantissas) against the f32 panels' fp16 data: well above 40 dB
    // (65 dB measured), never the same bits (which would be ∞).
    let db = b["psnr_db"].as_f64().unwrap();
    assert!(db > 40.0 && db < 100.0, "{db}");
}

/// Every command with a compute option offers bf16 and says what it is: a faster
/// evaluation mode, not what a device computes.
#[test]
fn help_calls_bf16_a_faster_evaluation_mode() {
    for cmd in [
        &["transcribe", "--help"][..],
        &["run", "--help"],
        &["eval", "--help"],
        &["bench", "audio", "--help"],
        &["bench", "gemm", "--help"],
    ] {
        let out = milkit(cmd);
        let text = String::from_utf8_lossy(&out.stdout).replace('\n', " ");
        let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(text.contains("bf16"), "{cmd:?}: {text}");
        assert!(text.contains("faster evaluation mode"), "{cmd:?}: {text}");
        assert!(
            text.contains("not what a device computes"),
            "{cmd:?}: {text}"
        );
    }
}
