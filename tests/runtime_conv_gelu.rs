//! `conv → gelu` fused into one step (`runtime::conv_fusion`): an encoder MLP's fc1 with
//! odd sizes, fp16 (the conv's result rounded before the GELU) and f32, in each GELU mode,
//! must equal op-by-op evaluation bit for bit, on the AVX-512 GEMM (GELU in its store) and
//! on the general path that the runtime takes without AVX-512; a conv with a second reader
//! is left unfused.

mod common;

use common::programs::*;
use common::rng::Rng;
use milkit::ir::{DType, Tensor as ITensor, Value};
use milkit::kernels::gemv::Isa;
use milkit::ops::{Builder, In};
use milkit::runtime::{conv_fusion, Options, Session};

const K: usize = 37;
const N: usize = 45;
const S: usize = 113;

fn build(dt: DType, mode: &str, extra_reader: bool, r: &mut Rng) -> milkit::ir::Model {
    let mut b = Builder::new(milkit::ir::Opset::Ios17);
    let x = b.input("x", tin(dt, &[1, K, 1, S]));
    let w: Vec<f32> = r.vec(N * K).iter().map(|v| v * 0.6).collect();
    let bias = r.vec(N);
    let (w, bias) = match dt {
        DType::F16 => (f16_tensor(&[N, K, 1, 1], &w), f16_tensor(&[N], &bias)),
        _ => (
            Value::Tensor(ITensor::f32(&[N, K, 1, 1], &w)),
            Value::Tensor(ITensor::f32(&[N], &bias)),
        ),
    };
    let y = b
        .op1(
            "conv",
            "fc1",
            vec![("x", In::from(&x)), ("weight", c(w)), ("bias", c(bias))],
        )
        .unwrap();
    let g = b.gelu("act", &y, mode).unwrap();
    let mut outs = vec![(g, "act")];
    if extra_reader {
        let pre = b.op1("identity", "pre", vec![("x", In::from(&y))]).unwrap();
        outs.push((pre, "pre"));
    }
    model(b, &outs)
}

/// The outputs' bits, and whether the fused step ran.
fn run(dt: DType, mode: &str, extra: bool, fuse: bool, seed: u64) -> (Vec<Vec<u32>>, bool) {
    let mut r = Rng(seed);
    let opts = Options {
        fuse_conv_gelu: fuse,
        ..Options::default()
    };
    let mut s = Session::from_model_with(build(dt, mode, extra, &mut r), &opts).unwrap();
    s.enable_profiling(true);
    let cdt = if dt == DType::F16 {
        candle_core::DType::F16
    } else {
        candle_core::DType::F32
    };
    // Values up to ±4 before the GELU: its curved part and both tails.
    let x: Vec<f32> = r.vec(K * S).iter().map(|v| v * 2.0).collect();
    let x = host(&x, &[1, K, 1, S]).to_dtype(cdt).unwrap();
    let out = s.predict(&[("x", x)]).unwrap();
    let bits = out
        .iter()
        .map(|(_, v)| f32s(v).iter().map(|x| x.to_bits()).collect())
        .collect();
    let fused = s.profile().iter().any(|p| p.0 == conv_fusion::FUSED);
    (bits, fused)
}

/// One test, since the kernel cap is process-wide.
#[test]
fn fused_conv_gelu_matches_op_by_op_bit_for_bit_on_every_path() {
    for cap in [None, Some(Isa::Avx2), Some(Isa::Portable)] {
        Isa::set_cap(cap);
        for dt in [DType::F16, DType::F32] {
            for mode in ["EXACT", "TANH_APPROXIMATION", "SIGMOID_APPROXIMATION"] {
                for seed in [1, 2] {
                    let what = format!("{cap:?} {dt:?} {mode} seed {seed}");
                    let (got, fused) = run(dt, mode, false, true, seed);
                    let (want, plain) = run(dt, mode, false, false, seed);
                    assert!(fused && !plain, "{what}: fused only when asked");
                    assert_eq!(got, want, "{what}");
                    assert!(got[0].iter().any(|&b| b != 0), "{what}: all zero");
                }
            }
        }
        let (_, fused) = run(DType::F16, "EXACT", true, true, 3);
        assert!(!fused, "a conv result with a second reader stays unfused");
    }
    Isa::set_cap(None);
}
