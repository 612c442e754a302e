//! Plan-level fusion of `add(mul(a, b), mul(c, d))` — the way a decoder with its KV cache as
//! inputs merges this token into the cache (`cache·(1 − mask) + new·mask`) — into one step
//! running `kernels::blend::mul_mul_add`, which rounds like the three ops and makes one
//! pass instead of three. Fused only when each product has the add as its only reader and
//! is no block output.

use super::step::{slot_uses, splice_fused, Src, Step};
use crate::kernels;
use crate::ops::eval::{out0, EvalCx, RValue};
use anyhow::Result;
use std::collections::{BTreeMap, HashMap};

/// The op type fused steps report (in profiles and errors).
pub const FUSED: &str = "mul+mul+add";

/// Replaces each fusable `add` of two products by one step at the add's position.
pub fn fuse_blends(steps: &mut Vec<Step>, outputs: &[Src]) {
    let uses = slot_uses(steps, outputs);
    let mut maker: HashMap<usize, usize> = HashMap::new();
    for (i, st) in steps.iter().enumerate() {
        for &o in &st.outs {
            maker.insert(o, i);
        }
    }
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
