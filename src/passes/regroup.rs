//! Outlier-aware grouping: before grouped-channel palettization, reorders the hidden
//! channels between two weight ops so that the output rows sharing one table are alike.
//!
//! A grouped-channel table (`constexpr_lut_to_dense` with `group_size` consecutive output
//! rows per table) must cover the values of every row of its group. One row with outliers
//! stretches its group's table and the 15 ordinary rows beside it lose precision. The rows'
//! order is free wherever the channel they produce is only read, through an elementwise
//! function, by one other weight op: the MLP `conv(W₁, b₁) → gelu → conv(W₂)` of every
//! Whisper layer. Permuting W₁'s rows (and b₁) and W₂'s input columns by the same
//! permutation P computes the same function — W₂·f(P·(W₁x + b₁)) with W₂ columns permuted by
//! P equals the original, as f acts per element — and leaves standard ops, so the validator
//! and Core ML see an ordinary program. The order chosen sorts the rows by their largest
//! magnitude, so outlier rows share tables among themselves and every other group gets a
//! table fitted to its own range; with calibration statistics each element counts in
//! proportion to √(its input channel's mean square), as the weighted k-means weighs it.
//! (With per-channel scales every row is divided by its
//! largest magnitude anyway; rows are then sorted by how peaked they are, rms ÷ max, so a
//! table serves rows whose values spread alike.)
//!
//! The pass touches only chains it can prove function-preserving: both weights are
//! constants read by nothing else, the bias (if any) too, neither intermediate value has
//! another reader or is an output, convs have `groups = 1`, and producer and consumer are the
//! same op type (so the channel axis of the intermediate is the same). Calibration
//! statistics of the consumer (one mean square per input channel) are permuted with it.

use super::calibrate::Calibration;
use super::compress::{selected_weights, Method, Selection};
use super::lut::LutGranularity;
use crate::ir::{Arg, Bytes, DType, Function, Model, Operation, Tensor, Value};
use crate::ops::WeightLayout;
use anyhow::{bail, Context, Result};
use std::collections::{BTreeSet, HashMap};

/// One reordered chain (the report's record: producer and consumer ops and weights, the
/// activation between them, hidden channels and how many moved).
pub use crate::report::RegroupedChain as Regrouped;

/// Elementwise activations a channel permutation passes through unchanged (each takes only
/// `x` plus non-tensor settings).
const PER_ELEMENT: [&str; 5] = ["gelu", "relu", "silu", "sigmoid", "tanh"];

/// Reorders the hidden channels of every eligible chain of `model` whose producer weight
/// `sel` selects for `method`, which must be grouped-channel palettization. Returns what it
/// reordered and, when `calibration` holds statistics for a reordered consumer, a copy of the
/// statistics with those permuted the same way (else `None`: use the original).
pub fn regroup(
    model: &mut Model,
    method: &Method,
    sel: &Selection,
    calibration: Option<&Calibration>,
) -> Result<(Vec<Regrouped>, Option<Calibration>)> {
    let scaled = match method {
        Method::Palettize(c) => match c.granularity {
            LutGranularity::PerGroupedChannel(g) if g > 1 => c.per_channel_scale,
            _ => bail!("outlier-aware grouping orders the output channels that share a table, so it needs --palettize with per-grouped-channel tables (--group-size ≥ 2)"),
        },
        Method::Quantize(_) => bail!("outlier-aware grouping applies to grouped-channel palettization, not to linear quantization (whose scales are per channel or block)"),
    };
    let selected: BTreeSet<String> = selected_weights(model, method, sel)?
        .into_iter()
        .map(|w| w.weight)
        .collect();
    let mut done = Vec::new();
    let mut cal = calibration.cloned();
    let mut cal_changed = false;
    for f in model.program.functions.values_mut() {
        for chain in find_chains(f, &selected) {
            let Some(r) = apply(f, &chain, scaled, cal.as_ref())? else {
                continue;
            };
            if let Some(m) = cal
                .as_mut()
                .and_then(|c| c.moments.get_mut(&r.1.consumer_weight))
            {
                if m.len() != r.0.len() {
                    bail!(
                        "calibration for `{}` has {} channels but the weight reads {}; calibrate the same model",
                        r.1.consumer_weight,
                        m.len(),
                        r.0.len()
                    );
                }
                *m = r.0.iter().map(|&p| m[p]).collect();
                cal_changed = true;
            }
            // The consumer's input Gram matrix moves with its columns (rows and columns).
            if let Some(g) = cal
                .as_mut()
                .and_then(|c| c.grams.get_mut(&r.1.consumer_weight))
            {
                *g = std::sync::Arc::new(g.permuted(&r.0).with_context(|| {
                    format!(
                        "reordering the Gram matrix of `{}`; calibrate the same model",
                        r.1.consumer_weight
                    )
                })?);
                cal_changed = true;
            }
            done.push(r.1);
        }
    }
    Ok((done, cal.filter(|_| cal_changed)))
}

/// Op indices of one candidate chain in a function's top-level block.
struct Chain {
    producer: usize,
    w1: usize,
    bias: Option<usize>,
    activation: usize,
    consumer: usize,
    w2: usize,
}

fn var_of(op: &Operation, param: &str) -> Option<String> {
    match op.arg(param) {
        Some(Arg::Var(v)) => Some(v.clone()),
        _ => None,
    }
}

/// `groups` of the op is 1 (inline or a const) or absent (ops without groups).
fn ungrouped(f: &Function, consts: &HashMap<String, usize>, op: &Operation) -> bool {
    let v = match op.arg("groups") {
        None => return true,
        Some(Arg::Value(v)) => Some(v),
        Some(Arg::Var(n)) => consts
            .get(n)
            .and_then(|&i| f.block.operations[i].const_val()),
    };
    matches!(v.and_then(Value::as_tensor).map(|t| t.to_i64_vec()), Some(Ok(g)) if g == [1])
}

fn find_chains(f: &Function, selected: &BTreeSet<String>) -> Vec<Chain> {
    let ops = &f.block.operations;
    // Every read of a variable, nested blocks and block outputs included.
    let mut uses: HashMap<&str, usize> = HashMap::new();
    for op in f.block.walk() {
        for args in op.inputs.values() {
            for a in args {
                if let Arg::Var(v) = a {
                    *uses.entry(v.as_str()).or_default() += 1;
                }
            }
        }
    }
    for o in &f.block.outputs {
        *uses.entry(o.as_str()).or_default() += 1;
    }
    let mut reader: HashMap<&str, usize> = HashMap::new();
    for (i, op) in ops.iter().enumerate() {
        for args in op.inputs.values() {
            for a in args {
                if let Arg::Var(v) = a {
                    reader.insert(v.as_str(), i);
                }
            }
        }
    }
    let consts: HashMap<String, usize> = ops
        .iter()
        .enumerate()
        .filter(|(_, o)| o.op_type == "const")
        .map(|(i, o)| (o.outputs[0].name.clone(), i))
        .collect();
    let once = |v: &str| uses.get(v).copied() == Some(1);
    // The const op index holding `op`'s `param`, if it is a float tensor read only there.
    let const_in = |op: &Operation, param: &str| -> Option<usize> {
        let v = var_of(op, param)?;
        let &i = consts.get(&v)?;
        let t = ops[i].const_val()?.as_tensor()?;
        (once(&v) && matches!(t.dtype, DType::F16 | DType::F32)).then_some(i)
    };
    let mut out = Vec::new();
    for (pi, p) in ops.iter().enumerate() {
        // Weights laid out [C_out, C_in, …] (conv, linear): rows are output channels.
        let Some(wp) = crate::ops::weight(&p.op_type).filter(|w| w.layout == WeightLayout::OutIn)
        else {
            continue;
        };
        if p.outputs.len() != 1 {
            continue;
        }
        let Some(w1) = const_in(p, wp.input) else {
            continue;
        };
        if !selected.contains(&ops[w1].name) || !ungrouped(f, &consts, p) {
            continue;
        }
        let bias = match p.inputs.get("bias") {
            None => None,
            Some(_) => match const_in(p, "bias") {
                Some(b) => Some(b),
                None => continue,
            },
        };
        let mid = p.outputs[0].name.as_str();
        let Some(&ai) = reader.get(mid).filter(|_| once(mid)) else {
            continue;
        };
        let a = &ops[ai];
        // Its other inputs are settings (a mode string, a scalar), inline or const.
        let setting = |x: &Arg| {
            let v = match x {
                Arg::Value(v) => Some(v),
                Arg::Var(n) => consts.get(n).and_then(|&i| ops[i].const_val()),
            };
            v.is_some_and(|v| v.as_tensor().is_none_or(|t| t.num_elements() <= 1))
        };
        let a_reads_mid = var_of(a, "x").as_deref() == Some(mid)
            && a.inputs
                .iter()
                .all(|(k, args)| k == "x" || args.iter().all(setting));
        if !PER_ELEMENT.contains(&a.op_type.as_str()) || !a_reads_mid || a.outputs.len() != 1 {
            continue;
        }
        let act = a.outputs[0].name.as_str();
        let Some(&ci) = reader.get(act).filter(|_| once(act)) else {
            continue;
        };
        let c = &ops[ci];
        if c.op_type != p.op_type || var_of(c, "x").as_deref() != Some(act) {
            continue;
        }
        let Some(w2) = const_in(c, wp.input) else {
            continue;
        };
        if !ungrouped(f, &consts, c) {
            continue;
        }
        out.push(Chain {
            producer: pi,
            w1,
            bias,
            activation: ai,
            consumer: ci,
            w2,
        });
    }
    out
}

fn tensor_of(f: &Function, i: usize) -> Option<&Tensor> {
    f.block.operations[i].const_val()?.as_tensor()
}

/// The values of a float tensor as f32 (for ordering only).
fn values(t: &Tensor) -> Vec<f32> {
    match t.dtype {
        DType::F16 => t.data.to_f16_vec().iter().map(|v| v.to_f32()).collect(),
        _ => t.data.to_f32_vec(),
    }
}

/// The sort key of one output row (see the module doc).
pub fn row_key(row: &[f32], scaled: bool) -> f64 {
    row_key_weighted(row, scaled, None)
}

/// [`row_key`] of the row with each element scaled by √(importance ÷ mean importance): with
/// calibration statistics, an outlier in a channel that carries little signal costs the
/// weighted k-means little, so it should not decide the row's group.
fn row_key_weighted(row: &[f32], scaled: bool, importance: Option<&[f32]>) -> f64 {
    let scaled_row: Vec<f32>;
    let row = match importance {
        Some(imp) if imp.len() == row.len() => {
            let mean = imp.iter().map(|v| *v as f64).sum::<f64>() / imp.len().max(1) as f64;
            if mean > 0.0 {
                scaled_row = row
                    .iter()
                    .zip(imp)
                    .map(|(w, m)| w * ((*m as f64 / mean).sqrt() as f32))
                    .collect();
                &scaled_row[..]
            } else {
                row
            }
        }
        _ => row,
    };
    let max = row.iter().fold(0f64, |m, v| m.max(v.abs() as f64));
    if !scaled {
        return max;
    }
    let ms = row.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / row.len().max(1) as f64;
    if max > 0.0 {
        ms.sqrt() / max
    } else {
        0.0
    }
}

/// The order of `rows` rows of `w` by [`row_key`]: entry i is the old index of new row i.
/// `importance`: one weight per element of a row (see [`Calibration::importance`]).
pub fn row_order(w: &[f32], rows: usize, scaled: bool, importance: Option<&[f32]>) -> Vec<usize> {
    let cols = w.len() / rows.max(1);
    let keys: Vec<f64> = (0..rows)
        .map(|r| row_key_weighted(&w[r * cols..(r + 1) * cols], scaled, importance))
        .collect();
    let mut perm: Vec<usize> = (0..rows).collect();
    perm.sort_by(|&a, &b| keys[a].total_cmp(&keys[b]));
    perm
}

/// `t` with its elements rearranged: viewed as [outer, n, inner], slab i of axis 1 becomes
/// old slab `perm[i]`.
fn permute_axis(t: &Tensor, outer: usize, perm: &[usize]) -> Result<Tensor> {
    let n = perm.len();
    let bytes = t.data.as_slice();
    let esize = t.dtype.bits() / 8;
    let slab = bytes.len() / (outer * n).max(1);
    if esize == 0 || slab * outer * n != bytes.len() || !slab.is_multiple_of(esize) {
        bail!(
            "cannot reorder a {:?} {:?} tensor along a {n}-channel axis",
            t.dtype,
            t.shape
        );
    }
    let mut out = Vec::with_capacity(bytes.len());
    for o in 0..outer {
        let base = o * n * slab;
        for &p in perm {
            out.extend_from_slice(&bytes[base + p * slab..base + (p + 1) * slab]);
        }
    }
    Tensor::new(t.dtype, t.shape.clone(), Bytes::from_vec(out))
}

fn set_const(f: &mut Function, i: usize, t: Tensor) {
    f.block.operations[i]
        .attributes
        .insert("val".to_string(), Value::Tensor(t));
}

/// Reorders one chain; `None` when its order is already sorted or its shapes do not match.
fn apply(
    f: &mut Function,
    c: &Chain,
    scaled: bool,
    cal: Option<&Calibration>,
) -> Result<Option<(Vec<usize>, Regrouped)>> {
    let (Some(w1), Some(w2)) = (tensor_of(f, c.w1), tensor_of(f, c.w2)) else {
        return Ok(None);
    };
    let n = w1.shape.first().copied().unwrap_or(0);
    if n < 2 || w1.shape.len() < 2 || w2.shape.len() < 2 || w2.shape[1] != n {
        return Ok(None);
    }
    if let Some(b) = c.bias.and_then(|i| tensor_of(f, i)) {
        if b.num_elements() != n {
            return Ok(None);
        }
    }
    let importance = match cal {
        Some(cal) => cal.importance(&f.block.operations[c.w1].name, &w1.shape)?,
        None => None,
    };
    let perm = row_order(&values(w1), n, scaled, importance.as_deref());
    let moved = perm.iter().enumerate().filter(|(i, p)| *i != **p).count();
    if moved == 0 {
        return Ok(None);
    }
    let new_w1 = permute_axis(w1, 1, &perm)?;
    let new_w2 = permute_axis(w2, w2.shape[0], &perm)?;
    let new_b = match c.bias.and_then(|i| tensor_of(f, i)) {
        Some(b) => Some(permute_axis(b, 1, &perm)?),
        None => None,
    };
    let ops = &f.block.operations;
    let rec = Regrouped {
        producer: ops[c.producer].name.clone(),
        producer_weight: ops[c.w1].name.clone(),
        consumer: ops[c.consumer].name.clone(),
        consumer_weight: ops[c.w2].name.clone(),
        activation: ops[c.activation].op_type.clone(),
        channels: n,
        moved,
    };
    set_const(f, c.w1, new_w1);
    set_const(f, c.w2, new_w2);
    if let (Some(i), Some(b)) = (c.bias, new_b) {
        set_const(f, i, b);
    }
    Ok(Some((perm, rec)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_sort_by_largest_magnitude_or_by_peakedness() {
        // Row 0: max 3; row 1: max 1; row 2: max 2 (flat), row 3: max 2 (one spike).
        let w = [
            3.0, 0.0, 0.0, 0.0, //
            1.0, -1.0, 0.5, 0.0, //
            2.0, 2.0, -2.0, 2.0, //
            0.0, 0.0, 0.0, -2.0,
        ];
        assert_eq!(row_order(&w, 4, false, None), vec![1, 2, 3, 0]);
        // rms/max: row0 0.5, row1 ≈0.75, row2 1.0, row3 0.5 → spiky rows first (stable).
        assert_eq!(row_order(&w, 4, true, None), vec![0, 3, 1, 2]);
        // Calibrated: column 3 carries no signal, so row 3's spike there no longer counts.
        let imp = [1.0, 1.0, 1.0, 0.0];
        assert_eq!(row_order(&w, 4, false, Some(&imp)), vec![3, 1, 2, 0]);
    }

    #[test]
    fn permuting_an_axis_moves_whole_slabs() {
        let t = Tensor::f32(
            &[2, 3, 2],
            &[0., 1., 2., 3., 4., 5., 6., 7., 8., 9., 10., 11.],
        );
        let p = permute_axis(&t, 2, &[2, 0, 1]).unwrap();
        assert_eq!(
            p.data.to_f32_vec(),
            vec![4., 5., 0., 1., 2., 3., 10., 11., 6., 7., 8., 9.]
        );
    }
}
