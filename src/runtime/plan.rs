//! Compiling one MIL function into an execution plan: every variable gets a slot, constants
//! (`const`, inline values, and any op whose inputs are all constant — `constexpr_*`
//! decompression included) are evaluated once here, and each remaining op becomes a step
//! that knows which slots die after it (their last use), so a run holds only live values.

use crate::ir::{Arg, Function, Opset, ValueType};
use crate::ops::eval::{check_output, value_from_ir, Bound, EvalCx, EvalFn};
use crate::ops::RValue;
use anyhow::{anyhow, bail, ensure, Context, Result};
use candle_core::Tensor;
use std::collections::{BTreeMap, HashMap};
use std::sync::OnceLock;

pub use super::step::{slot_uses, splice_fused, Const, Src, Step};

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

/// What a run checks values of run-time shape against: the cap, and what [`check_memory`]
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

/// Bytes a run-time value holds (a tensor's storage; string lengths; a state's tensor is
/// the session's, counted by its fixed type).
pub fn rvalue_bytes(v: &RValue) -> u64 {
    match v {
        RValue::T(t) => (t.elem_count() as u64).saturating_mul(t.dtype().size_in_bytes() as u64),
        RValue::Str(s) => s.iter().map(|x| x.len() as u64).sum(),
        RValue::State(_) => 0,
    }
}

/// Whether a value of type `ty` is counted only at run time (a tensor with an unknown
/// dimension, which [`value_bytes`] counts as 0).
pub fn is_run_time_sized(ty: &ValueType) -> bool {
    matches!(ty, ValueType::Tensor(t) if t.shape.iter().any(|d| matches!(d, crate::ir::Dim::Unknown)))
}

/// Builds the evaluation context of one step from the constants and the live slots.
pub fn make_cx<'a>(
    st: &'a Step,
    opset: Opset,
    consts: &'a [Const],
    slots: &'a [Option<RValue>],
) -> Result<EvalCx<'a>> {
    let mut inputs = BTreeMap::new();
    for (p, srcs) in &st.args {
        let bound = srcs
            .iter()
            .map(|s| match *s {
                Src::Const(i) => {
                    let c = &consts[i];
                    Ok(Bound {
                        val: &c.val,
                        konst: c.konst.as_ref(),
                        f32_cache: Some(&c.f32),
                        packed: c.packed.as_ref(),
                    })
                }
                Src::Slot(i) => slots[i]
                    .as_ref()
                    .map(|v| Bound {
                        val: v,
                        konst: None,
                        f32_cache: None,
                        packed: None,
                    })
                    .ok_or_else(|| {
                        anyhow!("input `{p}` was freed or never computed (interpreter bug)")
                    }),
            })
            .collect::<Result<Vec<_>>>()?;
        inputs.insert(p.as_str(), bound);
    }
    Ok(EvalCx {
        op_type: &st.op_type,
        op_name: &st.name,
        opset,
        inputs,
        attributes: &st.attributes,
        outputs: &st.out_types,
    })
}

/// Runs an op's evaluation and checks every output against its inferred type.
pub fn run_eval(eval: EvalFn, cx: &EvalCx) -> Result<Vec<RValue>> {
    let outs = eval(cx)?;
    ensure!(
        outs.len() == cx.outputs.len(),
        "produced {} outputs, its definition has {}",
        outs.len(),
        cx.outputs.len()
    );
    for (i, (v, t)) in outs.iter().zip(cx.outputs).enumerate() {
        check_output(v, t).with_context(|| format!("output {i}"))?;
    }
    Ok(outs)
}

pub fn op_label(op_type: &str, name: &str, opset: Opset) -> String {
    format!("op `{name}` ({op_type}, opset {})", opset.opset_name())
}

/// Compiles `f`; `opts` choose the fusions ([`super::fusion`], [`super::state_fusion`]).
pub fn compile(f: &Function, opts: &super::Options) -> Result<Plan> {
    let opset = f.opset;
    let mut names: HashMap<String, Src> = HashMap::new();
    let mut consts: Vec<Const> = Vec::new();
    let mut steps = Vec::new();
    let mut nslots = 0;
    let mut inputs = Vec::new();
    let mut origins = super::pack::Origins::new();
    for v in &f.inputs {
        names.insert(v.name.clone(), Src::Slot(nslots));
        inputs.push(PlanInput {
            name: v.name.clone(),
            ty: v.ty.clone(),
            slot: nslots,
        });
        nslots += 1;
    }
    let cap = opts.max_memory.unwrap_or(u64::MAX);
    let mut const_bytes = f
        .inputs
        .iter()
        .fold(0u64, |a, v| a.saturating_add(value_bytes(&v.ty)));
    for op in &f.block.operations {
        let label = op_label(&op.op_type, &op.name, opset);
        // Before anything of this op is evaluated (constants are folded right here): its
        // outputs on top of the constants so far must fit the cap.
        let out_bytes = op
            .outputs
            .iter()
            .fold(0u64, |a, o| a.saturating_add(value_bytes(&o.ty)));
        ensure!(
            const_bytes.saturating_add(out_bytes) <= cap,
            "{label}: its outputs take {} on top of {} of constants and inputs before it, over \
             the memory cap of {} (--max-memory)",
            show_bytes(out_bytes),
            show_bytes(const_bytes),
            show_bytes(cap)
        );
        ensure!(
            op.blocks.is_empty(),
            "{label}: nested blocks (control flow) are not supported by the interpreter"
        );
        let def = crate::ops::lookup(&op.op_type, opset).ok_or_else(|| {
            anyhow!(
                "{label}: no definition of this op in opset {}",
                opset.opset_name()
            )
        })?;
        let eval = def.eval.ok_or_else(|| {
            anyhow!(
                "{label}: milkit's interpreter has no evaluation for `{}` (opset {})",
                op.op_type,
                opset.opset_name()
            )
        })?;
        let mut args = Vec::new();
        for (p, binds) in &op.inputs {
            let mut srcs = Vec::new();
            for b in binds {
                srcs.push(match b {
                    Arg::Var(n) => *names
                        .get(n)
                        .ok_or_else(|| anyhow!("{label}: uses `{n}` before it is defined"))?,
                    Arg::Value(v) => {
                        let val = value_from_ir(v)
                            .with_context(|| format!("{label}: inline value of `{p}`"))?;
                        consts.push(Const {
                            val,
                            konst: Some(v.clone()),
                            f32: OnceLock::new(),
                            packed: None,
                        });
                        Src::Const(consts.len() - 1)
                    }
                });
            }
            args.push((p.clone(), srcs));
        }
        let constant = args
            .iter()
            .all(|(_, s)| s.iter().all(|s| matches!(s, Src::Const(_))));
        let mut step = Step {
            op_type: op.op_type.clone(),
            name: op.name.clone(),
            eval,
            args,
            attributes: op.attributes.clone(),
            out_types: op.outputs.iter().map(|o| o.ty.clone()).collect(),
            outs: vec![],
            free: vec![],
        };
        if constant {
            const_bytes = const_bytes.saturating_add(out_bytes);
            let vals = {
                let cx = make_cx(&step, opset, &consts, &[])?;
                run_eval(eval, &cx).with_context(|| format!("{label}: evaluating a constant"))?
            };
            for (o, val) in op.outputs.iter().zip(vals) {
                let konst = if op.op_type == "const" {
                    op.attributes.get("val").cloned()
                } else {
                    None
                };
                consts.push(Const {
                    val,
                    konst,
                    f32: OnceLock::new(),
                    packed: None,
                });
                names.insert(o.name.clone(), Src::Const(consts.len() - 1));
                if op.op_type.starts_with("constexpr_") {
                    origins.insert(consts.len() - 1, (op.op_type.clone(), step.args.clone()));
                }
            }
            continue;
        }
        for o in &op.outputs {
            ensure!(
                !names.contains_key(&o.name),
                "{label}: redefines `{}`",
                o.name
            );
            names.insert(o.name.clone(), Src::Slot(nslots));
            step.outs.push(nslots);
            nslots += 1;
        }
        steps.push(step);
    }
    let mut outputs = Vec::new();
    for o in &f.block.outputs {
        let src = *names
            .get(o)
            .ok_or_else(|| anyhow!("block output `{o}` is never defined"))?;
        let ty = f
            .block
            .operations
            .iter()
            .flat_map(|op| &op.outputs)
            .chain(&f.inputs)
            .find(|v| v.name == *o)
            .map(|v| v.ty.clone())
            .ok_or_else(|| anyhow!("block output `{o}` has no type"))?;
        outputs.push((o.clone(), src, ty));
    }
    let outs: Vec<Src> = outputs.iter().map(|o| o.1).collect();
    if opts.fuse_attention {
        super::fusion::fuse_attention(&mut steps, &consts, &outs);
    }
    if opts.fuse_state_updates {
        super::state_fusion::fuse_state_updates(&mut steps, &outs);
    }
    if opts.fuse_blends {
        super::blend_fusion::fuse_blends(&mut steps, &outs);
    }
    schedule_frees(&mut steps, &outputs, nslots);
    let fixed_live = check_memory(&steps, const_bytes, cap)?;
    super::pack::pack_weights(&mut consts, &steps, &outputs, &origins)?;
    drop_unused_consts(&mut consts, &steps, &outputs);
    widen_weights(&mut consts, &steps, &outputs)?;
    Ok(Plan {
        opset,
        inputs,
        consts,
        steps,
        outputs,
        nslots,
        budget: Budget {
            cap,
            const_bytes,
            fixed_live,
        },
    })
}

/// Bytes a value of type `ty` takes at run time: fixed-shape tensors and states at their
/// storage size (`u64::MAX` when that overflows); 0 for unknown dimensions and other types.
pub fn value_bytes(ty: &ValueType) -> u64 {
    let t = match ty {
        ValueType::Tensor(t) | ValueType::State(t) => t,
        _ => return 0,
    };
    let Ok(d) = crate::ops::eval::storage_dtype(t.dtype) else {
        return 0;
    };
    let mut n = d.size_in_bytes() as u64;
    for dim in &t.shape {
        match dim {
            crate::ir::Dim::Fixed(k) => n = n.saturating_mul(*k as u64),
            crate::ir::Dim::Unknown => return 0,
        }
    }
    n
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

/// The peak of one run: constants (and inputs) plus the values live at once, walking the
/// steps with their frees; over `cap` is an error naming the step where the peak is.
/// Returns, per step, the bytes of fixed-type values live at it (the run-time check adds
/// the values of run-time shape to them, [`Budget::check_run`]).
pub fn check_memory(steps: &[Step], const_bytes: u64, cap: u64) -> Result<Vec<u64>> {
    let mut sizes: HashMap<usize, u64> = HashMap::new();
    let mut live: u64 = 0;
    let mut at = Vec::with_capacity(steps.len());
    for st in steps {
        for (slot, ty) in st.outs.iter().zip(&st.out_types) {
            let b = value_bytes(ty);
            sizes.insert(*slot, b);
            live = live.saturating_add(b);
        }
        let total = const_bytes.saturating_add(live);
        ensure!(
            total <= cap,
            "op `{}` ({}): a run needs {} at this op ({} of constants and inputs, {} of live \
             values), over the memory cap of {} (--max-memory)",
            st.name,
            st.op_type,
            show_bytes(total),
            show_bytes(const_bytes),
            show_bytes(live),
            show_bytes(cap)
        );
        at.push(live);
        for slot in &st.free {
            live = live.saturating_sub(sizes.get(slot).copied().unwrap_or(0));
        }
    }
    Ok(at)
}

/// Marks each slot to be freed after the step that last reads it (or, for values nobody
/// reads, after the step that makes them). Block outputs live to the end.
fn schedule_frees(steps: &mut [Step], outputs: &[(String, Src, ValueType)], nslots: usize) {
    let mut last: Vec<Option<usize>> = vec![None; nslots];
    for (i, st) in steps.iter().enumerate() {
        for s in st.outs.iter() {
            last[*s] = Some(i);
        }
        for (_, srcs) in &st.args {
            for s in srcs {
                if let Src::Slot(k) = s {
                    last[*k] = Some(i);
                }
            }
        }
    }
    for (_, s, _) in outputs {
        if let Src::Slot(k) = s {
            last[*k] = None;
        }
    }
    for (slot, l) in last.into_iter().enumerate() {
        if let Some(i) = l {
            steps[i].free.push(slot);
        }
    }
}

/// Releases constants only folding needed (e.g. packed LUT indices once decoded).
fn drop_unused_consts(consts: &mut [Const], steps: &[Step], outputs: &[(String, Src, ValueType)]) {
    let mut used = vec![false; consts.len()];
    let srcs = steps
        .iter()
        .flat_map(|s| s.args.iter().flat_map(|(_, v)| v.iter()))
        .chain(outputs.iter().map(|o| &o.1));
    for s in srcs {
        if let Src::Const(i) = s {
            used[*i] = true;
        }
    }
    for (c, u) in consts.iter_mut().zip(used) {
        if !u {
            c.val = RValue::Str(vec![]);
            c.konst = None;
        }
    }
}

/// Parameters whose evaluation reads its input only through `EvalCx::f32` (contractions
/// compute in f32).
const F32_PARAMS: &[(&str, &str)] = &[
    ("linear", "weight"),
    ("linear", "bias"),
    ("conv", "weight"),
    ("conv", "bias"),
    ("matmul", "x"),
    ("matmul", "y"),
    (super::fusion::FUSED, "x"),
    (super::fusion::FUSED, "y"),
    (super::fusion::FUSED, "v"),
];

/// Converts constants that only feed contractions to f32 now, once, and keeps only that
/// copy: an fp16 weight then costs 4 bytes an element instead of 2 + 4, and no run
/// converts it again.
fn widen_weights(
    consts: &mut [Const],
    steps: &[Step],
    outputs: &[(String, Src, ValueType)],
) -> Result<()> {
    let mut only_f32 = vec![true; consts.len()];
    for st in steps {
        for (p, srcs) in &st.args {
            let ok = F32_PARAMS.contains(&(st.op_type.as_str(), p.as_str()));
            for s in srcs {
                if let Src::Const(i) = s {
                    only_f32[*i] &= ok;
                }
            }
        }
    }
    for (_, s, _) in outputs {
        if let Src::Const(i) = s {
            only_f32[*i] = false;
        }
    }
    for (c, widen) in consts.iter_mut().zip(only_f32) {
        if let (true, RValue::T(t)) = (widen, &c.val) {
            if crate::kernels::data::is_float(t.dtype()) {
                let w = crate::kernels::to_f32(t)?;
                c.val = RValue::T(w.clone());
                let _ = c.f32.set(w);
            }
        }
    }
    Ok(())
}

/// A zero tensor for a state of fixed type.
pub fn zero_state(name: &str, ty: &ValueType) -> Result<Tensor> {
    let ValueType::State(t) = ty else {
        bail!("`{name}` is not a state")
    };
    let shape = t
        .fixed_shape()
        .ok_or_else(|| anyhow!("state `{name}` needs a fixed shape, has {t}"))?;
    Ok(Tensor::zeros(
        shape,
        crate::ops::eval::storage_dtype(t.dtype)?,
        &candle_core::Device::Cpu,
    )?)
}
