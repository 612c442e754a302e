//! Compiling one MIL function into an execution plan: every variable gets a slot, constants
//! (`const`, inline values, and any op whose inputs are all constant — `constexpr_*`
//! decompression included) are evaluated once here, and each remaining op becomes a step
//! that knows which slots die after it (their last use), so a run holds only live values.

use crate::ir::{Arg, Block, Function, Opset, ValueType, Var};
use crate::ops::eval::{check_output, value_from_ir, Bound, EvalCx, EvalFn};
use crate::ops::RValue;
use anyhow::{anyhow, bail, ensure, Context, Result};
use candle_core::Tensor;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::OnceLock;

pub use super::step::{
    show_bytes, slot_uses, splice_fused, Budget, Const, Plan, PlanInput, Src, Step, CAPTURED,
};

fn tensor_bytes(t: &Tensor) -> u64 {
    (t.elem_count() as u64).saturating_mul(t.dtype().size_in_bytes() as u64)
}

/// Bytes a run-time value holds (a tensor's storage; string lengths; a state's tensor is
/// the session's, counted by its fixed type).
pub fn rvalue_bytes(v: &RValue) -> u64 {
    match v {
        RValue::T(t) => tensor_bytes(t),
        RValue::Str(s) => s.iter().map(|x| x.len() as u64).sum(),
        RValue::State(_) => 0,
        RValue::List(l) => l.elems.iter().flatten().map(tensor_bytes).sum(),
        RValue::Dict(d) => {
            let keys = match &d.keys {
                crate::ops::DictKeys::Int64(k) => 8 * k.len() as u64,
                crate::ops::DictKeys::Str(k) => k.iter().map(|x| x.len() as u64).sum(),
            };
            keys.saturating_add(tensor_bytes(&d.values))
        }
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
        env: None,
        spec: st.def.map_or(&[], |d| d.inputs),
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

/// Compiles `f`; `opts` choose the fusions ([`super::fusion`], [`super::state_fusion`],
/// [`super::blend_fusion`], [`super::conv_fusion`]).
pub fn compile(f: &Function, opts: &super::Options) -> Result<Plan> {
    compile_body(&f.inputs, vec![], &f.block, f.opset, opts, false)
}

/// An outer-scope value a nested block reads: its name, type, and either a slot of the
/// enclosing plan (fed as an input of the block's plan) or a constant (copied in).
struct Captured {
    name: String,
    ty: ValueType,
    konst: Option<Const>,
}

/// Names a block reads that it (and its own nested blocks) does not define, in order of
/// first use.
fn free_names(b: &Block, out: &mut Vec<String>) {
    let mut defined: HashSet<String> = b.inputs.iter().map(|v| v.name.clone()).collect();
    let push = |n: &str, defined: &HashSet<String>, out: &mut Vec<String>| {
        if !defined.contains(n) && !out.iter().any(|o| o == n) {
            out.push(n.to_string());
        }
    };
    for op in &b.operations {
        for a in op.inputs.values().flatten() {
            if let Arg::Var(n) = a {
                push(n, &defined, out);
            }
        }
        for nb in &op.blocks {
            let mut inner = vec![];
            free_names(nb, &mut inner);
            for n in inner {
                push(&n, &defined, out);
            }
        }
        for o in &op.outputs {
            defined.insert(o.name.clone());
        }
    }
    for o in &b.outputs {
        push(o, &defined, out);
    }
}

/// Compiles a function body or (`nested`) a block of `cond` / `while_loop`: `inputs` are
/// the body's inputs (slots 0..), then the captured outer slots, then the ops' values. A
/// nested block folds only `const` and `constexpr_*` ops (a branch not taken must not be
/// evaluated) and is not fused.
fn compile_body(
    f_inputs: &[Var],
    captured: Vec<Captured>,
    block: &Block,
    opset: Opset,
    opts: &super::Options,
    nested: bool,
) -> Result<Plan> {
    let mut names: HashMap<String, Src> = HashMap::new();
    let mut types: HashMap<String, ValueType> = HashMap::new();
    let mut consts: Vec<Const> = Vec::new();
    let mut steps = Vec::new();
    let mut nslots = 0;
    let mut inputs = Vec::new();
    let mut origins = super::pack::Origins::new();
    let mut slot_inputs: Vec<Var> = f_inputs.to_vec();
    let mut konsts = vec![];
    for c in captured {
        match c.konst {
            Some(k) => konsts.push((c.name, c.ty, k)),
            None => slot_inputs.push(Var {
                name: c.name,
                ty: c.ty,
            }),
        }
    }
    for v in &slot_inputs {
        names.insert(v.name.clone(), Src::Slot(nslots));
        types.insert(v.name.clone(), v.ty.clone());
        inputs.push(PlanInput {
            name: v.name.clone(),
            ty: v.ty.clone(),
            slot: nslots,
        });
        nslots += 1;
    }
    for (n, ty, k) in konsts {
        consts.push(k);
        names.insert(n.clone(), Src::Const(consts.len() - 1));
        types.insert(n, ty);
    }
    // Top level only: which values only ever feed packed weight inputs (folded straight
    // into their packed form) and how often each is read (constants freed after their
    // last folding use), so no weight is held expanded next to its packed copy.
    let mut usage = if nested {
        HashMap::new()
    } else {
        value_usage(block, opset)
    };
    let mut left: HashMap<usize, usize> = HashMap::new();
    let cap = opts.max_memory.unwrap_or(u64::MAX);
    let mut const_bytes = slot_inputs
        .iter()
        .fold(0u64, |a, v| a.saturating_add(value_bytes(&v.ty)));
    for op in &block.operations {
        let label = op_label(&op.op_type, &op.name, opset);
        // Its one output only feeds packed weight inputs: folded into its packed form.
        let packed_only = op.outputs.len() == 1
            && usage
                .get(&op.outputs[0].name)
                .is_some_and(|u| u.packed_only);
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
        // A LUT4 weight whose codes and palette are inline and which only feeds packed
        // weight inputs: packed from the stored bytes before its inputs are evaluated (no
        // code is ever unpacked to a byte of its own).
        if packed_only {
            if let Some(p) = super::pack::fold_lut4_inline(op)
                .with_context(|| format!("{label}: packing its 4-bit codes"))?
            {
                const_bytes = const_bytes.saturating_add(out_bytes);
                types.insert(op.outputs[0].name.clone(), op.outputs[0].ty.clone());
                push_packed(&mut consts, &mut names, &op.outputs[0].name, p);
                continue;
            }
        }
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
                        if let crate::ir::Value::Tensor(t) = v {
                            t.data.release_pages();
                        }
                        consts.push(Const {
                            val,
                            konst: Some(v.clone()),
                            f32: OnceLock::new(),
                            packed: None,
                        });
                        if !nested {
                            // Read by this op alone.
                            left.insert(consts.len() - 1, 1);
                        }
                        Src::Const(consts.len() - 1)
                    }
                });
            }
            args.push((p.clone(), srcs));
        }
        // Nested blocks: each compiled like a function body over its own inputs plus the
        // outer values any of them reads.
        let mut blocks = Vec::new();
        if !op.blocks.is_empty() {
            let mut free = vec![];
            for b in &op.blocks {
                let mut f = vec![];
                free_names(b, &mut f);
                for n in f {
                    if !free.contains(&n) {
                        free.push(n);
                    }
                }
            }
            let mut caps = vec![];
            let mut cap_srcs = vec![];
            for n in free {
                let src = *names
                    .get(&n)
                    .ok_or_else(|| anyhow!("{label}: a block uses `{n}` before it is defined"))?;
                let ty = types[&n].clone();
                let konst = match src {
                    Src::Const(i) => {
                        let c = &consts[i];
                        Some(Const {
                            val: c.val.clone(),
                            konst: c.konst.clone(),
                            f32: OnceLock::new(),
                            packed: None,
                        })
                    }
                    Src::Slot(_) => {
                        cap_srcs.push(src);
                        None
                    }
                };
                caps.push((n, ty, konst));
            }
            let sub_opts = super::Options {
                fuse_attention: false,
                fuse_state_updates: false,
                fuse_blends: false,
                fuse_conv_gelu: false,
                ..opts.clone()
            };
            for (i, b) in op.blocks.iter().enumerate() {
                let c = caps
                    .iter()
                    .map(|(n, ty, k)| Captured {
                        name: n.clone(),
                        ty: ty.clone(),
                        konst: k.as_ref().map(|k| Const {
                            val: k.val.clone(),
                            konst: k.konst.clone(),
                            f32: OnceLock::new(),
                            packed: None,
                        }),
                    })
                    .collect();
                blocks.push(
                    compile_body(&b.inputs, c, b, opset, &sub_opts, true)
                        .with_context(|| format!("{label}: block {i}"))?,
                );
            }
            args.push((CAPTURED.to_string(), cap_srcs));
        }
        let foldable = if nested {
            op.op_type == "const" || op.op_type.starts_with("constexpr_")
        } else {
            op.blocks.is_empty() && !crate::ops::random::is_random(&op.op_type)
        };
        let constant = foldable
            && args
                .iter()
                .all(|(_, s)| s.iter().all(|s| matches!(s, Src::Const(_))));
        let mut step = Step {
            op_type: op.op_type.clone(),
            name: op.name.clone(),
            def: Some(def),
            eval,
            args,
            attributes: op.attributes.clone(),
            out_types: op.outputs.iter().map(|o| o.ty.clone()).collect(),
            outs: vec![],
            free: vec![],
            blocks,
        };
        for o in &op.outputs {
            types.insert(o.name.clone(), o.ty.clone());
        }
        if constant {
            const_bytes = const_bytes.saturating_add(out_bytes);
            if packed_only {
                if let Some(p) = super::pack::fold_packed(op, &step.args, &consts)? {
                    push_packed(&mut consts, &mut names, &op.outputs[0].name, p);
                    // Inputs read by nothing else (a LUT's indices and palette, named or
                    // inline) go now.
                    for i in step.args.iter().flat_map(|(_, s)| s) {
                        let Src::Const(i) = *i else { continue };
                        if let Some(n) = left.get_mut(&i) {
                            *n -= 1;
                            if *n == 0 {
                                consts[i].val = RValue::Str(vec![]);
                                consts[i].konst = None;
                            }
                        }
                    }
                    continue;
                }
            }
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
                if let Some(u) = usage.remove(&o.name).filter(|u| !u.pinned) {
                    left.insert(consts.len() - 1, u.reads);
                }
                if op.op_type.starts_with("constexpr_") {
                    origins.insert(consts.len() - 1, (op.op_type.clone(), step.args.clone()));
                }
            }
            // A mapped weight is now a copy of its own: its file pages need not stay.
            if let Some(crate::ir::Value::Tensor(t)) = op.attributes.get("val") {
                t.data.release_pages();
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
    for o in &block.outputs {
        let src = *names
            .get(o)
            .ok_or_else(|| anyhow!("block output `{o}` is never defined"))?;
        let ty = types
            .get(o)
            .cloned()
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
        if opts.fuse_attention {
            super::blend_fusion::fuse_into_attention(&mut steps, &outs);
        }
    }
    if opts.fuse_conv_gelu {
        super::conv_fusion::fuse_conv_gelu(&mut steps, &consts, &outs);
    }
    schedule_frees(&mut steps, &outputs, nslots);
    let fixed_live = check_memory(&steps, const_bytes, cap)?;
    if !nested {
        super::pack::pack_weights(&mut consts, &steps, &outputs, &origins)?;
    }
    drop_unused_consts(&mut consts, &steps, &outputs);
    if !nested {
        widen_weights(&mut consts, &steps, &outputs)?;
    }
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

/// How a function body reads one of its values.
#[derive(Default)]
struct Usage {
    /// Times an op's input names it.
    reads: usize,
    /// Every read is a weight input its op takes packed ([`super::pack`]).
    packed_only: bool,
    /// A block output, or read by a nested block: the value must stay.
    pinned: bool,
}

/// How `block`'s ops (and its outputs) read each value it names.
/// Binds `name` to a new constant that holds only the packed weight `p` (its expanded
/// value is never made).
fn push_packed(
    consts: &mut Vec<Const>,
    names: &mut HashMap<String, Src>,
    name: &str,
    p: crate::kernels::gemv::PackedWeight,
) {
    consts.push(Const {
        val: RValue::Str(vec![]),
        konst: None,
        f32: OnceLock::new(),
        packed: Some(p),
    });
    names.insert(name.to_string(), Src::Const(consts.len() - 1));
}

fn value_usage(block: &Block, opset: Opset) -> HashMap<String, Usage> {
    let mut out: HashMap<String, Usage> = HashMap::new();
    for op in &block.operations {
        let weight = crate::ops::lookup(&op.op_type, opset)
            .and_then(|d| d.weight)
            .filter(|w| w.packed);
        for (p, binds) in &op.inputs {
            for b in binds {
                if let Arg::Var(n) = b {
                    let u = out.entry(n.clone()).or_insert(Usage {
                        packed_only: true,
                        ..Usage::default()
                    });
                    u.reads += 1;
                    u.packed_only &= weight.is_some_and(|w| w.input == p.as_str());
                }
            }
        }
        let mut free = vec![];
        for b in &op.blocks {
            free_names(b, &mut free);
        }
        for n in free {
            out.entry(n).or_default().pinned = true;
        }
    }
    for o in &block.outputs {
        out.entry(o.clone()).or_default().pinned = true;
    }
    for u in out.values_mut() {
        u.packed_only &= !u.pinned;
    }
    out
}

/// Whether a step draws random values, itself or in one of its nested blocks.
pub fn draws_random(st: &Step) -> bool {
    crate::ops::random::is_random(&st.op_type)
        || st.blocks.iter().any(|p| p.steps.iter().any(draws_random))
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

/// Parameters of the fused attention step read only through `EvalCx::f32`; an op's own
/// are in its definition ([`crate::ops::OpDef::f32_inputs`]).
const FUSED_F32_PARAMS: &[&str] = &["x", "y", "v"];

/// Whether `st` reads parameter `p` only through `EvalCx::f32` (contractions compute in f32).
fn reads_f32(st: &Step, p: &str) -> bool {
    match st.def {
        Some(d) => d.f32_inputs.contains(&p),
        None => st.op_type == super::fusion::FUSED && FUSED_F32_PARAMS.contains(&p),
    }
}

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
            let ok = reads_f32(st, p);
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
