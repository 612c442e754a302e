//! One definition per MIL op ([`OpDef`]): its inputs, the opset that introduced it and its
//! type inference and its evaluation. The builder, the package loader (which re-infers every
//! op), the verifier and the interpreter all read these definitions; nothing else knows an
//! op's signature or semantics. Uses `ir` (and `kernels` for evaluation).

mod activation;
mod attention;
pub mod builder;
mod classify;
mod compression;
mod control;
mod deconv;
mod elementwise;
pub mod eval;
mod index;
mod infer;
mod list;
mod nms;
mod nn;
mod pool;
mod quant;
pub mod random;
mod recurrent;
mod reduce;
mod resample;
mod resize;
mod scatter;
mod shape;
mod sparse;
mod state;
mod tensor_ops;

pub use builder::{Builder, In, V};
pub use eval::{DictKeys, DictVal, EvalCx, EvalFn, ExecEnv, ListVal, RValue, StateCell};
pub use infer::{ArgInfo, BlockSig, InferCx};
pub use state::{eval_state_slice_update, eval_state_slice_update_view};

use crate::ir::{Opset, ValueType};
use anyhow::Result;

/// How an op parameter may be bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Any value (variable or constant).
    Any,
    /// Must be known at compile time (a `const` op's output or an inline value).
    Const,
}

/// One op parameter.
#[derive(Clone, Copy, Debug)]
pub struct InputSpec {
    pub name: &'static str,
    pub kind: Kind,
    pub optional: bool,
    /// Takes a list of bindings (e.g. `concat`'s `values`).
    pub variadic: bool,
}

/// Required parameter, any binding.
pub const fn req(name: &'static str) -> InputSpec {
    InputSpec {
        name,
        kind: Kind::Any,
        optional: false,
        variadic: false,
    }
}
/// Optional parameter, any binding.
pub const fn opt(name: &'static str) -> InputSpec {
    InputSpec {
        name,
        kind: Kind::Any,
        optional: true,
        variadic: false,
    }
}
/// Required compile-time constant.
pub const fn req_c(name: &'static str) -> InputSpec {
    InputSpec {
        name,
        kind: Kind::Const,
        optional: false,
        variadic: false,
    }
}
/// Optional compile-time constant.
pub const fn opt_c(name: &'static str) -> InputSpec {
    InputSpec {
        name,
        kind: Kind::Const,
        optional: true,
        variadic: false,
    }
}
/// Required variadic parameter.
pub const fn var(name: &'static str) -> InputSpec {
    InputSpec {
        name,
        kind: Kind::Any,
        optional: false,
        variadic: true,
    }
}

/// The single definition of one MIL op (one version of it).
pub struct OpDef {
    /// MIL op type, verbatim (`"layer_norm"`).
    pub name: &'static str,
    /// The first opset that has this version of the op.
    pub since: Opset,
    /// A later opset that replaced or removed this version, if any.
    pub until: Option<Opset>,
    pub inputs: &'static [InputSpec],
    /// Output types from input types (and constant input values).
    pub infer: fn(&InferCx) -> Result<Vec<ValueType>>,
    /// Computes the outputs from input values (None: the interpreter cannot run the op).
    pub eval: Option<EvalFn>,
}

/// An op that exists from iOS15 on and that the interpreter evaluates (most ops).
pub(crate) const fn def(
    name: &'static str,
    inputs: &'static [InputSpec],
    infer: fn(&InferCx) -> Result<Vec<ValueType>>,
    eval: EvalFn,
) -> OpDef {
    OpDef {
        name,
        since: Opset::Ios15,
        until: None,
        inputs,
        infer,
        eval: Some(eval),
    }
}

/// One version of an op, in the opsets `[since, until)`, that the interpreter evaluates.
pub(crate) const fn ver(
    name: &'static str,
    since: Opset,
    until: Option<Opset>,
    inputs: &'static [InputSpec],
    infer: fn(&InferCx) -> Result<Vec<ValueType>>,
    eval: EvalFn,
) -> OpDef {
    OpDef {
        name,
        since,
        until,
        inputs,
        infer,
        eval: Some(eval),
    }
}

impl OpDef {
    pub fn input(&self, name: &str) -> Option<&InputSpec> {
        self.inputs.iter().find(|i| i.name == name)
    }
    pub fn available_in(&self, opset: Opset) -> bool {
        self.since <= opset && self.until.is_none_or(|u| opset < u)
    }
}

/// Every op definition milkit knows.
pub fn all() -> impl Iterator<Item = &'static OpDef> {
    elementwise::DEFS
        .iter()
        .chain(nn::DEFS)
        .chain(reduce::DEFS)
        .chain(shape::DEFS)
        .chain(index::DEFS)
        .chain(compression::DEFS)
        .chain(state::DEFS)
        .chain(activation::DEFS)
        .chain(tensor_ops::DEFS)
        .chain(scatter::DEFS)
        .chain(attention::DEFS)
        .chain(pool::DEFS)
        .chain(sparse::DEFS)
        .chain(quant::DEFS)
        .chain(control::DEFS)
        .chain(list::DEFS)
        .chain(random::DEFS)
        .chain(deconv::DEFS)
        .chain(resize::DEFS)
        .chain(recurrent::DEFS)
        .chain(nms::DEFS)
        .chain(resample::DEFS)
        .chain(classify::DEFS)
}

/// The version of `op_type` that `opset` uses, if the op exists there.
pub fn lookup(op_type: &str, opset: Opset) -> Option<&'static OpDef> {
    all()
        .filter(|d| d.name == op_type && d.available_in(opset))
        .max_by_key(|d| d.since)
}

/// Any version of `op_type`, for error messages ("exists since iOS18").
pub fn earliest(op_type: &str) -> Option<&'static OpDef> {
    all().filter(|d| d.name == op_type).min_by_key(|d| d.since)
}
