//! Fused `softmax(op(x) @ op(y) [+ mask]) · v` computed a block of query rows at a time, so
//! the [M, N] score matrix never exists as a whole (for Whisper's 1500×1500 scores per
//! head that is 54 MB of f32 per op, whose allocation, page faults and conversions cost
//! more than the arithmetic). The caller states at which dtype each intermediate value is
//! stored by the unfused program (scores, masked scores, probabilities); the kernel rounds
//! to it, so the result equals the op-by-op computation up to f32 summation order.
//! Three forms ([`Kernel`]): a decode step's few query rows read keys and values as stored
//! ([`few_rows`]); many rows run as panels of 48 on `kernels::gemm`'s micro-kernel where
//! AVX-512 does (`kernels::attention_panel`), else as blocks of [`ROWS`] on candle's gemm.
//! A session computing bf16 products (`--compute bf16`) runs the panels on the bf16
//! micro-kernel ([`Kernel::PanelsBf16`]); the decode-step form and the blocks stay f32.

use super::attention_panel::{self as panel, Mat, Problem, Round};
use super::blend::BlendRows;
use super::data::{from_vec, to_f32};
use super::elementwise::broadcast_shape;
use super::fastmath;
use super::gemm::Inputs;
use super::gemv::wide::Patch;
use super::gemv::Isa;
use anyhow::{ensure, Result};
use candle_core::{DType, Tensor};
use half::f16;
use rayon::prelude::*;

/// Query rows per task. Each task's two gemms re-pack the keys and values, so blocks must
/// be tall enough to amortise that (measured on Whisper's 1500 × 1500 × 64 heads: 32 rows
/// 249 ms, 128 rows 200 ms, 256 rows 173 ms per layer); a 256 × 1500 f32 block (1.5 MB)
/// still stays in cache.
const ROWS: usize = 256;

/// One attention core. Scores are `op(x) @ op(y)` ([.., M, N], `op` transposing the last two
/// axes when the flag is set); the softmax runs over N.
pub struct Attention<'a> {
    pub x: &'a Tensor,
    pub tx: bool,
    pub y: &'a Tensor,
    pub ty: bool,
    /// Added to the scores before the softmax (broadcast to [.., M, N]).
    pub mask: Option<&'a Tensor>,
    /// dtype the scores are stored at, then the masked scores, then the probabilities.
    pub round: [DType; 3],
    pub v: &'a Tensor,
    pub tv: bool,
    /// true: result `P @ op(v)` ([.., M, D]); false: `op(v) @ Pᵀ` ([.., D, M]).
    pub probs_left: bool,
}

fn round_to(buf: &mut [f32], d: DType) {
    if d == DType::F16 {
        super::convert::round_f16(buf);
    } else if d == DType::BF16 {
        buf.iter_mut()
            .for_each(|v| *v = half::bf16::from_f32(*v).to_f32());
    }
}

/// Last two axes transposed when `t`.
fn op(m: Tensor, t: bool) -> Result<Tensor> {
    Ok(if t { m.t()? } else { m })
}

/// `t` [.., r, c] → [nb, r, c]: batch flattened and broadcast to `batch` (a zero stride when
/// `t` has one batch entry, a copy otherwise).
fn batched(t: &Tensor, batch: &[usize]) -> Result<Tensor> {
    let r = t.rank();
    let (rows, cols) = (t.dims()[r - 2], t.dims()[r - 1]);
    let nb: usize = batch.iter().product();
    let mut full = batch.to_vec();
    full.extend([rows, cols]);
    let mut t = t.clone();
    while t.rank() < full.len() {
        t = t.unsqueeze(0)?;
    }
    let t = if t.dims() == full.as_slice() {
        t
    } else {
        t.broadcast_as(full)?
    };
    if t.is_contiguous() {
        return Ok(t.reshape((nb, rows, cols))?);
    }
    if t.dims()[..batch.len()]
        .iter()
        .zip(t.stride())
        .all(|(&d, &s)| d == 1 || s == 0)
    {
        let one = t.contiguous_one_batch(batch.len())?;
        return Ok(one
            .reshape((1, rows, cols))?
            .broadcast_as((nb, rows, cols))?);
    }
    Ok(t.contiguous()?.reshape((nb, rows, cols))?)
}

trait OneBatch {
    fn contiguous_one_batch(&self, nbatch: usize) -> Result<Tensor>;
}
impl OneBatch for Tensor {
    /// The first batch entry of a batch-broadcast tensor, contiguous.
    fn contiguous_one_batch(&self, nbatch: usize) -> Result<Tensor> {
        let mut t = self.clone();
        for _ in 0..nbatch {
            t = t.get(0)?;
        }
        Ok(t.contiguous()?)
    }
}

/// Which implementation computes the many-row form (more than [`FEW`] query rows; fewer
/// always run the decode-step form).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// Blocks of [`ROWS`] query rows, each through two candle f32 gemms: any dtype and
    /// layout, and the runtime's choice where the CPU lacks AVX-512.
    Blocks,
    /// Panels of 48 query rows on `kernels::gemm`'s micro-kernels at this level
    /// (`kernels::attention_panel`), where there are at least 48 queries and every
    /// intermediate is stored as f32 or fp16 (others take [`Kernel::Blocks`]). The
    /// portable and FMA levels are its tested fallbacks, not fast ones.
    Panels(Isa),
    /// The panels with both products on bf16-rounded operands and f32 sums (the bf16
    /// micro-kernel, `vdpbf16ps`; an evaluation mode): where the panels apply, else the
    /// blocks in f32. An error where the CPU lacks AVX512-BF16.
    PanelsBf16,
}

impl Kernel {
    /// The runtime's choice: panels where AVX-512 runs them ([`Isa::best`], so a capped
    /// level picks the blocks), blocks elsewhere.
    pub fn best() -> Kernel {
        match Isa::best() {
            Isa::Avx512 => Kernel::Panels(Isa::Avx512),
            _ => Kernel::Blocks,
        }
    }

    /// The runtime's choice for a session whose encoder-sized products multiply `inputs`:
    /// [`Kernel::PanelsBf16`] for bf16 products, else [`Kernel::best`].
    pub fn for_products(inputs: Inputs) -> Kernel {
        match inputs {
            Inputs::Bf16 => Kernel::PanelsBf16,
            Inputs::F32 => Kernel::best(),
        }
    }
}

/// Computes the fused attention; returns f32.
pub fn attention(a: &Attention) -> Result<Tensor> {
    Ok(attention_probs(a, false)?.0)
}

/// [`attention`], and with `want_probs` also the probabilities `[.., M, N]` (f32, rounded
/// to `round[2]`), for programs that read them elsewhere too (alignment heads).
pub fn attention_probs(a: &Attention, want_probs: bool) -> Result<(Tensor, Option<Tensor>)> {
    attention_with(a, want_probs, Kernel::best())
}

/// `(M, N, K, D)`: M queries of depth K against N keys, values of depth D.
type Dims = (usize, usize, usize, usize);

/// The batch shape and the [`Dims`] of an attention.
fn shapes(a: &Attention) -> Result<(Vec<usize>, Dims)> {
    let (xr, yr, vr) = (a.x.rank(), a.y.rank(), a.v.rank());
    ensure!(
        xr >= 2 && yr >= 2 && vr >= 2,
        "attention operands need rank ≥ 2"
    );
    let dims2 = |t: &Tensor, tr: bool| {
        let r = t.rank();
        let (p, q) = (t.dims()[r - 2], t.dims()[r - 1]);
        if tr {
            (q, p)
        } else {
            (p, q)
        }
    };
    let ((m, k), (k2, n)) = (dims2(a.x, a.tx), dims2(a.y, a.ty));
    ensure!(
        k == k2,
        "attention scores: inner dimensions {k} and {k2} differ"
    );
    let (vp, vq) = dims2(a.v, a.tv);
    let d = if a.probs_left { vq } else { vp };
    ensure!(
        if a.probs_left { vp == n } else { vq == n },
        "attention values {:?} do not match {n} keys",
        a.v.dims()
    );
    let mut batch = broadcast_shape(&a.x.dims()[..xr - 2], &a.y.dims()[..yr - 2])?;
    batch = broadcast_shape(&batch, &a.v.dims()[..vr - 2])?;
    Ok((batch, (m, n, k, d)))
}

/// The decode-step attention with its keys and/or values the rows of a cache blend
/// `a·b + c·d` ([`BlendRows`]) instead of a tensor: `a.y` / `a.v` then only give the shape
/// (a broadcast placeholder). Each head's rows are filled where they are read, so the
/// blended cache is never written whole. `None` where the decode-step form does not apply
/// (more queries, other layouts): the caller computes the blend and calls [`attention_probs`].
pub fn attention_blended(
    a: &Attention,
    want_probs: bool,
    fill: [Option<&BlendRows>; 2],
) -> Result<Option<(Tensor, Option<Tensor>)>> {
    let (batch, dims) = shapes(a)?;
    few_rows(a, &batch, dims, want_probs, fill)
}

/// [`attention_probs`] on the given many-row `kernel` (benchmarks and tests time and check
/// each).
pub fn attention_with(
    a: &Attention,
    want_probs: bool,
    kernel: Kernel,
) -> Result<(Tensor, Option<Tensor>)> {
    let (batch, (m, n, k, d)) = shapes(a)?;
    let nb: usize = batch.iter().product();
    if let Some(r) = few_rows(a, &batch, (m, n, k, d), want_probs, [None, None])? {
        return Ok(r);
    }
    let panelled = match kernel {
        Kernel::Panels(isa) => Some((isa, Inputs::F32)),
        Kernel::PanelsBf16 => Some((Isa::Avx512, Inputs::Bf16)),
        Kernel::Blocks => None,
    };
    if let Some((isa, inputs)) = panelled {
        if let Some(r) = panels(a, &batch, (m, n, k, d), want_probs, isa, inputs)? {
            return Ok(r);
        }
    }
    let x = batched(&to_f32(a.x)?, &batch)?;
    let y = batched(&to_f32(a.y)?, &batch)?;
    let v = batched(&to_f32(a.v)?, &batch)?;
    let mask = a
        .mask
        .map(|mk| -> Result<Tensor> {
            let mut full = batch.clone();
            full.extend([m, n]);
            ensure!(
                broadcast_shape(mk.dims(), &full)? == full,
                "mask {:?} does not broadcast to scores {full:?}",
                mk.dims()
            );
            let mut mk = to_f32(mk)?;
            while mk.rank() < full.len() {
                mk = mk.unsqueeze(0)?;
            }
            batched(&mk.broadcast_as(full)?, &batch)
        })
        .transpose()?;
    let blocks: Vec<(usize, usize)> = (0..nb)
        .flat_map(|b| (0..m).step_by(ROWS).map(move |r| (b, r)))
        .collect();
    let parts = blocks
        .par_iter()
        .map(|&(b, r0)| -> Result<(Vec<f32>, Vec<f32>)> {
            let rb = ROWS.min(m - r0);
            let xb = op(x.get(b)?, a.tx)?.narrow(0, r0, rb)?;
            let s = xb.matmul(&op(y.get(b)?, a.ty)?)?;
            let mut buf = super::data::to_vec::<f32>(&s)?;
            round_to(&mut buf, a.round[0]);
            if let Some(mk) = &mask {
                let rows = mk.get(b)?.narrow(0, r0, rb)?;
                let mv = super::data::to_vec::<f32>(&rows)?;
                buf.iter_mut().zip(&mv).for_each(|(s, m)| *s += m);
                round_to(&mut buf, a.round[1]);
            }
            for row in buf.chunks_mut(n) {
                let mx = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                row.iter_mut().for_each(|e| *e = fastmath::exp(*e - mx));
                let inv = 1.0 / row.iter().sum::<f32>();
                row.iter_mut().for_each(|e| *e *= inv);
            }
            round_to(&mut buf, a.round[2]);
            let kept = if want_probs { buf.clone() } else { vec![] };
            let p = from_vec(buf, &[rb, n])?;
            let vb = op(v.get(b)?, a.tv)?;
            let o = if a.probs_left {
                p.matmul(&vb)?
            } else {
                vb.matmul(&p.t()?)?
            };
            Ok((super::data::to_vec::<f32>(&o)?, kept))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut probs = if want_probs {
        vec![0f32; nb * m * n]
    } else {
        vec![]
    };
    // Assemble blocks: [nb, M, D] rows, or [nb, D, M] column strips.
    let mut out = vec![0f32; nb * m * d];
    for (&(b, r0), (part, pb)) in blocks.iter().zip(parts) {
        let rb = ROWS.min(m - r0);
        if want_probs {
            probs[(b * m + r0) * n..(b * m + r0 + rb) * n].copy_from_slice(&pb);
        }
        if a.probs_left {
            out[(b * m + r0) * d..(b * m + r0 + rb) * d].copy_from_slice(&part);
        } else {
            for (i, line) in part.chunks(rb).enumerate() {
                let at = (b * d + i) * m + r0;
                out[at..at + rb].copy_from_slice(line);
            }
        }
    }
    let mut pshape = batch.clone();
    pshape.extend([m, n]);
    let mut shape = batch;
    if a.probs_left {
        shape.extend([m, d]);
    } else {
        shape.extend([d, m]);
    }
    let probs = want_probs.then(|| from_vec(probs, &pshape)).transpose()?;
    Ok((from_vec(out, &shape)?, probs))
}

/// `t` [.., r, c] as f32 batch entries `[.., r, c]` contiguous, and the step between
/// entries for `batch`: 0 when one entry serves them all, `r·c` otherwise (converted as it
/// lies when its batch is `batch` or a single entry, broadcast and copied otherwise).
fn flat(t: &Tensor, batch: &[usize]) -> Result<(Vec<f32>, usize)> {
    let r = t.rank();
    let per = t.dims()[r - 2] * t.dims()[r - 1];
    let own: usize = t.dims()[..r - 2].iter().product();
    let nb: usize = batch.iter().product();
    Ok(if own == 1 {
        (super::data::to_f32_vec(t)?, 0)
    } else if own == nb {
        (super::data::to_f32_vec(t)?, per)
    } else {
        let full = batched(&to_f32(t)?, batch)?.contiguous()?;
        (super::data::to_f32_vec(&full)?, per)
    })
}

/// The many-row form on [`attention_panel`](super::attention_panel) (products of `inputs`):
/// `None` where a stored dtype is neither f32 nor fp16, or there are fewer queries than one
/// panel (the blocks handle those).
fn panels(
    a: &Attention,
    batch: &[usize],
    (m, n, k, d): (usize, usize, usize, usize),
    want_probs: bool,
    isa: Isa,
    inputs: Inputs,
) -> Result<Option<(Tensor, Option<Tensor>)>> {
    let mut round = [Round::None; 3];
    for (r, dt) in round.iter_mut().zip(a.round) {
        *r = match dt {
            DType::F32 => Round::None,
            DType::F16 => Round::F16,
            _ => return Ok(None),
        };
    }
    // Fewer queries than a panel would mostly compute padding (and still pack every key
    // and value once): the blocks do better there.
    if m < panel::NR || n == 0 || k == 0 || d == 0 {
        return Ok(None);
    }
    let nb: usize = batch.iter().product();
    let (x, y, v) = (flat(a.x, batch)?, flat(a.y, batch)?, flat(a.v, batch)?);
    let mask = a
        .mask
        .map(|mk| -> Result<(Vec<f32>, usize)> {
            let mut full = batch.to_vec();
            full.extend([m, n]);
            ensure!(
                broadcast_shape(mk.dims(), &full)? == full,
                "mask {:?} does not broadcast to scores {full:?}",
                mk.dims()
            );
            let mut mk = mk.clone();
            while mk.rank() < 2 {
                mk = mk.unsqueeze(0)?;
            }
            if mk.dims()[mk.rank() - 2..] != [m, n] {
                let mut rows = mk.dims()[..mk.rank() - 2].to_vec();
                rows.extend([m, n]);
                mk = mk.broadcast_as(rows)?;
            }
            flat(&mk, batch)
        })
        .transpose()?;
    // Element (r, c) of the stored [p, q] matrix is at r·q + c; a transposed operand reads
    // it the other way round.
    fn mat((data, step): &(Vec<f32>, usize), q: usize, t: bool) -> Mat<'_> {
        let (rs, cs) = if t { (1, q) } else { (q, 1) };
        Mat {
            data,
            step: *step,
            rs,
            cs,
        }
    }
    let last = |t: &Tensor| t.dims()[t.rank() - 1];
    // Q [M, k] = op(x); K [k, N] = op(y); V [D, N]: op(v), or op(v)ᵀ when the
    // probabilities are on the left.
    let p = Problem {
        nb,
        m,
        n,
        k,
        d,
        q: mat(&x, last(a.x), a.tx),
        keys: mat(&y, last(a.y), a.ty),
        v: mat(&v, last(a.v), a.tv != a.probs_left),
        mask: mask.as_ref().map(|mk| mat(mk, n, false)),
        round,
        probs_left: a.probs_left,
    };
    let (out, probs) = panel::attention(&p, want_probs, isa, inputs)?;
    let mut shape = batch.to_vec();
    shape.extend(if a.probs_left { [m, d] } else { [d, m] });
    let mut pshape = batch.to_vec();
    pshape.extend([m, n]);
    let probs = want_probs.then(|| from_vec(probs, &pshape)).transpose()?;
    Ok(Some((from_vec(out, &shape)?, probs)))
}

/// Query rows up to which [`few_rows`] runs (a decode step has one).
const FEW: usize = 4;

/// Rows of a contiguous fp16 or f32 buffer, converted to f32 one row at a time.
#[derive(Clone, Copy)]
enum Rows<'a> {
    H(&'a [f16]),
    F(&'a [f32]),
}

impl<'a> Rows<'a> {
    fn f16(&self) -> Option<&'a [f16]> {
        match *self {
            Rows::H(h) => Some(h),
            Rows::F(_) => None,
        }
    }

    fn row(&self, i: usize, n: usize, buf: &mut [f32]) {
        match self {
            Rows::H(s) => super::convert::f16_to_f32(&s[i * n..(i + 1) * n], buf),
            Rows::F(s) => buf.copy_from_slice(&s[i * n..(i + 1) * n]),
        }
    }

    /// `s += Σ_r q[r] · row(row0 + r)` over `q.len()` rows of `n = s.len()`; fp16 rows
    /// converted in registers, row after row on AVX-512 (one sequential stream), four at a
    /// time on AVX2 (`buf`: scratch for the f32 rows).
    fn axpy(&self, row0: usize, q: &[f32], s: &mut [f32], buf: &mut [f32], simd: bool, wide: bool) {
        let n = s.len();
        let mut r = 0;
        if let (Rows::H(h), true) = (self, wide) {
            let w = &h[row0 * n..(row0 + q.len()) * n];
            super::gemv::wide::axpy_rows_f16(w, q, s, true);
            return;
        }
        if let Rows::H(h) = self {
            while r + 4 <= q.len() {
                let w = &h[(row0 + r) * n..(row0 + r + 4) * n];
                let qv = [q[r], q[r + 1], q[r + 2], q[r + 3]];
                super::gemv::simd::axpy4_f16(w, qv, s, simd);
                r += 4;
            }
        }
        for (r, &qv) in q.iter().enumerate().skip(r) {
            self.row(row0 + r, n, buf);
            s.iter_mut().zip(&*buf).for_each(|(s, y)| *s += qv * y);
        }
    }

    /// `row(i) · p` (fp16 rows converted in registers).
    fn dot(&self, i: usize, p: &[f32], buf: &mut [f32], simd: bool) -> f32 {
        let n = p.len();
        match self {
            Rows::H(h) => super::gemv::simd::dot_f16(&h[i * n..(i + 1) * n], p, simd),
            Rows::F(_) => {
                self.row(i, n, buf);
                fastmath::dot(buf, p)
            }
        }
    }
}

fn with_rows<R>(t: &Tensor, f: impl FnOnce(Rows) -> Result<R>) -> Result<Option<R>> {
    Ok(Some(match t.dtype() {
        DType::F16 => super::data::with_slice(t, |s: &[f16]| f(Rows::H(s)))??,
        DType::F32 => super::data::with_slice(t, |s: &[f32]| f(Rows::F(s)))??,
        _ => return Ok(None),
    }))
}

static IN_PLACE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How many heads' keys or values decode steps have read in place from a one-hot cache
/// blend so far (tests check that the path is taken).
pub fn in_place_reads() -> usize {
    IN_PLACE.load(std::sync::atomic::Ordering::Relaxed)
}

/// Where a decode step reads its keys or values: a tensor's rows, or the rows of a cache
/// blend ([`BlendRows`]) filled head by head where they are read.
#[derive(Clone, Copy)]
enum Heads<'a> {
    Rows(Rows<'a>),
    Blend(&'a BlendRows<'a>),
}

impl<'a> Heads<'a> {
    /// Head `b`'s `rows` rows of `n`, and the row they start at: in the tensor, or filled
    /// into `buf` (starting at 0).
    fn head<'s>(&self, b: usize, rows: usize, n: usize, buf: &'s mut Vec<f16>) -> (Rows<'s>, usize)
    where
        'a: 's,
    {
        match *self {
            Heads::Rows(r) => (r, b * rows),
            Heads::Blend(br) => {
                buf.resize(rows * n, f16::ZERO);
                br.fill(b * rows, buf);
                (Rows::H(buf), 0)
            }
        }
    }

    /// Head `b`'s rows of a one-hot cache blend read in place ([`BlendRows::in_place`]):
    /// the cache's rows, and the token's column with its values in `vals`.
    fn in_place<'s>(
        &self,
        b: usize,
        rows: usize,
        vals: &'s mut Vec<f16>,
    ) -> Option<(&'a [f16], Patch<'s>)> {
        let Heads::Blend(br) = *self else { return None };
        let (w, col) = br.in_place(b * rows, rows, vals)?;
        IN_PLACE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Some((w, Patch { col, vals }))
    }
}

fn with_heads<R>(
    t: &Tensor,
    fill: Option<&BlendRows>,
    f: impl FnOnce(Heads) -> Result<R>,
) -> Result<Option<R>> {
    match fill {
        Some(br) => f(Heads::Blend(br)).map(Some),
        None => with_rows(t, |r| f(Heads::Rows(r))),
    }
}

/// A head's index, its part of the result and, where they are wanted, of the
/// probabilities ([`few_rows`]).
type HeadOut<'o> = (usize, &'o mut [f32], Option<&'o mut [f32]>);

/// What every head of a decode-step attention reads ([`few_rows`]).
struct Head<'h, 'a> {
    a: &'h Attention<'h>,
    /// This head's index in the batch.
    b: usize,
    m: usize,
    n: usize,
    k: usize,
    d: usize,
    /// The queries, `[nb, m, k]` f32.
    q: &'h [f32],
    /// The mask broadcast to `[nb, m, n]`, f32.
    mask: Option<&'h [f32]>,
    ky: Heads<'a>,
    vv: Heads<'a>,
    simd: bool,
    wide: bool,
}

/// A worker's buffers for [`head`], reused from call to call (see `super::with_local`).
#[derive(Default)]
struct Scratch {
    /// The head's scores, then its probabilities (`m·n`).
    s: Vec<f32>,
    /// One row widened to f32.
    buf: Vec<f32>,
    /// Blended keys' and values' rows, filled whole before they are read.
    kh: Vec<f16>,
    vh: Vec<f16>,
    /// The token's column where a blend is read in place.
    kc: Vec<f16>,
    vc: Vec<f16>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

/// One head of [`few_rows`]: its result `[d, m]` into `o` (zeroed by the caller) and its
/// probabilities left in `sc.s[..m·n]`.
fn head(h: &Head, sc: &mut Scratch, o: &mut [f32]) {
    let Head {
        a,
        b,
        m,
        n,
        k,
        d,
        q,
        mask,
        ky,
        vv,
        simd,
        wide,
    } = *h;
    let Scratch {
        s,
        buf,
        kh,
        vh,
        kc,
        vc,
    } = sc;
    s.clear();
    s.resize(m * n, 0.0);
    buf.resize(n, 0.0);
    let query = |i: usize| &q[(b * m + i) * k..(b * m + i + 1) * k];
    // The values read in place (a one-hot cache blend's rows, the token's column patched
    // in) where there is one query.
    let vplace = match (m, wide) {
        (1, true) => vv.in_place(b, d, vc),
        _ => None,
    };
    // This head's keys: a one-hot cache blend's rows read in place with the token's column
    // patched in, unless a score comes out infinite or NaN (then the blend's own rows,
    // which may differ there); else rows of the tensor, or its rows of the blend filled
    // here (they stay in this core's cache).
    let mut direct = false;
    if let (true, Some((w, patch))) = (wide, ky.in_place(b, k, kc)) {
        for (i, si) in s.chunks_mut(n).enumerate() {
            super::gemv::wide::axpy_rows_f16_patched(w, query(i), si, Some(patch), true);
        }
        direct = fastmath::all_finite(s);
        if !direct {
            s.fill(0.0);
        }
    }
    if !direct {
        let (ky, k0) = ky.head(b, k, n, kh);
        for (i, si) in s.chunks_mut(n).enumerate() {
            ky.axpy(k0, query(i), si, buf, simd, wide);
        }
    }
    round_to(s, a.round[0]);
    if let Some(mk) = mask {
        let mb = &mk[b * m * n..(b + 1) * m * n];
        s.iter_mut().zip(mb).for_each(|(s, m)| *s += m);
        round_to(s, a.round[1]);
    }
    s.chunks_mut(n).for_each(fastmath::softmax);
    round_to(s, a.round[2]);
    // The values likewise: in place where the result stays finite.
    let mut direct = false;
    if let Some((w, patch)) = vplace {
        super::gemv::wide::f16_rows_patched(w, s, o, Some(patch), true);
        direct = fastmath::all_finite(o);
    }
    if !direct {
        let (vv, v0) = vv.head(b, d, n, vh);
        // One query row against fp16 values: the `d` value rows in one pass of the row
        // kernel (AVX-512).
        if let (Some(hv), 1, true) = (vv.f16(), m, wide) {
            super::gemv::wide::f16_rows(&hv[v0 * n..(v0 + d) * n], s, o, true);
        } else {
            for r in 0..d {
                for i in 0..m {
                    o[r * m + i] = vv.dot(v0 + r, &s[i * n..(i + 1) * n], buf, simd);
                }
            }
        }
    }
}

/// The decode-step form: a few query rows against keys `[.., K, N]` and values `[.., D, N]`
/// (Whisper's head layout, result `[.., D, M]`), reading keys and values in their storage
/// dtype row by row — no f32 copy of a 1500-position cross-attention cache per token.
/// `None` when the operands have another layout.
fn few_rows(
    a: &Attention,
    batch: &[usize],
    (m, n, k, d): (usize, usize, usize, usize),
    want_probs: bool,
    fill: [Option<&BlendRows>; 2],
) -> Result<Option<(Tensor, Option<Tensor>)>> {
    if m > FEW || a.ty || a.tv || a.probs_left || a.y.dtype() != a.v.dtype() {
        return Ok(None);
    }
    // Blended keys or values must be exactly the batch's heads of rows of `n`.
    for (br, t, rows) in [(fill[0], a.y, k), (fill[1], a.v, d)] {
        if let Some(br) = br {
            let r = t.rank();
            if t.dims()[..r - 2] != *batch
                || br.dims.last() != Some(&n)
                || br.rows() != batch.iter().product::<usize>() * rows
            {
                return Ok(None);
            }
        }
    }
    let nb: usize = batch.iter().product();
    let q = op(batched(&to_f32(a.x)?, batch)?, a.tx)?;
    let q = super::data::to_vec::<f32>(&q.contiguous()?)?; // [nb, m, k]
    let mask = match a.mask {
        Some(mk) => {
            let mut full = batch.to_vec();
            full.extend([m, n]);
            let mut mk = to_f32(mk)?;
            while mk.rank() < full.len() {
                mk = mk.unsqueeze(0)?;
            }
            Some(super::data::to_vec::<f32>(
                &mk.broadcast_as(full)?.contiguous()?,
            )?)
        }
        None => None,
    };
    // Placeholders stand for blended operands (filled per head below).
    let operand = |t: &Tensor, filled: bool| match filled {
        true => Ok(t.clone()),
        false => batched(t, batch),
    };
    let (y, v) = (
        operand(a.y, fill[0].is_some())?,
        operand(a.v, fill[1].is_some())?,
    );
    let isa = super::gemv::Isa::best();
    let (simd, wide) = (
        isa != super::gemv::Isa::Portable,
        isa == super::gemv::Isa::Avx512,
    );
    // Each head writes its own part of the result (and of the probabilities), so the
    // parallel loop allocates nothing: with glibc's one arena (`crate::alloc::one_arena`)
    // the two workers' allocations there waited on each other.
    let mut out = vec![0f32; nb * d * m];
    let mut probs = vec![0f32; if want_probs { nb * m * n } else { 0 }];
    let mut parts: Vec<HeadOut> = Vec::with_capacity(nb);
    let mut pchunks = probs.chunks_mut((m * n).max(1));
    for (b, o) in out.chunks_mut((d * m).max(1)).enumerate() {
        parts.push((b, o, if want_probs { pchunks.next() } else { None }));
    }
    let done = with_heads(&y, fill[0], |ky| {
        with_heads(&v, fill[1], |vv| {
            parts.into_par_iter().for_each(|(b, o, p)| {
                super::with_local(&SCRATCH, |sc| {
                    head(
                        &Head {
                            a,
                            b,
                            m,
                            n,
                            k,
                            d,
                            q: &q,
                            mask: mask.as_deref(),
                            ky,
                            vv,
                            simd,
                            wide,
                        },
                        sc,
                        o,
                    );
                    if let Some(p) = p {
                        p.copy_from_slice(&sc.s[..m * n]);
                    }
                })
            });
            Ok(())
        })?
        .ok_or_else(|| anyhow::anyhow!("values are neither fp16 nor f32"))
    })?;
    if done.is_none() {
        return Ok(None);
    }
    let mut shape = batch.to_vec();
    shape.extend([d, m]);
    let mut pshape = batch.to_vec();
    pshape.extend([m, n]);
    let probs = want_probs.then(|| from_vec(probs, &pshape)).transpose()?;
    Ok(Some((from_vec(out, &shape)?, probs)))
}
