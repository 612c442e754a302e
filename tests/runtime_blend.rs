//! `add(mul(a, b), mul(c, d))` fused into one pass (`runtime::blend_fusion`): a decoder's
//! cache blend `cache·(1 − mask) + new·mask` with broadcasting, in fp16 (intermediate
//! roundings matter: arbitrary mask values) and f32, must equal op-by-op evaluation bit for
//! bit; a product with a second reader is left unfused. A blend that only feeds a fused
//! decode-step attention's keys or values through a reshape into heads moves into the
//! attention (its rows filled head by head), with the same bits as the blend run whole.

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
    let (cache, new, mask) = (r.vec(D * S), r.vec(D), r.vec(S));
    run_with(dt, extra, fuse, [cache, new, mask])
}

/// The blend of `[cache, new, mask]` (fused or op by op): each output's bits, and whether
/// the fused step ran.
fn run_with(dt: DType, extra: bool, fuse: bool, ins: [Vec<f32>; 3]) -> (Vec<Vec<u32>>, bool) {
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
    let [cache, new, mask] = ins;
    let ins = [
        ("cache", t(cache, &[1, D, 1, S])),
        ("new", t(new, &[1, D, 1, 1])),
        ("mask", t(mask, &[1, 1, 1, S])),
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
fn one_hot_blend_copies_the_cache_with_exact_special_values() {
    // A decode step's mask (one 1, the rest 0) lets the fused blend copy each cache row and
    // compute only the masked column; rows holding −0, infinities or NaN, and rows whose
    // new value is not finite, must still round exactly as mul, mul, add do (−0 + +0 is +0).
    let special = [
        -0.0,
        0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        6.0e-8,
        -65504.0,
    ];
    let mut r = Rng(21);
    let mut cache = r.vec(D * S);
    // Rows 0-7: positive new values (their products with 0 are +0).
    let mut new: Vec<f32> = r.vec(D).iter().map(|x| x.abs() + 0.1).collect();
    for (i, &x) in special.iter().enumerate() {
        // Row i holds one special value in an unmasked column; row 8 + i's new value is it.
        cache[i * S + (i % (S - 1)) + 1] = x;
        new[8 + i % 8] = x;
    }
    new[15] = -0.0;
    for pos in [0, 5, S - 1] {
        let mask: Vec<f32> = (0..S).map(|j| (j == pos) as u8 as f32).collect();
        let ins = || [cache.clone(), new.clone(), mask.clone()];
        let (got, fused) = run_with(DType::F16, false, true, ins());
        let (want, _) = run_with(DType::F16, false, false, ins());
        assert!(fused);
        assert_eq!(got, want, "mask at {pos}");
    }
}

#[test]
fn product_with_another_reader_is_not_fused() {
    let (got, fused) = run(DType::F16, true, true, &mut Rng(7));
    let (want, _) = run(DType::F16, true, false, &mut Rng(7));
    assert!(!fused);
    assert_eq!(got, want);
}

/// Keys and values of 2 heads of depth 8 over `n` positions, each the blend of a cache with
/// this token's column (`cache·(1 − mask) + new·mask`), reshaped into heads and attended by
/// one query: the WhisperKit decoder's self-attention.
fn attention_over_blends(n: usize) -> milkit::ir::Model {
    let dt = DType::F16;
    let mut b = Builder::new(milkit::ir::Opset::Ios17);
    let q = b.input("q", tin(dt, &[1, 2, 8, 1]));
    let mask = b.input("mask", tin(dt, &[1, 1, 1, n]));
    let keep = b
        .op1(
            "sub",
            "keep",
            vec![("x", c(Value::f16_scalar(1.0))), ("y", In::from(&mask))],
        )
        .unwrap();
    let mut heads = vec![];
    for name in ["k", "v"] {
        let cache = b.input(&format!("{name}_cache"), tin(dt, &[1, D, 1, n]));
        let new = b.input(&format!("{name}_new"), tin(dt, &[1, D, 1, 1]));
        let old = b
            .op1(
                "mul",
                &format!("{name}_old"),
                vec![("x", In::from(&cache)), ("y", In::V(keep.clone()))],
            )
            .unwrap();
        let put = b
            .op1(
                "mul",
                &format!("{name}_put"),
                vec![("x", In::from(&new)), ("y", In::from(&mask))],
            )
            .unwrap();
        let merged = b
            .op1(
                "add",
                &format!("{name}_merged"),
                vec![("x", In::V(old)), ("y", In::V(put))],
            )
            .unwrap();
        let h = b
            .op1(
                "reshape",
                &format!("{name}_heads"),
                vec![("x", In::V(merged)), ("shape", ints(&[1, 2, 8, n as i32]))],
            )
            .unwrap();
        heads.push(h);
    }
    let scores = b
        .op1(
            "matmul",
            "scores",
            vec![
                ("x", In::from(&q)),
                ("y", In::V(heads[0].clone())),
                ("transpose_x", c(Value::bool_scalar(true))),
            ],
        )
        .unwrap();
    let p = b
        .op1(
            "softmax",
            "p",
            vec![("x", In::V(scores)), ("axis", ints(&[3]))],
        )
        .unwrap();
    let out = b
        .op1(
            "matmul",
            "out",
            vec![
                ("x", In::V(heads[1].clone())),
                ("y", In::V(p)),
                ("transpose_y", c(Value::bool_scalar(true))),
            ],
        )
        .unwrap();
    model(b, &[(out, "out")])
}

/// Calls per op type, from a session's profile.
type OpCounts = Vec<(String, usize)>;

/// The attention over blends with and without blend fusion, on the given caches, new
/// columns and mask: (output bits, op counts) for each.
fn attention_both_ways(
    n: usize,
    mask: Vec<f32>,
    kv: [Vec<f32>; 4],
    r: &mut Rng,
) -> [(Vec<u32>, OpCounts); 2] {
    let q = r.vec(16);
    [true, false].map(|fuse| {
        let opts = Options {
            fuse_blends: fuse,
            ..Options::default()
        };
        let mut s = Session::from_model_with(attention_over_blends(n), &opts).unwrap();
        s.enable_profiling(true);
        let t =
            |v: &[f32], shape: &[usize]| host(v, shape).to_dtype(candle_core::DType::F16).unwrap();
        let ins = [
            ("q", t(&q, &[1, 2, 8, 1])),
            ("mask", t(&mask, &[1, 1, 1, n])),
            ("k_cache", t(&kv[0], &[1, D, 1, n])),
            ("k_new", t(&kv[1], &[1, D, 1, 1])),
            ("v_cache", t(&kv[2], &[1, D, 1, n])),
            ("v_new", t(&kv[3], &[1, D, 1, 1])),
        ];
        let out = s.predict(&ins).unwrap();
        let bits = f32s(&out[0].1).iter().map(|x| x.to_bits()).collect();
        let ops = s.profile().iter().map(|p| (p.0.clone(), p.1)).collect();
        (bits, ops)
    })
}

#[test]
fn blend_moved_into_a_decode_attention_keeps_the_bits() {
    // 45 positions: a whole 32-element step of the row kernels and a tail; the mask picks
    // position 7 (a decode step) or mixes arbitrary values (any blend).
    let n = 45;
    for (seed, one_hot) in [(11, true), (12, false)] {
        let mut r = Rng(seed);
        let mask: Vec<f32> = match one_hot {
            true => (0..n).map(|j| (j == 7) as u8 as f32).collect(),
            false => r.vec(n),
        };
        let kv = [r.vec(D * n), r.vec(D), r.vec(D * n), r.vec(D)];
        let [moved, whole] = attention_both_ways(n, mask, kv, &mut r);
        let count =
            |ops: &[(String, usize)], op: &str| ops.iter().find(|p| p.0 == op).map_or(0, |p| p.1);
        // Moved in: one attention step, no blend and no reshape left.
        assert_eq!(count(&moved.1, "matmul+softmax+matmul"), 1, "{:?}", moved.1);
        assert_eq!(count(&moved.1, blend_fusion::FUSED), 0, "{:?}", moved.1);
        assert_eq!(count(&moved.1, "reshape"), 0, "{:?}", moved.1);
        // Without blend fusion: the blend's three ops each, the same attention step.
        assert_eq!(count(&whole.1, "mul"), 4, "{:?}", whole.1);
        assert_eq!(count(&whole.1, "matmul+softmax+matmul"), 1, "{:?}", whole.1);
        assert_eq!(moved.0, whole.0, "seed {seed}: the outputs differ");
        assert!(moved.0.iter().any(|&b| b != 0));
    }
}

/// A one-hot case: what it checks, the token's position, and an optional special value for
/// the key (0) or value (2) cache.
type Case = (&'static str, usize, Option<(usize, f32)>);

#[test]
fn cache_rows_read_in_place_keep_the_bits_of_the_blend_with_special_values() {
    // A one-hot decode step reads the caches' rows in place and patches the token's column
    // into the row kernels. It must give the bits of the blend run op by op: at the first
    // position, inside the kernels' 32-element step and in the tail after it; with −0 in the
    // caches (the blend makes it +0) and negative new values (their column is −0 + x); and,
    // where a key or value is infinite or NaN, by reading the blend's own rows instead.
    let n = 45;
    let before = milkit::kernels::attention::in_place_reads();
    let cases: [Case; 6] = [
        ("plain", 7, None),
        ("first position", 0, None),
        ("tail position", 40, None),
        ("infinite key", 7, Some((0, f32::INFINITY))),
        ("NaN value", 40, Some((2, f32::NAN))),
        ("infinite value", 0, Some((2, f32::NEG_INFINITY))),
    ];
    for (i, (what, pos, special)) in cases.into_iter().enumerate() {
        let mut r = Rng(40 + i as u64);
        let mask: Vec<f32> = (0..n).map(|j| (j == pos) as u8 as f32).collect();
        let mut kv = [r.vec(D * n), r.vec(D), r.vec(D * n), r.vec(D)];
        // −0 in every fifth cache element away from the token's column; new values of
        // both signs, one of them −0.
        for c in [0, 2] {
            for (j, x) in kv[c].iter_mut().enumerate() {
                if j % 5 == 0 && j % n != pos {
                    *x = -0.0;
                }
            }
        }
        kv[1][3] = -0.0;
        kv[3][5] = -0.0;
        if let Some((c, x)) = special {
            // In head 1 (rows 8..16), away from the token's column.
            kv[c][11 * n + (pos + 3) % n] = x;
        }
        let [moved, whole] = attention_both_ways(n, mask, kv, &mut r);
        assert_eq!(moved.0, whole.0, "{what}: the outputs differ");
        if special.is_none() {
            assert!(
                moved.0.iter().all(|b| f32::from_bits(*b).is_finite()),
                "{what}"
            );
        }
    }
    if milkit::kernels::gemv::wide::available() {
        assert!(
            milkit::kernels::attention::in_place_reads() > before,
            "no head was read in place"
        );
    }
}
