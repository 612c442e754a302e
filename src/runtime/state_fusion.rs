//! Plan-level fusion of the in-place state update a stateful decoder writes per layer:
//! `read_state(S) → slice_update(x, update, begin, end) → write_state(S, ·)` plus the one
//! `slice_by_index` that reads the updated value back. Op by op, `slice_update` is functional
//! and copies the whole state (a tiny.en KV cache is 1.4 MB, updated 8 times a token); the
//! fused step (`ops::eval_state_slice_update`) writes the update into the state itself and
//! copies out only the slice. Fused only when nothing else can observe the difference: the
//! read feeds only the `slice_update`, the updated value feeds only that `write_state` and
//! that slice (no block output), and no other step touches the state in between.
//!
//! The slice is then handed out as a view of the state, not a copy (8 × 344 KB a token for
//! tiny.en), where [`allow_views`] proves that every value that may share its storage is
//! read for the last time before the state's next in-place update and none is a block
//! output; otherwise the fused step copies it.

use super::step::{slot_uses, splice_fused, Src, Step};
use std::collections::{BTreeMap, HashMap, HashSet};

/// The op type fused steps report (in profiles and errors).
pub const FUSED: &str = "read_state+slice_update+write_state";

/// `slice_update` parameters besides `x` and `update`; any other makes the chain unfusable.
const UPDATE_PARAMS: &[&str] = &[
    "begin",
    "end",
    "stride",
    "begin_mask",
    "end_mask",
    "squeeze_mask",
];

/// Replaces each fusable chain in `steps` by one step at the position of its slice.
/// `outputs` are the block outputs.
pub fn fuse_state_updates(steps: &mut Vec<Step>, outputs: &[Src]) {
    let uses = slot_uses(steps, outputs);
    let mut removed = vec![false; steps.len()];
    let mut fused: BTreeMap<usize, Step> = BTreeMap::new();
    for i in 0..steps.len() {
        let Some((gone, at, step)) = match_chain(steps, i, &uses) else {
            continue;
        };
        if gone
            .iter()
            .chain([&at])
            .any(|&r| removed[r] || fused.contains_key(&r))
        {
            continue;
        }
        gone.iter().for_each(|&r| removed[r] = true);
        removed[at] = true;
        fused.insert(at, step);
    }
    splice_fused(steps, fused, &removed);
    allow_views(steps, outputs);
}

/// Whether a fused update step hands out its slice as a view (see [`allow_views`]).
pub fn hands_out_view(st: &Step) -> bool {
    let view: crate::ops::EvalFn = crate::ops::eval_state_slice_update_view;
    st.eval as usize == view as usize
}

/// Whether `st`'s evaluation always returns new storage, never a view of an input (its
/// definition's `fresh`, or the fused attention): a value it computes from the slice no
/// longer shares the state's storage. Every other op may (reshape, transpose, slice,
/// squeeze, a same-dtype cast ...), so aliasing follows it.
fn fresh(st: &Step) -> bool {
    st.def.is_some_and(|d| d.fresh) || st.op_type == super::fusion::FUSED
}

/// Lets each fused update hand out its slice as a view when that is unobservable: every
/// step reading a value that may share the slice's storage runs before the next step that
/// reads the state's slot (the only steps that can write it in place), and none of those
/// values is a block output (which would outlive the call).
pub fn allow_views(steps: &mut [Step], outputs: &[Src]) {
    let uses = slot_uses(steps, outputs);
    for i in 0..steps.len() {
        let Some(Src::Slot(state)) = (steps[i].op_type == FUSED)
            .then(|| steps[i].single("state"))
            .flatten()
        else {
            continue;
        };
        let next = (i + 1..steps.len())
            .find(|&j| steps[j].reads(Src::Slot(state)))
            .unwrap_or(steps.len());
        let (mut stack, mut seen, mut safe) = (steps[i].outs.clone(), HashSet::new(), true);
        while let (Some(slot), true) = (stack.pop(), safe) {
            if !seen.insert(slot) {
                continue;
            }
            for &r in uses.get(&slot).into_iter().flatten() {
                // usize::MAX: a block output.
                if r >= next {
                    safe = false;
                } else if !fresh(&steps[r]) {
                    stack.extend(steps[r].outs.iter().copied());
                }
            }
        }
        if safe {
            steps[i].eval = crate::ops::eval_state_slice_update_view;
        }
    }
}

/// For the `slice_update` at `i`: the steps the chain removes, the position of its slice
/// (where the fused step goes), and the fused step.
fn match_chain(
    steps: &[Step],
    i: usize,
    uses: &HashMap<usize, Vec<usize>>,
) -> Option<(Vec<usize>, usize, Step)> {
    let su = &steps[i];
    if su.op_type != "slice_update" || su.outs.len() != 1 {
        return None;
    }
    if su
        .args
        .iter()
        .any(|(p, _)| p != "x" && p != "update" && !UPDATE_PARAMS.contains(&p.as_str()))
    {
        return None;
    }
    let only = |slot: usize| match uses.get(&slot).map(|v| v.as_slice()) {
        Some([j]) => Some(*j),
        _ => None,
    };
    // x: the only use of a read_state of a state slot.
    let Src::Slot(read_out) = su.single("x")? else {
        return None;
    };
    if only(read_out)? != i {
        return None;
    }
    let r = steps
        .iter()
        .position(|s| s.op_type == "read_state" && s.outs == [read_out])?;
    let Src::Slot(state) = steps[r].single("input")? else {
        return None;
    };
    // The updated value: read by exactly one write_state of the same state and one slice.
    let upd = su.outs[0];
    let readers = uses.get(&upd)?;
    let [a, b] = readers.as_slice() else {
        return None;
    };
    let (w, s) = match (
        steps.get(*a)?.op_type.as_str(),
        steps.get(*b)?.op_type.as_str(),
    ) {
        ("write_state", "slice_by_index") => (*a, *b),
        ("slice_by_index", "write_state") => (*b, *a),
        _ => return None,
    };
    let (ws, sl) = (&steps[w], &steps[s]);
    if ws.single("input")? != Src::Slot(state)
        || ws.single("data")? != Src::Slot(upd)
        || ws.args.len() != 2
        || sl.single("x")? != Src::Slot(upd)
        || sl.outs.len() != 1
    {
        return None;
    }
    // The fused step takes the slice's place, so the write must come before it (readers of
    // the slice stay after it); between the read and the slice nothing else may touch the
    // state: the fused step reads and writes it at one position.
    if w > s {
        return None;
    }
    let last = s;
    let chain = [r, i, w, s];
    if (r..=last).any(|j| !chain.contains(&j) && steps[j].reads(Src::Slot(state))) {
        return None;
    }
    let mut args = vec![
        ("state".to_string(), vec![Src::Slot(state)]),
        ("update".to_string(), vec![su.single("update")?]),
    ];
    for (p, v) in &su.args {
        if UPDATE_PARAMS.contains(&p.as_str()) {
            args.push((p.clone(), v.clone()));
        }
    }
    for (p, v) in &sl.args {
        if p != "x" {
            args.push((format!("slice_{p}"), v.clone()));
        }
    }
    let step = Step {
        op_type: FUSED.to_string(),
        def: None,
        name: su.name.clone(),
        eval: crate::ops::eval_state_slice_update,
        args,
        attributes: sl.attributes.clone(),
        out_types: sl.out_types.clone(),
        outs: sl.outs.clone(),
        free: vec![],
        blocks: vec![],
    };
    let gone: Vec<usize> = chain.into_iter().filter(|&j| j != last).collect();
    Some((gone, last, step))
}
