//! Non-finite constants (NaN, ±Inf) in a program: finding them (per op, with a count) and
//! the policy `milkit compress` applies before compressing a package — refuse, naming every
//! op and count, or with `--allow-nonfinite` go on with a warning. (Exports check the
//! checkpoint's tensors as they are read, with [`count_nonfinite_f16`], see
//! `whisper::weights`.) Uses only `ir`.

use crate::ir::{Arg, Block, DType, Model, Tensor, Value};
use anyhow::{bail, Result};
use rayon::prelude::*;

/// How many of the little-endian fp16 values in `data` are NaN or ±Inf (exponent all ones).
pub fn count_nonfinite_f16(data: &[u8]) -> usize {
    data.par_chunks(1 << 20)
        .map(|c| {
            c.chunks_exact(2)
                .filter(|b| u16::from_le_bytes([b[0], b[1]]) & 0x7c00 == 0x7c00)
                .count()
        })
        .sum()
}

/// One op whose constant data holds non-finite values.
#[derive(Clone, Debug, PartialEq)]
pub struct NonFinite {
    /// The op's name (its first output's when unnamed).
    pub op: String,
    /// Non-finite elements.
    pub count: usize,
    /// Elements of the op's float constants.
    pub total: usize,
}

/// (non-finite, total) elements of a float tensor; (0, 0) for other dtypes.
fn count_tensor(t: &Tensor) -> (usize, usize) {
    let b = t.data.as_slice();
    match t.dtype {
        DType::F16 => (count_nonfinite_f16(b), b.len() / 2),
        // bf16: exponent 0x7f80 all ones.
        DType::BF16 => (
            b.chunks_exact(2)
                .filter(|c| u16::from_le_bytes([c[0], c[1]]) & 0x7f80 == 0x7f80)
                .count(),
            b.len() / 2,
        ),
        DType::F32 => (
            b.chunks_exact(4)
                .filter(|c| !f32::from_le_bytes([c[0], c[1], c[2], c[3]]).is_finite())
                .count(),
            b.len() / 4,
        ),
        DType::F64 => (
            b.chunks_exact(8)
                .filter(|c| {
                    let mut w = [0u8; 8];
                    w.copy_from_slice(c);
                    !f64::from_le_bytes(w).is_finite()
                })
                .count(),
            b.len() / 8,
        ),
        _ => (0, 0),
    }
}

fn count_value(v: &Value, acc: &mut (usize, usize)) {
    match v {
        Value::Tensor(t) => {
            let (bad, n) = count_tensor(t);
            acc.0 += bad;
            acc.1 += n;
        }
        Value::Strings { .. } => {}
        Value::List { values, .. } | Value::Tuple(values) => {
            values.iter().for_each(|x| count_value(x, acc))
        }
        Value::Dict { entries, .. } => entries.iter().for_each(|(k, x)| {
            count_value(k, acc);
            count_value(x, acc);
        }),
    }
}

fn scan_block(b: &Block, out: &mut Vec<NonFinite>) {
    for op in &b.operations {
        let mut acc = (0, 0);
        op.attributes
            .values()
            .for_each(|v| count_value(v, &mut acc));
        for a in op.inputs.values().flatten() {
            if let Arg::Value(v) = a {
                count_value(v, &mut acc);
            }
        }
        if acc.0 > 0 {
            let op_name = if op.name.is_empty() {
                op.outputs
                    .first()
                    .map(|o| o.name.clone())
                    .unwrap_or_default()
            } else {
                op.name.clone()
            };
            out.push(NonFinite {
                op: op_name,
                count: acc.0,
                total: acc.1,
            });
        }
        op.blocks.iter().for_each(|b| scan_block(b, out));
    }
}

/// Every op of every function whose constants hold NaN or ±Inf, in program order.
pub fn nonfinite_constants(m: &Model) -> Vec<NonFinite> {
    let mut out = Vec::new();
    for f in m.program.functions.values() {
        scan_block(&f.block, &mut out);
    }
    out
}

/// Refuses a model with non-finite constants (the error names `what`, each op and its
/// count), or with `allow` prints the same list as a warning on stderr and goes on.
pub fn check_model(m: &Model, what: &str, allow: bool) -> Result<()> {
    let bad = nonfinite_constants(m);
    if bad.is_empty() {
        return Ok(());
    }
    let list = bad
        .iter()
        .map(|b| format!("\n  {}: {} of {} values", b.op, b.count, b.total))
        .collect::<String>();
    if allow {
        eprintln!(
            "warning: {what}: {} op(s) hold non-finite weights (NaN or ±Inf); going on \
             (--allow-nonfinite):{list}",
            bad.len()
        );
        return Ok(());
    }
    bail!(
        "{what}: {} op(s) hold non-finite weights (NaN or ±Inf), which compression cannot \
         represent (pass --allow-nonfinite to go on anyway):{list}",
        bad.len()
    )
}
