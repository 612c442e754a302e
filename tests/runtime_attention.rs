//! The fused attention's many-row kernels (`kernels::attention_with`: the blocks on candle's
//! gemm, the panels on `kernels::gemm`'s micro-kernels at every level this CPU runs — AVX-512
//! and the FMA and portable fallbacks) against a float64 attention written here: a Whisper
//! encoder's self-attention (1500 frames, heads of 64, fp16 scores and probabilities), and
//! small shapes for every layout of the operands, tile edges, a mask, f32 intermediates,
//! batch broadcasting and the probabilities as a second output. The panels on bf16 products
//! (`Kernel::PanelsBf16`, `--compute bf16`) against the same float64 attention computed on
//! the bf16-rounded operands.

use candle_core::{DType, Device, Tensor};
use half::f16;
use milkit::kernels::gemv::Isa;
use milkit::kernels::{attention_with, Attention, Kernel};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % 20001) as f64 / 10000.0 - 1.0
    }
    /// `n` values in ±`scale`, exactly representable in `dt`.
    fn vals(&mut self, n: usize, scale: f64, dt: DType) -> Vec<f64> {
        (0..n).map(|_| stored(self.next() * scale, dt)).collect()
    }
}

/// `x` as `dt` stores it.
fn stored(x: f64, dt: DType) -> f64 {
    match dt {
        DType::F16 => f16::from_f64(x).to_f64(),
        _ => x as f32 as f64,
    }
}

/// Every kernel: the blocks, then the panels at each level this CPU runs.
fn kernels() -> Vec<Kernel> {
    let mut k = vec![Kernel::Blocks];
    k.extend(Isa::supported().into_iter().map(Kernel::Panels));
    k
}

/// A batch of logical `[r, c]` matrices (`b` of them, row-major).
struct Logical {
    b: usize,
    r: usize,
    c: usize,
    v: Vec<f64>,
}

impl Logical {
    fn at(&self, b: usize, r: usize, c: usize) -> f64 {
        self.v[(b % self.b * self.r + r) * self.c + c]
    }

    /// The tensor `batch ++ [r, c]` (or `[c, r]` when `t`: stored transposed) of `dt`.
    fn tensor(&self, batch: &[usize], t: bool, dt: DType) -> Tensor {
        let (p, q) = if t {
            (self.c, self.r)
        } else {
            (self.r, self.c)
        };
        let mut v = Vec::with_capacity(self.b * p * q);
        for b in 0..self.b {
            for i in 0..p {
                for j in 0..q {
                    let (r, c) = if t { (j, i) } else { (i, j) };
                    v.push(self.at(b, r, c) as f32);
                }
            }
        }
        let mut shape = batch.to_vec();
        shape.extend([p, q]);
        Tensor::from_vec(v, shape, &Device::Cpu)
            .unwrap()
            .to_dtype(dt)
            .unwrap()
    }
}

/// The float64 attention of batch entry `b` (operands indexed `b` modulo their own count),
/// each intermediate rounded as `round` stores it: the output `[D][M]`, the probabilities
/// `[M][N]`, `Σ_j p·|v|` per output (the scale of its error) and `max_j |s|` per query.
struct Want {
    out: Vec<f64>,
    probs: Vec<f64>,
    mag: Vec<f64>,
    smax: Vec<f64>,
}

/// `x` rounded to bfloat16 (nearest, ties to even; every `x` here is an f32 value).
fn bf(x: f64) -> f64 {
    half::bf16::from_f32(x as f32).to_f64()
}

/// What the two products multiply: the values as they are, or rounded to bfloat16.
#[derive(Clone, Copy, PartialEq)]
enum Products {
    Exact,
    Bf16,
}

fn reference(
    b: usize,
    q: &Logical,
    k: &Logical,
    v: &Logical,
    mask: Option<&Logical>,
    round: DType,
) -> Want {
    reference_of(b, (q, k, v), mask, round, Products::Exact)
}

/// [`reference`] with the products' operands (queries, keys, stored probabilities,
/// values) rounded as `products` says.
fn reference_of(
    b: usize,
    (q, k, v): (&Logical, &Logical, &Logical),
    mask: Option<&Logical>,
    round: DType,
    products: Products,
) -> Want {
    let r = |x: f64| match products {
        Products::Exact => x,
        Products::Bf16 => bf(x),
    };
    let (m, kk, n, d) = (q.r, q.c, k.c, v.r);
    let mut w = Want {
        out: vec![0.0; d * m],
        probs: vec![0.0; m * n],
        mag: vec![0.0; d * m],
        smax: vec![0.0; m],
    };
    for i in 0..m {
        let mut s: Vec<f64> = (0..n)
            .map(|j| {
                let dot: f64 = (0..kk).map(|c| r(q.at(b, i, c)) * r(k.at(b, c, j))).sum();
                let mut x = stored(dot, round);
                if let Some(mk) = mask {
                    x = stored(x + mk.at(b, i, j), round);
                }
                x
            })
            .collect();
        w.smax[i] = s.iter().fold(0f64, |a, x| a.max(x.abs()));
        let mx = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        s.iter_mut().for_each(|x| *x = (*x - mx).exp());
        let z: f64 = s.iter().sum();
        for (p, e) in w.probs[i * n..(i + 1) * n].iter_mut().zip(&s) {
            *p = stored(e / z, round);
        }
        for c in 0..d {
            let p = &w.probs[i * n..(i + 1) * n];
            w.out[c * m + i] = (0..n).map(|j| r(p[j]) * r(v.at(b, c, j))).sum();
            w.mag[c * m + i] = (0..n).map(|j| r(p[j]) * r(v.at(b, c, j)).abs()).sum();
        }
    }
    w
}

/// The tolerance of a value whose probabilities weigh `mag`, for a query whose largest score
/// is `smax`. The kernels sum in f32 in another order than float64, so a score or a
/// probability near an fp16 rounding boundary may round one fp16 step (2⁻¹⁰ relative) the
/// other way: a score's step moves its probability by up to 2⁻¹⁰·|s| relative and the
/// normaliser by as much, a probability's step by 2⁻¹⁰ relative, 2⁻²⁴ among subnormals.
/// With f32 intermediates only the sums' order: 1e-5 relative.
fn tolerance(mag: f64, smax: f64, round: DType) -> f64 {
    match round {
        DType::F16 => mag * (2f64).powi(-10) * (1.0 + 2.0 * smax) + (2f64).powi(-24) + 1e-7,
        _ => mag * 1e-5 * (1.0 + 2.0 * smax) + 1e-7,
    }
}

/// Compares a kernel's output and probabilities with batch entry `b`'s reference;
/// `probs_left` says the output is `[M][D]`. Returns the largest error over its tolerance
/// and the fraction of probabilities that equal the reference's exactly.
fn check(
    what: &str,
    (out, probs): (&[f32], Option<&[f32]>),
    want: &Want,
    probs_left: bool,
    round: DType,
) -> (f64, f64) {
    let (m, d) = (want.smax.len(), want.out.len() / want.smax.len());
    let mut worst = 0f64;
    for c in 0..d {
        for i in 0..m {
            let g = out[if probs_left { i * d + c } else { c * m + i }] as f64;
            let (w, tol) = (
                want.out[c * m + i],
                tolerance(want.mag[c * m + i], want.smax[i], round),
            );
            let err = (g - w).abs();
            assert!(
                err <= tol,
                "{what}: output ({c}, {i}): {g} vs {w} (err {err:e}, tolerance {tol:e})"
            );
            worst = worst.max(err / tol);
        }
    }
    let same = probs.map_or(1.0, |p| check_probs(what, p, want, round));
    (worst, same)
}

/// The probabilities `[M][N]` against the reference's, within [`tolerance`] and rounded
/// to `round`; returns the fraction equal to the reference's exactly.
fn check_probs(what: &str, p: &[f32], want: &Want, round: DType) -> f64 {
    let m = want.smax.len();
    let n = want.probs.len() / m;
    assert_eq!(p.len(), m * n, "{what}: probabilities");
    let mut eq = 0usize;
    for (e, (&g, &w)) in p.iter().zip(&want.probs).enumerate() {
        let (g, i) = (g as f64, e / n);
        let tol = tolerance(w, want.smax[i], round);
        assert!(
            (g - w).abs() <= tol,
            "{what}: probability ({i}, {}): {g} vs {w}",
            e % n
        );
        assert_eq!(g, stored(g, round), "{what}: a probability not rounded");
        eq += (g == w) as usize;
    }
    eq as f64 / p.len() as f64
}

fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

/// Three heads of a base-sized Whisper encoder window: queries, keys, values
/// [1, H, 64, 1500] in fp16 (Whisper's BC1S head layout: scores = qᵀ·k, output v·pᵀ),
/// scores and probabilities stored as fp16. Queries in ±1 and keys in ±0.5 give scores of a
/// few units, as Whisper's scaled queries do, so that the softmax is far from uniform.
struct WhisperWindow {
    q: Logical,
    k: Logical,
    v: Logical,
    x: Tensor,
    y: Tensor,
    vt: Tensor,
}

/// Heads, frames and head depth of a [`WhisperWindow`].
const WINDOW: (usize, usize, usize) = (3, 1500, 64);

impl WhisperWindow {
    fn new(seed: u64) -> Self {
        let (h, s, dh) = WINDOW;
        let mut r = Rng(seed);
        let mut logical = |b, rows, cols, scale| Logical {
            b,
            r: rows,
            c: cols,
            v: r.vals(h * s * dh, scale, DType::F16),
        };
        let (q, k, v) = (
            logical(h, s, dh, 1.0),
            logical(h, dh, s, 0.5),
            logical(h, dh, s, 1.0),
        );
        let (x, y, vt) = (
            q.tensor(&[1, h], true, DType::F16),
            k.tensor(&[1, h], false, DType::F16),
            v.tensor(&[1, h], false, DType::F16),
        );
        WhisperWindow { q, k, v, x, y, vt }
    }

    fn attention(&self) -> Attention<'_> {
        Attention {
            x: &self.x,
            tx: true,
            y: &self.y,
            ty: false,
            mask: None,
            round: [DType::F16; 3],
            v: &self.vt,
            tv: false,
            probs_left: false,
        }
    }
}

#[test]
fn whisper_encoder_self_attention_matches_float64_on_every_kernel() {
    // See `WhisperWindow`.
    let (h, s, dh) = WINDOW;
    let w = WhisperWindow::new(19);
    let (q, k, v) = (&w.q, &w.k, &w.v);
    assert_eq!(w.x.dims(), &[1, h, dh, s]);
    let a = w.attention();
    let wants: Vec<Want> = (0..h)
        .map(|b| reference(b, q, k, v, None, DType::F16))
        .collect();
    for kernel in kernels() {
        let (out, probs) = attention_with(&a, true, kernel).unwrap();
        assert_eq!(out.dims(), &[1, h, dh, s], "{kernel:?}");
        let (out, probs) = (f32s(&out), f32s(&probs.unwrap()));
        for (b, want) in wants.iter().enumerate() {
            let what = format!("{kernel:?}, head {b}");
            let (worst, same) = check(
                &what,
                (
                    &out[b * dh * s..(b + 1) * dh * s],
                    Some(&probs[b * s * s..(b + 1) * s * s]),
                ),
                want,
                false,
                DType::F16,
            );
            // The scores are rounded before the softmax: only scores and probabilities at
            // an fp16 rounding boundary may differ (without the scores' rounding about half
            // of the probabilities would).
            assert!(
                same > 0.99,
                "{what}: only {same} of the probabilities as rounded op by op"
            );
            eprintln!("{what}: worst error {worst:.3} of the tolerance, {same:.5} of the probabilities exact");
        }
    }
}

/// One case of the layout tests: batch [2, 3] of `m` queries of depth `kd` against `n`
/// keys shared over the first batch axis ([3, ..]), values [3, ..] of depth `d`, and one
/// causal-like mask [M, N] for all (far keys out at −30000, the others a small bias); the
/// four layout flags from the bits of `flags`, the mask where `flags % 3 != 0`.
struct LayoutCase {
    q: Logical,
    k: Logical,
    v: Logical,
    mk: Logical,
    x: Tensor,
    y: Tensor,
    vt: Tensor,
    mt: Tensor,
    flags: [bool; 4],
    with_mask: bool,
}

impl LayoutCase {
    fn new(
        seed: u64,
        (m, n, kd, d): (usize, usize, usize, usize),
        round: DType,
        flags: u32,
    ) -> Self {
        let [tx, ty, tv, probs_left] = [0, 1, 2, 3].map(|b| flags >> b & 1 == 1);
        let mut r = Rng(seed);
        let nb = 6;
        let q = Logical {
            b: nb,
            r: m,
            c: kd,
            v: r.vals(nb * m * kd, 2.0, round),
        };
        let k = Logical {
            b: 3,
            r: kd,
            c: n,
            v: r.vals(3 * kd * n, 1.0, round),
        };
        let v = Logical {
            b: 3,
            r: d,
            c: n,
            v: r.vals(3 * d * n, 1.0, round),
        };
        let mv: Vec<f64> = (0..m * n)
            .map(|e| match e % n > e / n + 3 {
                true => -30000.0,
                false => stored(r.next() * 0.5, round),
            })
            .collect();
        let mk = Logical {
            b: 1,
            r: m,
            c: n,
            v: mv,
        };
        let (x, y) = (q.tensor(&[2, 3], tx, round), k.tensor(&[3], ty, round));
        // op(v) is V [D, N], or Vᵀ [N, D] with the probabilities on the left.
        let vt = v.tensor(&[3], tv != probs_left, round);
        let mt = mk.tensor(&[], false, round);
        LayoutCase {
            q,
            k,
            v,
            mk,
            x,
            y,
            vt,
            mt,
            flags: [tx, ty, tv, probs_left],
            with_mask: !flags.is_multiple_of(3),
        }
    }

    fn attention(&self, round: DType) -> Attention<'_> {
        let [tx, ty, tv, probs_left] = self.flags;
        Attention {
            x: &self.x,
            tx,
            y: &self.y,
            ty,
            mask: self.with_mask.then_some(&self.mt),
            round: [round; 3],
            v: &self.vt,
            tv,
            probs_left,
        }
    }

    fn mask(&self) -> Option<&Logical> {
        self.with_mask.then_some(&self.mk)
    }
}

#[test]
fn every_layout_mask_and_tile_edge_matches_float64_on_every_kernel() {
    // 53 queries (a panel of 48 and a partial one), 37 keys and 11 values (partial tiles of
    // 8), depth 5; then the decode-step form's few queries (3 and 1) against 37 and 70 keys
    // (a whole 32-key step of the row kernels and a tail); batch [2, 3] with keys shared
    // over the first axis ([3, ..]), values [3, ..] and one mask [M, N] for all.
    let (kd, d) = (5, 11);
    let nb = 6;
    let mut case = 0;
    for (m, n) in [(53, 37), (3, 37), (1, 70)] {
        for round in [DType::F16, DType::F32] {
            for flags in 0..16u32 {
                let want_probs = flags % 2 == 0;
                case += 1;
                let c = LayoutCase::new(100 + case, (m, n, kd, d), round, flags);
                let [tx, ty, tv, probs_left] = c.flags;
                let with_mask = c.with_mask;
                let a = c.attention(round);
                let wants: Vec<Want> = (0..nb)
                    .map(|b| reference(b, &c.q, &c.k, &c.v, c.mask(), round))
                    .collect();
                for kernel in kernels() {
                    let what = format!(
                        "{kernel:?} {round:?} m {m} n {n} tx {tx} ty {ty} tv {tv} \
                     probs_left {probs_left} mask {with_mask}"
                    );
                    let (out, probs) = attention_with(&a, want_probs, kernel).unwrap();
                    let shape = if probs_left {
                        [2, 3, m, d]
                    } else {
                        [2, 3, d, m]
                    };
                    assert_eq!(out.dims(), &shape, "{what}");
                    assert_eq!(probs.is_some(), want_probs, "{what}");
                    let out = f32s(&out);
                    let probs = probs.map(|p| f32s(&p));
                    for (b, want) in wants.iter().enumerate() {
                        check(
                            &format!("{what}, entry {b}"),
                            (
                                &out[b * m * d..(b + 1) * m * d],
                                probs.as_ref().map(|p| &p[b * m * n..(b + 1) * m * n]),
                            ),
                            want,
                            probs_left,
                            round,
                        );
                    }
                }
            }
        }
    }
}

/// The bf16 panels' output for batch entry `b` against float64 sums on its own
/// probabilities: `Σ_j bf16(p_j)·bf16(v(c, j))` with the probabilities the kernel handed
/// out (each checked against the float64 softmax by [`check`]), within what f32 sums of
/// exact products can be off, 1e-5 of `Σ |terms|` plus 1e-7 (the bf16 products are exact
/// in f32; 1500 terms in random order stay far below their worst case). Returns the largest
/// error against the unrounded float64 attention over that same tolerance.
fn check_bf16_output(
    what: &str,
    (out, probs): (&[f32], &[f32]),
    (v, b): (&Logical, usize),
    exact: &Want,
    probs_left: bool,
) -> f64 {
    let (m, d) = (exact.smax.len(), v.r);
    let n = probs.len() / m;
    let mut unrounded = 0f64;
    for c in 0..d {
        for i in 0..m {
            let g = out[if probs_left { i * d + c } else { c * m + i }] as f64;
            let (mut want, mut mag) = (0f64, 0f64);
            for j in 0..n {
                let t = bf(probs[i * n + j] as f64) * bf(v.at(b, c, j));
                want += t;
                mag += t.abs();
            }
            let tol = 1e-5 * mag + 1e-7;
            assert!(
                (g - want).abs() <= tol,
                "{what}: output ({c}, {i}): {g} vs {want} from its own probabilities (err \
                 {:e}, tolerance {tol:e})",
                (g - want).abs()
            );
            let tol = 1e-5 * exact.mag[c * m + i] + 1e-7;
            unrounded = unrounded.max((g - exact.out[c * m + i]).abs() / tol);
        }
    }
    unrounded
}

/// The loose form for runs without the probabilities: the bf16 reference within the fp16
/// tolerance of [`check`] widened to a bf16 step (2⁻⁸): a probability that rounds one fp16
/// (or f32) step the other way may round one bf16 step the other way in the product.
fn check_bf16_loose(what: &str, out: &[f32], want: &Want, probs_left: bool) {
    let (m, d) = (want.smax.len(), want.out.len() / want.smax.len());
    for c in 0..d {
        for i in 0..m {
            let g = out[if probs_left { i * d + c } else { c * m + i }] as f64;
            let w = want.out[c * m + i];
            let tol =
                want.mag[c * m + i] * 2f64.powi(-8) * (1.0 + 2.0 * want.smax[i]) + 2f64.powi(-24);
            assert!(
                (g - w).abs() <= tol,
                "{what}: output ({c}, {i}): {g} vs {w} (tolerance {tol:e})"
            );
        }
    }
}

#[test]
fn bf16_panels_match_float64_attention_of_the_bf16_rounded_operands() {
    // A Whisper encoder's self-attention as in the first test (`WhisperWindow`).
    let (h, s, dh) = WINDOW;
    let w = WhisperWindow::new(23);
    let (q, k, v) = (&w.q, &w.k, &w.v);
    let a = w.attention();
    if !milkit::kernels::gemm::bf16_cpu() {
        // The kernel cannot run here: it must say so, never fall back.
        let e = attention_with(&a, false, Kernel::PanelsBf16).unwrap_err();
        assert!(format!("{e:#}").contains("AVX512-BF16"), "{e:#}");
        eprintln!("this CPU lacks AVX512-BF16: only the error is checked");
        return;
    }
    let (out, probs) = attention_with(&a, true, Kernel::PanelsBf16).unwrap();
    assert_eq!(out.dims(), &[1, h, dh, s]);
    let (out, probs) = (f32s(&out), f32s(&probs.unwrap()));
    // Without the probabilities handed out, the same result (they are only copied).
    let alone = f32s(&attention_with(&a, false, Kernel::PanelsBf16).unwrap().0);
    assert_eq!(out, alone);
    for b in 0..h {
        let what = format!("bf16 panels, head {b}");
        let want = reference_of(b, (q, k, v), None, DType::F16, Products::Bf16);
        let exact = reference(b, q, k, v, None, DType::F16);
        let (o, p) = (
            &out[b * dh * s..(b + 1) * dh * s],
            &probs[b * s * s..(b + 1) * s * s],
        );
        // The probabilities: the float64 softmax of the bf16 operands' scores, as the
        // f32 panels' are of theirs (scores and probabilities rounded to fp16); the output
        // near the bf16 reference, then exactly from those probabilities.
        let same = check_probs(&what, p, &want, DType::F16);
        check_bf16_loose(&what, o, &want, false);
        assert!(
            same > 0.99,
            "{what}: only {same} of the probabilities as the bf16 reference rounds them"
        );
        let unrounded = check_bf16_output(&what, (o, p), (v, b), &exact, false);
        // The operands are rounded: far outside f32's reach of the unrounded attention.
        assert!(
            unrounded > 10.0,
            "{what}: within {unrounded:.2}× the f32 tolerance of the unrounded attention: \
             no bf16 rounding seen"
        );
        eprintln!(
            "{what}: {same:.5} of the probabilities exact; {unrounded:.0}× the f32 \
             tolerance from the unrounded attention"
        );
    }
}

#[test]
fn bf16_panels_handle_every_layout_mask_and_odd_depth() {
    if !milkit::kernels::gemm::bf16_cpu() {
        return; // the error is checked by the test above
    }
    // As the layout test above: 53 queries, 37 keys (an odd count: the probabilities'
    // last pair half zero), depth 5 (odd: the last query/key pair half zero), 11 values,
    // batch [2, 3] with shared keys and values and one mask.
    let (m, n, kd, d) = (53, 37, 5, 11);
    let nb = 6;
    let mut case = 0;
    for round in [DType::F16, DType::F32] {
        for flags in 0..16u32 {
            let want_probs = flags % 2 == 0;
            case += 1;
            let c = LayoutCase::new(300 + case, (m, n, kd, d), round, flags);
            let [tx, ty, tv, probs_left] = c.flags;
            let with_mask = c.with_mask;
            let (q, k, v) = (&c.q, &c.k, &c.v);
            let a = c.attention(round);
            let what = format!(
                "bf16 panels {round:?} tx {tx} ty {ty} tv {tv} probs_left {probs_left} mask \
                 {with_mask}"
            );
            let (out, probs) = attention_with(&a, want_probs, Kernel::PanelsBf16).unwrap();
            assert_eq!(
                out.dims(),
                &if probs_left {
                    [2, 3, m, d]
                } else {
                    [2, 3, d, m]
                },
                "{what}"
            );
            let out = f32s(&out);
            let probs = probs.map(|p| f32s(&p));
            for b in 0..nb {
                let what = format!("{what}, entry {b}");
                let mask = c.mask();
                let want = reference_of(b, (q, k, v), mask, round, Products::Bf16);
                let o = &out[b * m * d..(b + 1) * m * d];
                check_bf16_loose(&what, o, &want, probs_left);
                if let Some(p) = &probs {
                    let p = &p[b * m * n..(b + 1) * m * n];
                    check_probs(&what, p, &want, round);
                    let exact = reference(b, q, k, v, mask, round);
                    check_bf16_output(&what, (o, p), (v, b), &exact, probs_left);
                }
            }
        }
    }
}
