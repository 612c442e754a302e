//! Keeping contraction weights in their stored form. A constant that only feeds `linear` /
//! `conv` weights becomes a [`PackedWeight`]: LUT4 codes + per-group palettes when it came
//! from an iOS18 `constexpr_lut_to_dense` with ≤ 16 entries per output-row group, 4-bit
//! codes + per-row/block scales when it came from a `constexpr_blockwise_shift_scale` whose
//! data fits in 4 bits, else fp16 (or f32) as stored. Decode-sized products then stream
//! those bytes (see `kernels::gemv`); the dense decode made while folding is released.
//! The bulk of the small ones then moves into one shared block (`kernels::gemv::Store`).

use super::step::{Const, Src, Step};
use crate::ir::ValueType;
use crate::kernels::{self, PackedWeight};
use crate::ops::RValue;
use anyhow::Result;
use candle_core::DType;
use half::f16;
use std::collections::HashMap;

/// Constant index → the constexpr op (type, arguments) that folded into it.
pub type Origins = HashMap<usize, (String, Vec<(String, Vec<Src>)>)>;

/// Whether `st`'s evaluation takes parameter `p` packed (its definition's weight says so).
fn takes_packed(st: &Step, p: &str) -> bool {
    st.def
        .and_then(|d| d.weight)
        .is_some_and(|w| w.packed && w.input == p)
}

/// Packs every constant read only where [`takes_packed`].
pub fn pack_weights(
    consts: &mut [Const],
    steps: &[Step],
    outputs: &[(String, Src, ValueType)],
    origins: &Origins,
) -> Result<()> {
    let mut only = vec![None::<bool>; consts.len()];
    for st in steps {
        for (p, srcs) in &st.args {
            let ok = takes_packed(st, p);
            for s in srcs {
                if let Src::Const(i) = s {
                    only[*i] = Some(only[*i].unwrap_or(true) && ok);
                }
            }
        }
    }
    for (_, s, _) in outputs {
        if let Src::Const(i) = s {
            only[*i] = Some(false);
        }
    }
    for (i, flag) in only.into_iter().enumerate() {
        if flag != Some(true) {
            continue;
        }
        let RValue::T(t) = &consts[i].val else {
            continue;
        };
        if !kernels::data::is_float(t.dtype()) || t.rank() < 2 {
            continue;
        }
        let shape = t.dims().to_vec();
        let compressed = match origins.get(&i) {
            Some((op, args)) => from_origin(op, args, consts, &shape).unwrap_or(None),
            None => None,
        };
        let p = match compressed {
            Some(p) => p,
            None if t.dtype() == DType::F16 => {
                PackedWeight::from_f16(&shape, kernels::to_vec::<f16>(t)?)?
            }
            None => PackedWeight::from_f32(&shape, kernels::to_f32_vec(t)?)?,
        };
        consts[i].packed = Some(p);
        consts[i].val = RValue::Str(vec![]);
    }
    // The small weights into one block, large enough for huge pages (see `Store`).
    let mut packed: Vec<&mut PackedWeight> = consts
        .iter_mut()
        .filter_map(|c| c.packed.as_mut())
        .collect();
    kernels::gemv::share_arena(&mut packed);
    Ok(())
}

/// A constant op whose one output only feeds packed weight inputs, folded straight into
/// its packed form: a `const` fp16 / f32 tensor copied once from its (mapped) bytes, whose
/// file pages are then released; a `constexpr_*` decompression read from its compressed
/// inputs, never expanded. `None` where the op has no such form (it is then evaluated and
/// packed at the end as any constant, see [`pack_weights`]).
pub fn fold_packed(
    op: &crate::ir::Operation,
    args: &[(String, Vec<Src>)],
    consts: &[Const],
) -> Result<Option<PackedWeight>> {
    let [out] = op.outputs.as_slice() else {
        return Ok(None);
    };
    let ValueType::Tensor(tt) = &out.ty else {
        return Ok(None);
    };
    let Some(shape) = tt.fixed_shape() else {
        return Ok(None);
    };
    if shape.len() < 2 {
        return Ok(None);
    }
    if op.op_type == "const" {
        let Some(crate::ir::Value::Tensor(t)) = op.attributes.get("val") else {
            return Ok(None);
        };
        if t.shape != shape || t.data.len() != t.dtype.storage_bytes(t.num_elements()) {
            return Ok(None);
        }
        // Copied on every core (the stored little-endian values are the host's).
        let le = cfg!(target_endian = "little");
        let p = match t.dtype {
            crate::ir::DType::F16 if le => {
                PackedWeight::from_f16(&shape, kernels::data::par_copy(t.data.as_slice()))?
            }
            crate::ir::DType::F32 if le => {
                PackedWeight::from_f32(&shape, kernels::data::par_copy(t.data.as_slice()))?
            }
            crate::ir::DType::F16 => PackedWeight::from_f16(&shape, t.data.to_f16_vec())?,
            crate::ir::DType::F32 => PackedWeight::from_f32(&shape, t.data.to_f32_vec())?,
            _ => return Ok(None),
        };
        t.data.release_pages();
        return Ok(Some(p));
    }
    if !matches!(tt.dtype, crate::ir::DType::F16 | crate::ir::DType::F32) {
        return Ok(None);
    }
    from_origin(&op.op_type, args, consts, &shape)
}

/// An iOS18 `constexpr_lut_to_dense` whose `indices` (`uint4`, the weight's shape) and
/// `lut` (fp16 or f32, one palette of at most 16 entries per group of output rows) are
/// inline values, packed straight from the stored bytes: the codes already lie two a byte,
/// low nibble first, as [`kernels::Packed::Lut4`] keeps them, so they are copied once (on
/// every core) and never unpacked to a byte each. `None` for any other form (the op is
/// then compiled as usual). Call it before the op's inputs are evaluated.
pub fn fold_lut4_inline(op: &crate::ir::Operation) -> Result<Option<PackedWeight>> {
    use crate::ir::{Arg, DType as D, Value};
    if op.op_type != "constexpr_lut_to_dense" || op.inputs.len() != 2 {
        return Ok(None);
    }
    let [out] = op.outputs.as_slice() else {
        return Ok(None);
    };
    let ValueType::Tensor(tt) = &out.ty else {
        return Ok(None);
    };
    let Some(shape) = tt.fixed_shape() else {
        return Ok(None);
    };
    let inline = |p: &str| match op.inputs.get(p).map(Vec::as_slice) {
        Some([Arg::Value(Value::Tensor(t))]) => Some(t),
        _ => None,
    };
    let (Some(it), Some(lt)) = (inline("indices"), inline("lut")) else {
        return Ok(None);
    };
    let r = shape.len();
    if r < 2 || !matches!(tt.dtype, D::F16 | D::F32) || !cfg!(target_endian = "little") {
        return Ok(None);
    }
    let elems = shape.iter().product::<usize>();
    let ok = it.dtype == D::U4
        && it.shape == shape
        && it.data.len() == elems / 2
        && matches!(lt.dtype, D::F16 | D::F32);
    let Some((groups, pal)) = lut4_layout(&lt.shape, &shape).filter(|_| ok) else {
        return Ok(None);
    };
    let vals = match lt.dtype {
        D::F16 => lt.data.to_f16_vec().iter().map(|h| h.to_f32()).collect(),
        _ => lt.data.to_f32_vec(),
    };
    if vals.len() != groups * pal {
        return Ok(None);
    }
    let lut = padded_palettes(&vals, groups, pal);
    // A code past a short palette: left to the op's own evaluation (and its error).
    if pal < 16 && kernels::gemv::max_nibble(it.data.as_slice()) as usize >= pal {
        return Ok(None);
    }
    let nibbles = kernels::data::par_copy::<u8>(it.data.as_slice());
    let p = PackedWeight::lut4_nibbles(&shape, nibbles, lut, pal)?;
    it.data.release_pages();
    lt.data.release_pages();
    Ok(Some(p))
}

/// (groups, palette size) of an iOS18 LUT of dims `l` over a weight of `shape` when it has
/// the layout the LUT4 kernels take — one palette of at most 16 scalar entries per group
/// of output rows (axis 0), an even number of elements per row — else `None`.
fn lut4_layout(l: &[usize], shape: &[usize]) -> Option<(usize, usize)> {
    let r = shape.len();
    let (n, k) = (shape[0], shape[1..].iter().product::<usize>());
    let ok = l.len() == r + 2
        && l[r] <= 16
        && l[r + 1] == 1
        && l[1..r].iter().all(|&g| g == 1)
        && l[0] >= 1
        && n % l[0] == 0
        && k % 2 == 0;
    ok.then(|| (l[0], l[r]))
}

/// `groups` palettes of `pal` entries each (`vals`), each padded with zeros to the 16
/// entries the kernels index.
fn padded_palettes(vals: &[f32], groups: usize, pal: usize) -> Vec<f32> {
    let mut lut = vec![0f32; groups * 16];
    for g in 0..groups {
        lut[g * 16..g * 16 + pal].copy_from_slice(&vals[g * pal..(g + 1) * pal]);
    }
    lut
}

fn arg<'a>(args: &'a [(String, Vec<Src>)], consts: &'a [Const], name: &str) -> Option<&'a Const> {
    match args.iter().find(|(p, _)| p == name)?.1.as_slice() {
        [Src::Const(i)] => consts.get(*i),
        _ => None,
    }
}

fn tensor(c: &Const) -> Option<&candle_core::Tensor> {
    match &c.val {
        RValue::T(t) => Some(t),
        _ => None,
    }
}

/// The compressed form of a weight of `shape` folded from `op`, when it has one of the
/// layouts the kernels take: groups / blocks along output rows (axis 0) and, for int4,
/// blocks along axis 1 with unit trailing axes (1x1 conv kernels).
fn from_origin(
    op: &str,
    args: &[(String, Vec<Src>)],
    consts: &[Const],
    shape: &[usize],
) -> Result<Option<PackedWeight>> {
    let r = shape.len();
    let n = shape[0];
    match op {
        // iOS16's form carries `shape` and packed bytes; only iOS18's is taken here.
        "constexpr_lut_to_dense" if arg(args, consts, "shape").is_none() => {
            let (Some(it), Some(lt)) = (
                arg(args, consts, "indices").and_then(tensor),
                arg(args, consts, "lut").and_then(tensor),
            ) else {
                return Ok(None);
            };
            let ok = it.dims() == shape && it.dtype() == DType::U8;
            let Some((groups, pal)) = lut4_layout(lt.dims(), shape).filter(|_| ok) else {
                return Ok(None);
            };
            let lut = padded_palettes(&kernels::to_f32_vec(lt)?, groups, pal);
            // The codes as they lie (no copy of a weight's worth of bytes).
            kernels::data::with_slice(it, |codes: &[u8]| {
                if kernels::gemv::max_code(codes) as usize >= pal {
                    return Ok(None);
                }
                Ok(Some(PackedWeight::lut4(shape, codes, lut)?))
            })?
        }
        "constexpr_blockwise_shift_scale" => {
            let (Some(dt), Some(st)) = (
                arg(args, consts, "data").and_then(tensor),
                arg(args, consts, "scale").and_then(tensor),
            ) else {
                return Ok(None);
            };
            let sd = st.dims();
            let ok = dt.dims() == shape
                && r >= 2
                && sd.len() == r
                && sd[0] == n
                && sd[1] >= 1
                && shape[1].is_multiple_of(sd[1])
                && shape[2..].iter().all(|&d| d == 1)
                && sd[2..].iter().all(|&d| d == 1);
            if !ok {
                return Ok(None);
            }
            let block = shape[1] / sd[1];
            // Signed data is stored shifted by 8 so every code is a nibble.
            let shift: i64 = match dt.dtype() {
                DType::I16 => 8,
                DType::U8 => 0,
                _ => return Ok(None),
            };
            let raw = kernels::to_vec::<i64>(dt)?;
            if !block.is_multiple_of(2) || raw.iter().any(|&v| !(0..16).contains(&(v + shift))) {
                return Ok(None);
            }
            let codes: Vec<u8> = raw.iter().map(|&v| (v + shift) as u8).collect();
            let shift = shift as f32;
            let scale = kernels::to_f32_vec(st)?;
            let zero = match arg(args, consts, "offset").and_then(tensor) {
                Some(o) if o.dims() == sd => kernels::to_f32_vec(o)?
                    .into_iter()
                    .map(|z| z + shift)
                    .collect(),
                Some(_) => return Ok(None),
                None => vec![shift; scale.len()],
            };
            Ok(Some(PackedWeight::int4(shape, &codes, scale, zero, block)?))
        }
        _ => Ok(None),
    }
}

/// Bytes a run's contractions read from constants: packed weights at their stored size,
/// other constant operands of `linear` / `conv` / `matmul` (biases, f32 weights) in f32.
pub fn streamed_bytes(consts: &[Const], steps: &[Step]) -> usize {
    let mut seen = vec![false; consts.len()];
    let mut total = 0;
    for st in steps {
        // Contractions: ops that compute in f32 from their operands.
        let contraction = st.def.is_some_and(|d| !d.f32_inputs.is_empty());
        for (_, srcs) in &st.args {
            for s in srcs {
                let Src::Const(i) = *s else { continue };
                if seen[i] {
                    continue;
                }
                let c = &consts[i];
                if let Some(p) = &c.packed {
                    total += p.bytes();
                    seen[i] = true;
                } else if let (true, RValue::T(t)) = (contraction, &c.val) {
                    if t.elem_count() > 1 {
                        total += t.elem_count() * t.dtype().size_in_bytes();
                        seen[i] = true;
                    }
                }
            }
        }
    }
    total
}
