//! `a·b + c·d` with broadcasting in one pass, each product and the sum rounded to the
//! operands' storage dtype exactly as three separate elementwise ops would round them. A
//! decoder that keeps its KV cache as inputs merges this token's key/value into it as
//! `cache·(1 − mask) + new·mask` per layer: op by op that is three full passes over the
//! cache (two of them writing a cache-sized intermediate); here it is one.

use super::data::{from_f32, from_vec, strides};
use super::elementwise::{binary, broadcast_shape, BinOp};
use anyhow::{anyhow, Result};
use candle_core::{DType, Storage, Tensor};
use half::f16;
use rayon::prelude::*;

/// Output rows (of the last axis) per parallel task: ≥ 16 K elements a task.
const MIN_TASK: usize = 1 << 14;

/// An operand's elements, borrowed from its storage.
#[derive(Clone, Copy)]
enum Data<'a> {
    H(&'a [f16]),
    F(&'a [f32]),
}

/// One operand: its elements, its offset for each output row and its step along the row
/// (0 when it is broadcast along the last axis).
struct Operand<'a> {
    v: Data<'a>,
    rows: Offsets,
    step: usize,
}

/// Where each output row of an operand starts.
enum Offsets {
    /// Row `r` at `r·s`: the leading axes collapse to one (a contiguous cache, a per-row
    /// value, or `s = 0` for one row broadcast to all) — no table to build per call.
    Step(usize),
    /// Any other broadcast: one offset per row.
    Table(Vec<usize>),
}

impl<'a> Operand<'a> {
    fn new(v: Data<'a>, dims: &[usize], out: &[usize]) -> Operand<'a> {
        let n = out.len();
        let mut full = vec![1; n - dims.len()];
        full.extend_from_slice(dims);
        let mut st = strides(&full);
        for (s, &d) in st.iter_mut().zip(&full) {
            if d == 1 {
                *s = 0;
            }
        }
        // The leading axes of more than one row collapse to one when each one's stride is
        // the next one's times its length (or all are broadcast).
        let lead: Vec<usize> = (0..n - 1).filter(|&ax| out[ax] > 1).collect();
        let collapses = lead.windows(2).all(|w| st[w[0]] == st[w[1]] * out[w[1]]);
        let rows = match (collapses, lead.last()) {
            (true, Some(&ax)) => Offsets::Step(st[ax]),
            (true, None) => Offsets::Step(0),
            _ => Offsets::Table(Self::table(&st, out)),
        };
        Operand {
            v,
            rows,
            step: st[n - 1],
        }
    }

    /// Each row's offset, counting the row index like an odometer over the leading axes
    /// (a division per axis and row cost more than the blend of a decode step).
    fn table(st: &[usize], out: &[usize]) -> Vec<usize> {
        let n = out.len();
        let rows: usize = out[..n - 1].iter().product();
        let mut row_base = Vec::with_capacity(rows);
        let mut idx = vec![0usize; n - 1];
        let mut off = 0usize;
        for _ in 0..rows {
            row_base.push(off);
            for ax in (0..n - 1).rev() {
                idx[ax] += 1;
                off += st[ax];
                if idx[ax] < out[ax] {
                    break;
                }
                off -= idx[ax] * st[ax];
                idx[ax] = 0;
            }
        }
        row_base
    }

    /// Where output row `r` starts in this operand.
    fn base(&self, r: usize) -> usize {
        match &self.rows {
            Offsets::Step(s) => r * s,
            Offsets::Table(t) => t[r],
        }
    }

    /// Whether every output row reads the same elements.
    fn one_row(&self) -> bool {
        match &self.rows {
            Offsets::Step(s) => *s == 0,
            Offsets::Table(t) => t.iter().all(|&b| b == t[0]),
        }
    }

    /// Output row `r` of this operand, as f32, into `buf`.
    fn row(&self, r: usize, buf: &mut [f32]) {
        let b = self.base(r);
        match (self.v, self.step) {
            (Data::H(v), 0) => buf.fill(v[b].to_f32()),
            (Data::F(v), 0) => buf.fill(v[b]),
            (Data::H(v), _) => super::convert::f16_to_f32(&v[b..b + buf.len()], buf),
            (Data::F(v), _) => buf.copy_from_slice(&v[b..b + buf.len()]),
        }
    }
}

/// The output shape of `a·b + c·d` (rank ≥ 1), or an error when the operands do not
/// broadcast.
fn out_shape(a: &Tensor, b: &Tensor, c: &Tensor, d: &Tensor) -> Result<Vec<usize>> {
    let mut out = broadcast_shape(a.dims(), b.dims())?;
    out = broadcast_shape(&out, &broadcast_shape(c.dims(), d.dims())?)?;
    if out.is_empty() {
        out.push(1);
    }
    Ok(out)
}

/// Calls `f` with the four operands (fp16 or f32, all `dt`) laid against the output shape.
fn with_operands<R>(
    ts: [&Tensor; 4],
    out: &[usize],
    dt: DType,
    f: impl FnOnce(Vec<Operand>) -> R,
) -> Result<R> {
    let ts = ts
        .iter()
        .map(|t| {
            Ok(if t.is_contiguous() {
                (*t).clone()
            } else {
                t.contiguous()?
            })
        })
        .collect::<Result<Vec<Tensor>>>()?;
    let guards: Vec<_> = ts.iter().map(|t| t.storage_and_layout()).collect();
    let mut ops = Vec::with_capacity(4);
    for ((g, layout), t) in guards.iter().zip(&ts) {
        let Storage::Cpu(cs) = &**g else {
            return Err(anyhow!("only CPU tensors are supported"));
        };
        let (s0, s1) = layout
            .contiguous_offsets()
            .ok_or_else(|| anyhow!("tensor is not contiguous"))?;
        let v = match dt {
            DType::F16 => Data::H(&cs.as_slice::<f16>()?[s0..s1]),
            _ => Data::F(&cs.as_slice::<f32>()?[s0..s1]),
        };
        ops.push(Operand::new(v, t.dims(), out));
    }
    Ok(f(ops))
}

/// The rows (of the last axis) of `a·b + c·d` on fp16 operands, computed on demand: a
/// consumer that reads the result row by row (a decode step's attention over a blended KV
/// cache) fills each row where it needs it, and the whole result is never written.
pub struct BlendRows<'a> {
    ops: Vec<Operand<'a>>,
    /// The output shape; rows are of its last axis.
    pub dims: Vec<usize>,
    /// Where most of a row is one operand passed through (a cache blend with a one-hot
    /// mask), how to copy it.
    pass: Option<Pass>,
}

/// A blend `v·w + o·u` (in either operand order) whose weights `w` and `u` are one row for
/// every output row, and whose second value `o` is one number per output row: in each
/// column where `w` is exactly 1 and `u` exactly 0 the result is `v`'s element itself, so
/// a row is `v`'s row copied with only the other columns computed. Exact wherever `o` is
/// finite and `v`'s row holds no infinity, NaN or −0 (−0 + +0 rounds to +0): rows that do
/// are computed whole.
struct Pass {
    /// The operand whose row is passed through (`v`), and the per-row value (`o`).
    v: usize,
    o: usize,
    /// The columns computed by the formula (where the mask is not 0 / 1).
    general: Vec<usize>,
}

impl Pass {
    /// The plan for `ops` (`a, b, c, d` of `a·b + c·d`) with rows of `len`, if it applies
    /// and at most a quarter of each row must be computed.
    fn plan(ops: &[Operand], len: usize) -> Option<Pass> {
        let row_const = |op: &Operand| op.step == 1 && op.one_row();
        // Each product as (value, weight) with a weight that is one row for all rows.
        let split = |p: usize| {
            [(2 * p, 2 * p + 1), (2 * p + 1, 2 * p)]
                .into_iter()
                .find(|&(_, w)| row_const(&ops[w]))
        };
        let ((v, wv), (o, wo)) = match (split(0)?, split(1)?) {
            (f, g) if ops[f.0].step == 1 && ops[g.0].step == 0 => (f, g),
            (g, f) if ops[f.0].step == 1 && ops[g.0].step == 0 => (f, g),
            _ => return None,
        };
        let row = |k: usize| -> Option<&[f16]> {
            match ops[k].v {
                Data::H(h) => h.get(ops[k].base(0)..ops[k].base(0) + len),
                Data::F(_) => None,
            }
        };
        let (wv, wo) = (row(wv)?, row(wo)?);
        let general: Vec<usize> = (0..len)
            .filter(|&j| !(wv[j].to_bits() == 0x3c00 && wo[j].to_bits() & 0x7fff == 0))
            .collect();
        (general.len() * 4 <= len).then_some(Pass { v, o, general })
    }
}

impl<'a> BlendRows<'a> {
    /// Output rows `first..first + out.len() / row_len` into `out`, each rounded exactly as
    /// `mul`, `mul` and `add` on fp16 tensors round (`out`: a whole number of rows).
    pub fn fill(&self, first: usize, out: &mut [f16]) {
        let len = *self.dims.last().unwrap_or(&1);
        let mut bufs = vec![0f32; 4 * len];
        let mut last = [usize::MAX; 4];
        for (i, yr) in out.chunks_mut(len).enumerate() {
            let r = first + i;
            if self.pass_row(r, yr) {
                continue;
            }
            // Each operand's row widened once and reused while the next output row reads
            // the same elements (a broadcast mask is one row for the whole cache).
            for (k, (op, buf)) in self.ops.iter().zip(bufs.chunks_mut(len)).enumerate() {
                if last[k] != op.base(r) {
                    op.row(r, buf);
                    last[k] = op.base(r);
                }
            }
            let (a, rest) = bufs.split_at(len);
            let (b, rest) = rest.split_at(len);
            let (c, d) = rest.split_at(len);
            super::convert::blend_to_f16(a, b, c, d, yr);
        }
    }

    /// Rows `first..first + rows` read in place: the passed-through operand's slice of
    /// those rows, which must lie one after another, and the one column the blend computes,
    /// each row's value in it written to `vals` (a decode step's cache rows and the
    /// token's column). Elsewhere the blend is that operand's element itself, except that
    /// it turns −0 into +0 and may give another NaN: a reader of the slice must not depend
    /// on the sign of a zero and must check its results for infinities and NaNs, reading
    /// [`fill`](Self::fill)'s rows where it finds one. `None` where there is no one-hot
    /// plan, the plan computes more than one column, the rows are not consecutive, or a
    /// row's new value is not finite.
    pub fn in_place(
        &self,
        first: usize,
        rows: usize,
        vals: &mut Vec<f16>,
    ) -> Option<(&'a [f16], usize)> {
        let p = self.pass.as_ref()?;
        let (&[col], Data::H(v), Data::H(o)) = (&p.general[..], self.ops[p.v].v, self.ops[p.o].v)
        else {
            return None;
        };
        let len = *self.dims.last()?;
        let (vo, oo) = (&self.ops[p.v], &self.ops[p.o]);
        if first + rows > self.rows() {
            return None;
        }
        let b0 = vo.base(first);
        let consecutive = match &vo.rows {
            Offsets::Step(s) => *s == len,
            Offsets::Table(t) => (0..rows).all(|i| t[first + i] == b0 + i * len),
        };
        if !consecutive {
            return None;
        }
        if (first..first + rows).any(|r| !o[oo.base(r)].is_finite()) {
            return None;
        }
        self.column(first, rows, col, vals)?;
        v.get(b0..b0 + rows * len).map(|rows| (rows, col))
    }

    /// Column `j` of rows `first..first + rows` by the formula into `vals`, the operands
    /// gathered and widened together and the products and sum rounded by
    /// [`blend_to_f16`](super::convert::blend_to_f16) (a value at a time, half's software
    /// conversions cost about 100 ns a row); `None` if an operand is not fp16.
    fn column(&self, first: usize, rows: usize, j: usize, vals: &mut Vec<f16>) -> Option<()> {
        // The gathered column and its widened operands in this thread's buffers: decode
        // steps call this for every head from two workers at once.
        thread_local! {
            static BUFS: std::cell::RefCell<(Vec<f16>, Vec<f32>)> = Default::default();
        }
        super::with_local(&BUFS, |(g, wide)| {
            wide.clear();
            wide.resize(4 * rows, 0.0);
            for (op, w) in self.ops.iter().zip(wide.chunks_mut(rows)) {
                let Data::H(h) = op.v else { return None };
                g.clear();
                g.extend((first..first + rows).map(|r| h[op.base(r) + j * op.step]));
                super::convert::f16_to_f32(g, w);
            }
            vals.clear();
            vals.resize(rows, f16::ZERO);
            let (a, rest) = wide.split_at(rows);
            let (b, rest) = rest.split_at(rows);
            let (c, d) = rest.split_at(rows);
            super::convert::blend_to_f16(a, b, c, d, vals);
            Some(())
        })
    }

    /// Element `j` of row `r` by the formula, rounded as `mul`, `mul`, `add` round.
    fn formula(&self, r: usize, j: usize) -> f16 {
        let at = |k: usize| {
            let op = &self.ops[k];
            let i = op.base(r) + j * op.step;
            match op.v {
                Data::H(h) => h[i].to_f32(),
                Data::F(f) => f[i],
            }
        };
        let round = |x: f32| f16::from_f32(x).to_f32();
        f16::from_f32(round(at(0) * at(1)) + round(at(2) * at(3)))
    }

    /// Row `r` by [`Pass`] into `yr`; false where the plan does not apply to it.
    fn pass_row(&self, r: usize, yr: &mut [f16]) -> bool {
        let Some(p) = &self.pass else { return false };
        let (Data::H(v), Data::H(o)) = (self.ops[p.v].v, self.ops[p.o].v) else {
            return false;
        };
        let (b, len) = (self.ops[p.v].base(r), yr.len());
        if !o[self.ops[p.o].base(r)].is_finite() {
            return false;
        }
        let row = &v[b..b + len];
        // Infinities and NaNs (all exponent bits set) and −0, without an early exit so
        // that the loop vectorises.
        let odd = row.iter().fold(0u16, |acc, h| {
            let x = h.to_bits();
            acc | u16::from(x & 0x7c00 == 0x7c00) | u16::from(x == 0x8000)
        });
        if odd != 0 {
            return false;
        }
        yr.copy_from_slice(row);
        for &j in &p.general {
            yr[j] = self.formula(r, j);
        }
        true
    }

    /// How many rows the result has.
    pub fn rows(&self) -> usize {
        self.dims[..self.dims.len() - 1].iter().product()
    }
}

/// Calls `f` with the rows of `a·b + c·d` on demand ([`BlendRows`]) when all four operands
/// are fp16 and broadcast; `None` otherwise (then [`mul_mul_add`] computes it whole).
pub fn with_rows<R>(
    a: &Tensor,
    b: &Tensor,
    c: &Tensor,
    d: &Tensor,
    f: impl FnOnce(&BlendRows) -> R,
) -> Result<Option<R>> {
    if [a, b, c, d].iter().any(|t| t.dtype() != DType::F16) || a.rank() == 0 {
        return Ok(None);
    }
    let out = out_shape(a, b, c, d)?;
    if out.iter().product::<usize>() == 0 {
        return Ok(None);
    }
    let dims = out.clone();
    with_operands([a, b, c, d], &out, DType::F16, |ops| {
        let pass = Pass::plan(&ops, *dims.last().unwrap_or(&1));
        f(&BlendRows { ops, dims, pass })
    })
    .map(Some)
}

/// `a·b + c·d` (broadcast). Operands of one float dtype (fp16 or f32) are computed
/// in f32 and rounded to it after each product and after the sum — bit-identical to
/// `mul`, `mul`, `add` evaluated one by one; anything else runs as those three ops.
pub fn mul_mul_add(a: &Tensor, b: &Tensor, c: &Tensor, d: &Tensor) -> Result<Tensor> {
    let dt = a.dtype();
    let same = [b, c, d].iter().all(|t| t.dtype() == dt);
    if !same || !matches!(dt, DType::F16 | DType::F32) || a.rank() == 0 {
        let p = binary(a, b, BinOp::Mul)?;
        let q = binary(c, d, BinOp::Mul)?;
        return binary(&p, &q, BinOp::Add);
    }
    let out = out_shape(a, b, c, d)?;
    let len = *out.last().unwrap_or(&1);
    let total: usize = out.iter().product();
    if total == 0 {
        return from_f32(vec![], &out, dt);
    }
    let rows_per_task = MIN_TASK.div_ceil(len).max(1);
    if dt == DType::F16 {
        // Rows filled in parallel tasks, one pass each.
        let filled = with_rows(a, b, c, d, |br| {
            let mut out16 = vec![f16::ZERO; total];
            out16
                .par_chunks_mut(rows_per_task * len)
                .enumerate()
                .for_each(|(t, ys)| br.fill(t * rows_per_task, ys));
            out16
        })?;
        if let Some(out16) = filled {
            return from_vec(out16, &out);
        }
    }
    // f32: one row's two products and their sum, each an f32 operation as op by op.
    with_operands([a, b, c, d], &out, dt, |ops| {
        let row = |r: usize, p: &mut [f32], q: &mut [f32], y: &mut [f32]| {
            ops[0].row(r, p);
            ops[1].row(r, y);
            p.iter_mut().zip(&*y).for_each(|(p, v)| *p *= v);
            ops[2].row(r, q);
            ops[3].row(r, y);
            q.iter_mut().zip(&*y).for_each(|(q, v)| *q *= v);
            y.iter_mut()
                .zip(p.iter().zip(&*q))
                .for_each(|(y, (p, q))| *y = p + q);
        };
        let mut y = vec![0f32; total];
        y.par_chunks_mut(rows_per_task * len)
            .enumerate()
            .for_each(|(t, ys)| {
                let (mut p, mut q) = (vec![0f32; len], vec![0f32; len]);
                for (i, yr) in ys.chunks_mut(len).enumerate() {
                    row(t * rows_per_task + i, &mut p, &mut q, yr);
                }
            });
        from_f32(y, &out, dt)
    })?
}
