//! The encoder-sized GEMM (`kernels::gemm`) against float64 sums written here: every weight
//! form (fp16, f32, LUT4, int4), fp16 and f32 activations at a row stride wider than the
//! columns, fp16 and f32 outputs with and without a bias, tile edges in rows and columns,
//! depths that take several passes, and a 1x1 conv over a batch of two — through every
//! micro-kernel this CPU runs (portable, FMA, AVX-512); the GELU epilogue against the product
//! stored and then GELU, and GELU in f64.

use half::f16;
use milkit::kernels::fastmath::Gelu;
use milkit::kernels::gemm::{self, Act, Out};
use milkit::kernels::gemv::Isa;
use milkit::kernels::PackedWeight;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % 20001) as f32 / 10000.0 - 1.0
    }
    fn code(&mut self) -> u8 {
        ((self.next() + 1.0) * 7.99) as u8
    }
    fn f16s(&mut self, n: usize) -> Vec<f16> {
        (0..n).map(|_| f16::from_f32(self.next())).collect()
    }
}

/// `y[r, j] = bias[r] + Σ_c w(r, c)·x(c, j)` in f64, and `Σ |terms|` to judge f32 sums by.
fn reference(
    n: usize,
    k: usize,
    m: usize,
    w: &dyn Fn(usize, usize) -> f64,
    x: &dyn Fn(usize, usize) -> f64,
    bias: Option<&[f32]>,
) -> (Vec<f64>, Vec<f64>) {
    let (mut y, mut mag) = (vec![0f64; n * m], vec![0f64; n * m]);
    for r in 0..n {
        for j in 0..m {
            let b = bias.map_or(0.0, |b| b[r] as f64);
            let (mut s, mut a) = (b, b.abs());
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

/// f32 sums of k products in another order: 1e-5 of the magnitude sum; an fp16 output
/// also its one rounding (half an fp16 ulp: 2⁻¹¹ relative, 2⁻²⁵ among subnormals).
fn check(what: &str, got: &[f64], want: &(Vec<f64>, Vec<f64>), fp16: bool) {
    assert_eq!(got.len(), want.0.len(), "{what}: length");
    for (i, (g, (w, m))) in got.iter().zip(want.0.iter().zip(&want.1)).enumerate() {
        let mut tol = 1e-5 * m + 1e-6;
        if fp16 {
            tol += w.abs() * (2f64).powi(-11) + (2f64).powi(-25);
        }
        let err = (g - w).abs();
        assert!(
            err <= tol,
            "{what}: element {i}: {g} vs {w} (err {err:e}, tolerance {tol:e})"
        );
    }
}

/// The weight forms of one `[n, k]` matrix, each with its element function.
fn weights(n: usize, k: usize, rng: &mut Rng) -> Vec<(&'static str, PackedWeight, Vec<f64>)> {
    let mut out = vec![];
    let w16 = rng.f16s(n * k);
    let dense: Vec<f64> = w16.iter().map(|v| v.to_f64()).collect();
    out.push((
        "f16",
        PackedWeight::from_f16(&[n, k, 1, 1], w16.clone()).unwrap(),
        dense,
    ));
    let w32: Vec<f32> = (0..n * k).map(|_| rng.next()).collect();
    let dense: Vec<f64> = w32.iter().map(|&v| v as f64).collect();
    out.push(("f32", PackedWeight::from_f32(&[n, k], w32).unwrap(), dense));
    if k.is_multiple_of(2) {
        let lut: Vec<f32> = (0..16).map(|_| rng.next()).collect();
        let codes: Vec<u8> = (0..n * k).map(|_| rng.code()).collect();
        let dense = codes.iter().map(|&c| lut[c as usize] as f64).collect();
        out.push((
            "lut4",
            PackedWeight::lut4(&[n, k], &codes, lut).unwrap(),
            dense,
        ));
        let block = 2;
        let nb = n * k / block;
        let scale: Vec<f32> = (0..nb).map(|_| rng.next() * 0.1).collect();
        let zero: Vec<f32> = (0..nb).map(|_| rng.code() as f32).collect();
        let codes: Vec<u8> = (0..n * k).map(|_| rng.code()).collect();
        let dense = (0..n * k)
            .map(|i| {
                let b = i / block;
                scale[b] as f64 * (codes[i] as f64 - zero[b] as f64)
            })
            .collect();
        let p = PackedWeight::int4(&[n, k], &codes, scale, zero, block).unwrap();
        out.push(("int4", p, dense));
    }
    out
}

#[test]
fn gemm_matches_float64_for_every_weight_form_and_kernel() {
    let mut rng = Rng(5);
    // (n, k, m): a single element; tile edges in rows (13, 37) and columns (50, 97);
    // k past one pass (600, 1100: two and three passes); more rows than one task (100).
    for &(n, k, m) in &[
        (1, 1, 1),
        (13, 8, 50),
        (37, 600, 97),
        (100, 64, 48),
        (9, 1100, 17),
    ] {
        let ldx = m + 3;
        let x16 = rng.f16s(k * ldx);
        let x32: Vec<f32> = (0..k * ldx).map(|_| rng.next()).collect();
        let bias: Vec<f32> = (0..n).map(|_| rng.next()).collect();
        for (form, p, dense) in weights(n, k, &mut rng) {
            let wf = |r: usize, c: usize| dense[r * k + c];
            for (xname, act) in [("x f16", Act::F16(&x16)), ("x f32", Act::F32(&x32))] {
                let xf = |c: usize, j: usize| match act {
                    Act::F16(v) => v[c * ldx + j].to_f64(),
                    Act::F32(v) => v[c * ldx + j] as f64,
                };
                for b in [Some(bias.as_slice()), None] {
                    let want = reference(n, k, m, &wf, &xf, b);
                    for isa in Isa::supported() {
                        let what = format!(
                            "{form} [{n}×{k}]·[{k}×{m}] {xname} bias {} {isa:?}",
                            b.is_some()
                        );
                        let mut y16 = vec![f16::ZERO; n * m];
                        gemm::gemm(&p, act, ldx, m, b, Out::F16(&mut y16), isa).unwrap();
                        let got: Vec<f64> = y16.iter().map(|v| v.to_f64()).collect();
                        check(&format!("{what} → f16"), &got, &want, true);
                        let mut y32 = vec![0f32; n * m];
                        gemm::gemm(&p, act, ldx, m, b, Out::F32(&mut y32), isa).unwrap();
                        let got: Vec<f64> = y32.iter().map(|&v| v as f64).collect();
                        check(&format!("{what} → f32"), &got, &want, false);
                    }
                }
            }
        }
    }
}

/// With k = 0 the product is the bias alone; with no rows or columns, nothing.
#[test]
fn gemm_of_empty_depth_is_the_bias() {
    let p = PackedWeight::from_f32(&[3, 0], vec![]).unwrap();
    let bias = [1.5f32, -2.0, 0.25];
    for isa in Isa::supported() {
        let mut y = vec![9f32; 3 * 5];
        gemm::gemm(&p, Act::F32(&[]), 5, 5, Some(&bias), Out::F32(&mut y), isa).unwrap();
        for (i, v) in y.iter().enumerate() {
            assert_eq!(*v, bias[i / 5], "{isa:?} element {i}");
        }
    }
}

#[test]
fn gemm_rejects_operands_of_the_wrong_size() {
    let p = PackedWeight::from_f32(&[4, 6], vec![0.5; 24]).unwrap();
    let x = vec![1f32; 6 * 10];
    let mut y = vec![0f32; 4 * 10];
    let isa = Isa::best();
    let e = gemm::gemm(&p, Act::F32(&x[..50]), 10, 10, None, Out::F32(&mut y), isa);
    assert!(e.unwrap_err().to_string().contains("activations"));
    let e = gemm::gemm(&p, Act::F32(&x), 10, 10, None, Out::F32(&mut y[..39]), isa);
    assert!(e.unwrap_err().to_string().contains("output"));
    let e = gemm::gemm(
        &p,
        Act::F32(&x),
        10,
        10,
        Some(&[1.0; 3]),
        Out::F32(&mut y),
        isa,
    );
    assert!(e.unwrap_err().to_string().contains("bias"));
}

/// A BC1S conv `[2, k, 1, s]` (two batch items) with an fp16 weight and bias, fp16 out.
#[test]
fn conv1x1_runs_each_batch_item_on_the_gemm() {
    let mut rng = Rng(9);
    let (nb, n, k, s) = (2, 20, 70, 61);
    let w = rng.f16s(n * k);
    let p = PackedWeight::from_f16(&[n, k, 1, 1], w.clone()).unwrap();
    let x = rng.f16s(nb * k * s);
    let bias: Vec<f32> = (0..n).map(|_| f16::from_f32(rng.next()).to_f32()).collect();
    let xt = milkit::kernels::from_vec(x.clone(), &[nb, k, 1, s]).unwrap();
    for isa in Isa::supported() {
        let f16 = candle_core::DType::F16;
        let y = gemm::conv1x1(&xt, &p, Some(&bias), f16, isa, gemm::Inputs::F32).unwrap();
        assert_eq!(y.dims(), &[nb, n, 1, s]);
        let got: Vec<f64> = milkit::kernels::to_vec::<f16>(&y)
            .unwrap()
            .iter()
            .map(|v| v.to_f64())
            .collect();
        for b in 0..nb {
            let wf = |r: usize, c: usize| w[r * k + c].to_f64();
            let xf = |c: usize, j: usize| x[b * k * s + c * s + j].to_f64();
            let want = reference(n, k, s, &wf, &xf, Some(&bias));
            let part = &got[b * n * s..(b + 1) * n * s];
            check(&format!("conv batch {b} {isa:?}"), part, &want, true);
        }
    }
}

/// `cost::flops_per_call` (the encoder rate's numerator in `bench audio`): 2·k per output
/// element of a 1x1 conv, a 3-wide conv, a matmul and a transposed matmul, counted by hand.
#[test]
fn flops_per_call_counts_every_contraction() {
    use milkit::ir::{DType, Description, Model, Opset, Tensor as ITensor, Value, ValueType};
    use milkit::ops::{Builder, In};
    let (n, k, m) = (6usize, 5usize, 11usize);
    let mut b = Builder::new(Opset::Ios18);
    let x = b.input("x", ValueType::tensor(DType::F32, &[1, k, 1, m]));
    let w1 = ITensor::f32(&[n, k, 1, 1], &vec![0.5; n * k]);
    let c1 = b
        .op1(
            "conv",
            "c1",
            vec![("x", In::V(x)), ("weight", In::C(Value::Tensor(w1)))],
        )
        .unwrap();
    let w3 = ITensor::f32(&[n, n, 1, 3], &vec![0.5; n * n * 3]);
    let c3 = b
        .op1(
            "conv",
            "c3",
            vec![("x", In::V(c1)), ("weight", In::C(Value::Tensor(w3)))],
        )
        .unwrap();
    // c3: [1, n, 1, m - 2]; a [2, 3, 4] · [2, 4, 7] product and its transposed-x twin.
    let p = b.input("p", ValueType::tensor(DType::F32, &[2, 3, 4]));
    let q = b.input("q", ValueType::tensor(DType::F32, &[2, 4, 7]));
    let pt = b.input("pt", ValueType::tensor(DType::F32, &[2, 4, 3]));
    let mm = b
        .op1(
            "matmul",
            "mm",
            vec![("x", In::V(p)), ("y", In::V(q.clone()))],
        )
        .unwrap();
    let tr = In::C(Value::bool_scalar(true));
    let mt = b
        .op1(
            "matmul",
            "mt",
            vec![("x", In::V(pt)), ("y", In::V(q)), ("transpose_x", tr)],
        )
        .unwrap();
    let (inputs, block) = b.finish(&[(c3, "y"), (mm, "z"), (mt, "t")]).unwrap();
    let model = Model::single(Opset::Ios18, inputs, block, Description::default());
    let want = 2 * (n * m * k) + 2 * (n * (m - 2) * n * 3) + 2 * 2 * (2 * 3 * 7 * 4);
    let got = milkit::transcribe::cost::flops_per_call(&model).unwrap();
    assert_eq!(got, want as u64);
}

/// erf in f64 by its Maclaurin series (|x| ≤ 5: cancellation stays below 1e-9), ±1 beyond.
fn erf64(x: f64) -> f64 {
    if x.abs() > 5.0 {
        return x.signum();
    }
    let (mut term, mut sum, mut n) = (x, x, 0.0);
    while term.abs() > 1e-17 && n < 400.0 {
        n += 1.0;
        term *= -x * x / n;
        sum += term / (2.0 * n + 1.0);
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

/// coremltools' three GELU forms, in f64.
fn gelu64(g: Gelu, x: f64) -> f64 {
    match g {
        Gelu::Exact => 0.5 * x * (1.0 + erf64(x / 2f64.sqrt())),
        Gelu::Tanh => {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
        }
        Gelu::Sigmoid => x / (1.0 + (-1.702 * x).exp()),
    }
}

/// The GELU epilogue on every micro-kernel: the bits of the product stored, rounded, and
/// `Gelu::apply` run on it (what a separate `gelu` op computes), and within fp16 rounding
/// (f32 output: 1e-5) of GELU in f64 of the f64 product.
#[test]
fn gemm_with_a_gelu_epilogue_is_the_product_then_gelu_bit_for_bit() {
    let mut rng = Rng(11);
    let (n, k, m) = (21, 77, 59);
    let w = rng.f16s(n * k);
    let p = PackedWeight::from_f16(&[n, k, 1, 1], w.clone()).unwrap();
    let x: Vec<f16> = (0..k * m)
        .map(|_| f16::from_f32(rng.next() * 3.0))
        .collect();
    let bias: Vec<f32> = (0..n).map(|_| rng.next()).collect();
    let wf = |r: usize, c: usize| w[r * k + c].to_f64();
    let xf = |c: usize, j: usize| x[c * m + j].to_f64();
    let want = reference(n, k, m, &wf, &xf, Some(&bias));
    for g in [Gelu::Exact, Gelu::Tanh, Gelu::Sigmoid] {
        for isa in Isa::supported() {
            let what = format!("{g:?} {isa:?}");
            let (b, a) = (Some(bias.as_slice()), Act::F16(&x));
            let mut plain = vec![f16::ZERO; n * m];
            gemm::gemm(&p, a, m, m, b, Out::F16(&mut plain), isa).unwrap();
            let mut fused = vec![f16::ZERO; n * m];
            gemm::gemm_then(&p, a, m, m, b, Some(g), Out::F16(&mut fused), isa).unwrap();
            for (i, (f, y)) in fused.iter().zip(&plain).enumerate() {
                let then = f16::from_f32(g.apply(y.to_f32()));
                assert_eq!(f.to_bits(), then.to_bits(), "{what} f16 element {i}");
                // The product may round to a neighbouring fp16 (f32 sums), GELU's slope
                // is below 1.13, then one more rounding.
                let w = gelu64(g, want.0[i]);
                let tol = 1e-5 * want.1[i] + (w.abs() + want.0[i].abs()) * 1.2e-3 + 1e-6;
                assert!((f.to_f64() - w).abs() <= tol, "{what}: {f} vs {w}");
            }
            let mut plain = vec![0f32; n * m];
            gemm::gemm(&p, a, m, m, b, Out::F32(&mut plain), isa).unwrap();
            let mut fused = vec![0f32; n * m];
            gemm::gemm_then(&p, a, m, m, b, Some(g), Out::F32(&mut fused), isa).unwrap();
            for (i, (f, y)) in fused.iter().zip(&plain).enumerate() {
                assert_eq!(f.to_bits(), g.apply(*y).to_bits(), "{what} f32 element {i}");
                let w = gelu64(g, want.0[i]);
                let tol = 1.2e-5 * want.1[i] + 2e-6 * (1.0 + w.abs());
                assert!((*f as f64 - w).abs() <= tol, "{what}: {f} vs {w}");
            }
        }
    }
}
