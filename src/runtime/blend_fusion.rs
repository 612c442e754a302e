//! Plan-level fusion of `add(mul(a, b), mul(c, d))` — the way a decoder with its KV cache as
//! inputs merges this token into the cache (`cache·(1 − mask) + new·mask`) — into one step
//! running `kernels::blend::mul_mul_add`, which rounds like the three ops and makes one
//! pass instead of three. Fused only when each product has the add as its only reader and
//! is no block output.

use super::plan::{Src, Step};
use crate::kernels;
use crate::ops::eval::{out0, EvalCx, RValue};
use anyhow::Result;
use std::collections::{BTreeMap, HashMap};

/// The op type fused steps report (in profiles and errors).
pub const FUSED: &str = "mul+mul+add";

fn single(st: &Step, name: &str) -> Option<Src> {
    match st.args.iter().find(|(p, _)| p == name) {
        Some((_, v)) if v.len() == 1 => Some(v[0]),
        _ => None,
    }
}

/// Replaces each fusable `add` of two products by one step at the add's position.
pub fn fuse_blends(steps: &mut Vec<Step>, outputs: &[Src]) {
    let mut uses: HashMap<usize, usize> = HashMap::new();
    let mut maker: HashMap<usize, usize> = HashMap::new();
    for (i, st) in steps.iter().enumerate() {
        for s in st.args.iter().flat_map(|(_, v)| v) {
            if let Src::Slot(k) = s {
                *uses.entry(*k).or_default() += 1;
            }
        }
        for &o in &st.outs {
            maker.insert(o, i);
        }
    }
    for s in outputs {
        if let Src::Slot(k) = s {
            *uses.entry(*k).or_default() += 2;
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
            let Src::Slot(k) = single(add, p)? else {
                return None;
            };
            let m = *maker.get(&k)?;
            let st = &steps[m];
            let ok = st.op_type == "mul"
                && st.args.len() == 2
                && st.outs == [k]
                && uses.get(&k) == Some(&1)
                && !removed[m];
            ok.then_some((m, single(st, "x")?, single(st, "y")?))
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
                name: add.name.clone(),
                eval: eval_mul_mul_add,
                args,
                attributes: BTreeMap::new(),
                out_types: add.out_types.clone(),
                outs: add.outs.clone(),
                free: vec![],
            },
        );
    }
    let old = std::mem::take(steps);
    for (i, st) in old.into_iter().enumerate() {
        match fused.remove(&i) {
            Some(f) => steps.push(f),
            None if !removed[i] => steps.push(st),
            None => {}
        }
    }
}

fn eval_mul_mul_add(cx: &EvalCx) -> Result<Vec<RValue>> {
    let (a, b, c, d) = (cx.t("a")?, cx.t("b")?, cx.t("c")?, cx.t("d")?);
    out0(cx, kernels::blend::mul_mul_add(a, b, c, d)?)
}
