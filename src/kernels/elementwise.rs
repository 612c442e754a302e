//! Elementwise maths: unary maps and numpy-broadcast binary ops, parallel over rayon.
//! Floats are computed in f32 (f64 stays f64) and rounded once to the storage dtype, which is
//! what an fp16 tensor program computing in fp32 produces; integers go through i64.

use super::data::{from_f32, from_vec, is_float, to_vec, with_f32, CHUNK};
use super::fastmath::Gelu;
use anyhow::{bail, ensure, Result};
use candle_core::{DType, Tensor};
use half::f16;
use rayon::prelude::*;

/// Applies `f` to every element of a float tensor, keeping its dtype.
pub fn map_f32(t: &Tensor, f: impl Fn(f32) -> f32 + Sync + Send) -> Result<Tensor> {
    ensure!(
        is_float(t.dtype()),
        "expected a float tensor, got {:?}",
        t.dtype()
    );
    if t.dtype() == DType::F64 {
        let mut v = to_vec::<f64>(t)?;
        v.par_chunks_mut(CHUNK)
            .for_each(|c| c.iter_mut().for_each(|x| *x = f(*x as f32) as f64));
        return from_vec(v, t.dims());
    }
    super::data::map_chunks(t, 1, |c| c.iter_mut().for_each(|x| *x = f(*x)))
}

/// GELU of every element of a float tensor, keeping its dtype: each chunk widened to f32,
/// [`Gelu::apply_slice`] (vector lanes), rounded back once.
pub fn map_gelu(t: &Tensor, g: Gelu) -> Result<Tensor> {
    ensure!(
        is_float(t.dtype()),
        "expected a float tensor, got {:?}",
        t.dtype()
    );
    if t.dtype() == DType::F64 {
        return map_f32(t, |x| g.apply(x));
    }
    super::data::map_chunks(t, 1, |c| g.apply_slice(c))
}

/// Applies `f` to every element of an integer tensor, keeping its dtype.
pub fn map_i64(t: &Tensor, f: impl Fn(i64) -> i64 + Sync + Send) -> Result<Tensor> {
    let mut v = to_vec::<i64>(t)?;
    v.par_chunks_mut(CHUNK)
        .for_each(|c| c.iter_mut().for_each(|x| *x = f(*x)));
    Ok(from_vec(v, t.dims())?.to_dtype(t.dtype())?)
}

/// Numpy broadcast of two shapes.
pub fn broadcast_shape(a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let n = a.len().max(b.len());
    (0..n)
        .map(|i| {
            let da = if i + a.len() >= n {
                a[i + a.len() - n]
            } else {
                1
            };
            let db = if i + b.len() >= n {
                b[i + b.len() - n]
            } else {
                1
            };
            match (da, db) {
                (x, y) if x == y => Ok(x),
                (1, y) => Ok(y),
                (x, 1) => Ok(x),
                (x, y) => bail!("shapes {a:?} and {b:?} do not broadcast ({x} vs {y})"),
            }
        })
        .collect()
}

/// Strides of `shape` when broadcast to `out` (0 on broadcast and missing axes).
fn bstrides(shape: &[usize], out: &[usize]) -> Vec<usize> {
    let s = super::data::strides(shape);
    let off = out.len() - shape.len();
    (0..out.len())
        .map(|i| {
            if i < off || shape[i - off] == 1 {
                0
            } else {
                s[i - off]
            }
        })
        .collect()
}

/// Merges adjacent axes that both operands walk uniformly, so the innermost loop is long.
fn coalesce(dims: &[usize], sa: &[usize], sb: &[usize]) -> (Vec<usize>, Vec<usize>, Vec<usize>) {
    let (mut d, mut a, mut b) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..dims.len() {
        if dims[i] == 1 {
            continue;
        }
        if let (Some(&ld), Some(&la), Some(&lb)) = (d.last(), a.last(), b.last()) {
            if la == sa[i] * dims[i] && lb == sb[i] * dims[i] {
                let k = d.len() - 1;
                d[k] = ld * dims[i];
                a[k] = sa[i];
                b[k] = sb[i];
                continue;
            }
        }
        d.push(dims[i]);
        a.push(sa[i]);
        b.push(sb[i]);
    }
    if d.is_empty() {
        return (vec![1], vec![0], vec![0]);
    }
    (d, a, b)
}

/// Offsets into both operands of the start of innermost run `row` (coalesced `dims` with the
/// operands' strides `sa`/`sb`; the last axis is the run itself).
fn row_offsets(row: usize, dims: &[usize], sa: &[usize], sb: &[usize]) -> (usize, usize) {
    let (mut rem, mut oa, mut ob) = (row, 0, 0);
    for ax in (0..dims.len() - 1).rev() {
        let i = rem % dims[ax];
        rem /= dims[ax];
        oa += i * sa[ax];
        ob += i * sb[ax];
    }
    (oa, ob)
}

/// `out[i] = f(a[ia], b[ib])` over the broadcast of two row-major operands.
pub fn zip_broadcast<A, B, U>(
    a: &[A],
    ash: &[usize],
    b: &[B],
    bsh: &[usize],
    f: impl Fn(A, B) -> U + Sync + Send,
) -> Result<(Vec<U>, Vec<usize>)>
where
    A: Copy + Sync,
    B: Copy + Sync,
    U: Copy + Send + Default,
{
    let out = broadcast_shape(ash, bsh)?;
    let n: usize = out.iter().product();
    let mut res = vec![U::default(); n];
    if n == 0 {
        return Ok((res, out));
    }
    if ash == bsh {
        res.par_chunks_mut(CHUNK).enumerate().for_each(|(c, o)| {
            let base = c * CHUNK;
            let (a, b) = (&a[base..base + o.len()], &b[base..base + o.len()]);
            for ((x, &p), &q) in o.iter_mut().zip(a).zip(b) {
                *x = f(p, q);
            }
        });
        return Ok((res, out));
    }
    let (dims, sa, sb) = coalesce(&out, &bstrides(ash, &out), &bstrides(bsh, &out));
    let r = dims.len();
    let inner = dims[r - 1];
    let (ia, ib) = (sa[r - 1], sb[r - 1]);
    let rows_per_task = (CHUNK / inner).max(1);
    res.par_chunks_mut(inner * rows_per_task)
        .enumerate()
        .for_each(|(c, o)| {
            for (k, row) in o.chunks_mut(inner).enumerate() {
                let (oa, ob) = row_offsets(c * rows_per_task + k, &dims, &sa, &sb);
                let w = row.len();
                // The common strides get loops the compiler can vectorise.
                match (ia, ib) {
                    (1, 1) => {
                        let (a, b) = (&a[oa..oa + w], &b[ob..ob + w]);
                        for ((x, &p), &q) in row.iter_mut().zip(a).zip(b) {
                            *x = f(p, q);
                        }
                    }
                    (1, 0) => {
                        let q = b[ob];
                        for (x, &p) in row.iter_mut().zip(&a[oa..oa + w]) {
                            *x = f(p, q);
                        }
                    }
                    (0, 1) => {
                        let p = a[oa];
                        for (x, &q) in row.iter_mut().zip(&b[ob..ob + w]) {
                            *x = f(p, q);
                        }
                    }
                    _ => {
                        for (j, x) in row.iter_mut().enumerate() {
                            *x = f(a[oa + j * ia], b[ob + j * ib]);
                        }
                    }
                }
            }
        });
    Ok((res, out))
}

/// Elements converted per inner piece of [`zip_f16`] (three f32 buffers of this size stay in
/// L1).
const PIECE: usize = 1024;

/// [`zip_broadcast`] for two fp16 operands and an fp16 result: each run of the innermost
/// axis is widened into small f32 buffers, combined, and rounded straight into the output,
/// instead of widening both whole operands and narrowing a whole f32 result (three full
/// passes and two large allocations — most of the cost of a decode step's cache blends).
/// Same values as computing in f32 and rounding once.
fn zip_f16(
    a: &[f16],
    ash: &[usize],
    b: &[f16],
    bsh: &[usize],
    f: impl Fn(f32, f32) -> f32 + Sync + Send,
) -> Result<(Vec<f16>, Vec<usize>)> {
    let out = broadcast_shape(ash, bsh)?;
    let n: usize = out.iter().product();
    let mut res = vec![f16::ZERO; n];
    if n == 0 {
        return Ok((res, out));
    }
    let (dims, sa, sb) = if ash == bsh {
        (vec![n], vec![1], vec![1])
    } else {
        coalesce(&out, &bstrides(ash, &out), &bstrides(bsh, &out))
    };
    let r = dims.len();
    let inner = dims[r - 1];
    let (ia, ib) = (sa[r - 1], sb[r - 1]);
    // Widens `len` elements of `src` from `off` with stride `st` (0: one repeated value).
    let widen = |src: &[f16], off: usize, st: usize, dst: &mut [f32]| match st {
        0 => dst.fill(src[off].to_f32()),
        1 => super::convert::f16_to_f32(&src[off..off + dst.len()], dst),
        _ => dst
            .iter_mut()
            .enumerate()
            .for_each(|(j, d)| *d = src[off + j * st].to_f32()),
    };
    let run = |row: usize, o: &mut [f16], j0: usize, xa: &mut [f32], xb: &mut [f32]| {
        let (oa, ob) = row_offsets(row, &dims, &sa, &sb);
        let (oa, ob) = (oa + j0 * ia, ob + j0 * ib);
        for (p, piece) in o.chunks_mut(PIECE).enumerate() {
            let w = piece.len();
            widen(a, oa + p * PIECE * ia, ia, &mut xa[..w]);
            widen(b, ob + p * PIECE * ib, ib, &mut xb[..w]);
            for (x, &y) in xa[..w].iter_mut().zip(&xb[..w]) {
                *x = f(*x, y);
            }
            super::convert::f32_to_f16(&xa[..w], piece);
        }
    };
    if inner >= CHUNK {
        // Long rows (same-shape operands): split each row into parallel pieces.
        res.par_chunks_mut(CHUNK).enumerate().for_each(|(c, o)| {
            let flat = c * CHUNK;
            // A chunk may end in the next row when CHUNK does not divide the row length.
            let (mut row, mut j0, mut done) = (flat / inner, flat % inner, 0);
            let (mut xa, mut xb) = (vec![0f32; PIECE], vec![0f32; PIECE]);
            while done < o.len() {
                let take = (inner - j0).min(o.len() - done);
                run(row, &mut o[done..done + take], j0, &mut xa, &mut xb);
                done += take;
                row += 1;
                j0 = 0;
            }
        });
    } else {
        let rows_per_task = (CHUNK / inner).max(1);
        res.par_chunks_mut(inner * rows_per_task)
            .enumerate()
            .for_each(|(c, o)| {
                let w = inner.min(PIECE);
                let (mut xa, mut xb) = (vec![0f32; w], vec![0f32; w]);
                for (k, row) in o.chunks_mut(inner).enumerate() {
                    run(c * rows_per_task + k, row, 0, &mut xa, &mut xb);
                }
            });
    }
    Ok((res, out))
}

/// Binary arithmetic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Max,
    Min,
    Pow,
    /// Rounds toward −∞.
    FloorDiv,
    /// Result has the sign of the divisor (numpy `mod`).
    Mod,
}

fn float_op(op: BinOp) -> fn(f32, f32) -> f32 {
    match op {
        BinOp::Add => |x, y| x + y,
        BinOp::Sub => |x, y| x - y,
        BinOp::Mul => |x, y| x * y,
        BinOp::Div => |x, y| x / y,
        BinOp::Max => |x, y| if x.is_nan() || x > y { x } else { y },
        BinOp::Min => |x, y| if x.is_nan() || x < y { x } else { y },
        BinOp::Pow => f32::powf,
        BinOp::FloorDiv => |x, y| (x / y).floor(),
        BinOp::Mod => |x, y| x - (x / y).floor() * y,
    }
}

fn f64_op(op: BinOp) -> fn(f64, f64) -> f64 {
    match op {
        BinOp::Add => |x, y| x + y,
        BinOp::Sub => |x, y| x - y,
        BinOp::Mul => |x, y| x * y,
        BinOp::Div => |x, y| x / y,
        BinOp::Max => f64::max,
        BinOp::Min => f64::min,
        BinOp::Pow => f64::powf,
        BinOp::FloorDiv => |x, y| (x / y).floor(),
        BinOp::Mod => |x, y| x - (x / y).floor() * y,
    }
}

fn int_op(op: BinOp) -> fn(i64, i64) -> i64 {
    match op {
        BinOp::Add => i64::wrapping_add,
        BinOp::Sub => i64::wrapping_sub,
        BinOp::Mul => i64::wrapping_mul,
        // Integer division by zero yields 0 rather than a panic (Core ML leaves it undefined).
        BinOp::Div => |x, y| if y == 0 { 0 } else { x.wrapping_div(y) },
        BinOp::Max => i64::max,
        BinOp::Min => i64::min,
        BinOp::Pow => |x, y| {
            if y < 0 {
                0
            } else {
                x.wrapping_pow(y.min(u32::MAX as i64) as u32)
            }
        },
        BinOp::FloorDiv => floor_div_i64,
        BinOp::Mod => |x, y| x.wrapping_sub(floor_div_i64(x, y).wrapping_mul(y)),
    }
}

fn floor_div_i64(x: i64, y: i64) -> i64 {
    if y == 0 {
        return 0;
    }
    let q = x.wrapping_div(y);
    if x.wrapping_rem(y) != 0 && ((x < 0) != (y < 0)) {
        q - 1
    } else {
        q
    }
}

/// Zips two float tensors through f32 (the nested closures borrow f32 views of both).
fn zip_f32<U>(
    a: &Tensor,
    b: &Tensor,
    f: impl Fn(f32, f32) -> U + Sync + Send,
) -> Result<(Vec<U>, Vec<usize>)>
where
    U: Copy + Send + Default,
{
    with_f32(a, |x| {
        with_f32(b, |y| zip_broadcast(x, a.dims(), y, b.dims(), f))
    })??
}

/// `a op b` with broadcasting; both operands must have the same dtype, which the result keeps.
pub fn binary(a: &Tensor, b: &Tensor, op: BinOp) -> Result<Tensor> {
    ensure!(
        a.dtype() == b.dtype(),
        "binary op on {:?} and {:?}",
        a.dtype(),
        b.dtype()
    );
    let dt = a.dtype();
    match dt {
        DType::F16 if matches!(op, BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div) => {
            let (v, shape) = super::data::with_slice(a, |x: &[f16]| {
                super::data::with_slice(b, |y: &[f16]| {
                    let (ad, bd) = (a.dims(), b.dims());
                    match op {
                        BinOp::Add => zip_f16(x, ad, y, bd, |p, q| p + q),
                        BinOp::Sub => zip_f16(x, ad, y, bd, |p, q| p - q),
                        BinOp::Mul => zip_f16(x, ad, y, bd, |p, q| p * q),
                        _ => zip_f16(x, ad, y, bd, |p, q| p / q),
                    }
                })
            })???;
            from_vec(v, &shape)
        }
        DType::F16 | DType::F32 | DType::BF16 => {
            // One closure per op (not a function pointer), so each loop is specialised and
            // inlined: an indirect call per element costs more than the arithmetic.
            let (v, shape) = match op {
                BinOp::Add => zip_f32(a, b, |x, y| x + y)?,
                BinOp::Sub => zip_f32(a, b, |x, y| x - y)?,
                BinOp::Mul => zip_f32(a, b, |x, y| x * y)?,
                BinOp::Div => zip_f32(a, b, |x, y| x / y)?,
                _ => zip_f32(a, b, float_op(op))?,
            };
            from_f32(v, &shape, dt)
        }
        DType::F64 => {
            let f = f64_op(op);
            let (x, y) = (to_vec::<f64>(a)?, to_vec::<f64>(b)?);
            let (v, shape) = zip_broadcast(&x, a.dims(), &y, b.dims(), f)?;
            from_vec(v, &shape)
        }
        _ => {
            let f = int_op(op);
            let (x, y) = (to_vec::<i64>(a)?, to_vec::<i64>(b)?);
            let (v, shape) = zip_broadcast(&x, a.dims(), &y, b.dims(), f)?;
            Ok(from_vec(v, &shape)?.to_dtype(dt)?)
        }
    }
}

/// Comparisons; the result is u8 0/1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

fn cmp<T: PartialOrd>(op: CmpOp) -> fn(T, T) -> u8 {
    match op {
        CmpOp::Eq => |x, y| (x == y) as u8,
        CmpOp::Ne => |x, y| (x != y) as u8,
        CmpOp::Lt => |x, y| (x < y) as u8,
        CmpOp::Le => |x, y| (x <= y) as u8,
        CmpOp::Gt => |x, y| (x > y) as u8,
        CmpOp::Ge => |x, y| (x >= y) as u8,
    }
}

pub fn compare(a: &Tensor, b: &Tensor, op: CmpOp) -> Result<Tensor> {
    ensure!(
        a.dtype() == b.dtype(),
        "comparison of {:?} and {:?}",
        a.dtype(),
        b.dtype()
    );
    let (v, shape) = if matches!(a.dtype(), DType::F16 | DType::F32 | DType::BF16) {
        zip_f32(a, b, cmp::<f32>(op))?
    } else if a.dtype() == DType::F64 {
        let (x, y) = (to_vec::<f64>(a)?, to_vec::<f64>(b)?);
        zip_broadcast(&x, a.dims(), &y, b.dims(), cmp::<f64>(op))?
    } else {
        let (x, y) = (to_vec::<i64>(a)?, to_vec::<i64>(b)?);
        zip_broadcast(&x, a.dims(), &y, b.dims(), cmp::<i64>(op))?
    };
    from_vec(v, &shape)
}

/// Logical ops on u8 booleans (any non-zero is true).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogicOp {
    And,
    Or,
    Xor,
}

pub fn logical(a: &Tensor, b: &Tensor, op: LogicOp) -> Result<Tensor> {
    let (x, y) = (to_vec::<u8>(a)?, to_vec::<u8>(b)?);
    let f: fn(u8, u8) -> u8 = match op {
        LogicOp::And => |x, y| (x != 0 && y != 0) as u8,
        LogicOp::Or => |x, y| (x != 0 || y != 0) as u8,
        LogicOp::Xor => |x, y| ((x != 0) ^ (y != 0)) as u8,
    };
    let (v, shape) = zip_broadcast(&x, a.dims(), &y, b.dims(), f)?;
    from_vec(v, &shape)
}

/// `cond ? a : b` with three-way broadcasting; `cond` is u8, `a` and `b` share a dtype.
pub fn select(cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    ensure!(
        a.dtype() == b.dtype(),
        "select between {:?} and {:?}",
        a.dtype(),
        b.dtype()
    );
    let shape = broadcast_shape(&broadcast_shape(a.dims(), b.dims())?, cond.dims())?;
    let c = cond.to_dtype(DType::U8)?.broadcast_as(shape.as_slice())?;
    Ok(c.where_cond(
        &a.broadcast_as(shape.as_slice())?,
        &b.broadcast_as(shape.as_slice())?,
    )?
    .contiguous()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_add_matches_loop() {
        let a: Vec<f32> = (0..24).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..4).map(|i| 100.0 * i as f32).collect();
        let ta = from_vec(a.clone(), &[2, 3, 4]).unwrap();
        let tb = from_vec(b.clone(), &[1, 1, 4]).unwrap();
        let r = to_vec::<f32>(&binary(&ta, &tb, BinOp::Add).unwrap()).unwrap();
        for i in 0..24 {
            assert_eq!(r[i], a[i] + b[i % 4]);
        }
        // Column broadcast [2,3,1] against [2,3,4].
        let tc = from_vec(vec![1f32, 2., 3., 4., 5., 6.], &[2, 3, 1]).unwrap();
        let r = to_vec::<f32>(&binary(&ta, &tc, BinOp::Mul).unwrap()).unwrap();
        for i in 0..24 {
            assert_eq!(r[i], a[i] * (i / 4 + 1) as f32);
        }
    }

    #[test]
    fn int_floor_div_and_mod_follow_numpy() {
        let a = from_vec(vec![7i64, -7, 7, -7], &[4]).unwrap();
        let b = from_vec(vec![2i64, 2, -2, -2], &[4]).unwrap();
        assert_eq!(
            to_vec::<i64>(&binary(&a, &b, BinOp::FloorDiv).unwrap()).unwrap(),
            vec![3, -4, -4, 3]
        );
        assert_eq!(
            to_vec::<i64>(&binary(&a, &b, BinOp::Mod).unwrap()).unwrap(),
            vec![1, 1, -1, -1]
        );
    }
}
