//! `add(mul(a, b), mul(c, d))` fused into one pass (`runtime::blend_fusion`): a decoder's
//! cache blend `cache·(1 − mask) + new·mask` with broadcasting, in fp16 (intermediate
//! roundings matter: arbitrary mask values) and f32, must equal op-by-op evaluation bit for
//! bit; a product with a second reader is left unfused.

mod common;

use common::programs::*;
use common::rng::Rng;
use milkit::ir::{DType, Value};
use milkit::ops::{Builder, In};
use milkit::runtime::{blend_fusion, Options, Session};

const D: usize = 16;
const S: usize = 12;

fn build(dt: DType, extra_reader: bool) -> milkit::ir::Model {
    let mut b = Builder::new(milkit::ir::Opset::Ios17);
    let cache = b.input("cache", tin(dt, &[1, D, 1, S]));
    let new = b.input("new", tin(dt, &[1, D, 1, 1]));
    let mask = b.input("mask", tin(dt, &[1, 1, 1, S]));
    let one = match dt {
        DType::F16 => Value::f16_scalar(1.0),
        _ => Value::f32_scalar(1.0),
    };
    let keep = b
        .op1("sub", "keep", vec![("x", c(one)), ("y", In::from(&mask))])
        .unwrap();
    let old = b
        .op1(
            "mul",
            "old",
            vec![("x", In::from(&cache)), ("y", In::V(keep))],
        )
        .unwrap();
    let put = b
        .op1(
            "mul",
            "put",
            vec![("x", In::from(&new)), ("y", In::from(&mask))],
        )
        .unwrap();
    let merged = b
        .op1(
            "add",
            "merged",
            vec![("x", In::from(&old)), ("y", In::from(&put))],
        )
        .unwrap();
    let mut outs = vec![(merged, "merged")];
    if extra_reader {
        let twice = b
            .op1(
                "add",
                "twice",
                vec![("x", In::from(&put)), ("y", In::from(&put))],
            )
            .unwrap();
        outs.push((twice, "twice"));
    }
    model(b, &outs)
}

fn run(dt: DType, extra: bool, fuse: bool, r: &mut Rng) -> (Vec<Vec<u32>>, bool) {
    let opts = Options {
        fuse_blends: fuse,
        ..Options::default()
    };
    let mut s = Session::from_model_with(build(dt, extra), &opts).unwrap();
    s.enable_profiling(true);
    let cdt = if dt == DType::F16 {
        candle_core::DType::F16
    } else {
        candle_core::DType::F32
    };
    let t = |v: Vec<f32>, shape: &[usize]| host(&v, shape).to_dtype(cdt).unwrap();
    let ins = [
        ("cache", t(r.vec(D * S), &[1, D, 1, S])),
        ("new", t(r.vec(D), &[1, D, 1, 1])),
        ("mask", t(r.vec(S), &[1, 1, 1, S])),
    ];
    let out = s.predict(&ins).unwrap();
    let bits = out
        .iter()
        .map(|(_, v)| f32s(v).iter().map(|x| x.to_bits()).collect())
        .collect();
    let fused = s.profile().iter().any(|p| p.0 == blend_fusion::FUSED);
    (bits, fused)
}

#[test]
fn fused_blend_matches_op_by_op_bit_for_bit() {
    for dt in [DType::F16, DType::F32] {
        for seed in [1, 2, 3] {
            let (got, fused) = run(dt, false, true, &mut Rng(seed));
            let (want, plain) = run(dt, false, false, &mut Rng(seed));
            assert!(fused && !plain, "{dt:?}: fused only when asked");
            assert_eq!(got, want, "{dt:?} seed {seed}");
        }
    }
}

#[test]
fn product_with_another_reader_is_not_fused() {
    let (got, fused) = run(DType::F16, true, true, &mut Rng(7));
    let (want, _) = run(DType::F16, true, false, &mut Rng(7));
    assert!(!fused);
    assert_eq!(got, want);
}
