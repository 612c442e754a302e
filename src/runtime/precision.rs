//! Compute precision of a session. A Core ML package fixes its tensors' types (fp16 for
//! milkit's and argmax's Whisper packages), and by default milkit computes exactly those.
//! [`Compute::Fp32`] instead runs the same program with every fp16 tensor held in float32 —
//! constants widened, the weights `constexpr_*` ops decode (to fp16, as the package says)
//! widened after decoding, `cast`s to fp16 turned into casts to fp32, fp16 inputs, outputs
//! and states declared fp32 — so one
//! package can be compared against a PyTorch float32 reference without its fp16 roundings
//! (e.g. exact fp16 ties between two logits). It is an evaluation mode, not what a device
//! computes: a package's fidelity is measured at its own precision.
//!
//! [`Compute::Bf16`] keeps the package's types but runs its encoder-sized 1x1 convs on
//! bfloat16-rounded weights and activations with f32 sums (`kernels::gemm::gemm_bf16`,
//! `vdpbf16ps`), and the fused attention's two products over many query rows on
//! bfloat16-rounded operands too (`kernels::Kernel::PanelsBf16`): a faster evaluation mode
//! where the CPU has AVX512-BF16, with its own fidelity (docs/speed.md), and an error
//! elsewhere — never a silent fallback.

use crate::ir::{
    Arg, ArrayDType, Block, Bytes, DType, Model, Operation, Tensor, TensorType, Value, ValueType,
    Var,
};
use anyhow::{Context, Result};
use std::collections::HashSet;

/// The precision a session computes its floating-point tensors in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Compute {
    /// The package's own types (fp16 stays fp16): what Core ML computes on the GPU and ANE.
    #[default]
    Package,
    /// Every fp16 tensor widened to float32 (PyTorch float32's precision; slower, twice the
    /// memory for fp16 weights). Not what a device computes.
    Fp32,
    /// A faster evaluation mode: the package's types, encoder-sized products on
    /// bf16-rounded inputs with f32 sums (less exact; needs AVX512-BF16). Not what a
    /// device computes.
    Bf16,
}

impl Compute {
    /// What the session's encoder-sized products multiply.
    pub fn products(self) -> crate::kernels::gemm::Inputs {
        match self {
            Compute::Bf16 => crate::kernels::gemm::Inputs::Bf16,
            Compute::Package | Compute::Fp32 => crate::kernels::gemm::Inputs::F32,
        }
    }

    /// `Ok` unless this precision needs an instruction set the CPU lacks: [`Compute::Bf16`]
    /// where `has_bf16` (`kernels::gemm::bf16_cpu()` in a session; any value in a test) is
    /// false fails naming AVX512-BF16.
    pub fn require(self, has_bf16: bool) -> Result<()> {
        if self == Compute::Bf16 {
            crate::kernels::gemm::require_bf16(has_bf16)
                .context("--compute bf16 cannot run here (use `package` or `fp32`)")?;
        }
        Ok(())
    }
}

/// What [`promote_fp16`] changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Promotion {
    /// fp16 constants widened (op inputs, attributes and `const` values).
    pub constants: usize,
    /// Values (function inputs, op outputs, block inputs) whose fp16 type became fp32.
    pub values: usize,
    /// `dtype = "fp16"` arguments (of `cast` and the like) turned into `"fp32"`.
    pub dtype_args: usize,
}

fn widen_type(t: &mut TensorType) -> bool {
    if t.dtype == DType::F16 {
        t.dtype = DType::F32;
        true
    } else {
        false
    }
}

fn widen_value_type(ty: &mut ValueType) -> usize {
    match ty {
        ValueType::Tensor(t) | ValueType::State(t) => usize::from(widen_type(t)),
        ValueType::List { elem, .. } => widen_value_type(elem),
        ValueType::Tuple(ts) => ts.iter_mut().map(widen_value_type).sum(),
        ValueType::Dict { key, value } => widen_value_type(key) + widen_value_type(value),
    }
}

fn widen_tensor(t: &mut Tensor) -> bool {
    if t.dtype != DType::F16 {
        return false;
    }
    let wide: Vec<f32> = t.data.to_f16_vec().into_iter().map(f32::from).collect();
    t.dtype = DType::F32;
    t.data = Bytes::from_f32(&wide);
    true
}

fn widen_value(v: &mut Value, p: &mut Promotion) {
    match v {
        Value::Tensor(t) => {
            if widen_tensor(t) {
                p.constants += 1;
            }
        }
        Value::List { elem, values } => {
            p.values += widen_value_type(elem);
            for v in values {
                widen_value(v, p);
            }
        }
        Value::Tuple(vs) => vs.iter_mut().for_each(|v| widen_value(v, p)),
        Value::Dict {
            key,
            value,
            entries,
        } => {
            p.values += widen_value_type(key) + widen_value_type(value);
            for (k, v) in entries {
                widen_value(k, p);
                widen_value(v, p);
            }
        }
        Value::Strings { .. } => {}
    }
}

/// `dtype` arguments name the output type of casts and fills: "fp16" becomes "fp32".
fn widen_dtype_arg(v: &mut Value, p: &mut Promotion) {
    if let Value::Strings { values, .. } = v {
        for s in values.iter_mut().filter(|s| s.as_str() == "fp16") {
            *s = "fp32".to_string();
            p.dtype_args += 1;
        }
    }
}

/// Names of the values bound to a `dtype` parameter anywhere in `b` (the `const` ops that
/// hold a cast's target type).
fn dtype_vars(b: &Block, out: &mut HashSet<String>) {
    for op in &b.operations {
        for a in op.inputs.get("dtype").into_iter().flatten() {
            if let Arg::Var(v) = a {
                out.insert(v.clone());
            }
        }
        for inner in &op.blocks {
            dtype_vars(inner, out);
        }
    }
}

fn widen_op(op: &mut Operation, dtypes: &HashSet<String>, p: &mut Promotion) {
    let holds_dtype = op.op_type == "const" && op.outputs.iter().any(|o| dtypes.contains(&o.name));
    for (name, args) in op.inputs.iter_mut() {
        for a in args.iter_mut() {
            if let Arg::Value(v) = a {
                if name == "dtype" {
                    widen_dtype_arg(v, p);
                } else {
                    widen_value(v, p);
                }
            }
        }
    }
    for (name, v) in op.attributes.iter_mut() {
        if name == "dtype" || (holds_dtype && name == "val") {
            widen_dtype_arg(v, p);
        } else {
            widen_value(v, p);
        }
    }
    for o in &mut op.outputs {
        p.values += widen_value_type(&mut o.ty);
    }
    for b in &mut op.blocks {
        widen_block(b, dtypes, p);
    }
}

/// A `constexpr_*` op keeps its fp16 tables and output, so the weights are exactly those the
/// package decodes to; a `cast` to fp32 (folded at load like the op itself) takes over the
/// output's name.
fn widen_constexpr(mut op: Operation, p: &mut Promotion) -> Vec<Operation> {
    let mut casts = vec![];
    for o in &mut op.outputs {
        let mut wide = o.ty.clone();
        if widen_value_type(&mut wide) == 0 {
            continue;
        }
        p.values += 1;
        let narrow = format!("{}__fp16", o.name);
        casts.push(Operation {
            op_type: "cast".into(),
            name: format!("{}__fp32", o.name),
            inputs: [
                ("x".to_string(), vec![Arg::Var(narrow.clone())]),
                ("dtype".to_string(), vec![Arg::Value(Value::str("fp32"))]),
            ]
            .into_iter()
            .collect(),
            outputs: vec![Var {
                name: std::mem::replace(&mut o.name, narrow),
                ty: wide,
            }],
            blocks: vec![],
            attributes: Default::default(),
        });
    }
    std::iter::once(op).chain(casts).collect()
}

fn widen_block(b: &mut Block, dtypes: &HashSet<String>, p: &mut Promotion) {
    for v in &mut b.inputs {
        p.values += widen_value_type(&mut v.ty);
    }
    let ops = std::mem::take(&mut b.operations);
    for mut op in ops {
        if op.op_type.starts_with("constexpr_") {
            b.operations.extend(widen_constexpr(op, p));
        } else {
            widen_op(&mut op, dtypes, p);
            b.operations.push(op);
        }
    }
}

/// Rewrites `m` so that every fp16 tensor is float32 (see the module doc), description
/// included. Integer, boolean and fp32 tensors are untouched, so quantized and palettized
/// weights keep their codes and decode straight to float32.
pub fn promote_fp16(m: &mut Model) -> Result<Promotion> {
    let mut p = Promotion::default();
    for f in m.program.functions.values_mut() {
        for v in &mut f.inputs {
            p.values += widen_value_type(&mut v.ty);
        }
        let mut dtypes = HashSet::new();
        dtype_vars(&f.block, &mut dtypes);
        widen_block(&mut f.block, &dtypes, &mut p);
    }
    let d = &mut m.description;
    // A multifunction model's per-function interfaces too.
    let per_function = d.functions.values_mut().flat_map(|io| {
        io.inputs
            .iter_mut()
            .chain(&mut io.outputs)
            .chain(&mut io.states)
    });
    for f in d
        .inputs
        .iter_mut()
        .chain(&mut d.outputs)
        .chain(&mut d.states)
        .chain(per_function)
    {
        if f.dtype == ArrayDType::F16 {
            f.dtype = ArrayDType::F32;
        }
    }
    Ok(p)
}
