//! Predicted compute-unit placement. Core ML decides placement itself when it compiles a model
//! on the device and documents few rules, so this is a *prediction* from the facts below; every
//! row says so and lists the rules that fired. `--measured` (macOS 14.4+) compares it with
//! what MLComputePlan reports.
//!
//! Resolution: `const`/`constexpr_*` ops are load-time (no unit). Otherwise each fired rule
//! names a unit or none (informational); the op goes to the most restrictive named unit, in
//! the order ANE < GPU < CPU (an op that needs both the GPU and the CPU gets the CPU).
//! Costs (FLOPs and bytes moved) are estimates for weighting the totals, not timings.

use super::analysis::{index, is_constexpr, FnIndex};
use crate::ir::{Arg, DType, Dim, Model, Operation, TensorType, Value};
use crate::ops::placement::{Flops, Placement, Unit, LOAD_TIME, STATE_MACHINERY};
use crate::ops::{ArgInfo, InferCx, OpDef};
use crate::report::{ComputeUnit, PlacementReport, PlacementRow, RuleInfo, UnitTotal};
use std::borrow::Cow;

/// What a rule sees of one op.
pub struct OpView<'a> {
    pub op: &'a Operation,
    pub fx: &'a FnIndex<'a>,
    /// Tensor inputs produced at run time (function inputs and non-constant op outputs).
    pub runtime_inputs: Vec<TensorType>,
    /// Tensor inputs known when the model loads (inline, `const` or `constexpr_*` outputs).
    pub const_inputs: Vec<(String, TensorType)>,
    pub outputs: Vec<TensorType>,
}

impl OpView<'_> {
    fn runtime_tensors(&self) -> impl Iterator<Item = &TensorType> {
        self.runtime_inputs.iter().chain(&self.outputs)
    }
    fn all_tensors(&self) -> impl Iterator<Item = &TensorType> {
        self.runtime_tensors()
            .chain(self.const_inputs.iter().map(|(_, t)| t))
    }
    /// The op's definition (the function's opset's version of it).
    fn def(&self) -> Option<&'static OpDef> {
        crate::ops::lookup(&self.op.op_type, self.fx.function.opset)
            .or_else(|| crate::ops::earliest(&self.op.op_type))
    }
    /// Whether the op's definition carries placement rule `rule`.
    fn carries(&self, rule: &Placement) -> bool {
        self.def()
            .and_then(|d| d.placement)
            .is_some_and(|p| p.rule == rule.rule)
    }
    /// What type inference would see of the op: its bindings' types and constant values.
    fn infer_cx(&self) -> InferCx<'_> {
        let mut args = std::collections::BTreeMap::new();
        for (param, binds) in &self.op.inputs {
            let infos = binds
                .iter()
                .filter_map(|b| match b {
                    Arg::Value(v) => Some(ArgInfo {
                        ty: Cow::Owned(v.value_type()),
                        val: Some(v),
                    }),
                    Arg::Var(n) => self.fx.types.get(n.as_str()).map(|t| ArgInfo {
                        ty: Cow::Borrowed(*t),
                        val: self.fx.const_value(b),
                    }),
                })
                .collect();
            args.insert(param.as_str(), infos);
        }
        InferCx {
            op_type: &self.op.op_type,
            op_name: &self.op.name,
            opset: self.fx.function.opset,
            args,
            attributes: &self.op.attributes,
            blocks: vec![],
            spec: self.def().map_or(&[], |d| d.inputs),
        }
    }
    /// Ops producing any input variable.
    fn input_producers(&self) -> impl Iterator<Item = &Operation> {
        self.op.inputs.values().flatten().filter_map(|a| match a {
            Arg::Var(n) => self.fx.producer_of(n),
            Arg::Value(_) => None,
        })
    }
}

/// The report's unit of an op definition's placement unit.
const fn unit(u: Unit) -> ComputeUnit {
    match u {
        Unit::LoadTime => ComputeUnit::LoadTime,
        Unit::Cpu => ComputeUnit::Cpu,
    }
}

/// One placement rule.
pub struct Rule {
    pub id: &'static str,
    /// The unit a firing sends the op to; `None` for rules that only inform.
    pub effect: Option<ComputeUnit>,
    pub statement: &'static str,
    pub source: &'static str,
    pub fires: fn(&OpView) -> bool,
}

/// The rule table, in the order rows list fired rules.
pub static RULES: &[Rule] = &[
    Rule {
        id: LOAD_TIME.rule,
        effect: Some(unit(LOAD_TIME.unit)),
        statement: LOAD_TIME.statement,
        source: LOAD_TIME.source,
        fires: load_time_constant,
    },
    Rule {
        id: "fp32_compute",
        effect: Some(ComputeUnit::Gpu),
        statement: "fp32 computation is scheduled on the GPU (or CPU), not the ANE",
        source: "coremltools docs, Typed Execution Workflow Example: a float 32 typed model executes on a combination of the GPU and CPU",
        fires: fp32_compute,
    },
    Rule {
        id: "dynamic_shape",
        effect: Some(ComputeUnit::Gpu),
        statement: "tensors of unknown (dynamic) shape leave the ANE",
        source: "Apple Developer Forums thread 724930 (Apple engineer): with range flexibility only the default shape runs on the Neural Engine, others on GPU or CPU",
        fires: dynamic_shape,
    },
    Rule {
        id: "dim_over_16384",
        effect: Some(ComputeUnit::Gpu),
        statement: "a tensor dimension over 16,384 leaves the ANE",
        source: "ANE hardware maximum tensor dimension 16,384 (ane-guide.readthedocs.io, Model-design rules; coremltools issue #1260 on the 16384 limit)",
        fires: dim_over_16384,
    },
    Rule {
        id: "ane_output_channels",
        effect: Some(ComputeUnit::Gpu),
        statement: "a conv/conv_transpose/linear/matmul with more than 32,768 fp16 output channels (over the ANE's 64 KB output-channel budget, e.g. an unsplit 51,866-wide vocab head) cannot be one ANE op",
        source: "milkit design budget of 64 KB = 32,768 fp16 channels; ANE ports split LM heads into chunks (maderix/ANE PR #26; Apple, Deploying Transformers on the Apple Neural Engine: chunk large tensors)",
        fires: ane_output_channels,
    },
    Rule {
        id: "int4_per_block",
        effect: Some(ComputeUnit::Cpu),
        statement: "an op reading a per-block int4 linear-quantized weight risks CPU fallback",
        source: "observed on a sibling graph (per-block int4 fell back to the CPU); coremltools docs, Quantization / Performance: per-block int4 gains are on the GPU",
        fires: int4_per_block,
    },
    Rule {
        id: "lut_keeps_ane",
        effect: None,
        statement: "grouped-channel LUT palettized weights kept ANE placement",
        source: "observed on a sibling graph (grouped-channel LUT4 stayed on the ANE); coremltools docs, Palettization / Performance: just-in-time decompression is most likely on the Neural Engine",
        fires: lut_keeps_ane,
    },
    Rule {
        id: STATE_MACHINERY.rule,
        effect: Some(unit(STATE_MACHINERY.unit)),
        statement: STATE_MACHINERY.statement,
        source: STATE_MACHINERY.source,
        fires: state_machinery,
    },
    Rule {
        id: "int32_arithmetic",
        effect: Some(ComputeUnit::Cpu),
        statement: "ops on int32 tensors at run time (token ids, cache positions) run on the CPU",
        source: "the ANE datapath is fp16 (ane-guide.readthedocs.io, Model-design rules); WhisperKit TextDecoder compute plans place the int32-indexed gather on the CPU",
        fires: int32_arithmetic,
    },
    Rule {
        id: "fp16_static",
        effect: Some(ComputeUnit::Ane),
        statement: "fp16 computation on static shapes is ANE-eligible",
        source: "coremltools docs, Typed Execution: float 16 typed models are eligible for the Neural Engine",
        fires: fp16_static,
    },
];

fn load_time_constant(v: &OpView) -> bool {
    v.carries(&LOAD_TIME)
}

fn fp32_compute(v: &OpView) -> bool {
    v.runtime_tensors().any(|t| t.dtype == DType::F32)
}

fn dynamic_shape(v: &OpView) -> bool {
    v.runtime_tensors().any(|t| t.shape.contains(&Dim::Unknown))
}

/// Largest dimension the ANE takes (see the rule's source).
pub const ANE_MAX_DIM: usize = 16_384;
/// 64 KB of fp16 output channels.
pub const ANE_MAX_OUTPUT_CHANNELS: usize = 32_768;

fn dim_over_16384(v: &OpView) -> bool {
    v.all_tensors().any(|t| {
        t.shape
            .iter()
            .any(|d| matches!(d, Dim::Fixed(n) if *n > ANE_MAX_DIM))
    })
}

/// Output channels of an op with a weight (conv, conv_transpose, linear, matmul), on the
/// output axis its definition names.
pub fn output_channels(v: &OpView) -> Option<usize> {
    let out = v.outputs.first()?;
    let axis = crate::ops::weight(&v.op.op_type)?
        .out_channel_axis
        .of(out.rank())?;
    match out.shape.get(axis)? {
        Dim::Fixed(n) => Some(*n),
        Dim::Unknown => None,
    }
}

fn ane_output_channels(v: &OpView) -> bool {
    output_channels(v).is_some_and(|c| c > ANE_MAX_OUTPUT_CHANNELS)
}

/// A `constexpr_blockwise_shift_scale` with 4-bit data and more than one scale along an axis
/// other than the output-channel axis 0 (per-channel scales are [C_out, 1, ...]).
fn is_int4_per_block(fx: &FnIndex, p: &Operation) -> bool {
    if p.op_type != "constexpr_blockwise_shift_scale" {
        return false;
    }
    let tensor = |name: &str| -> Option<&crate::ir::Tensor> {
        match p.attributes.get(name) {
            Some(Value::Tensor(t)) => Some(t),
            _ => match fx.const_value(p.arg(name)?)? {
                Value::Tensor(t) => Some(t),
                _ => None,
            },
        }
    };
    let four_bit = tensor("data").is_some_and(|t| matches!(t.dtype, DType::I4 | DType::U4));
    let per_block = tensor("scale").is_some_and(|s| s.shape.iter().skip(1).any(|&d| d > 1));
    four_bit && per_block
}

fn int4_per_block(v: &OpView) -> bool {
    v.input_producers().any(|p| is_int4_per_block(v.fx, p))
}

fn lut_keeps_ane(v: &OpView) -> bool {
    v.input_producers()
        .any(|p| p.op_type == "constexpr_lut_to_dense")
}

fn state_machinery(v: &OpView) -> bool {
    v.carries(&STATE_MACHINERY)
}

fn int32_arithmetic(v: &OpView) -> bool {
    v.runtime_tensors().any(|t| t.dtype == DType::I32)
}

fn fp16_static(v: &OpView) -> bool {
    let mut any_f16 = false;
    for t in v.runtime_tensors() {
        if t.shape.contains(&Dim::Unknown) || (t.dtype.is_float() && t.dtype != DType::F16) {
            return false;
        }
        any_f16 |= t.dtype == DType::F16;
    }
    any_f16
}

/// The rule table as report data.
pub fn rule_table() -> Vec<RuleInfo> {
    RULES
        .iter()
        .map(|r| RuleInfo {
            id: r.id.to_string(),
            effect: r
                .effect
                .map(|u| u.label().to_string())
                .unwrap_or_else(|| "none".into()),
            statement: r.statement.to_string(),
            source: r.source.to_string(),
        })
        .collect()
}

fn view<'a>(fx: &'a FnIndex<'a>, op: &'a Operation) -> OpView<'a> {
    let mut runtime_inputs = Vec::new();
    let mut const_inputs = Vec::new();
    for (param, binds) in &op.inputs {
        for b in binds {
            let (ty, constant) = match b {
                Arg::Value(v) => (v.value_type(), true),
                Arg::Var(n) => {
                    let Some(ty) = fx.types.get(n.as_str()) else {
                        continue;
                    };
                    let constant = fx
                        .producer_of(n)
                        .is_some_and(|p| p.op_type == "const" || is_constexpr(&p.op_type));
                    ((*ty).clone(), constant)
                }
            };
            if let Some(t) = ty.as_tensor() {
                if constant {
                    const_inputs.push((param.clone(), t.clone()));
                } else {
                    runtime_inputs.push(t.clone());
                }
            }
        }
    }
    let outputs = op
        .outputs
        .iter()
        .filter_map(|o| o.ty.as_tensor().cloned())
        .collect();
    OpView {
        op,
        fx,
        runtime_inputs,
        const_inputs,
        outputs,
    }
}

fn elems(t: &TensorType) -> u64 {
    t.num_elements().unwrap_or(0) as u64
}

fn bytes(t: &TensorType) -> u64 {
    t.dtype.storage_bytes(t.num_elements().unwrap_or(0)) as u64
}

/// Estimated (FLOPs, bytes moved) of one run of the op.
pub fn cost(v: &OpView) -> (u64, u64) {
    if load_time_constant(v) {
        return (0, 0);
    }
    let moved: u64 = v.all_tensors().map(bytes).sum();
    let out_elems = v.outputs.first().map(elems).unwrap_or(0);
    // Ops milkit has no definition of count one operation per output element.
    let flops = match v.def().map_or(Flops::PerOutput(1), |d| d.flops) {
        Flops::None => 0,
        Flops::PerOutput(n) => n * out_elems,
        Flops::PerInput => v.runtime_inputs.first().map(elems).unwrap_or(0),
        Flops::Formula(f) => f(&v.infer_cx(), out_elems).unwrap_or(0),
    };
    (flops, moved)
}

/// Predicts the unit of every op (nested blocks included) in every function.
pub fn predict(model: &Model) -> PlacementReport {
    let mut ops = Vec::new();
    for fx in index(model) {
        for op in &fx.ops {
            let v = view(&fx, op);
            let mut fired: Vec<&Rule> = RULES.iter().filter(|r| (r.fires)(&v)).collect();
            // A load-time constant runs on no unit, so no other rule applies to it.
            if fired
                .iter()
                .any(|r| r.effect == Some(ComputeUnit::LoadTime))
            {
                fired.retain(|r| r.effect == Some(ComputeUnit::LoadTime));
            }
            let unit = if fired
                .iter()
                .any(|r| r.effect == Some(ComputeUnit::LoadTime))
            {
                ComputeUnit::LoadTime
            } else {
                fired
                    .iter()
                    .filter_map(|r| r.effect)
                    .max()
                    .unwrap_or(ComputeUnit::Ane)
            };
            let (flops, bytes) = cost(&v);
            ops.push(PlacementRow {
                function: fx.name.to_string(),
                op_type: op.op_type.clone(),
                name: op.name.clone(),
                output: op
                    .outputs
                    .first()
                    .map(|o| o.name.clone())
                    .unwrap_or_default(),
                unit,
                basis: "predicted".into(),
                rules: fired.iter().map(|r| r.id.to_string()).collect(),
                flops,
                bytes,
                measured: None,
            });
        }
    }
    let totals = totals(&ops);
    PlacementReport {
        basis: "predicted".into(),
        rules: rule_table(),
        ops,
        totals,
        measured: None,
    }
}

/// Ops, FLOPs and bytes per unit, with shares of the run-time totals.
pub fn totals(rows: &[PlacementRow]) -> Vec<UnitTotal> {
    let run = |r: &&PlacementRow| r.unit != ComputeUnit::LoadTime;
    let all_flops: u64 = rows.iter().filter(run).map(|r| r.flops).sum();
    let all_bytes: u64 = rows.iter().filter(run).map(|r| r.bytes).sum();
    let share = |x: u64, all: u64| if all == 0 { 0.0 } else { x as f64 / all as f64 };
    [
        ComputeUnit::Ane,
        ComputeUnit::Gpu,
        ComputeUnit::Cpu,
        ComputeUnit::LoadTime,
    ]
    .into_iter()
    .map(|unit| {
        let mine: Vec<&PlacementRow> = rows.iter().filter(|r| r.unit == unit).collect();
        let flops = mine.iter().map(|r| r.flops).sum();
        let bytes = mine.iter().map(|r| r.bytes).sum();
        let (fs, bs) = if unit == ComputeUnit::LoadTime {
            (0.0, 0.0)
        } else {
            (share(flops, all_flops), share(bytes, all_bytes))
        };
        UnitTotal {
            unit,
            ops: mine.len() as u64,
            flops,
            bytes,
            flops_share: fs,
            bytes_share: bs,
        }
    })
    .collect()
}

/// The share of its function's run-time FLOPs, or of its run-time bytes moved, from which an
/// op predicted off the Neural Engine is *material*: the summary names it (0.1 %). Below both,
/// moving the op back would change little, so the summary only counts it. An op whose shapes
/// are unknown (the `dynamic_shape` rule fired) has no cost estimate and is always material.
pub const MATERIAL_SHARE: f64 = 0.001;

/// One op predicted off the Neural Engine, with its shares of its function's run-time costs.
#[derive(Clone, Debug)]
pub struct OffAne<'a> {
    pub row: &'a PlacementRow,
    pub flops_share: f64,
    pub bytes_share: f64,
    /// The fired rules that send it to its unit (those whose effect is that unit).
    pub deciding: Vec<String>,
}

/// The ops predicted off the Neural Engine: the material ones (see [`MATERIAL_SHARE`]), in
/// program order, and how many others there are.
pub fn off_ane(p: &PlacementReport) -> (Vec<OffAne<'_>>, usize) {
    let run = |r: &&PlacementRow| r.unit != ComputeUnit::LoadTime;
    let mut per_fn: std::collections::BTreeMap<&str, (u64, u64)> = Default::default();
    for r in p.ops.iter().filter(run) {
        let t = per_fn.entry(r.function.as_str()).or_default();
        t.0 += r.flops;
        t.1 += r.bytes;
    }
    let share = |x: u64, all: u64| if all == 0 { 0.0 } else { x as f64 / all as f64 };
    let effect_of = |id: &str| {
        p.rules
            .iter()
            .find(|r| r.id == id)
            .map(|r| r.effect.as_str())
    };
    let (mut material, mut minor) = (Vec::new(), 0);
    for r in p
        .ops
        .iter()
        .filter(run)
        .filter(|r| r.unit != ComputeUnit::Ane)
    {
        let (flops, bytes) = per_fn[r.function.as_str()];
        let (fs, bs) = (share(r.flops, flops), share(r.bytes, bytes));
        let unknown_cost = r.rules.iter().any(|id| id == "dynamic_shape") || flops + bytes == 0;
        if fs < MATERIAL_SHARE && bs < MATERIAL_SHARE && !unknown_cost {
            minor += 1;
            continue;
        }
        let mut deciding: Vec<String> = r
            .rules
            .iter()
            .filter(|id| effect_of(id) == Some(r.unit.label()))
            .cloned()
            .collect();
        if deciding.is_empty() {
            deciding = r.rules.clone();
        }
        material.push(OffAne {
            row: r,
            flops_share: fs,
            bytes_share: bs,
            deciding,
        });
    }
    (material, minor)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Opset, Tensor, ValueType};
    use crate::ops::{Builder, In};

    /// x [1, cin, 1, len] fp16 → 1x1 conv with `cout` channels.
    fn conv(cin: usize, cout: usize, len: usize) -> Model {
        let mut b = Builder::new(Opset::Ios18);
        let x = b.input("x", ValueType::tensor(DType::F16, &[1, cin, 1, len]));
        let w = b.konst(
            "w",
            Value::Tensor(Tensor::f16(
                &[cout, cin, 1, 1],
                &vec![half::f16::ZERO; cout * cin],
            )),
        );
        let y = b
            .op1("conv", "c", vec![("x", (&x).into()), ("weight", In::V(w))])
            .unwrap();
        let (inputs, block) = b.finish(&[(y, "y")]).unwrap();
        Model::single(Opset::Ios18, inputs, block, Default::default())
    }

    fn fired(m: &Model, id: &str) -> bool {
        let fx = &index(m)[0];
        let op = fx.ops.iter().find(|o| o.op_type == "conv").unwrap();
        let rule = RULES.iter().find(|r| r.id == id).unwrap();
        (rule.fires)(&view(fx, op))
    }

    #[test]
    fn thresholds_are_exclusive() {
        assert!(!fired(
            &conv(1, ANE_MAX_OUTPUT_CHANNELS, 4),
            "ane_output_channels"
        ));
        assert!(fired(
            &conv(1, ANE_MAX_OUTPUT_CHANNELS + 1, 4),
            "ane_output_channels"
        ));
        assert!(!fired(&conv(2, 8, ANE_MAX_DIM), "dim_over_16384"));
        assert!(fired(&conv(2, 8, ANE_MAX_DIM + 1), "dim_over_16384"));
        let ok = predict(&conv(2, 8, ANE_MAX_DIM));
        assert_eq!(
            ok.ops.iter().find(|r| r.op_type == "conv").unwrap().unit,
            ComputeUnit::Ane
        );
    }

    #[test]
    fn every_rule_has_a_source_and_unique_id() {
        for (i, r) in RULES.iter().enumerate() {
            assert!(!r.source.is_empty() && !r.statement.is_empty(), "{}", r.id);
            assert!(
                RULES[..i].iter().all(|o| o.id != r.id),
                "duplicate {}",
                r.id
            );
        }
    }
}
