//! What a one-token decoder call must read, and how fast this machine reads it: the inputs
//! of the weight-stream floor that `milkit bench` reports; and the arithmetic of one call
//! (the FLOPs of its contractions), the encoder rate's numerator.

use crate::ir::{Arg, Model, Operation, Value, ValueType};
use crate::kernels::gemv::wide;
use crate::package::convert::goes_to_blob;
use anyhow::{anyhow, Result};
use rayon::prelude::*;
use std::collections::{HashMap, HashSet};
use std::time::Instant;

/// Bytes of stored weights one call of `m`'s main function reads: every blob constant
/// (a `constexpr_*` weight counts its stored inputs, i.e. compressed bytes), except tables that
/// only `gather` reads (embeddings), which count one row per call.
pub fn weight_bytes_per_call(m: &Model) -> Result<u64> {
    weight_bytes(m, &|_| true)
}

/// Bytes one token's call of `m`'s main function must read when the inputs for which
/// `fixed` holds keep their values across a window's tokens (the encoder output, or
/// precomputed cross-attention K/V), so that a runtime computes what depends only on them
/// once per window. An op runs every token when one of its inputs derives from an input
/// that is not fixed. The count is the sum of:
/// - the stored weights those per-token ops read, as [`weight_bytes_per_call`] counts them
///   (weights read only by ops of the fixed inputs, such as the cross-attention K/V
///   projections, count 0);
/// - every value derived from the fixed inputs (or a fixed input itself) that a per-token
///   op reads, by its static type: the cross-attention K/V, counted once each;
/// - every input that is not fixed, by its static type, states included: the
///   self-attention caches, the masks and the token.
///
/// A value whose shape is not fixed counts 0.
pub fn token_bytes_per_call(m: &Model, fixed: &dyn Fn(&str) -> bool) -> Result<u64> {
    let f = m
        .program
        .main()
        .ok_or_else(|| anyhow!("the program has no functions"))?;
    let type_bytes = |ty: &ValueType| -> u64 {
        let t = match ty {
            ValueType::Tensor(t) | ValueType::State(t) => t,
            _ => return 0,
        };
        t.num_elements()
            .map_or(0, |n| (n * t.dtype.bits()).div_ceil(8) as u64)
    };
    let mut types: HashMap<&str, &ValueType> = HashMap::new();
    let mut window: HashSet<&str> = HashSet::new();
    let mut token: HashSet<&str> = HashSet::new();
    let mut bytes = 0u64;
    for v in &f.inputs {
        types.insert(v.name.as_str(), &v.ty);
        if fixed(&v.name) {
            window.insert(v.name.as_str());
        } else {
            token.insert(v.name.as_str());
            bytes += type_bytes(&v.ty);
        }
    }
    let ops = f.block.walk();
    let mut read: HashSet<&str> = HashSet::new();
    for op in &ops {
        let vars = || {
            op.inputs.values().flatten().filter_map(|a| match a {
                Arg::Var(v) => Some(v.as_str()),
                Arg::Value(_) => None,
            })
        };
        let set = if vars().any(|v| token.contains(v)) {
            read.extend(vars().filter(|v| window.contains(v)));
            &mut token
        } else if vars().any(|v| window.contains(v)) {
            &mut window
        } else {
            continue;
        };
        for o in &op.outputs {
            set.insert(o.name.as_str());
            types.insert(o.name.as_str(), &o.ty);
        }
    }
    bytes += read
        .iter()
        .map(|v| types.get(v).map_or(0, |t| type_bytes(t)))
        .sum::<u64>();
    let per_token = |op: &Operation| {
        op.outputs
            .first()
            .is_some_and(|o| token.contains(o.name.as_str()))
    };
    Ok(bytes + weight_bytes(m, &per_token)?)
}

/// [`weight_bytes_per_call`] counting only the reads of the ops for which `counts` holds.
fn weight_bytes(m: &Model, counts: &dyn Fn(&Operation) -> bool) -> Result<u64> {
    let f = m
        .program
        .main()
        .ok_or_else(|| anyhow!("the program has no functions"))?;
    // Stored bytes and row count of every weight-carrying variable.
    let mut weights: HashMap<&str, (u64, u64)> = HashMap::new();
    // Per weight: (gather reads, other reads).
    let mut uses: HashMap<&str, (usize, usize)> = HashMap::new();
    let ops = f.block.walk();
    for op in &ops {
        if let Some(Value::Tensor(t)) = op.const_val() {
            if goes_to_blob(t) {
                if let Some(out) = op.outputs.first() {
                    let rows = t.shape.first().copied().unwrap_or(1).max(1) as u64;
                    weights.insert(out.name.as_str(), (t.data.len() as u64, rows));
                }
            }
            continue;
        }
        let constexpr = op.op_type.starts_with("constexpr_");
        if !constexpr && !counts(op) {
            continue;
        }
        let mut inline = 0u64;
        let mut fed = 0u64;
        for (param, args) in &op.inputs {
            for a in args {
                match a {
                    Arg::Value(Value::Tensor(t)) if goes_to_blob(t) => {
                        inline += t.data.len() as u64
                    }
                    Arg::Var(v) if weights.contains_key(v.as_str()) => {
                        if op.op_type.starts_with("constexpr_") {
                            fed += weights.get(v.as_str()).map_or(0, |w| w.0);
                        } else {
                            let u = uses.entry(v.as_str()).or_default();
                            if op.op_type == "gather" && param == "x" {
                                u.0 += 1;
                            } else {
                                u.1 += 1;
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        if op.op_type.starts_with("constexpr_") {
            // The decompressed weight stands for its stored inputs.
            for a in op.inputs.values().flatten() {
                if let Arg::Var(v) = a {
                    weights.remove(v.as_str());
                }
            }
            if let Some(out) = op.outputs.first() {
                let rows = out
                    .ty
                    .as_tensor()
                    .and_then(|t| t.fixed_shape())
                    .and_then(|s| s.first().copied())
                    .unwrap_or(1)
                    .max(1) as u64;
                weights.insert(out.name.as_str(), (fed + inline, rows));
            }
        } else if inline > 0 {
            weights.insert(op.name.as_str(), (inline, 1));
            uses.entry(op.name.as_str()).or_default().1 += 1;
        }
    }
    Ok(weights
        .iter()
        .map(|(name, &(bytes, rows))| match uses.get(name) {
            None => 0,
            Some(&(g, 0)) if g > 0 => bytes.div_ceil(rows),
            Some(_) => bytes,
        })
        .sum())
}

/// FLOPs of one call of `m`'s main function: `2·k` per output element of every `conv`
/// (k = input channels per group × kernel size), `linear` and `matmul` (k the contracted
/// length), read from the program's static types; other ops are not counted. A contraction
/// whose shapes are not fixed counts 0.
pub fn flops_per_call(m: &Model) -> Result<u64> {
    let f = m
        .program
        .main()
        .ok_or_else(|| anyhow!("the program has no functions"))?;
    let mut shapes: HashMap<&str, Vec<usize>> = HashMap::new();
    for v in &f.inputs {
        if let Some(s) = v.ty.as_tensor().and_then(|t| t.fixed_shape()) {
            shapes.insert(v.name.as_str(), s);
        }
    }
    let ops = f.block.walk();
    for op in &ops {
        for o in &op.outputs {
            if let Some(s) = o.ty.as_tensor().and_then(|t| t.fixed_shape()) {
                shapes.insert(o.name.as_str(), s);
            }
        }
    }
    let shape = |op: &crate::ir::Operation, p: &str| -> Option<Vec<usize>> {
        match op.arg(p)? {
            Arg::Var(v) => shapes.get(v.as_str()).cloned(),
            Arg::Value(Value::Tensor(t)) => Some(t.shape.clone()),
            Arg::Value(_) => None,
        }
    };
    let flag = |op: &crate::ir::Operation, p: &str| {
        match op.arg(p) {
        Some(Arg::Value(Value::Tensor(t))) => t.to_i64_vec().ok() == Some(vec![1]),
        Some(Arg::Var(v)) => ops.iter().any(|o| {
            o.outputs.first().is_some_and(|x| &x.name == v)
                && matches!(o.const_val(), Some(Value::Tensor(t)) if t.to_i64_vec().ok() == Some(vec![1]))
        }),
        _ => false,
    }
    };
    let mut total = 0u64;
    for op in &ops {
        let out: Option<u64> = op
            .outputs
            .first()
            .and_then(|o| shapes.get(o.name.as_str()))
            .map(|s| s.iter().product::<usize>() as u64);
        let k = match op.op_type.as_str() {
            // weight [O, C/groups, *K]
            "conv" => shape(op, "weight").map(|w| w[1..].iter().product::<usize>()),
            // weight [O, C]
            "linear" => shape(op, "weight").and_then(|w| w.last().copied()),
            "matmul" => shape(op, "x").and_then(|x| match x.len() {
                0 => None,
                1 => Some(x[0]),
                r if flag(op, "transpose_x") => Some(x[r - 2]),
                r => Some(x[r - 1]),
            }),
            _ => None,
        };
        if let (Some(n), Some(k)) = (out, k) {
            total += 2 * n * k as u64;
        }
    }
    Ok(total)
}

/// Best read bandwidth (10^9 bytes/s) over `passes` passes of summing a buffer of `bytes`
/// bytes with all rayon threads, as the decoder's kernels read weights. The same working set
/// matters: a buffer that fits a large last-level cache streams far faster than DRAM.
pub fn stream_bandwidth_gbps(bytes: u64, passes: usize) -> f64 {
    best_pass_gbps(bytes, &stream_pass_seconds(bytes, passes))
}

/// The bandwidth (10^9 bytes/s) of the fastest of [`stream_pass_seconds`]`(bytes, ..)`'s
/// passes.
pub fn best_pass_gbps(bytes: u64, pass_seconds: &[f64]) -> f64 {
    let best = pass_seconds.iter().copied().fold(f64::INFINITY, f64::min);
    streamed_bytes(bytes) as f64 / best.max(1e-9) / 1e9
}

/// The bytes [`stream_pass_seconds`] reads for `bytes`: rounded down to whole u64s, at
/// least 4 KiB.
pub fn streamed_bytes(bytes: u64) -> u64 {
    (bytes / 8).max(512) * 8
}

/// The time of each of `passes` passes (at least one) of summing a buffer of
/// [`streamed_bytes`]`(bytes)` bytes with all rayon threads, in seconds. Each chunk is read
/// by `kernels::gemv::wide::read_sum`, at least as fast as the decoder's row kernels read
/// their weights (a scalar fold was not: the decoder then came out under its "floor").
pub fn stream_pass_seconds(bytes: u64, passes: usize) -> Vec<f64> {
    let n = (streamed_bytes(bytes) / 8) as usize;
    let buf: Vec<u64> = (0..n as u64).collect();
    let chunk = n.div_ceil(rayon::current_num_threads() * 4).max(512);
    let on = wide::available();
    (0..passes.max(1))
        .map(|_| {
            let t0 = Instant::now();
            let s: u64 = buf
                .par_chunks(chunk)
                .map(|c| wide::read_sum(c, on))
                .reduce(|| 0, u64::wrapping_add);
            let dt = t0.elapsed().as_secs_f64();
            std::hint::black_box(s);
            dt
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Opset;
    use crate::ir::{DType, Description, Tensor, ValueType};
    use crate::ops::{Builder, In};

    /// embed [100, 64] gathered, head [100, 64] in a linear: one row + the whole head.
    #[test]
    fn gathered_tables_count_one_row() {
        let mut b = Builder::new(Opset::Ios17);
        let ids = b.input("ids", ValueType::tensor(DType::I32, &[1]));
        let table = b.konst(
            "embed",
            Value::Tensor(Tensor::f16(&[100, 64], &[half::f16::ONE; 6400])),
        );
        let row = b
            .op1(
                "gather",
                "row",
                vec![
                    ("x", In::V(table)),
                    ("indices", In::V(ids)),
                    ("axis", In::C(Value::i32_scalar(0))),
                ],
            )
            .unwrap();
        let head = b.konst(
            "head",
            Value::Tensor(Tensor::f16(&[100, 64], &[half::f16::ONE; 6400])),
        );
        let y = b
            .op1(
                "linear",
                "logits",
                vec![("x", In::V(row)), ("weight", In::V(head))],
            )
            .unwrap();
        let (inputs, block) = b.finish(&[(y, "logits")]).unwrap();
        let m = Model::single(Opset::Ios17, inputs, block, Description::default());
        assert_eq!(weight_bytes_per_call(&m).unwrap(), 64 * 2 + 6400 * 2);
    }

    #[test]
    fn bandwidth_is_positive_and_finite() {
        let g = stream_bandwidth_gbps(1 << 20, 3);
        assert!(g.is_finite() && g > 0.1, "{g}");
    }
}
