//! The steps of an execution plan and the plan-level fusions' shared tools: the [`Plan`] of a
//! function or nested block, a [`Step`] (one op to run, its bindings, the slots it frees and
//! its nested blocks' plans), where a binding lives ([`Src`]), the
//! constants ([`Const`]), who reads each slot ([`slot_uses`]) and how a fusion splices its
//! fused steps in ([`splice_fused`]). A leaf of `runtime`: [`super::plan`] compiles functions
//! into these steps, the fusions and the weight packing rewrite them.

use crate::ir::{Opset, Value, ValueType};
use crate::ops::eval::EvalFn;
use crate::ops::{OpDef, RValue};
use anyhow::{ensure, Result};
use candle_core::Tensor;
use std::collections::{BTreeMap, HashMap};
use std::sync::OnceLock;

/// A value known before any input: converted once, with its program value (for reading
/// constant parameters) and a lazily filled f32 copy (for contractions).
pub struct Const {
    pub val: RValue,
    pub konst: Option<Value>,
    pub f32: OnceLock<Tensor>,
    /// A contraction weight kept in its stored form (see [`super::pack`]); `val` is then
    /// a placeholder.
    pub packed: Option<crate::kernels::PackedWeight>,
}

/// Where a binding's value lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Src {
    Const(usize),
    Slot(usize),
}

/// One op to run.
pub struct Step {
    pub op_type: String,
    pub name: String,
    /// The op's definition; `None` for the runtime's fused steps.
    pub def: Option<&'static OpDef>,
    pub eval: EvalFn,
    pub args: Vec<(String, Vec<Src>)>,
    pub attributes: BTreeMap<String, Value>,
    pub out_types: Vec<ValueType>,
    pub outs: Vec<usize>,
    /// Slots whose last use is this step.
    pub free: Vec<usize>,
    /// The op's nested blocks compiled (`cond`, `while_loop`); their inputs are the
    /// block's own, then the outer values the blocks read, bound as [`CAPTURED`].
    pub blocks: Vec<Plan>,
}

/// A function input: a tensor fed by the caller or a state held by the session.
pub struct PlanInput {
    pub name: String,
    pub ty: ValueType,
    pub slot: usize,
}

pub struct Plan {
    pub opset: Opset,
    pub inputs: Vec<PlanInput>,
    pub consts: Vec<Const>,
    pub steps: Vec<Step>,
    pub outputs: Vec<(String, Src, ValueType)>,
    pub nslots: usize,
    pub budget: Budget,
}

/// What a run checks values of run-time shape against: the cap, and what `plan::check_memory`
/// counted at load (constants and fixed-shape inputs; per step, the fixed-type values live
/// at it). Values whose type has an unknown dimension count 0 at load; a run adds their
/// real size as they are produced (see [`Budget::check_run`]).
pub struct Budget {
    pub cap: u64,
    pub const_bytes: u64,
    pub fixed_live: Vec<u64>,
}

impl Budget {
    /// Checks, right after step `si` produced its values, that constants, the fixed-type
    /// values live at it and `dynamic` bytes of live run-time-shaped values (`produced` of
    /// them made by this step) fit the cap; the error names the op like the load check.
    pub fn check_run(&self, st: &Step, si: usize, dynamic: u64, produced: u64) -> Result<()> {
        let fixed = self.fixed_live.get(si).copied().unwrap_or(0);
        let total = self
            .const_bytes
            .saturating_add(fixed)
            .saturating_add(dynamic);
        ensure!(
            total <= self.cap,
            "op `{}` ({}): its outputs of run-time shape take {}; with {} of constants and \
             inputs and {} of other live values the run needs {}, over the memory cap of {} \
             (--max-memory)",
            st.name,
            st.op_type,
            show_bytes(produced),
            show_bytes(self.const_bytes),
            show_bytes(fixed.saturating_add(dynamic - produced)),
            show_bytes(total),
            show_bytes(self.cap)
        );
        Ok(())
    }
}

/// `1.5 GiB`, `512.0 MiB`, `12 bytes`.
pub fn show_bytes(n: u64) -> String {
    match n {
        u64::MAX => "more than 16 EiB".into(),
        n if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n => format!("{n} bytes"),
    }
}

/// The parameter under which a step with nested blocks binds the outer-scope values its
/// blocks read (so their slots live until the step has run).
pub const CAPTURED: &str = "(outer values)";

impl Step {
    /// Whether any parameter of this step is bound to `src`.
    pub fn reads(&self, src: Src) -> bool {
        self.args.iter().flat_map(|(_, v)| v).any(|x| *x == src)
    }

    /// The single binding of parameter `name` (None when absent or variadic).
    pub fn single(&self, name: &str) -> Option<Src> {
        match self.args.iter().find(|(p, _)| p == name) {
            Some((_, v)) if v.len() == 1 => Some(v[0]),
            _ => None,
        }
    }
}

/// The readers of every slot, for the plan-level fusions: step indices in order, and
/// `usize::MAX` once per block output the slot is.
pub fn slot_uses(steps: &[Step], outputs: &[Src]) -> HashMap<usize, Vec<usize>> {
    let mut uses: HashMap<usize, Vec<usize>> = HashMap::new();
    for (i, st) in steps.iter().enumerate() {
        for s in st.args.iter().flat_map(|(_, v)| v) {
            if let Src::Slot(k) = s {
                uses.entry(*k).or_default().push(i);
            }
        }
    }
    for s in outputs {
        if let Src::Slot(k) = s {
            uses.entry(*k).or_default().push(usize::MAX);
        }
    }
    uses
}

/// The one step that reads `slot` (None when several do, none does, or it is a block
/// output), from [`slot_uses`]'s map.
pub fn only_reader(uses: &HashMap<usize, Vec<usize>>, slot: usize) -> Option<usize> {
    match uses.get(&slot).map(Vec::as_slice) {
        Some([i]) if *i != usize::MAX => Some(*i),
        _ => None,
    }
}

/// The step that produces every slot, for the plan-level fusions.
pub fn slot_makers(steps: &[Step]) -> HashMap<usize, usize> {
    let mut maker = HashMap::new();
    for (i, st) in steps.iter().enumerate() {
        for &o in &st.outs {
            maker.insert(o, i);
        }
    }
    maker
}

/// Rebuilds `steps` after a fusion: each step in `fused` takes the place of the step at its
/// index; the other `removed` steps are dropped.
pub fn splice_fused(steps: &mut Vec<Step>, mut fused: BTreeMap<usize, Step>, removed: &[bool]) {
    let old = std::mem::take(steps);
    for (i, st) in old.into_iter().enumerate() {
        match fused.remove(&i) {
            Some(f) => steps.push(f),
            None if !removed[i] => steps.push(st),
            None => {}
        }
    }
}
