//! Where an op runs and what one run costs, as its definition states them: the placement
//! rule an op carries whatever its tensors (load-time constants, state machinery), with the
//! fact it rests on, and the formula of its floating-point operations. The verifier's
//! placement prediction (`verify::placement`) reads these; the dtype and shape rules that
//! apply to every op stay there.

use super::infer::InferCx;

/// A compute unit an op is predicted on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Materialised when the model loads; runs on no unit.
    LoadTime,
    Cpu,
}

/// A placement rule an op's definition carries.
#[derive(Debug)]
pub struct Placement {
    /// The rule's id in placement reports.
    pub rule: &'static str,
    pub unit: Unit,
    pub statement: &'static str,
    pub source: &'static str,
}

/// `const` and every `constexpr_*` op.
pub const LOAD_TIME: Placement = Placement {
    rule: "load_time_constant",
    unit: Unit::LoadTime,
    statement: "const and constexpr_* ops are materialised when the model loads; they run on no unit",
    source: "coremltools docs, Optimization / What's New (iOS16: 'ahead-of-runtime weight decompression to float16'); constexpr op docs in coremltools mil/ops/defs/iOS16/constexpr_ops.py",
};

/// `read_state`, `coreml_update_state` and `slice_update`.
pub const STATE_MACHINERY: Placement = Placement {
    rule: "state_machinery",
    unit: Unit::Cpu,
    statement: "state read/update machinery (read_state, coreml_update_state, slice_update) runs on the CPU",
    source: "observed placement of stateful KV-cache graphs (MLComputePlan); not an Apple-documented guarantee",
};

/// Estimated floating-point operations of one run of an op (for weighting placement
/// totals, not a timing).
#[derive(Clone, Copy, Debug)]
pub enum Flops {
    /// None: data movement, metadata, state access, load-time constants.
    None,
    /// `n` per element of output 0 (1 for plain elementwise arithmetic, 8 for a
    /// transcendental function or a normalisation, 5 for softmax).
    PerOutput(u64),
    /// One per element of the op's first run-time input (reductions).
    PerInput,
    /// A formula of the op's input types and constant values and the element count of
    /// output 0 (contractions); `None` where a shape it needs is unknown.
    Formula(fn(&InferCx, u64) -> Option<u64>),
}
