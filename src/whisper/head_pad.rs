//! Vocabulary heads no group size divides: a program rewrite that pads the rows of each
//! vocabulary-head conv of a milkit text decoder (the ops its `milkit.head_ops` metadata
//! names) with zero rows up to a multiple of `m`, and slices the conv's output back to the
//! real rows right after it, so every reader — the chunk `concat`, the `logits` reshape —
//! sees exactly the shape it saw before and the ABI (`logits` [1, 1, vocab]) is unchanged.
//!
//! Multilingual vocabularies have 51,865 (= 5 · 11 · 23 · 41) or 51,866 (= 2 · 25,933) rows,
//! so no group size but 1 (or 2) divides them; padded, the head palettizes per group of 8 or
//! 16 rows like every other weight. A zero row computes a zero logit, which the slice drops,
//! and each real row is computed exactly as before (one dot product per row), so the real
//! logits are unchanged bit for bit. The zero rows are grouped only with each other and the
//! last real rows; a group of real rows that does not reach the padding is fitted exactly as
//! it would be without it. The package records the padding as `milkit.head_padding`
//! (`inspect` and `verify` print it).

use super::decoder_spec::head_ops;
use crate::ir::{Arg, Bytes, DType, Model, Operation, Tensor, Value, ValueType, Var};
use crate::passes::compress::Method;
use crate::passes::lut::LutGranularity;
use anyhow::{bail, ensure, Context, Result};
use std::collections::BTreeMap;

/// Metadata key recording the padding of a decoder's head (defined in `ir`, where `verify`
/// can read it without knowing Whisper).
pub use crate::ir::HEAD_PADDING_KEY;

/// One padded head conv: its op name and rows before and after.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PaddedHead {
    pub op: String,
    pub rows: usize,
    pub padded_rows: usize,
}

/// The row multiple `method` needs of a weight's output channels (axis 0): the group size of
/// grouped-channel palettization, else 1. (Per-block quantization blocks the input axis,
/// d_model, which every Whisper block size divides; it needs no padding.)
pub fn row_multiple(method: &Method) -> usize {
    match method {
        Method::Palettize(c) => match c.granularity {
            LutGranularity::PerGroupedChannel(g) => g.max(1),
            LutGranularity::PerTensor => 1,
        },
        Method::Quantize(_) => 1,
    }
}

/// Pads the head convs of decoder `m` whose rows `multiple` does not divide (see the module
/// doc). Does nothing (and returns nothing) when every head conv is already divisible.
/// Errors when `m` is not a milkit decoder (no `milkit.head_ops`) or a head op is not the
/// 1x1 conv milkit builds.
pub fn pad_head_rows(m: &mut Model, multiple: usize) -> Result<Vec<PaddedHead>> {
    let names = head_ops(m)?;
    pad_head_rows_of(m, multiple, &names)
}

/// [`pad_head_rows`] for only the head convs named in `only` (a subset of the decoder's
/// `milkit.head_ops`), so that a head whose chunks are compressed in several passes — chunk
/// 0 at 6 bits, then the others at 4 — can be padded chunk by chunk: a chunk compressed by an
/// earlier pass is not touched again. The padding record lists every padded chunk of every
/// pass.
pub fn pad_head_rows_of(
    m: &mut Model,
    multiple: usize,
    only: &[String],
) -> Result<Vec<PaddedHead>> {
    ensure!(multiple >= 1, "the head's row multiple must be at least 1");
    let heads = head_ops(m)?;
    if let Some(o) = only.iter().find(|o| !heads.contains(o)) {
        bail!(
            "`{o}` is not one of the decoder's vocabulary head ops ({})",
            heads.join(", ")
        );
    }
    let names: Vec<String> = heads.into_iter().filter(|h| only.contains(h)).collect();
    let mut done = Vec::new();
    for f in m.program.functions.values_mut() {
        let ops = &mut f.block.operations;
        for name in &names {
            let Some(i) = ops.iter().position(|o| &o.name == name) else {
                continue;
            };
            if let Some(p) = pad_one(ops, i, multiple)
                .with_context(|| format!("padding the vocabulary head op `{name}`"))?
            {
                done.push(p);
            }
        }
    }
    if !done.is_empty() {
        let text = done
            .iter()
            .map(|p| {
                format!(
                    "{}: {} rows + {} zero rows = {} (logits sliced back to {})",
                    p.op,
                    p.rows,
                    p.padded_rows - p.rows,
                    p.padded_rows,
                    p.rows
                )
            })
            .collect::<Vec<_>>()
            .join("; ");
        let text = match m.description.user_defined.get(HEAD_PADDING_KEY) {
            Some(earlier) => format!("{earlier}; {text}"),
            None => text,
        };
        m.description
            .user_defined
            .insert(HEAD_PADDING_KEY.into(), text);
    }
    Ok(done)
}

/// Pads the head conv at `ops[i]` in place and inserts its slice after it.
fn pad_one(ops: &mut Vec<Operation>, i: usize, multiple: usize) -> Result<Option<PaddedHead>> {
    let conv = &ops[i];
    ensure!(
        conv.op_type == "conv" && conv.outputs.len() == 1,
        "expected a conv with one output, found `{}`",
        conv.op_type
    );
    let Some(Arg::Var(wname)) = conv.arg("weight").cloned() else {
        bail!("its weight is not a named constant (already compressed?)");
    };
    let bias = match conv.arg("bias") {
        Some(Arg::Var(b)) => Some(b.clone()),
        None => None,
        Some(_) => bail!("its bias is not a named constant"),
    };
    let out = conv.outputs[0].clone();
    let (rows, padded) = {
        let w = const_tensor(ops, &wname)?;
        ensure!(
            w.dtype == DType::F16 && w.shape.len() == 4 && w.shape[2..] == [1, 1],
            "weight `{wname}` is {:?} {:?}, expected an fp16 [rows, d, 1, 1] 1x1 kernel",
            w.dtype,
            w.shape
        );
        (w.shape[0], w.shape[0].next_multiple_of(multiple))
    };
    if padded == rows {
        return Ok(None);
    }
    for (c, what) in std::iter::once((wname.clone(), "weight")).chain(bias.map(|b| (b, "bias"))) {
        let readers = ops
            .iter()
            .filter(|o| {
                o.inputs
                    .values()
                    .flatten()
                    .any(|a| *a == Arg::Var(c.clone()))
            })
            .count();
        ensure!(
            readers == 1,
            "its {what} `{c}` is read by {readers} ops; only a constant of its own can be padded"
        );
        let t = const_tensor_mut(ops, &c)?;
        let row_elems: usize = t.shape[1..].iter().product();
        ensure!(
            t.shape[0] == rows,
            "its {what} `{c}` has {} rows, the weight {rows}",
            t.shape[0]
        );
        let mut data = t.data.as_slice().to_vec();
        data.resize(padded * row_elems * t.dtype.storage_bytes(1), 0);
        let mut shape = t.shape.clone();
        shape[0] = padded;
        *t = Tensor::new(t.dtype, shape, Bytes::from_vec(data))?;
        let ty = ValueType::Tensor(t.tensor_type());
        set_const_type(ops, &c, ty);
    }
    let Some(mut out_shape) = out.ty.as_tensor().and_then(|t| t.fixed_shape()) else {
        bail!("its output `{}` has no fixed shape", out.name);
    };
    ensure!(
        out_shape.len() == 4 && out_shape[1] == rows,
        "its output `{}` has shape {out_shape:?}, expected [1, {rows}, 1, S]",
        out.name
    );
    let dtype = out.ty.as_tensor().map(|t| t.dtype).unwrap_or(DType::F16);
    let full = out_shape.clone();
    out_shape[1] = padded;
    let padded_name = format!("{}_padded", out.name);
    ops[i].outputs[0] = Var {
        name: padded_name.clone(),
        ty: ValueType::tensor(dtype, &out_shape),
    };
    let konst = |name: String, v: &[i32]| {
        let val = Value::i32s(v);
        let ty = val.value_type();
        Operation {
            op_type: "const".into(),
            name: name.clone(),
            inputs: BTreeMap::new(),
            outputs: vec![Var { name, ty }],
            blocks: vec![],
            attributes: BTreeMap::from([("val".to_string(), val)]),
        }
    };
    let begin = format!("{}_unpad_begin", out.name);
    let end = format!("{}_unpad_end", out.name);
    let full_i32: Vec<i32> = full.iter().map(|&d| d as i32).collect();
    let slice = Operation {
        op_type: "slice_by_index".into(),
        name: format!("{}_unpad", ops[i].name),
        inputs: BTreeMap::from([
            ("x".to_string(), vec![Arg::Var(padded_name)]),
            ("begin".to_string(), vec![Arg::Var(begin.clone())]),
            ("end".to_string(), vec![Arg::Var(end.clone())]),
        ]),
        outputs: vec![out],
        blocks: vec![],
        attributes: BTreeMap::new(),
    };
    let name = ops[i].name.clone();
    let added = [konst(begin, &[0, 0, 0, 0]), konst(end, &full_i32), slice];
    for (k, op) in added.into_iter().enumerate() {
        ops.insert(i + 1 + k, op);
    }
    Ok(Some(PaddedHead {
        op: name,
        rows,
        padded_rows: padded,
    }))
}

fn const_op<'a>(ops: &'a mut [Operation], name: &str) -> Result<&'a mut Operation> {
    ops.iter_mut()
        .find(|o| o.op_type == "const" && o.outputs.iter().any(|v| v.name == name))
        .with_context(|| format!("`{name}` is not produced by a const op"))
}

fn const_tensor<'a>(ops: &'a [Operation], name: &str) -> Result<&'a Tensor> {
    ops.iter()
        .find(|o| o.op_type == "const" && o.outputs.iter().any(|v| v.name == name))
        .and_then(|o| o.const_val())
        .and_then(Value::as_tensor)
        .with_context(|| format!("`{name}` is not a tensor constant"))
}

fn const_tensor_mut<'a>(ops: &'a mut [Operation], name: &str) -> Result<&'a mut Tensor> {
    match const_op(ops, name)?.attributes.get_mut("val") {
        Some(Value::Tensor(t)) => Ok(t),
        _ => bail!("`{name}` is not a tensor constant"),
    }
}

fn set_const_type(ops: &mut [Operation], name: &str, ty: ValueType) {
    if let Ok(op) = const_op(ops, name) {
        for v in op.outputs.iter_mut() {
            v.ty = ty.clone();
        }
    }
}
