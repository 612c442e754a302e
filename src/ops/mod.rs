//! One definition per MIL op ([`OpDef`]): its inputs and their defaults, the opset that
//! introduced it, its type inference and its evaluation, its weight input, and where it runs
//! and what it costs ([`placement`]). The builder, the package loader (which re-infers every
//! op), the passes, the verifier and the interpreter all read these definitions; nothing else
//! knows an op's signature or semantics. Uses `ir` (and `kernels` for evaluation).

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
pub mod placement;
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
pub use compression::{decode_grid, decode_lut, decode_lut_vector, decode_shift_scale};
pub use eval::{DictKeys, DictVal, EvalCx, EvalFn, ExecEnv, ListVal, RValue, StateCell};
pub use infer::{ArgInfo, BlockSig, InferCx};
pub use nn::{eval_conv_gelu, gelu_mode};
pub use state::{eval_state_slice_update, eval_state_slice_update_view};

use crate::ir::{Opset, ValueType};
use anyhow::Result;
use placement::{Flops, Placement};

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
    /// The value an absent optional parameter takes (coremltools' default), read through
    /// the contexts' `…_or_default` accessors.
    pub default: Option<DefaultValue>,
}

/// The default of an optional parameter.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DefaultValue {
    Int(i64),
    Bool(bool),
    Float(f64),
    Str(&'static str),
    /// This integer once per element the op needs (per spatial axis, per axis of the
    /// input): the length depends on an input's rank, which the accessor is given.
    Ints(i64),
}

impl DefaultValue {
    /// The integer this default is, or an error naming parameter `name`.
    pub(crate) fn int(self, name: &str) -> Result<i64> {
        match self {
            DefaultValue::Int(v) => Ok(v),
            d => anyhow::bail!("`{name}`'s default {d:?} is not an integer"),
        }
    }
    /// The bool this default is.
    pub(crate) fn bool(self, name: &str) -> Result<bool> {
        match self {
            DefaultValue::Bool(v) => Ok(v),
            d => anyhow::bail!("`{name}`'s default {d:?} is not a bool"),
        }
    }
    /// The float this default is.
    pub(crate) fn float(self, name: &str) -> Result<f64> {
        match self {
            DefaultValue::Float(v) => Ok(v),
            d => anyhow::bail!("`{name}`'s default {d:?} is not a float"),
        }
    }
    /// The string this default is.
    pub(crate) fn str(self, name: &str) -> Result<&'static str> {
        match self {
            DefaultValue::Str(v) => Ok(v),
            d => anyhow::bail!("`{name}`'s default {d:?} is not a string"),
        }
    }
    /// This default's integer repeated `len` times (an integer-list default).
    pub(crate) fn ints(self, name: &str, len: usize) -> Result<Vec<i64>> {
        match self {
            DefaultValue::Ints(v) => Ok(vec![v; len]),
            d => anyhow::bail!("`{name}`'s default {d:?} is not an integer list"),
        }
    }
}

impl InputSpec {
    /// This parameter with a default.
    pub(crate) const fn or(mut self, d: DefaultValue) -> InputSpec {
        self.default = Some(d);
        self
    }
}

/// The default of parameter `name` in `specs`, or an error naming op and parameter.
pub(crate) fn default_of(specs: &[InputSpec], op_type: &str, name: &str) -> Result<DefaultValue> {
    specs
        .iter()
        .find(|s| s.name == name)
        .and_then(|s| s.default)
        .ok_or_else(|| anyhow::anyhow!("`{op_type}` declares no default for `{name}`"))
}

/// Required parameter, any binding.
pub const fn req(name: &'static str) -> InputSpec {
    InputSpec {
        name,
        kind: Kind::Any,
        optional: false,
        variadic: false,
        default: None,
    }
}
/// Optional parameter, any binding.
pub const fn opt(name: &'static str) -> InputSpec {
    InputSpec {
        name,
        kind: Kind::Any,
        optional: true,
        variadic: false,
        default: None,
    }
}
/// Required compile-time constant.
pub const fn req_c(name: &'static str) -> InputSpec {
    InputSpec {
        name,
        kind: Kind::Const,
        optional: false,
        variadic: false,
        default: None,
    }
}
/// Optional compile-time constant.
pub const fn opt_c(name: &'static str) -> InputSpec {
    InputSpec {
        name,
        kind: Kind::Const,
        optional: true,
        variadic: false,
        default: None,
    }
}
/// Required variadic parameter.
pub const fn var(name: &'static str) -> InputSpec {
    InputSpec {
        name,
        kind: Kind::Any,
        optional: false,
        variadic: true,
        default: None,
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
    /// The weight operand, for ops that multiply their input by one (conv, linear, matmul …).
    pub weight: Option<Weight>,
    /// Inputs the evaluation reads only as f32 (`EvalCx::f32`, `EvalCx::weight_f32`): the
    /// runtime may keep nothing but an f32 copy of a constant bound there.
    pub f32_inputs: &'static [&'static str],
    /// The evaluation always returns new storage, never a view of an input.
    pub fresh: bool,
    /// Where the op runs whatever its tensors (load time, CPU), with the rule's source;
    /// `None` where only the dtype and shape rules decide (`verify::placement`).
    pub placement: Option<&'static Placement>,
    /// Floating-point operations of one run.
    pub flops: Flops,
}

/// An axis of a tensor, counted from the front or the last one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Axis {
    At(usize),
    Last,
}

impl Axis {
    /// The axis index in a tensor of `rank` (`None` when the tensor has no such axis).
    pub fn of(self, rank: usize) -> Option<usize> {
        match self {
            Axis::At(a) => (a < rank).then_some(a),
            Axis::Last => rank.checked_sub(1),
        }
    }
}

/// How a weight's axes are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightLayout {
    /// `[C_out, C_in / groups, k…]` (conv) or `[C_out, C_in]` (linear): output channels on
    /// axis 0, the input channels it multiplies on axis 1.
    OutIn,
    /// `[C_in, C_out / groups, k…]` (conv_transpose).
    InOut,
    /// A general product operand (matmul's `y`, `[…, K, N]` unless transposed), as often a
    /// run-time value as a weight.
    Operand,
}

/// The weight operand of an op: what compression, calibration, the runtime's packing and
/// the placement rules ask of it.
#[derive(Clone, Copy, Debug)]
pub struct Weight {
    /// The input that holds the weight.
    pub input: &'static str,
    pub layout: WeightLayout,
    /// The axis of input `x` holding the channels the weight multiplies.
    pub x_channel_axis: Axis,
    /// The axis of output 0 holding the output channels.
    pub out_channel_axis: Axis,
    /// The evaluation takes the weight in its packed form (`EvalCx::packed`, LUT4 / int4 /
    /// fp16 rows streamed by `kernels::gemv`).
    pub packed: bool,
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
        weight: None,
        f32_inputs: &[],
        fresh: false,
        placement: None,
        flops: Flops::PerOutput(1),
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
        weight: None,
        f32_inputs: &[],
        fresh: false,
        placement: None,
        flops: Flops::PerOutput(1),
    }
}

impl OpDef {
    /// This definition with a weight operand.
    pub(crate) const fn with_weight(mut self, w: Weight) -> OpDef {
        self.weight = Some(w);
        self
    }
    /// This definition with inputs read only as f32 (see [`OpDef::f32_inputs`]).
    pub(crate) const fn with_f32_inputs(mut self, inputs: &'static [&'static str]) -> OpDef {
        self.f32_inputs = inputs;
        self
    }
    /// This definition with a placement rule.
    pub(crate) const fn with_placement(mut self, p: &'static Placement) -> OpDef {
        self.placement = Some(p);
        self
    }
    /// This definition with its cost formula (the default is one operation per output
    /// element).
    pub(crate) const fn with_flops(mut self, f: Flops) -> OpDef {
        self.flops = f;
        self
    }
    /// This definition, whose evaluation always returns new storage.
    pub(crate) const fn fresh(mut self) -> OpDef {
        self.fresh = true;
        self
    }
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

/// The weight operand of `op_type` (the same in every version of an op).
pub fn weight(op_type: &str) -> Option<Weight> {
    earliest(op_type).and_then(|d| d.weight)
}
