//! Reusing input-invariant work across calls. A decoder that projects
//! `encoder_output_embeds` (1500 × d) in-graph would redo that projection every token
//! although the input is the same for the whole window. [`Memo`] remembers each fed
//! input's bytes from the previous call; a step whose inputs (transitively) are all
//! unchanged fed inputs — no state, no changed input — is skipped when the values it
//! hands to the rest of the program are cached. Only those frontier values are kept (not
//! every intermediate), and an entry is dropped as soon as one of its inputs changes.
//!
//! An input that changed on [`VOLATILE_AFTER`] calls in a row (a decoder's KV cache fed
//! back every token: megabytes that differ every call) is then counted as changed without
//! reading or copying its bytes for the next [`VOLATILE_CALLS`] calls, after which it is
//! compared again; its remembered bytes are dropped meanwhile, so a comparison never
//! matches a stale copy.

use super::plan::{Plan, Src};
use crate::ir::ValueType;
use crate::kernels;
use crate::ops::RValue;
use candle_core::DType;
use std::collections::HashMap;

/// Calls in a row on which an input changed before it is taken as changing every call.
pub const VOLATILE_AFTER: u32 = 2;
/// Calls a volatile input counts as changed without comparison before it is compared again.
pub const VOLATILE_CALLS: u32 = 32;

/// An input's content as last seen: dtype, shape, bytes.
type Seen = (DType, Vec<usize>, Vec<u8>);

/// Per-function memo state held by the session.
pub struct Memo {
    /// Per step: the fed inputs it depends on (bit i = `plan.inputs[i]`), `None` when it
    /// depends on a state or on no input at all (never cached).
    deps: Vec<Option<u128>>,
    /// Per slot: the steps reading it.
    readers: Vec<Vec<usize>>,
    /// Slots that are block outputs.
    is_output: Vec<bool>,
    /// Previous call's (dtype, shape, bytes) of each input; `None` if unseen (or not kept
    /// while the input is volatile).
    last: Vec<Option<Seen>>,
    /// Per input: the tensor of the previous call (its id answers "the very same tensor
    /// again" even while its bytes are not kept).
    held: Vec<Option<candle_core::Tensor>>,
    /// Per input: calls in a row on which it changed.
    streak: Vec<u32>,
    /// Per input: calls left on which it counts as changed without being compared.
    volatile: Vec<u32>,
    cache: HashMap<usize, (u128, RValue)>,
}

/// What one call may skip, from [`Memo::begin`].
pub struct CallPlan {
    /// Per step: run it (else its needed outputs come from the cache).
    pub run: Vec<bool>,
    /// Per slot: needed by a step that runs or by the caller.
    needed: Vec<bool>,
}

impl Memo {
    /// `None` when the function has more fed inputs than the bitsets hold.
    pub fn new(plan: &Plan) -> Option<Memo> {
        if plan.inputs.len() > 128 {
            return None;
        }
        let mut slot_deps: Vec<Option<u128>> = vec![Some(0); plan.nslots];
        for (i, inp) in plan.inputs.iter().enumerate() {
            slot_deps[inp.slot] = match inp.ty {
                ValueType::State(_) => None,
                _ => Some(1u128 << i),
            };
        }
        let mut readers = vec![Vec::new(); plan.nslots];
        let mut deps = Vec::with_capacity(plan.steps.len());
        for (si, st) in plan.steps.iter().enumerate() {
            let mut d = Some(0u128);
            for (_, srcs) in &st.args {
                for s in srcs {
                    if let Src::Slot(k) = *s {
                        readers[k].push(si);
                        d = match (d, slot_deps[k]) {
                            (Some(a), Some(b)) => Some(a | b),
                            _ => None,
                        };
                    }
                }
            }
            // Random draws differ between calls: never cached, nor anything after them.
            let d = d.filter(|&b| b != 0 && !super::plan::draws_random(st));
            for &o in &st.outs {
                slot_deps[o] = d;
            }
            deps.push(d);
        }
        let mut is_output = vec![false; plan.nslots];
        for (_, s, _) in &plan.outputs {
            if let Src::Slot(k) = *s {
                is_output[k] = true;
            }
        }
        Some(Memo {
            deps,
            readers,
            is_output,
            last: vec![None; plan.inputs.len()],
            held: vec![None; plan.inputs.len()],
            streak: vec![0; plan.inputs.len()],
            volatile: vec![0; plan.inputs.len()],
            cache: HashMap::new(),
        })
    }

    /// Compares the bound inputs with the previous call's, drops stale entries, and decides
    /// which steps run.
    pub fn begin(&mut self, plan: &Plan, slots: &[Option<RValue>]) -> CallPlan {
        let mut changed = 0u128;
        for (i, inp) in plan.inputs.iter().enumerate() {
            let Some(RValue::T(t)) = &slots[inp.slot] else {
                continue;
            };
            // The same tensor handed in again (a caller feeding one window's encoder output
            // or cross K/V to every token) is unchanged: tensors are immutable once made, so
            // its megabytes need no comparison. Any other tensor is compared by content.
            if matches!(&self.held[i], Some(prev) if prev.id() == t.id()) {
                self.streak[i] = 0;
                self.volatile[i] = 0;
                continue;
            }
            self.held[i] = Some(t.clone());
            if self.volatile[i] > 0 {
                self.volatile[i] -= 1;
                changed |= 1u128 << i;
                continue;
            }
            let goes_volatile = self.streak[i] + 1 >= VOLATILE_AFTER;
            let same = kernels::data::with_bytes(t, |b| {
                let same = matches!(&self.last[i], Some((d, s, old))
                    if *d == t.dtype() && s.as_slice() == t.dims() && old.as_slice() == b);
                if !same {
                    // Not kept when it is about to count as changed uncompared.
                    self.last[i] =
                        (!goes_volatile).then(|| (t.dtype(), t.dims().to_vec(), b.to_vec()));
                }
                same
            })
            .unwrap_or(false);
            if same {
                self.streak[i] = 0;
            } else {
                changed |= 1u128 << i;
                self.streak[i] += 1;
                if goes_volatile {
                    self.streak[i] = 0;
                    self.volatile[i] = VOLATILE_CALLS;
                }
            }
        }
        self.cache.retain(|_, (d, _)| *d & changed == 0);
        let inv: Vec<bool> = self
            .deps
            .iter()
            .map(|d| d.is_some_and(|d| d & changed == 0))
            .collect();
        let mut needed = self.is_output.clone();
        let mut run = vec![true; plan.steps.len()];
        for (si, st) in plan.steps.iter().enumerate().rev() {
            run[si] = !inv[si]
                || st
                    .outs
                    .iter()
                    .any(|o| needed[*o] && !self.cache.contains_key(o));
            if run[si] {
                for (_, srcs) in &st.args {
                    for s in srcs {
                        if let Src::Slot(k) = *s {
                            needed[k] = true;
                        }
                    }
                }
            }
        }
        CallPlan { run, needed }
    }

    /// Fills the needed outputs of a skipped step from the cache.
    pub fn restore(&self, plan: &Plan, si: usize, cp: &CallPlan, slots: &mut [Option<RValue>]) {
        for &o in &plan.steps[si].outs {
            if cp.needed[o] {
                slots[o] = self.cache.get(&o).map(|(_, v)| v.clone());
            }
        }
    }

    /// Keeps the frontier outputs of a step that depends only on fed inputs: values read
    /// by a step with other dependencies (so invalidated on a different schedule), or
    /// handed to the caller. Stored on every run, so the next call with the same inputs
    /// already skips the step.
    pub fn store(&mut self, plan: &Plan, si: usize, slots: &[Option<RValue>]) {
        let Some(d) = self.deps[si] else {
            return;
        };
        for &o in &plan.steps[si].outs {
            let frontier =
                self.is_output[o] || self.readers[o].iter().any(|&r| self.deps[r] != Some(d));
            if let (true, Some(v @ RValue::T(_))) = (frontier, &slots[o]) {
                self.cache.insert(o, (d, v.clone()));
            }
        }
    }

    /// Number of cached values (for tests and reports).
    pub fn cached(&self) -> usize {
        self.cache.len()
    }
}
