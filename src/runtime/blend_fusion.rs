//! Plan-level fusion of `add(mul(a, b), mul(c, d))` — the way a decoder with its KV cache as
//! inputs merges this token into the cache (`cache·(1 − mask) + new·mask`) — into one step
//! running `kernels::blend::mul_mul_add`, which rounds like the three ops and makes one
//! pass instead of three. Fused only when each product has the add as its only reader and
//! is no block output. Then, where such a blend only feeds (through a reshape into heads)
//! the keys or values of a fused attention, the blend moves into the attention step
//! ([`fuse_into_attention`]): a decode step fills each head's blended rows where it reads
//! them, and the blended cache is never written whole.

use super::step::{only_reader, slot_makers, slot_uses, splice_fused, Src, Step};
use crate::ir::Value;
use crate::kernels;
use crate::ops::eval::{out0, EvalCx, RValue};
use anyhow::Result;
use std::collections::BTreeMap;

/// The op type fused steps report (in profiles and errors).
pub const FUSED: &str = "mul+mul+add";

/// Replaces each fusable `add` of two products by one step at the add's position.
pub fn fuse_blends(steps: &mut Vec<Step>, outputs: &[Src]) {
    let uses = slot_uses(steps, outputs);
    let maker = slot_makers(steps);
    let mut removed = vec![false; steps.len()];
    let mut fused: BTreeMap<usize, Step> = BTreeMap::new();
    for i in 0..steps.len() {
        let add = &steps[i];
        if add.op_type != "add" || add.args.len() != 2 || add.outs.len() != 1 {
            continue;
        }
        let product = |p: &str| -> Option<(usize, Src, Src)> {
            let Src::Slot(k) = add.single(p)? else {
                return None;
            };
            let m = *maker.get(&k)?;
            let st = &steps[m];
            let ok = st.op_type == "mul"
                && st.args.len() == 2
                && st.outs == [k]
                && matches!(uses.get(&k).map(Vec::as_slice), Some([_]))
                && !removed[m];
            ok.then_some((m, st.single("x")?, st.single("y")?))
        };
        let (Some((m1, a, b)), Some((m2, c, d))) = (product("x"), product("y")) else {
            continue;
        };
        if m1 == m2 {
            continue;
        }
        removed[m1] = true;
        removed[m2] = true;
        let args = [("a", a), ("b", b), ("c", c), ("d", d)]
            .into_iter()
            .map(|(p, s)| (p.to_string(), vec![s]))
            .collect();
        fused.insert(
            i,
            Step {
                op_type: FUSED.to_string(),
                def: None,
                name: add.name.clone(),
                eval: eval_mul_mul_add,
                args,
                attributes: BTreeMap::new(),
                out_types: add.out_types.clone(),
                outs: add.outs.clone(),
                free: vec![],
                blocks: vec![],
            },
        );
    }
    splice_fused(steps, fused, &removed);
}

fn eval_mul_mul_add(cx: &EvalCx) -> Result<Vec<RValue>> {
    let (a, b, c, d) = (cx.t("a")?, cx.t("b")?, cx.t("c")?, cx.t("d")?);
    out0(cx, kernels::blend::mul_mul_add(a, b, c, d)?)
}

/// Moves each blend that only feeds a fused attention's keys or values through one
/// `reshape` (which keeps the rows: the last axis unchanged, every dimension fixed) into
/// the attention step, removing the blend and the reshape. Run after [`fuse_blends`] and
/// the attention fusion.
pub fn fuse_into_attention(steps: &mut Vec<Step>, outputs: &[Src]) {
    let uses = slot_uses(steps, outputs);
    let only_use = |slot: usize| only_reader(&uses, slot);
    let maker = slot_makers(steps);
    let fixed = |st: &Step| st.out_types[0].as_tensor()?.fixed_shape();
    let mut removed = vec![false; steps.len()];
    let mut rewrites: Vec<(usize, &str, usize, Vec<usize>)> = vec![];
    for (i, st) in steps.iter().enumerate() {
        if st.op_type != super::fusion::FUSED {
            continue;
        }
        for p in ["y", "v"] {
            let Some(Src::Slot(k1)) = st.single(p) else {
                continue;
            };
            let Some(r) = maker.get(&k1).copied() else {
                continue;
            };
            let rs = &steps[r];
            if rs.op_type != "reshape" || rs.outs != [k1] || only_use(k1) != Some(i) {
                continue;
            }
            let Some(Src::Slot(k2)) = rs.single("x") else {
                continue;
            };
            let Some(b) = maker.get(&k2).copied() else {
                continue;
            };
            let bs = &steps[b];
            if bs.op_type != FUSED || bs.outs != [k2] || only_use(k2) != Some(r) {
                continue;
            }
            let (Some(shape), Some(blended)) = (fixed(rs), fixed(bs)) else {
                continue;
            };
            if shape.last() != blended.last() || removed[r] || removed[b] {
                continue;
            }
            removed[r] = true;
            removed[b] = true;
            rewrites.push((i, p, b, shape));
        }
    }
    for (i, p, b, shape) in rewrites {
        let (names, shape_attr) = super::fusion::blend_args(p);
        let srcs: Vec<Src> = ["a", "b", "c", "d"]
            .iter()
            .map(|o| {
                steps[b]
                    .single(o)
                    .expect("a fused blend binds a, b, c and d")
            })
            .collect();
        let st = &mut steps[i];
        st.args.retain(|(n, _)| n != p);
        for (name, src) in names.iter().zip(srcs) {
            st.args.push((name.clone(), vec![src]));
        }
        let dims: Vec<i32> = shape.iter().map(|&n| n as i32).collect();
        st.attributes.insert(shape_attr, Value::i32s(&dims));
    }
    splice_fused(steps, BTreeMap::new(), &removed);
}
