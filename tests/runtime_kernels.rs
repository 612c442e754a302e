//! The decode-path GEMV kernels (`kernels::gemv`) against straightforward f64 references
//! built from the same codes, palettes and scales: every storage form, single and multi-row
//! activations, row lengths with SIMD tails, and matrices big enough to run multi-threaded.

use half::f16;
use milkit::kernels::gemv::Isa;
use milkit::kernels::PackedWeight;

/// `y[j, r] = Σ_c w(r, c) x[j, c]` in f64, plus the scale `Σ |w x|` the error is judged by.
fn reference(
    n: usize,
    k: usize,
    m: usize,
    x: &[f32],
    w: impl Fn(usize, usize) -> f64,
) -> (Vec<f64>, Vec<f64>) {
    let (mut y, mut mag) = (vec![0f64; m * n], vec![0f64; m * n]);
    for j in 0..m {
        for r in 0..n {
            for c in 0..k {
                let p = w(r, c) * x[j * k + c] as f64;
                y[j * n + r] += p;
                mag[j * n + r] += p.abs();
            }
        }
    }
    (y, mag)
}

/// f32 accumulation over k terms: allow 1e-5 of the magnitude sum (a few ulps per term).
fn check(what: &str, got: &[f32], want: &(Vec<f64>, Vec<f64>)) {
    assert_eq!(got.len(), want.0.len(), "{what}: length");
    for (i, (g, (w, m))) in got.iter().zip(want.0.iter().zip(&want.1)).enumerate() {
        let err = (*g as f64 - w).abs();
        assert!(
            err <= 1e-5 * m + 1e-6,
            "{what}: element {i}: {g} vs {w} (err {err:e}, magnitude {m})"
        );
    }
}

/// [`check`] of the product through every inner-loop level this CPU runs (portable,
/// AVX2, AVX-512), so that each path is held to the reference wherever it can run.
fn check_isas(what: &str, p: &PackedWeight, x: &[f32], m: usize, want: &(Vec<f64>, Vec<f64>)) {
    for isa in Isa::supported() {
        let got = p.gemv_with(x, m, isa).unwrap();
        check(&format!("{what} {isa:?}"), &got, want);
    }
}

const SIZES: &[(usize, usize)] = &[(1, 8), (5, 40), (37, 72), (64, 200), (3000, 384)];

#[test]
fn f16_and_f32_gemv_match_reference() {
    let mut rng = Rng(7);
    // (6, 13): rows past the last group of four and columns past the last SIMD lane.
    for &(n, k) in SIZES.iter().chain(&[(6, 13)]) {
        for m in [1, 3] {
            let w: Vec<f16> = (0..n * k).map(|_| f16::from_f32(rng.next())).collect();
            let x: Vec<f32> = (0..m * k).map(|_| rng.next()).collect();
            let want = reference(n, k, m, &x, |r, c| w[r * k + c].to_f64());
            let p = PackedWeight::from_f16(&[n, k], w.clone()).unwrap();
            check_isas(&format!("f16 {n}x{k} m{m}"), &p, &x, m, &want);
            let w32: Vec<f32> = w.iter().map(|v| v.to_f32()).collect();
            let p = PackedWeight::from_f32(&[n, k, 1, 1], w32.clone()).unwrap();
            check_isas(&format!("f32 {n}x{k} m{m}"), &p, &x, m, &want);
            assert_eq!(p.to_f32(), w32);
            assert_eq!(p.bytes(), n * k * 4);
        }
    }
}

#[test]
fn lut4_gemv_reads_packed_codes_and_group_palettes() {
    let mut rng = Rng(11);
    for &(n, k) in SIZES {
        // One palette per group of 8 rows when 8 divides n, else a single palette.
        let groups = if n % 8 == 0 { n / 8 } else { 1 };
        let rpg = n / groups;
        let lut: Vec<f32> = (0..groups * 16).map(|_| rng.next()).collect();
        let codes: Vec<u8> = (0..n * k).map(|_| rng.code()).collect();
        let p = PackedWeight::lut4(&[n, k], &codes, lut.clone()).unwrap();
        assert_eq!(p.bytes(), n * k / 2 + groups * 64, "LUT4 bytes");
        let dense = |r: usize, c: usize| lut[(r / rpg) * 16 + codes[r * k + c] as usize] as f64;
        for m in [1, 2] {
            let x: Vec<f32> = (0..m * k).map(|_| rng.next()).collect();
            let want = reference(n, k, m, &x, dense);
            check_isas(&format!("lut4 {n}x{k} m{m}"), &p, &x, m, &want);
        }
        let d = p.to_f32();
        assert!((0..n * k).all(|i| d[i] as f64 == dense(i / k, i % k)));
    }
}

/// `PackedWeight::lut4_nibbles` (the codes as a `uint4` tensor stores them, two a byte,
/// low nibble first) holds the same weight as `lut4` of the codes one a byte — decoded
/// values compared exactly against the palette look-up — and refuses a code past a short
/// palette.
#[test]
fn lut4_from_stored_nibbles_equals_lut4_from_codes() {
    let mut rng = Rng(19);
    let (n, k) = (24, 70);
    let lut: Vec<f32> = (0..3 * 16).map(|_| rng.next()).collect();
    let codes: Vec<u8> = (0..n * k).map(|_| rng.code()).collect();
    let nibbles: Vec<u8> = codes.chunks(2).map(|c| c[0] | c[1] << 4).collect();
    let p = PackedWeight::lut4_nibbles(&[n, k], nibbles.clone(), lut.clone(), 16).unwrap();
    let q = PackedWeight::lut4(&[n, k], &codes, lut.clone()).unwrap();
    let d = p.to_f32();
    assert_eq!(d, q.to_f32());
    assert!((0..n * k).all(|i| d[i] == lut[(i / k / 8) * 16 + codes[i] as usize]));
    let top = *codes.iter().max().unwrap() as usize;
    let e = PackedWeight::lut4_nibbles(&[n, k], nibbles, lut, top).unwrap_err();
    assert!(e.to_string().contains("out of range"), "{e}");
}

#[test]
fn int4_gemv_per_channel_and_per_block() {
    let mut rng = Rng(13);
    for &(n, k) in SIZES {
        // Per block of 8 (SIMD path), per block of 2 (scalar path) and per channel.
        for block in [8, 2, k] {
            if k % block != 0 || block % 2 != 0 {
                continue;
            }
            let nb = n * (k / block);
            let scale: Vec<f32> = (0..nb).map(|_| rng.next() * 0.1).collect();
            let zero: Vec<f32> = (0..nb).map(|_| (rng.code() % 16) as f32).collect();
            let codes: Vec<u8> = (0..n * k).map(|_| rng.code()).collect();
            let p =
                PackedWeight::int4(&[n, k], &codes, scale.clone(), zero.clone(), block).unwrap();
            let dense = |r: usize, c: usize| {
                let b = r * (k / block) + c / block;
                scale[b] as f64 * (codes[r * k + c] as f64 - zero[b] as f64)
            };
            for m in [1, 3] {
                let x: Vec<f32> = (0..m * k).map(|_| rng.next()).collect();
                let want = reference(n, k, m, &x, dense);
                let what = format!("int4 {n}x{k} block {block} m{m}");
                check_isas(&what, &p, &x, m, &want);
            }
            let d = p.to_f32();
            for (i, v) in d.iter().enumerate() {
                let err = (*v as f64 - dense(i / k, i % k)).abs();
                assert!(err <= 1e-6 * dense(i / k, i % k).abs() + 1e-7, "decode {i}");
            }
        }
    }
}

/// fp16 palettes and int4 blocks of 32/64 take the `pshufb` lookup kernels (activations
/// permuted per call); row lengths with a tail past the last 64-element chunk, several
/// activation rows, and a matrix large enough to split across threads.
#[test]
fn shuffle_lookup_paths_match_reference() {
    let mut rng = Rng(17);
    for &(n, k) in &[(16usize, 64usize), (24, 200), (3000, 384)] {
        let groups = n / 8;
        let lut: Vec<f32> = (0..groups * 16)
            .map(|_| f16::from_f32(rng.next()).to_f32())
            .collect();
        let codes: Vec<u8> = (0..n * k).map(|_| rng.code()).collect();
        let p = PackedWeight::lut4(&[n, k], &codes, lut.clone()).unwrap();
        let dense = |r: usize, c: usize| lut[(r / 8) * 16 + codes[r * k + c] as usize] as f64;
        for m in [1, 2] {
            let x: Vec<f32> = (0..m * k).map(|_| rng.next()).collect();
            let want = reference(n, k, m, &x, dense);
            check_isas(&format!("fp16-palette lut4 {n}x{k} m{m}"), &p, &x, m, &want);
        }
        for block in [32, 64] {
            if k % block != 0 {
                continue;
            }
            let nb = n * (k / block);
            let scale: Vec<f32> = (0..nb).map(|_| rng.next() * 0.1).collect();
            let zero = vec![8.0; nb];
            let p = PackedWeight::int4(&[n, k], &codes, scale.clone(), zero, block).unwrap();
            let dense = |r: usize, c: usize| {
                scale[r * (k / block) + c / block] as f64 * (codes[r * k + c] as f64 - 8.0)
            };
            for m in [1, 3] {
                let x: Vec<f32> = (0..m * k).map(|_| rng.next()).collect();
                let want = reference(n, k, m, &x, dense);
                let what = format!("int4 {n}x{k} block {block} m{m}");
                check_isas(&what, &p, &x, m, &want);
            }
        }
    }
}

#[test]
fn packing_rejects_bad_shapes() {
    assert!(
        PackedWeight::lut4(&[2, 3], &[0; 6], vec![0.0; 16]).is_err(),
        "odd k"
    );
    assert!(
        PackedWeight::lut4(&[2, 4], &[16; 8], vec![0.0; 16]).is_err(),
        "code 16"
    );
    assert!(
        PackedWeight::lut4(&[3, 4], &[0; 12], vec![0.0; 32]).is_err(),
        "2 ∤ 3 rows"
    );
    assert!(PackedWeight::int4(&[2, 6], &[0; 12], vec![0.0; 4], vec![0.0; 4], 4).is_err());
    assert!(PackedWeight::from_f16(&[2, 2], vec![f16::ZERO; 3]).is_err());
    let p = PackedWeight::from_f32(&[2, 2], vec![1.0; 4]).unwrap();
    assert!(p.gemv(&[1.0; 3], 1).is_err(), "activation length");
}

// ---- The interpreter with packed weights and memoization ----

mod common;

use common::programs::*;
use common::rng::Rng;
use milkit::ir::{DType, Model, Opset, Tensor as ITensor, Value};
use milkit::ops::{Builder, In};
use milkit::package::blob::{pack_i4, pack_sub_byte, BlobDType};
use milkit::runtime::Session;

fn q16(v: f32) -> f32 {
    f16::from_f32(v).to_f32()
}

/// One fp16 rounding of an f32 sum: 1e-3 relative (+ 1e-3 absolute near zero).
fn close16(got: &[f32], want: &[f64], what: &str) {
    assert_close(got, want, 1e-3, what);
}

/// A LUT4 conv 1x1 (two palettes of 8 output rows) and an int4 per-block linear, both on
/// iOS18 constexpr weights, each run with a decode-sized input (GEMV on the packed form)
/// and an encoder-sized one (decoded per call, GEMM), against loops over the codes.
#[test]
fn compressed_weights_run_packed_for_decode_and_dense_for_gemm() {
    let mut r = Rng(21);
    let (n, k) = (16, 32);
    let codes: Vec<u8> = (0..n * k)
        .map(|_| ((r.next() + 1.0) * 8.0) as u8 % 16)
        .collect();
    let lut: Vec<f32> = r.vec(2 * 16).into_iter().map(q16).collect();
    let (ln, bs) = (12, 16);
    let data: Vec<i8> = (0..ln * k)
        .map(|_| ((r.next() * 8.0).floor() as i8).clamp(-8, 7))
        .collect();
    let scale: Vec<f32> = r.vec(ln * 2).into_iter().map(|v| q16(v * 0.1)).collect();
    let offs: Vec<i8> = (0..ln * 2).map(|i| (i % 5) as i8 - 2).collect();

    let mut b = Builder::new(Opset::Ios18);
    let packed = pack_sub_byte(BlobDType::U4, &codes).unwrap();
    let idx = ITensor::new(
        DType::U4,
        vec![n, k, 1, 1],
        milkit::ir::Bytes::from_vec(packed),
    );
    let wl = b
        .op1(
            "constexpr_lut_to_dense",
            "wl",
            vec![
                ("indices", In::Inline(Value::Tensor(idx.unwrap()))),
                ("lut", In::Inline(f16_tensor(&[2, 1, 1, 1, 16, 1], &lut))),
            ],
        )
        .unwrap();
    let i4 = |v: &[i8], s: Vec<usize>| {
        let bytes = milkit::ir::Bytes::from_vec(pack_i4(v).unwrap());
        In::Inline(Value::Tensor(ITensor::new(DType::I4, s, bytes).unwrap()))
    };
    let wq = b
        .op1(
            "constexpr_blockwise_shift_scale",
            "wq",
            vec![
                ("data", i4(&data, vec![ln, k])),
                ("scale", In::Inline(f16_tensor(&[ln, 2], &scale))),
                ("offset", i4(&offs, vec![ln, 2])),
            ],
        )
        .unwrap();
    let mut outs = vec![];
    for (name, s) in [("c1", 1usize), ("c20", 20)] {
        let x = b.input(&format!("x_{name}"), tin(DType::F16, &[1, k, 1, s]));
        let y = b
            .op1(
                "conv",
                name,
                vec![("x", x.into()), ("weight", In::from(&wl))],
            )
            .unwrap();
        outs.push((y, name));
    }
    for (name, m) in [("l1", 1usize), ("l24", 24)] {
        let x = b.input(&format!("x_{name}"), tin(DType::F16, &[m, k]));
        let y = b
            .op1(
                "linear",
                name,
                vec![("x", x.into()), ("weight", In::from(&wq))],
            )
            .unwrap();
        outs.push((y, name));
    }
    let names: Vec<(milkit::ops::V, &str)> = outs.iter().map(|(v, n)| (v.clone(), *n)).collect();
    let mut s = Session::from_model(model(b, &names)).unwrap();
    let xs: Vec<Vec<f32>> = [k, 20 * k, k, 24 * k]
        .iter()
        .map(|&len| r.vec(len).into_iter().map(q16).collect())
        .collect();
    let inputs = [
        ("x_c1", host(&xs[0], &[1, k, 1, 1])),
        ("x_c20", host(&xs[1], &[1, k, 1, 20])),
        ("x_l1", host(&xs[2], &[1, k])),
        ("x_l24", host(&xs[3], &[24, k])),
    ];
    let out = s.predict(&inputs).unwrap();
    // The session streams LUT4 and int4 bytes, not dense fp16.
    let lut_bytes = n * k / 2 + 2 * 16 * 4;
    let int4_bytes = ln * k / 2 + ln * 2 * 8;
    assert_eq!(s.streamed_bytes(None).unwrap(), lut_bytes + int4_bytes);
    let wlut = |o: usize, c: usize| lut[(o / 8) * 16 + codes[o * k + c] as usize] as f64;
    let wint = |o: usize, c: usize| {
        let bi = o * 2 + c / bs;
        scale[bi] as f64 * (data[o * k + c] as f64 - offs[bi] as f64)
    };
    for (sp, x, got) in [(1, &xs[0], &out[0].1), (20, &xs[1], &out[1].1)] {
        let mut want = vec![0f64; n * sp];
        for o in 0..n {
            for j in 0..sp {
                want[o * sp + j] = (0..k).map(|c| wlut(o, c) * x[c * sp + j] as f64).sum();
            }
        }
        close16(&f32s(got), &want, &format!("lut4 conv, {sp} columns"));
    }
    for (m, x, got) in [(1, &xs[2], &out[2].1), (24, &xs[3], &out[3].1)] {
        let mut want = vec![0f64; m * ln];
        for i in 0..m {
            for o in 0..ln {
                want[i * ln + o] = (0..k).map(|c| wint(o, c) * x[i * k + c] as f64).sum();
            }
        }
        close16(&f32s(got), &want, &format!("int4 linear, {m} rows"));
    }
}

/// `score = q · (enc · W)ᵀ` (enc fp16 [t, d], q fp16 [1, h], W the constant [h, d]): a
/// projection of `enc` that is invariant while `enc` is, for the memo's tests.
fn projected_score_model(t: usize, d: usize, h: usize, w: &[f32]) -> Model {
    let mut b = Builder::new(Opset::Ios17);
    let enc = b.input("enc", tin(DType::F16, &[t, d]));
    let q = b.input("q", tin(DType::F16, &[1, h]));
    let wc = b.konst("w", f16_tensor(&[h, d], w));
    let kp = b
        .op1(
            "linear",
            "k",
            vec![("x", enc.into()), ("weight", wc.into())],
        )
        .unwrap();
    let y = b
        .op1(
            "matmul",
            "score",
            vec![
                ("x", q.into()),
                ("y", kp.into()),
                ("transpose_y", In::C(Value::bool_scalar(true))),
            ],
        )
        .unwrap();
    model(b, &[(y, "score")])
}

/// Two sessions of one [`projected_score_model`] (its weight drawn from `r`, fp16 values):
/// memoizing with profiling on, and plain.
fn memo_and_plain(r: &mut Rng, (t, d, h): (usize, usize, usize)) -> (Session, Session) {
    let w: Vec<f32> = r.vec(h * d).into_iter().map(q16).collect();
    let mut memo = Session::from_model(projected_score_model(t, d, h, &w)).unwrap();
    memo.enable_profiling(true);
    let mut plain = Session::from_model(projected_score_model(t, d, h, &w)).unwrap();
    plain.set_memoize(false);
    (memo, plain)
}

/// `score = q · (enc · W)ᵀ`: the projection of `enc` is invariant while `enc` is. With
/// memoization the projection runs once per distinct `enc`; outputs are bit-identical to a
/// session without it, across a changed `enc`.
#[test]
fn memoized_session_matches_plain_across_changed_inputs() {
    let mut r = Rng(5);
    let (t, d, h) = (64, 32, 16);
    let (mut memo, mut plain) = memo_and_plain(&mut r, (t, d, h));
    let (enc1, enc2) = (r.vec(t * d), r.vec(t * d));
    let calls = [&enc1, &enc1, &enc2, &enc2, &enc1];
    for (i, enc) in calls.iter().enumerate() {
        let ins = [("enc", host(enc, &[t, d])), ("q", host(&r.vec(h), &[1, h]))];
        let a = memo.predict(&ins).unwrap();
        let b = plain.predict(&ins).unwrap();
        assert_eq!(f32s(&a[0].1), f32s(&b[0].1), "call {i}: memoized vs plain");
    }
    let linear_runs = memo.profile().iter().find(|p| p.0 == "linear").map(|p| p.1);
    assert_eq!(
        linear_runs,
        Some(3),
        "projection once per distinct enc (3 changes)"
    );
    assert!(memo.memoized_values() >= 1);
}

/// An input that changes on every call (a decoder's KV cache fed back each token) is, after
/// `memo::VOLATILE_AFTER` changes in a row, counted as changed for `memo::VOLATILE_CALLS`
/// calls without its bytes being compared or copied; then compared again, so a value that
/// settles is memoized once more, and the very same tensor handed in again is reused at
/// once. Outputs stay bit-identical to a session without memoization throughout.
#[test]
fn memo_stops_comparing_an_input_that_changes_every_call_and_recovers() {
    use milkit::runtime::memo::{VOLATILE_AFTER, VOLATILE_CALLS};
    let mut r = Rng(11);
    let (t, d, h) = (32, 16, 8);
    let (mut memo, mut plain) = memo_and_plain(&mut r, (t, d, h));
    let linear_runs = |s: &Session| {
        s.profile()
            .iter()
            .find(|p| p.0 == "linear")
            .map_or(0, |p| p.1)
    };
    let mut rq = Rng(12);
    let mut call = |memo: &mut Session, enc: &milkit::runtime::Tensor| {
        let ins = [("enc", enc.clone()), ("q", host(&rq.vec(h), &[1, h]))];
        let a = memo.predict(&ins).unwrap();
        let b = plain.predict(&ins).unwrap();
        assert_eq!(f32s(&a[0].1), f32s(&b[0].1), "memoized vs plain");
    };
    // A new value every call: compared while it has changed fewer than VOLATILE_AFTER
    // times in a row, then taken as changed for VOLATILE_CALLS calls.
    let changing = (VOLATILE_AFTER + VOLATILE_CALLS) as usize;
    for _ in 0..changing {
        call(&mut memo, &host(&r.vec(t * d), &[t, d]));
    }
    assert_eq!(linear_runs(&memo), changing, "every new value projected");
    // Then one value, as a fresh tensor each call: the first call compares (nothing kept
    // to compare with: runs), the second finds the same bytes and skips the projection.
    let settled = r.vec(t * d);
    for _ in 0..4 {
        call(&mut memo, &host(&settled, &[t, d]));
    }
    assert_eq!(
        linear_runs(&memo),
        changing + 1,
        "a settled value memoized again"
    );
    // Volatile again, then the very same tensor twice: reused without comparison.
    for _ in 0..VOLATILE_AFTER + 1 {
        call(&mut memo, &host(&r.vec(t * d), &[t, d]));
    }
    // (fp16 as the input is: a converted tensor would be a new one each call.)
    let same = host(&r.vec(t * d), &[t, d])
        .to_dtype(milkit::runtime::DType::F16)
        .unwrap();
    call(&mut memo, &same);
    call(&mut memo, &same);
    assert_eq!(
        linear_runs(&memo),
        changing + 1 + (VOLATILE_AFTER as usize + 1) + 1,
        "the same tensor again is reused even while the input is volatile"
    );
}

/// fp16 arithmetic with broadcasting equals, bit for bit, each element computed in f32 and
/// rounded once — for same-shape operands longer than one parallel chunk, a decode step's
/// cache blend shapes, a scalar, and axes that broadcast on both sides.
#[test]
fn fp16_binary_ops_round_once_under_broadcasting() {
    use milkit::kernels::{binary, BinOp};
    let mut rng = Rng(11);
    let shapes: &[(&[usize], &[usize])] = &[
        (&[40_000], &[40_000]),
        (&[1, 384, 1, 448], &[1, 1, 1, 448]),
        (&[1, 384, 1, 1], &[1, 1, 1, 448]),
        (&[2, 3, 5], &[]),
        (&[3, 1, 5], &[1, 4, 1]),
        (&[1, 20_000], &[7, 1]),
    ];
    for &(sa, sb) in shapes {
        let (na, nb) = (sa.iter().product::<usize>(), sb.iter().product::<usize>());
        let a: Vec<f16> = (0..na).map(|_| f16::from_f32(rng.next() * 4.0)).collect();
        let b: Vec<f16> = (0..nb)
            .map(|_| f16::from_f32(rng.next().abs() * 4.0 + 0.5))
            .collect();
        let ta = candle_core::Tensor::from_vec(a.clone(), sa, &candle_core::Device::Cpu).unwrap();
        let tb = candle_core::Tensor::from_vec(b.clone(), sb, &candle_core::Device::Cpu).unwrap();
        let out_shape = milkit::kernels::elementwise::broadcast_shape(sa, sb).unwrap();
        let at = |v: &[f16], s: &[usize], idx: &[usize]| {
            let off = out_shape.len() - s.len();
            let mut flat = 0;
            for (i, &d) in s.iter().enumerate() {
                flat = flat * d + if d == 1 { 0 } else { idx[off + i] };
            }
            v[flat].to_f32()
        };
        for (op, f) in [
            (BinOp::Add, (|x, y| x + y) as fn(f32, f32) -> f32),
            (BinOp::Sub, |x, y| x - y),
            (BinOp::Mul, |x, y| x * y),
            (BinOp::Div, |x, y| x / y),
        ] {
            let got: Vec<f16> = binary(&ta, &tb, op)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let n: usize = out_shape.iter().product();
            assert_eq!(got.len(), n, "{op:?} {sa:?} {sb:?}");
            let mut idx = vec![0; out_shape.len()];
            for (i, g) in got.iter().enumerate() {
                let mut rem = i;
                for ax in (0..out_shape.len()).rev() {
                    idx[ax] = rem % out_shape[ax];
                    rem /= out_shape[ax];
                }
                let want = f16::from_f32(f(at(&a, sa, &idx), at(&b, sb, &idx)));
                assert_eq!(g.to_bits(), want.to_bits(), "{op:?} {sa:?} {sb:?} at {i}");
            }
        }
    }
}

/// An fp16 1x1 conv with a bias, run on the GEMV path (1 and 4 columns: bias and the fp16
/// rounding in the kernel's epilogue) and on the general path (20 columns), against f64.
#[test]
fn packed_conv_adds_its_bias_on_every_path() {
    let mut r = Rng(33);
    let (n, k) = (24, 40);
    let w: Vec<f32> = r.vec(n * k).into_iter().map(|v| q16(v * 0.3)).collect();
    let bias: Vec<f32> = r.vec(n).into_iter().map(q16).collect();
    let mut b = Builder::new(Opset::Ios18);
    let wt = b.konst("w", f16_tensor(&[n, k, 1, 1], &w));
    let bt = b.konst("b", f16_tensor(&[n], &bias));
    let mut outs = vec![];
    for s in [1usize, 4, 20] {
        let x = b.input(&format!("x{s}"), tin(DType::F16, &[1, k, 1, s]));
        let y = b
            .op1(
                "conv",
                &format!("c{s}"),
                vec![
                    ("x", x.into()),
                    ("weight", In::from(&wt)),
                    ("bias", In::from(&bt)),
                ],
            )
            .unwrap();
        outs.push(y);
    }
    let names = [("c1"), ("c4"), ("c20")];
    let named: Vec<(milkit::ops::V, &str)> = outs.into_iter().zip(names).collect();
    let mut s = Session::from_model(model(b, &named)).unwrap();
    let xs: Vec<Vec<f32>> = [1usize, 4, 20]
        .iter()
        .map(|&sp| r.vec(k * sp).into_iter().map(q16).collect())
        .collect();
    let inputs = [
        ("x1", host(&xs[0], &[1, k, 1, 1])),
        ("x4", host(&xs[1], &[1, k, 1, 4])),
        ("x20", host(&xs[2], &[1, k, 1, 20])),
    ];
    let out = s.predict(&inputs).unwrap();
    for ((sp, x), (_, got)) in [1usize, 4, 20].iter().zip(&xs).zip(&out) {
        let mut want = vec![0f64; n * sp];
        for o in 0..n {
            for j in 0..*sp {
                want[o * sp + j] = bias[o] as f64
                    + (0..k)
                        .map(|c| w[o * k + c] as f64 * x[c * sp + j] as f64)
                        .sum::<f64>();
            }
        }
        assert_eq!(got.dtype(), candle_core::DType::F16, "{sp} columns");
        close16(
            &f32s(got),
            &want,
            &format!("fp16 conv + bias, {sp} columns"),
        );
    }
}
