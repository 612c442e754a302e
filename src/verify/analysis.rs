//! Static analysis of a program as report data: op histograms (nested blocks included), type
//! re-inference, opset availability, `constexpr_*` ops with what they feed, constant bytes by
//! storage kind with the compression ratio, and the positional-embedding check.

use crate::ir::{Arg, DType, Function, Model, Opset, Tensor, Value, ValueType};
use crate::ops;
use crate::report::{
    ConstexprOp, ConstexprSummary, FunctionOps, OpRef, OpsetViolation, PositionalEntry,
    PositionalReport, PositionalStatus, StorageBytes, WeightSummary,
};
use std::collections::{BTreeMap, HashMap, HashSet};

/// One function's ops in program order with who produces and who consumes each variable.
pub struct FnIndex<'a> {
    pub name: &'a str,
    pub function: &'a Function,
    pub ops: Vec<&'a crate::ir::Operation>,
    /// variable → index of the op producing it.
    pub producer: HashMap<&'a str, usize>,
    /// variable → indices of the ops reading it.
    pub consumers: HashMap<&'a str, Vec<usize>>,
    /// variable → type (function inputs, block inputs and op outputs).
    pub types: HashMap<&'a str, &'a ValueType>,
}

impl<'a> FnIndex<'a> {
    pub fn new(name: &'a str, function: &'a Function) -> FnIndex<'a> {
        let ops = function.block.walk();
        let mut producer = HashMap::new();
        let mut consumers: HashMap<&str, Vec<usize>> = HashMap::new();
        let mut types = HashMap::new();
        for v in &function.inputs {
            types.insert(v.name.as_str(), &v.ty);
        }
        for (i, op) in ops.iter().enumerate() {
            for o in &op.outputs {
                producer.insert(o.name.as_str(), i);
                types.insert(o.name.as_str(), &o.ty);
            }
            for b in &op.blocks {
                for v in &b.inputs {
                    types.insert(v.name.as_str(), &v.ty);
                }
            }
            for arg in op.inputs.values().flatten() {
                if let Arg::Var(n) = arg {
                    let list = consumers.entry(n.as_str()).or_default();
                    if list.last() != Some(&i) {
                        list.push(i);
                    }
                }
            }
        }
        FnIndex {
            name,
            function,
            ops,
            producer,
            consumers,
            types,
        }
    }

    /// The op producing `var`, if an op does.
    pub fn producer_of(&self, var: &str) -> Option<&'a crate::ir::Operation> {
        self.producer.get(var).map(|&i| self.ops[i])
    }

    /// The constant value bound to `arg` (inline, or the output of a `const` op).
    pub fn const_value(&self, arg: &'a Arg) -> Option<&'a Value> {
        match arg {
            Arg::Value(v) => Some(v),
            Arg::Var(n) => self.producer_of(n).and_then(|p| p.const_val()),
        }
    }

    /// Ops reading any output of op `i`.
    pub fn consumers_of(&self, i: usize) -> Vec<usize> {
        let mut out = Vec::new();
        for o in &self.ops[i].outputs {
            for &c in self
                .consumers
                .get(o.name.as_str())
                .map(|v| v.as_slice())
                .unwrap_or(&[])
            {
                if !out.contains(&c) {
                    out.push(c);
                }
            }
        }
        out
    }
}

/// Indexes of every function, in name order.
pub fn index(model: &Model) -> Vec<FnIndex<'_>> {
    model
        .program
        .functions
        .iter()
        .map(|(n, f)| FnIndex::new(n, f))
        .collect()
}

pub fn is_constexpr(op_type: &str) -> bool {
    op_type.starts_with("constexpr_")
}

/// Op histogram of each function, nested blocks included.
pub fn histograms(model: &Model) -> Vec<FunctionOps> {
    model
        .program
        .functions
        .iter()
        .map(|(name, f)| {
            let mut ops = BTreeMap::new();
            let all = f.block.walk();
            for op in &all {
                *ops.entry(op.op_type.clone()).or_insert(0u64) += 1;
            }
            FunctionOps {
                name: name.clone(),
                opset: f.opset.opset_name().to_string(),
                total_ops: all.len() as u64,
                ops,
            }
        })
        .collect()
}

/// Count of `op_type` over all functions.
pub fn count_ops(hist: &[FunctionOps], op_type: &str) -> u64 {
    hist.iter()
        .map(|f| f.ops.get(op_type).copied().unwrap_or(0))
        .sum()
}

/// Ops the function's opset does not define (unknown ops included).
pub fn opset_violations(model: &Model) -> Vec<OpsetViolation> {
    let mut out = Vec::new();
    for (fname, f) in &model.program.functions {
        for op in f.block.walk() {
            if ops::lookup(&op.op_type, f.opset).is_none() {
                out.push(OpsetViolation {
                    function: fname.clone(),
                    op_type: op.op_type.clone(),
                    name: op.name.clone(),
                    opset: f.opset.opset_name().to_string(),
                    available_since: ops::earliest(&op.op_type)
                        .map(|d| d.since.opset_name().to_string()),
                });
            }
        }
    }
    out
}

/// Functions whose opset needs a later specification version than the model declares.
pub fn spec_version_problems(model: &Model) -> Vec<String> {
    let max = Opset::from_spec_version(model.spec_version);
    model
        .program
        .functions
        .iter()
        .filter(|(_, f)| max.is_none_or(|m| f.opset > m))
        .map(|(n, f)| {
            format!(
                "function `{n}` uses opset {} (specification version {}), the model declares version {}",
                f.opset.opset_name(),
                f.opset.spec_version(),
                model.spec_version
            )
        })
        .collect()
}

/// Runs type inference of every op again (as the loader does) and lists every op whose
/// declared output types differ from the inferred ones, or that does not infer at all.
pub fn reinfer_types(model: &Model) -> Vec<String> {
    let mut problems = Vec::new();
    for (fname, f) in &model.program.functions {
        let mut scope: HashMap<String, (ValueType, Option<Value>)> = f
            .inputs
            .iter()
            .map(|v| (v.name.clone(), (v.ty.clone(), None)))
            .collect();
        reinfer_block(fname, &f.block, f.opset, &mut scope, &mut problems);
    }
    problems
}

fn reinfer_block(
    fname: &str,
    block: &crate::ir::Block,
    opset: Opset,
    scope: &mut HashMap<String, (ValueType, Option<Value>)>,
    problems: &mut Vec<String>,
) {
    for v in &block.inputs {
        scope.insert(v.name.clone(), (v.ty.clone(), None));
    }
    for op in &block.operations {
        match ops::builder::infer_op(op, opset, scope) {
            Ok(types) => {
                if types.len() != op.outputs.len() {
                    problems.push(format!(
                        "{fname}: `{}` ({}) declares {} outputs, infers {}",
                        op.name,
                        op.op_type,
                        op.outputs.len(),
                        types.len()
                    ));
                }
                for (o, t) in op.outputs.iter().zip(&types) {
                    if o.ty != *t {
                        problems.push(format!(
                            "{fname}: `{}` ({}) output `{}` is declared {} but infers to {t}",
                            op.name, op.op_type, o.name, o.ty
                        ));
                    }
                }
            }
            Err(e) => problems.push(format!("{fname}: {e:#}")),
        }
        let cval = op.const_val().cloned();
        for o in &op.outputs {
            scope.insert(o.name.clone(), (o.ty.clone(), cval.clone()));
        }
        for b in &op.blocks {
            reinfer_block(fname, b, opset, scope, problems);
        }
    }
}

/// Storage kind of a plain tensor constant.
fn plain_kind(t: &Tensor) -> &'static str {
    match t.dtype {
        DType::F16 => "fp16",
        DType::F32 => "fp32",
        _ => "other",
    }
}

fn lut_bits(op: &crate::ir::Operation, parts: &[(&str, &Tensor)]) -> Option<u32> {
    let get = |n: &str| parts.iter().find(|(k, _)| *k == n).map(|(_, t)| *t);
    let idx = get("indices")?;
    let bits = match idx.dtype {
        DType::U1 => 1,
        DType::U2 => 2,
        DType::U3 => 3,
        DType::U4 => 4,
        DType::U6 => 6,
        // iOS16 packs indices into uint8 bytes; its 1-D LUT has 2^nbits entries.
        DType::U8 if op.inputs.contains_key("shape") || op.attributes.contains_key("shape") => {
            let n = get("lut")?.num_elements();
            if n.is_power_of_two() {
                n.trailing_zeros()
            } else {
                return None;
            }
        }
        DType::U8 => 8,
        _ => return None,
    };
    Some(bits)
}

/// Storage kind of a `constexpr_*` op from its stored parts.
fn constexpr_kind(op: &crate::ir::Operation, parts: &[(&str, &Tensor)]) -> String {
    match op.op_type.as_str() {
        "constexpr_lut_to_dense" => {
            // iOS18 vector palettization: the table's last dim is the vector size.
            let vector = parts
                .iter()
                .find(|(k, _)| *k == "lut")
                .and_then(|(_, t)| (t.shape.len() >= 3).then(|| t.shape[t.shape.len() - 1]))
                .filter(|&vs| vs > 1);
            match (lut_bits(op, parts), vector) {
                (Some(b), Some(vs)) => format!("lut{b}x{vs}"),
                (Some(b), None) => format!("lut{b}"),
                (None, _) => "other".into(),
            }
        }
        "constexpr_blockwise_shift_scale" => match parts
            .iter()
            .find(|(k, _)| *k == "data")
            .map(|(_, t)| t.dtype)
        {
            Some(DType::I4 | DType::U4) => "int4_blockwise".into(),
            Some(DType::I8 | DType::U8) => "int8_blockwise".into(),
            _ => "other".into(),
        },
        _ => "other".into(),
    }
}

/// Everything about constant data: the constexpr ops and the bytes by storage kind.
pub struct ConstantData {
    pub constexpr: ConstexprSummary,
    pub weights: WeightSummary,
}

fn add_bytes(map: &mut BTreeMap<String, StorageBytes>, kind: &str, bytes: usize) {
    let e = map.entry(kind.to_string()).or_default();
    e.tensors += 1;
    e.bytes += bytes as u64;
}

/// Classifies every stored tensor: inputs of `constexpr_*` ops (inline values, attributes, or
/// `const` ops that feed only constexpr ops) count under the constexpr's storage kind; other
/// tensor constants (const ops and inline bindings) as fp16 / fp32 / other.
pub fn constant_data(model: &Model) -> ConstantData {
    let mut by_storage: BTreeMap<String, StorageBytes> = BTreeMap::new();
    let mut summary = ConstexprSummary::default();
    let (mut stored_total, mut dense_total) = (0u64, 0u64);
    for fx in index(model) {
        // const ops all of whose readers are constexpr ops: their bytes are compressed data.
        let mut absorbed: HashSet<usize> = HashSet::new();
        for (i, op) in fx.ops.iter().enumerate() {
            if op.op_type == "const" {
                let cons = fx.consumers_of(i);
                if !cons.is_empty() && cons.iter().all(|&c| is_constexpr(&fx.ops[c].op_type)) {
                    absorbed.insert(i);
                }
            }
        }
        for (i, op) in fx.ops.iter().enumerate() {
            if is_constexpr(&op.op_type) {
                let mut parts: Vec<(&str, &Tensor)> = Vec::new();
                for (k, binds) in &op.inputs {
                    for b in binds {
                        let from_const = match b {
                            Arg::Var(n) => fx
                                .producer
                                .get(n.as_str())
                                .is_some_and(|p| absorbed.contains(p)),
                            Arg::Value(_) => true,
                        };
                        if from_const {
                            if let Some(Value::Tensor(t)) = fx.const_value(b) {
                                parts.push((k.as_str(), t));
                            }
                        }
                    }
                }
                for (k, v) in &op.attributes {
                    if let Value::Tensor(t) = v {
                        parts.push((k.as_str(), t));
                    }
                }
                let kind = constexpr_kind(op, &parts);
                let stored: usize = parts.iter().map(|(_, t)| t.data.len()).sum();
                let e = by_storage.entry(kind.clone()).or_default();
                e.tensors += 1;
                e.bytes += stored as u64;
                let out = op.outputs.first().and_then(|o| o.ty.as_tensor());
                let shape: Vec<u64> = out
                    .and_then(|t| t.fixed_shape())
                    .unwrap_or_default()
                    .iter()
                    .map(|&d| d as u64)
                    .collect();
                let elems = out.and_then(|t| t.num_elements()).unwrap_or(0) as u64;
                let feeds: Vec<OpRef> = fx
                    .consumers_of(i)
                    .into_iter()
                    .map(|c| OpRef {
                        op_type: fx.ops[c].op_type.clone(),
                        name: fx.ops[c].name.clone(),
                    })
                    .collect();
                // A constexpr feeding only other constexprs (a compressed LUT, say) is part of
                // the stored form of the outer one, not a weight of its own.
                let is_final = feeds.is_empty() || feeds.iter().any(|f| !is_constexpr(&f.op_type));
                let dense = if is_final { elems * 2 } else { 0 };
                stored_total += stored as u64;
                dense_total += dense;
                *summary.counts.entry(op.op_type.clone()).or_insert(0) += 1;
                summary.ops.push(ConstexprOp {
                    function: fx.name.to_string(),
                    op_type: op.op_type.clone(),
                    name: op.name.clone(),
                    storage: kind,
                    output_shape: shape,
                    stored_bytes: stored as u64,
                    dense_fp16_bytes: dense,
                    feeds,
                });
            } else if op.op_type == "const" {
                if absorbed.contains(&i) {
                    continue;
                }
                if let Some(Value::Tensor(t)) = op.const_val() {
                    add_bytes(&mut by_storage, plain_kind(t), t.data.len());
                }
            } else {
                for b in op.inputs.values().flatten() {
                    if let Arg::Value(Value::Tensor(t)) = b {
                        add_bytes(&mut by_storage, plain_kind(t), t.data.len());
                    }
                }
            }
        }
    }
    let total_bytes = by_storage.values().map(|s| s.bytes).sum();
    let compression_ratio = (stored_total > 0).then(|| dense_total as f64 / stored_total as f64);
    ConstantData {
        constexpr: summary,
        weights: WeightSummary {
            by_storage,
            total_bytes,
            compressed_stored_bytes: stored_total,
            compressed_dense_fp16_bytes: dense_total,
            compression_ratio,
        },
    }
}

/// Whether a name looks like a positional embedding (`embed_positions`, `*positional*`).
pub fn is_positional_name(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n.contains("embed_positions") || n.contains("positional")
}

/// Finds constants named like a positional embedding; each must be a plain fp16 `const`.
pub fn positional_embedding(model: &Model) -> PositionalReport {
    let mut entries = Vec::new();
    let (mut compressed, mut not_fp16) = (false, false);
    for fx in index(model) {
        for op in &fx.ops {
            let constant = op.op_type == "const" || is_constexpr(&op.op_type);
            let named = is_positional_name(&op.name)
                || op.outputs.iter().any(|o| is_positional_name(&o.name));
            if !constant || !named {
                continue;
            }
            let t = op.outputs.first().and_then(|o| o.ty.as_tensor());
            // A table has rows and columns; an axis, shape or index constant that merely
            // carries the name (`embed_positions_row_axis`) is a parameter, not the table.
            if t.is_none_or(|t| t.rank() < 2) {
                continue;
            }
            let dtype = t
                .map(|t| t.dtype.name().to_string())
                .unwrap_or_else(|| "?".into());
            if is_constexpr(&op.op_type) {
                compressed = true;
            } else {
                // A const that only feeds constexpr ops is the stored form of a compressed one.
                let feeds_constexpr = op.outputs.iter().any(|o| {
                    fx.consumers.get(o.name.as_str()).is_some_and(|c| {
                        !c.is_empty() && c.iter().all(|&i| is_constexpr(&fx.ops[i].op_type))
                    })
                });
                if feeds_constexpr {
                    compressed = true;
                } else if t.map(|t| t.dtype) != Some(DType::F16) {
                    not_fp16 = true;
                }
            }
            entries.push(PositionalEntry {
                function: fx.name.to_string(),
                op_type: op.op_type.clone(),
                name: op.name.clone(),
                dtype,
                shape: t
                    .and_then(|t| t.fixed_shape())
                    .unwrap_or_default()
                    .iter()
                    .map(|&d| d as u64)
                    .collect(),
            });
        }
    }
    let status = if compressed {
        PositionalStatus::Compressed
    } else if not_fp16 {
        PositionalStatus::NotFp16
    } else if entries.is_empty() {
        PositionalStatus::Absent
    } else {
        PositionalStatus::Untouched
    };
    PositionalReport { status, entries }
}
