//! Data movement by index: strided slices (negative steps too) and their functional update,
//! padding (constant, reflect, replicate) and gathers. Views are kept where candle can
//! express them (a unit-step slice is a `narrow`); everything else selects by index.

use anyhow::{ensure, Result};
use candle_core::{DType, Tensor};

/// One axis of a strided slice: first index, step (non-zero, may be negative), count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub start: usize,
    pub step: isize,
    pub len: usize,
}

impl Span {
    /// The whole axis of size `n`.
    pub fn full(n: usize) -> Span {
        Span {
            start: 0,
            step: 1,
            len: n,
        }
    }
    fn indices(&self) -> Vec<u32> {
        (0..self.len)
            .map(|i| (self.start as isize + i as isize * self.step) as u32)
            .collect()
    }
    fn check(&self, n: usize) -> Result<()> {
        ensure!(self.step != 0, "slice step 0");
        if self.len > 0 {
            let last = self.start as isize + (self.len as isize - 1) * self.step;
            ensure!(
                self.start < n && last >= 0 && (last as usize) < n,
                "slice {self:?} outside an axis of {n}"
            );
        }
        Ok(())
    }
}

fn u32_tensor(v: Vec<u32>) -> Result<Tensor> {
    let n = v.len();
    Ok(Tensor::from_vec(v, n, &candle_core::Device::Cpu)?)
}

/// `x[start::step][:len]` on every axis.
pub fn strided_slice(x: &Tensor, spans: &[Span]) -> Result<Tensor> {
    ensure!(
        spans.len() == x.rank(),
        "slice of rank {} with {} spans",
        x.rank(),
        spans.len()
    );
    let mut y = x.clone();
    for (ax, s) in spans.iter().enumerate() {
        let n = x.dims()[ax];
        s.check(n)?;
        if *s == Span::full(n) {
            continue;
        }
        y = if s.step == 1 || s.len <= 1 {
            y.narrow(ax, s.start, s.len)?
        } else {
            // candle selects only from contiguous data; a narrowed axis before this one
            // leaves `y` a strided view.
            y.contiguous()?
                .index_select(&u32_tensor(s.indices())?, ax)?
        };
    }
    Ok(y)
}

/// Flat row-major offsets, in a tensor of `dims`, of the elements `spans` select (in order).
fn slice_offsets(dims: &[usize], spans: &[Span]) -> Result<Vec<usize>> {
    ensure!(
        spans.len() == dims.len(),
        "slice of rank {} with {} spans",
        dims.len(),
        spans.len()
    );
    let st = super::data::strides(dims);
    let mut flat: Vec<usize> = vec![0];
    for (ax, s) in spans.iter().enumerate() {
        s.check(dims[ax])?;
        let offs: Vec<usize> = s
            .indices()
            .into_iter()
            .map(|i| i as usize * st[ax])
            .collect();
        flat = flat
            .iter()
            .flat_map(|&b| offs.iter().map(move |&o| b + o))
            .collect();
    }
    Ok(flat)
}

/// The flat offsets in `x` that `spans` select, checked to be as many as `update` holds.
fn update_offsets(x: &Tensor, spans: &[Span], update: &Tensor) -> Result<Vec<usize>> {
    let flat = slice_offsets(x.dims(), spans)?;
    ensure!(
        flat.len() == update.elem_count(),
        "update of shape {:?} for a slice of {} elements",
        update.dims(),
        flat.len()
    );
    Ok(flat)
}

/// A copy of `x` whose elements selected by `spans` are replaced, in row-major order, by the
/// elements of `update` (which must have as many elements, any shape).
pub fn strided_assign(x: &Tensor, spans: &[Span], update: &Tensor) -> Result<Tensor> {
    let flat = update_offsets(x, spans, update)?;
    ensure!(
        x.elem_count() < u32::MAX as usize,
        "tensor too large to update by index"
    );
    let flat: Vec<u32> = flat.into_iter().map(|o| o as u32).collect();
    let src = update.to_dtype(x.dtype())?.flatten_all()?;
    let y = x.flatten_all()?.scatter(&u32_tensor(flat)?, &src, 0)?;
    Ok(y.reshape(x.dims())?)
}

/// [`strided_assign`] into `x` itself: its storage is written, so every tensor sharing that
/// storage sees the change — the caller must hold the only reference (a Core ML state the
/// session owns; see `StateCell::update_in_place`). `x` must be contiguous. Writes only
/// the selected elements instead of copying the whole tensor.
pub fn strided_assign_in_place(x: &Tensor, spans: &[Span], update: &Tensor) -> Result<()> {
    let flat = update_offsets(x, spans, update)?;
    ensure!(
        x.is_contiguous(),
        "an in-place update needs a contiguous tensor"
    );
    let src = update.to_dtype(x.dtype())?.flatten_all()?.contiguous()?;
    x.inplace_op2(&src, &WriteAt(flat))?;
    Ok(())
}

/// Writes a contiguous source, element `i` to flat offset `self.0[i]` of the destination.
struct WriteAt(Vec<usize>);

impl candle_core::InplaceOp2 for WriteAt {
    fn name(&self) -> &'static str {
        "strided_assign_in_place"
    }

    fn cpu_fwd(
        &self,
        d: &mut candle_core::CpuStorage,
        dl: &candle_core::Layout,
        s: &candle_core::CpuStorage,
        sl: &candle_core::Layout,
    ) -> candle_core::Result<()> {
        use candle_core::CpuStorage as C;
        let (Some((d0, d1)), Some((s0, s1))) = (dl.contiguous_offsets(), sl.contiguous_offsets())
        else {
            return Err(candle_core::Error::Msg(
                "in-place update of a strided tensor".into(),
            ));
        };
        let fits = |n: usize| s1 - s0 == self.0.len() && self.0.iter().all(|&o| d0 + o < d1.min(n));
        macro_rules! put {
            ($($v:ident),*) => {
                match (d, s) {
                    $((C::$v(d), C::$v(s)) => {
                        if !fits(d.len()) {
                            return Err(candle_core::Error::Msg("in-place update out of range".into()));
                        }
                        for (&o, &v) in self.0.iter().zip(&s[s0..s1]) {
                            d[d0 + o] = v;
                        }
                    })*
                    _ => return Err(candle_core::Error::Msg("in-place update: unsupported dtype".into())),
                }
            };
        }
        put!(U8, U32, I16, I32, I64, BF16, F16, F32, F64);
        Ok(())
    }
}

/// How `pad` fills new elements.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PadMode {
    Constant(f64),
    /// Mirror without repeating the edge (`[1,2,3]` → `3,2,[1,2,3],2,1`).
    Reflect,
    /// Repeat the edge.
    Replicate,
}

/// Pads every axis by `(before, after)`.
pub fn pad(x: &Tensor, pads: &[(usize, usize)], mode: PadMode) -> Result<Tensor> {
    ensure!(
        pads.len() == x.rank(),
        "pad of rank {} with {} pairs",
        x.rank(),
        pads.len()
    );
    let mut y = x.clone();
    for (ax, &(b, a)) in pads.iter().enumerate() {
        if b == 0 && a == 0 {
            continue;
        }
        let n = y.dims()[ax];
        y = match mode {
            PadMode::Constant(v) => {
                let side = |k: usize| -> Result<Tensor> {
                    let mut s = y.dims().to_vec();
                    s[ax] = k;
                    Ok(Tensor::zeros(s, y.dtype(), y.device())?.affine(0.0, v)?)
                };
                Tensor::cat(&[side(b)?, y.clone(), side(a)?], ax)?
            }
            PadMode::Reflect | PadMode::Replicate => {
                ensure!(n > 0, "cannot {mode:?}-pad an empty axis");
                if mode == PadMode::Reflect {
                    ensure!(
                        b < n && a < n,
                        "reflect padding ({b}, {a}) needs an axis longer than {}",
                        b.max(a)
                    );
                }
                let idx: Vec<u32> = (-(b as isize)..(n + a) as isize)
                    .map(|i| {
                        let j = match mode {
                            PadMode::Reflect if i < 0 => -i,
                            PadMode::Reflect if i >= n as isize => 2 * (n as isize - 1) - i,
                            _ => i.clamp(0, n as isize - 1),
                        };
                        j as u32
                    })
                    .collect();
                y.contiguous()?.index_select(&u32_tensor(idx)?, ax)?
            }
        };
    }
    Ok(y)
}

/// Normalises possibly negative indices for an axis of `n`.
fn norm_indices(idx: &[i64], n: usize) -> Result<Vec<u32>> {
    idx.iter()
        .map(|&i| {
            let j = if i < 0 { i + n as i64 } else { i };
            ensure!(
                j >= 0 && j < n as i64,
                "index {i} out of range for an axis of {n}"
            );
            Ok(j as u32)
        })
        .collect()
}

/// `x` indexed along `axis` by `idx` (shape `idx_shape`): the result has shape
/// `x[..axis] + idx_shape + x[axis+1..]`.
pub fn take(x: &Tensor, idx: &[i64], idx_shape: &[usize], axis: usize) -> Result<Tensor> {
    ensure!(
        axis < x.rank(),
        "axis {axis} out of range for rank {}",
        x.rank()
    );
    let ids = u32_tensor(norm_indices(idx, x.dims()[axis])?)?;
    let y = x.contiguous()?.index_select(&ids, axis)?;
    let mut shape = x.dims()[..axis].to_vec();
    shape.extend_from_slice(idx_shape);
    shape.extend_from_slice(&x.dims()[axis + 1..]);
    Ok(y.reshape(shape)?)
}

/// `out[.., i, ..] = x[.., idx[.., i, ..], ..]` along `axis`, `idx` of the result's shape.
pub fn take_along(x: &Tensor, idx: &[i64], idx_shape: &[usize], axis: usize) -> Result<Tensor> {
    ensure!(
        idx_shape.len() == x.rank() && axis < x.rank(),
        "take_along: indices {idx_shape:?} for {:?}",
        x.dims()
    );
    let ids = Tensor::from_vec(norm_indices(idx, x.dims()[axis])?, idx_shape, x.device())?;
    Ok(x.contiguous()?.gather(&ids, axis)?)
}

/// Integer scalar tensors of `dtype` from values (rounded toward zero for integer dtypes).
pub fn full(shape: &[usize], value: f64, dtype: DType) -> Result<Tensor> {
    Ok(Tensor::zeros(shape, dtype, &candle_core::Device::Cpu)?.affine(0.0, value)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::data::{from_vec, to_vec};

    #[test]
    fn negative_step_slice_and_assign() {
        let x = from_vec((0..10).map(|i| i as f32).collect::<Vec<_>>(), &[2, 5]).unwrap();
        let s = strided_slice(
            &x,
            &[
                Span::full(2),
                Span {
                    start: 4,
                    step: -2,
                    len: 3,
                },
            ],
        )
        .unwrap();
        assert_eq!(to_vec::<f32>(&s).unwrap(), vec![4., 2., 0., 9., 7., 5.]);
        let u = from_vec(vec![-1f32, -2., -3.], &[3]).unwrap();
        let y = strided_assign(
            &x,
            &[
                Span {
                    start: 1,
                    step: 1,
                    len: 1,
                },
                Span {
                    start: 0,
                    step: 2,
                    len: 3,
                },
            ],
            &u,
        )
        .unwrap();
        assert_eq!(
            to_vec::<f32>(&y).unwrap(),
            vec![0., 1., 2., 3., 4., -1., 6., -2., 8., -3.]
        );
    }

    #[test]
    fn reflect_and_constant_pad() {
        let x = from_vec(vec![1f32, 2., 3.], &[3]).unwrap();
        assert_eq!(
            to_vec::<f32>(&pad(&x, &[(2, 2)], PadMode::Reflect).unwrap()).unwrap(),
            vec![3., 2., 1., 2., 3., 2., 1.]
        );
        assert_eq!(
            to_vec::<f32>(&pad(&x, &[(1, 0)], PadMode::Constant(7.0)).unwrap()).unwrap(),
            vec![7., 1., 2., 3.]
        );
        assert_eq!(
            to_vec::<f32>(&pad(&x, &[(0, 2)], PadMode::Replicate).unwrap()).unwrap(),
            vec![1., 2., 3., 3., 3.]
        );
    }
}
