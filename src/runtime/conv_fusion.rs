//! Plan-level fusion of `conv → gelu` (every encoder MLP's `fc1`) into one step running
//! `ops::eval_conv_gelu`: where the blocked GEMM runs the conv, the GELU happens in its
//! store (the product plus the bias rounded to the conv's dtype, widened, GELU in f32,
//! rounded again), which saves a pass over the largest activation and a rayon fork/join.
//! Elsewhere the fused step runs the two ops' kernels one after the other. Either way its
//! bits are the two ops'. Fused only when the gelu is the conv's only reader (no block
//! output either) and its mode is a constant; the fused step keeps the conv's definition
//! (its weight is packed and counted as the conv's).

use super::step::{slot_uses, splice_fused, Const, Src, Step};
use std::collections::BTreeMap;

/// The op type fused steps report (in profiles and errors).
pub const FUSED: &str = "conv+gelu";

/// The gelu's mode as a constant string (its declared default when absent).
fn gelu_mode(st: &Step, consts: &[Const]) -> Option<String> {
    let mode = match st.single("mode") {
        None => {
            let def = st.def?;
            crate::ops::default_of(def.inputs, def.name, "mode")
                .ok()?
                .str("mode")
                .ok()?
                .to_string()
        }
        Some(Src::Const(i)) => consts[i].konst.as_ref()?.as_str()?.to_string(),
        Some(Src::Slot(_)) => return None,
    };
    crate::ops::gelu_mode(&mode).ok().map(|_| mode)
}

/// Replaces each `conv` whose only reader is a `gelu` by one step at the gelu's position.
/// `outputs` are the block outputs.
pub fn fuse_conv_gelu(steps: &mut Vec<Step>, consts: &[Const], outputs: &[Src]) {
    let uses = slot_uses(steps, outputs);
    let mut removed = vec![false; steps.len()];
    let mut fused: BTreeMap<usize, Step> = BTreeMap::new();
    for i in 0..steps.len() {
        let conv = &steps[i];
        if conv.op_type != "conv" || conv.outs.len() != 1 || conv.def.is_none() {
            continue;
        }
        let k = conv.outs[0];
        let Some(&[j]) = uses.get(&k).map(Vec::as_slice) else {
            continue;
        };
        if j == usize::MAX {
            continue;
        }
        let g = &steps[j];
        let same_dtype = match (conv.out_types[0].as_tensor(), g.out_types.first()) {
            (Some(a), Some(b)) => b.as_tensor().is_some_and(|b| b.dtype == a.dtype),
            _ => false,
        };
        if g.op_type != "gelu"
            || g.outs.len() != 1
            || g.single("x") != Some(Src::Slot(k))
            || !same_dtype
        {
            continue;
        }
        let Some(mode) = gelu_mode(g, consts) else {
            continue;
        };
        let mut attributes = conv.attributes.clone();
        attributes.insert("gelu_mode".to_string(), crate::ir::Value::str(&mode));
        removed[i] = true;
        fused.insert(
            j,
            Step {
                op_type: FUSED.to_string(),
                def: conv.def,
                name: g.name.clone(),
                eval: crate::ops::eval_conv_gelu,
                args: conv.args.clone(),
                attributes,
                out_types: g.out_types.clone(),
                outs: g.outs.clone(),
                free: vec![],
                blocks: vec![],
            },
        );
    }
    splice_fused(steps, fused, &removed);
}
