//! Plan-level fusion of the attention core `matmul → [add mask] → softmax(last axis) →
//! matmul` into one step running `kernels::attention`, which works a block of query rows
//! at a time instead of materialising the whole score matrix. Only fused when every
//! intermediate value has exactly one use and is not a block output (the probabilities may
//! have later readers: they are then a second output of the fused step); the fused step keeps
//! the unfused program's storage dtypes (scores, masked scores and probabilities are
//! rounded to them), so results match op-by-op evaluation up to f32 summation order.
//! Keys or values that are a cache blend may be moved in by
//! [`super::blend_fusion::fuse_into_attention`]; the step then fills their rows per head
//! (`kernels::attention_blended`), or computes the blend whole where the decode-step form
//! does not apply.

use super::step::{only_reader, slot_uses, splice_fused, Const, Src, Step};
use crate::ir::{Value, ValueType};
use crate::kernels::{self, blend::BlendRows, Attention};
use crate::ops::eval::{storage_dtype, EvalCx, RValue};
use anyhow::{anyhow, Result};
use candle_core::Tensor;
use std::collections::BTreeMap;

/// The op type fused steps report (in profiles and errors).
pub const FUSED: &str = "matmul+softmax+matmul";

/// A constant integer parameter (None when absent → `default`, or when not constant).
fn const_int(st: &Step, name: &str, consts: &[Const], default: i64) -> Option<i64> {
    match st.single(name) {
        None => Some(default),
        Some(Src::Const(i)) => match &consts[i].konst {
            Some(Value::Tensor(t)) => t.to_i64_vec().ok().filter(|v| v.len() == 1).map(|v| v[0]),
            _ => None,
        },
        Some(Src::Slot(_)) => None,
    }
}

fn rank(ty: &ValueType) -> usize {
    ty.as_tensor().map_or(0, |t| t.rank())
}

fn dtype_name(ty: &ValueType) -> Option<String> {
    ty.as_tensor()
        .filter(|t| t.dtype.is_float())
        .map(|t| t.dtype.name().to_string())
}

/// Replaces each fusable attention chain in `steps` by one step at the position of its last
/// matmul. `outputs` are the block outputs (never fused away).
pub fn fuse_attention(steps: &mut Vec<Step>, consts: &[Const], outputs: &[Src]) {
    let uses = slot_uses(steps, outputs);
    let only_use = |slot: usize| only_reader(&uses, slot);
    let all_uses = |slot: usize| uses.get(&slot).cloned().unwrap_or_default();
    let mut removed = vec![false; steps.len()];
    let mut fused: Vec<(usize, Step)> = Vec::new();
    for i in 0..steps.len() {
        let Some(chain) = match_chain(steps, consts, i, &only_use, &all_uses) else {
            continue;
        };
        if chain.removed.iter().any(|&r| removed[r]) || removed[chain.last] {
            continue;
        }
        chain.removed.iter().for_each(|&r| removed[r] = true);
        removed[chain.last] = true;
        fused.push((chain.last, chain.step));
    }
    let fused: BTreeMap<usize, Step> = fused.into_iter().collect();
    splice_fused(steps, fused, &removed);
}

struct Chain {
    removed: Vec<usize>,
    last: usize,
    step: Step,
}

fn bool_attr(v: bool) -> Value {
    Value::bool_scalar(v)
}

fn match_chain(
    steps: &[Step],
    consts: &[Const],
    i: usize,
    only_use: &dyn Fn(usize) -> Option<usize>,
    all_uses: &dyn Fn(usize) -> Vec<usize>,
) -> Option<Chain> {
    let mm = &steps[i];
    if mm.op_type != "matmul" || mm.outs.len() != 1 || rank(&mm.out_types[0]) < 2 {
        return None;
    }
    let (x, y) = (mm.single("x")?, mm.single("y")?);
    let tx = const_int(mm, "transpose_x", consts, 0)? != 0;
    let ty = const_int(mm, "transpose_y", consts, 0)? != 0;
    let mut round = vec![dtype_name(&mm.out_types[0])?];
    let mut removed = vec![i];
    let mut cur = only_use(mm.outs[0])?;
    let mut value = mm.outs[0];
    let mut mask = None;
    if steps[cur].op_type == "add" {
        let add = &steps[cur];
        let (a, b) = (add.single("x")?, add.single("y")?);
        mask = Some(match (a, b) {
            (Src::Slot(k), other) if k == value => other,
            (other, Src::Slot(k)) if k == value => other,
            _ => return None,
        });
        if rank(&add.out_types[0]) != rank(&mm.out_types[0]) {
            return None;
        }
        round.push(dtype_name(&add.out_types[0])?);
        removed.push(cur);
        value = add.outs[0];
        cur = only_use(value)?;
    } else {
        round.push(round[0].clone());
    }
    let sm = &steps[cur];
    let r = rank(&sm.out_types[0]) as i64;
    let axis = const_int(sm, "axis", consts, -1)?;
    if sm.op_type != "softmax"
        || sm.single("x")? != Src::Slot(value)
        || (axis != -1 && axis != r - 1)
    {
        return None;
    }
    round.push(dtype_name(&sm.out_types[0])?);
    removed.push(cur);
    let p = sm.outs[0];
    // The probabilities feed the second matmul and, in a decoder that reports alignment
    // heads, later ops too: then the fused step hands them out as a second output. Every
    // other reader must come after the matmul, where the fused step takes its place.
    let readers = all_uses(p);
    let last = *readers
        .iter()
        .filter(|&&j| j != usize::MAX && steps[j].op_type == "matmul")
        .min()?;
    let extra = readers.len() > 1;
    if readers
        .iter()
        .any(|&j| j != last && j != usize::MAX && j < last)
    {
        return None;
    }
    let mm2 = &steps[last];
    if mm2.op_type != "matmul" || rank(&mm2.out_types[0]) != r as usize {
        return None;
    }
    let (x2, y2) = (mm2.single("x")?, mm2.single("y")?);
    let tx2 = const_int(mm2, "transpose_x", consts, 0)? != 0;
    let ty2 = const_int(mm2, "transpose_y", consts, 0)? != 0;
    let (v, tv, probs_left) = match (x2, y2) {
        (Src::Slot(k), other) if k == p && !tx2 => (other, ty2, true),
        (other, Src::Slot(k)) if k == p && ty2 => (other, tx2, false),
        _ => return None,
    };
    let mut args = vec![
        ("x".to_string(), vec![x]),
        ("y".to_string(), vec![y]),
        ("v".to_string(), vec![v]),
    ];
    if let Some(m) = mask {
        args.push(("mask".to_string(), vec![m]));
    }
    let mut attributes = BTreeMap::new();
    for (k, b) in [
        ("tx", tx),
        ("ty", ty),
        ("tv", tv),
        ("probs_left", probs_left),
    ] {
        attributes.insert(k.to_string(), bool_attr(b));
    }
    attributes.insert("probs_out".to_string(), bool_attr(extra));
    let (mut out_types, mut outs) = (mm2.out_types.clone(), mm2.outs.clone());
    if extra {
        out_types.push(sm.out_types[0].clone());
        outs.push(p);
    }
    for (k, d) in ["round_scores", "round_masked", "round_probs"]
        .iter()
        .zip(round)
    {
        attributes.insert(k.to_string(), Value::str(&d));
    }
    let step = Step {
        op_type: FUSED.to_string(),
        def: None,
        name: mm2.name.clone(),
        eval: eval_fused_attention,
        args,
        attributes,
        out_types,
        outs,
        free: vec![],
        blocks: vec![],
    };
    Some(Chain {
        removed,
        last,
        step,
    })
}

/// The arguments a fused attention takes instead of `p` (`y` or `v`) when that operand is
/// a moved-in blend: its four operands, and the attribute with the reshaped shape.
pub fn blend_args(p: &str) -> ([String; 4], String) {
    (
        ["a", "b", "c", "d"].map(|o| format!("{p}_blend_{o}")),
        format!("{p}_blend_shape"),
    )
}

/// A blended operand moved into the attention: the blend's four operands and the shape
/// its result is reshaped to.
type Blended<'t> = ([&'t Tensor; 4], Vec<usize>);

/// The attention's result and, when asked for, its probabilities.
type Outs = (Tensor, Option<Tensor>);

fn eval_fused_attention(cx: &EvalCx) -> Result<Vec<RValue>> {
    let flag = |k: &str| -> Result<bool> {
        match cx
            .attributes
            .get(k)
            .and_then(|v| v.as_tensor())
            .map(|t| t.to_i64_vec())
        {
            Some(Ok(v)) if v.len() == 1 => Ok(v[0] != 0),
            _ => Err(anyhow!("fused attention lacks flag `{k}`")),
        }
    };
    let dt = |k: &str| -> Result<candle_core::DType> {
        let name = cx
            .attributes
            .get(k)
            .and_then(|v| v.as_str())
            .ok_or_else(|| anyhow!("fused attention lacks `{k}`"))?;
        storage_dtype(
            crate::ir::DType::from_name(name).ok_or_else(|| anyhow!("unknown dtype `{name}`"))?,
        )
    };
    // Constants through their cached f32 copy; computed values as they are (the kernel
    // reads fp16 keys/values of a decode step without widening them first).
    let get = |n: &str| -> Result<Tensor> {
        match cx.all(n).first().and_then(|b| b.f32_cache) {
            Some(_) => cx.f32(n),
            None => Ok(cx.t(n)?.clone()),
        }
    };
    // Keys or values that are a cache blend moved into this step
    // (`blend_fusion::fuse_into_attention`): its four operands and the reshaped shape.
    let blended = |p: &str| -> Result<Option<Blended>> {
        let (names, shape) = blend_args(p);
        if !cx.has(&names[0]) {
            return Ok(None);
        }
        let ops = [
            cx.t(&names[0])?,
            cx.t(&names[1])?,
            cx.t(&names[2])?,
            cx.t(&names[3])?,
        ];
        let dims = cx
            .attributes
            .get(&shape)
            .and_then(|v| v.as_tensor())
            .map(|t| t.to_i64_vec())
            .ok_or_else(|| anyhow!("fused attention lacks `{shape}`"))??;
        Ok(Some((ops, dims.iter().map(|&n| n as usize).collect())))
    };
    let (yb, vb) = (blended("y")?, blended("v")?);
    // A blended operand as a placeholder of its shape (the decode-step kernel fills its
    // rows), or computed whole where that kernel does not apply.
    let placeholder = |b: &Blended| -> Result<Tensor> {
        let t = Tensor::zeros((), b.0[0].dtype(), b.0[0].device())?;
        Ok(t.broadcast_as(b.1.as_slice())?)
    };
    let whole = |b: &Blended| -> Result<Tensor> {
        let [a, bb, c, d] = b.0;
        Ok(kernels::blend::mul_mul_add(a, bb, c, d)?.reshape(b.1.as_slice())?)
    };
    let operand = |p: &str, b: &Option<Blended>, lazy: bool| match b {
        Some(b) if lazy => placeholder(b),
        Some(b) => whole(b),
        None => get(p),
    };
    let mask = cx.opt_t("mask")?;
    let want = flag("probs_out")?;
    let run = |lazy: bool| -> Result<Option<Outs>> {
        let (x, y, v) = (
            get("x")?,
            operand("y", &yb, lazy)?,
            operand("v", &vb, lazy)?,
        );
        let a = Attention {
            x: &x,
            tx: flag("tx")?,
            y: &y,
            ty: flag("ty")?,
            mask,
            round: [dt("round_scores")?, dt("round_masked")?, dt("round_probs")?],
            v: &v,
            tv: flag("tv")?,
            probs_left: flag("probs_left")?,
        };
        if !lazy {
            // A session computing bf16 products runs the panels on them
            // (`--compute bf16`).
            let kernel = kernels::Kernel::for_products(cx.products());
            return kernels::attention_with(&a, want, kernel).map(Some);
        }
        // Each blended operand's rows (`None`: not fp16, computed whole instead).
        let with = |b: &Option<Blended>,
                    f: &mut dyn FnMut(Option<&BlendRows>) -> Result<Option<Outs>>|
         -> Result<Option<Outs>> {
            match b {
                Some(([a, bb, c, d], _)) => {
                    let r = kernels::blend::with_rows(a, bb, c, d, |br| f(Some(br)))?;
                    Ok(r.transpose()?.flatten())
                }
                None => f(None),
            }
        };
        with(&yb, &mut |fy| {
            with(&vb, &mut |fv| {
                kernels::attention_blended(&a, want, [fy, fv])
            })
        })
    };
    let lazy = yb.is_some() || vb.is_some();
    let (out, probs) = match run(lazy)? {
        Some(r) => r,
        None => run(false)?.ok_or_else(|| anyhow!("attention returned nothing"))?,
    };
    let mut res = vec![RValue::T(kernels::cast(&out, cx.out_dtype(0)?)?)];
    if let Some(p) = probs {
        res.push(RValue::T(kernels::cast(&p, cx.out_dtype(1)?)?));
    }
    Ok(res)
}
