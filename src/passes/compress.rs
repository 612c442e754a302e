//! The compression pass: swaps selected weight constants for iOS18 `constexpr_*` ops
//! (`constexpr_lut_to_dense` for palettization, `constexpr_blockwise_shift_scale` for linear
//! quantization) whose data are bound inline, as coremltools 9 writes them; palettization
//! with per-channel scales is a two-op chain (the table op's output feeds a
//! `constexpr_blockwise_shift_scale`). Never compresses outside the selection, never touches
//! the positional embedding, never skips silently.

use super::calibrate::Calibration;
use super::feedback::{feedback_factor, palettize_with_feedback, quantize_packed_with_feedback};
use super::lut::{palettize, LutConfig, LutGranularity, LutMode};
use super::quant::{quantize_packed, QuantConfig, QuantDtype, QuantGranularity};
pub use super::select::{is_positional, Selection};
use crate::ir::{Arg, DType, Model, Operation, Opset, Tensor, Value, ValueType, Var};
use anyhow::{bail, Context, Result};
use half::f16;
use rayon::prelude::*;
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

/// What to do with each selected weight.
#[derive(Clone, Copy, Debug)]
pub enum Method {
    Palettize(LutConfig),
    Quantize(QuantConfig),
}

/// One compressed weight.
#[derive(Clone, Debug)]
pub struct Compressed {
    /// The consuming op's name and type.
    pub op: String,
    pub op_type: String,
    /// The weight constant's name (also the constexpr output's name).
    pub weight: String,
    pub shape: Vec<usize>,
    pub mode: String,
    pub bytes_before: u64,
    pub bytes_after: u64,
    pub rel_rms_error: f64,
}

/// The width a mixed plan ([`super::mixed`]) gives a weight it leaves fp16: no table, 16
/// stored bits per element, no error.
pub const FP16: u32 = 16;

/// Metadata key (`userDefined`) naming, comma-separated, the weights a mixed plan left fp16
/// (width 16): selected for compression and kept exact, so they count at 16 bits in the
/// package's bits per compressed weight (`quality::bits`).
pub const KEPT_FP16_KEY: &str = "milkit.kept_fp16";

/// The reason a report gives for such a weight.
pub const KEPT_FP16_REASON: &str = "kept fp16 by the mixed plan";

/// A weight left alone because its shape does not fit the granularity.
#[derive(Clone, Debug)]
pub struct Skipped {
    pub op: String,
    pub weight: String,
    pub shape: Vec<usize>,
    pub reason: String,
}

#[derive(Clone, Debug, Default)]
pub struct Outcome {
    pub compressed: Vec<Compressed>,
    pub skipped: Vec<Skipped>,
    /// Channel reorderings done before compressing (outlier-aware grouping).
    pub regrouped: Vec<crate::report::RegroupedChain>,
}

/// Which input of a consumer holds its weight (its op definition says).
fn weight_input(op: &Operation) -> Option<&'static str> {
    crate::ops::weight(&op.op_type).map(|w| w.input)
}

pub fn mode_name(m: &Method) -> String {
    match m {
        Method::Palettize(c) => {
            let mode = match c.mode {
                LutMode::Kmeans => "kmeans",
                LutMode::Uniform => "uniform",
            };
            // Vector tables: `lut8x2` = 8-bit indices into entries of 2 values.
            let lut = match c.cluster_dim {
                1 => format!("lut{}", c.nbits),
                cd => format!("lut{}x{cd}", c.nbits),
            };
            let base = match c.granularity {
                LutGranularity::PerTensor => format!("{lut}-{mode}-per-tensor"),
                LutGranularity::PerGroupedChannel(g) => format!("{lut}-{mode}-g{g}"),
            };
            if c.per_channel_scale {
                format!("{base}-channel-scale")
            } else {
                base
            }
        }
        Method::Quantize(c) => {
            let g = match c.granularity {
                QuantGranularity::PerTensor => "per-tensor".to_string(),
                QuantGranularity::PerChannel => "per-channel".to_string(),
                QuantGranularity::PerBlock(b) => format!("block{b}"),
            };
            format!(
                "{}-{}{}",
                c.dtype.mil_name(),
                g,
                if c.symmetric { "" } else { "-asym" }
            )
        }
    }
}

/// Why `shape` can't take `method`, if it can't.
fn indivisible(method: &Method, shape: &[usize]) -> Option<String> {
    match method {
        Method::Palettize(c) => match c.granularity {
            LutGranularity::PerGroupedChannel(g) if g == 0 || !shape[0].is_multiple_of(g) => Some(format!(
                "group size {g} does not divide the {} output channels (axis 0); use a group size that divides {} (e.g. {}) or --granularity per-tensor",
                shape[0],
                shape[0],
                largest_divisor(shape[0], g)
            )),
            LutGranularity::PerGroupedChannel(g) if !g.is_multiple_of(c.cluster_dim.max(1)) => Some(format!(
                "--cluster-dim {} does not divide the group size {g} (the output channels sharing a table, which the vectors of {} channels tile); use a group size that is a multiple of {}",
                c.cluster_dim, c.cluster_dim, c.cluster_dim
            )),
            LutGranularity::PerTensor if !shape[0].is_multiple_of(c.cluster_dim.max(1)) => Some(format!(
                "--cluster-dim {} does not divide the {} output channels (axis 0), along which the vectors lie; use --cluster-dim {} or 1",
                c.cluster_dim,
                shape[0],
                if shape[0].is_multiple_of(2) { 2 } else { 1 }
            )),
            _ => None,
        },
        Method::Quantize(c) => match c.granularity {
            QuantGranularity::PerBlock(b) if shape.len() < 2 || b == 0 || !shape[1].is_multiple_of(b) => Some(format!(
                "block size {b} does not divide the {} input channels (axis 1); use a block size that divides {} (e.g. {}) or --granularity per-channel",
                shape.get(1).copied().unwrap_or(0),
                shape.get(1).copied().unwrap_or(0),
                largest_divisor(shape.get(1).copied().unwrap_or(1), b)
            )),
            _ => None,
        },
    }
}

fn largest_divisor(n: usize, at_most: usize) -> usize {
    (1..=at_most.min(n).max(1))
        .rev()
        .find(|d| n.is_multiple_of(*d))
        .unwrap_or(1)
}

/// A planned replacement: (function, index of the const op, consumer name, consumer type).
struct Job {
    func: String,
    const_idx: usize,
    op: String,
    op_type: String,
}

/// Compresses the selected weights of every function of `model` in place. The model must
/// target iOS18 (the constexpr ops used here exist from iOS18 on).
pub fn compress(model: &mut Model, method: &Method, sel: &Selection) -> Result<Outcome> {
    compress_calibrated(model, method, sel, None)
}

/// [`compress`], data-aware: with `calibration`, k-means weighs each element's squared error
/// by its input channel's second moment (see [`super::calibrate`]). Every selected weight
/// must then have statistics; linear quantization does not take them.
pub fn compress_calibrated(
    model: &mut Model,
    method: &Method,
    sel: &Selection,
    calibration: Option<&Calibration>,
) -> Result<Outcome> {
    compress_mixed(model, method, sel, calibration, &BTreeMap::new())
}

/// [`compress_calibrated`] with per-weight palettization bit widths (weight constant name →
/// nbits) overriding `method`'s, as chosen by [`super::mixed::plan_bits`].
pub fn compress_mixed(
    model: &mut Model,
    method: &Method,
    sel: &Selection,
    calibration: Option<&Calibration>,
    nbits: &BTreeMap<String, u32>,
) -> Result<Outcome> {
    compress_with(model, method, sel, calibration, nbits, None)
}

/// [`compress_mixed`], optionally with error feedback while rounding
/// ([`super::feedback`]): with `error_feedback` = Some(damping), every weight whose
/// statistics hold its input's Gram matrix is rounded column by column with the error
/// pushed onto the columns not yet rounded (palettization: tables fitted first, indices by
/// the sweep; linear quantization: scales as usual, codes by the sweep). Weights without a
/// matrix (convs with wider kernels) are compressed as without it; their mode says which.
pub fn compress_with(
    model: &mut Model,
    method: &Method,
    sel: &Selection,
    calibration: Option<&Calibration>,
    nbits: &BTreeMap<String, u32>,
    error_feedback: Option<f64>,
) -> Result<Outcome> {
    if !nbits.is_empty() && !matches!(method, Method::Palettize(_)) {
        bail!("per-weight bit widths apply to palettization only");
    }
    if error_feedback.is_some() && calibration.is_none() {
        bail!("error feedback needs calibration statistics with Gram matrices (--calibration from `milkit calibrate --gram`)");
    }
    if error_feedback.is_some() && calibration.is_some_and(|c| c.grams.is_empty()) {
        bail!("error feedback needs the inputs' Gram matrices, and these calibration statistics have none: measure them with `milkit calibrate --gram`");
    }
    if calibration.is_some() {
        match method {
            Method::Palettize(c) if c.mode == LutMode::Kmeans => {}
            Method::Quantize(_) if error_feedback.is_some() => {}
            _ => bail!(
                "calibration statistics apply to k-means palettization (--palettize kmeans), or to linear quantization with --error-feedback"
            ),
        }
    }
    if let Method::Palettize(c) = method {
        if c.cluster_dim > 1 {
            if error_feedback.is_some() {
                bail!("--error-feedback rounds one element at a time, so it does not apply to vector palettization (--cluster-dim {}); use --cluster-dim 1 or leave out --error-feedback", c.cluster_dim);
            }
            if !nbits.is_empty() {
                bail!("per-weight bit widths (--target-bits, --op-nbits) are planned for scalar tables; they do not apply to vector palettization (--cluster-dim {})", c.cluster_dim);
            }
            for (fname, f) in &model.program.functions {
                if f.opset < Opset::Ios18 {
                    bail!(
                        "vector palettization (--cluster-dim {}) is the iOS18 constexpr_lut_to_dense with vector_axis, but function `{fname}` targets {}; export with --target ios18",
                        c.cluster_dim,
                        f.opset
                    );
                }
            }
        }
        if c.per_channel_scale {
            for (fname, f) in &model.program.functions {
                if f.opset < Opset::Ios18 {
                    bail!(
                        "--per-channel-scale needs iOS18 (its scale is a constexpr_blockwise_shift_scale after the table), but function `{fname}` targets {}; export with --target ios18",
                        f.opset
                    );
                }
            }
        }
    }
    let (mut jobs, mut skipped) = plan_jobs(model, method, sel)?;
    // A plan's width 16 leaves the weight as it is ([`FP16`]); the package names such
    // weights under `KEPT_FP16_KEY` so that its bits per weight count them.
    let mut kept = Vec::new();
    jobs.retain(|j| {
        let c = &model.program.functions[&j.func].block.operations[j.const_idx];
        if nbits.get(&c.name) != Some(&FP16) {
            return true;
        }
        let shape = match c.const_val() {
            Some(Value::Tensor(t)) => t.shape.clone(),
            _ => vec![],
        };
        skipped.push(Skipped {
            op: j.op.clone(),
            weight: c.name.clone(),
            shape,
            reason: KEPT_FP16_REASON.into(),
        });
        kept.push(c.name.clone());
        false
    });
    if !kept.is_empty() {
        kept.sort();
        kept.dedup();
        model
            .description
            .user_defined
            .insert(KEPT_FP16_KEY.into(), kept.join(","));
    }
    let mut outcome = Outcome {
        skipped,
        ..Outcome::default()
    };
    // Compute replacements in parallel (k-means dominates), then splice them in.
    let results: Vec<Result<(usize, Vec<Operation>, Compressed)>> = jobs
        .par_iter()
        .map(|j| {
            let f = &model.program.functions[&j.func];
            let c = &f.block.operations[j.const_idx];
            let Some(Value::Tensor(t)) = c.const_val() else {
                unreachable!("selected consts are tensors")
            };
            let importance = match calibration {
                // Linear quantization takes no per-element weights (only the Gram matrix).
                Some(_) if matches!(method, Method::Quantize(_)) => None,
                Some(cal) => Some(cal.importance(&c.name, &t.shape)?.with_context(|| {
                    format!(
                        "no calibration statistics for weight `{}` (op `{}`); run `milkit calibrate` on this model",
                        c.name, j.op
                    )
                })?),
                None => None,
            };
            let method = match (method, nbits.get(&c.name)) {
                (Method::Palettize(cfg), Some(&b)) => Method::Palettize(LutConfig { nbits: b, ..*cfg }),
                _ => *method,
            };
            let factor = match (error_feedback, calibration) {
                (Some(damping), Some(cal)) => match cal.gram(&c.name, &t.shape)? {
                    Some(g) => Some(feedback_factor(&g.data, g.dim, damping).with_context(|| {
                        format!("error feedback for `{}` (op `{}`)", c.name, j.op)
                    })?),
                    None => None,
                },
                _ => None,
            };
            let (ops, rec) = replace(c, t, &method, importance.as_deref(), factor.as_deref())
                .with_context(|| format!("compressing `{}` of op `{}`", c.name, j.op))?;
            Ok((
                j.const_idx,
                ops,
                Compressed {
                    op: j.op.clone(),
                    op_type: j.op_type.clone(),
                    ..rec
                },
            ))
        })
        .collect();
    let mut by_func: BTreeMap<String, Vec<(usize, Vec<Operation>)>> = BTreeMap::new();
    for (j, r) in jobs.iter().zip(results) {
        let (i, ops, rec) = r?;
        by_func.entry(j.func.clone()).or_default().push((i, ops));
        outcome.compressed.push(rec);
    }
    for (fname, mut reps) in by_func {
        let f = model
            .program
            .functions
            .get_mut(&fname)
            .expect("function exists");
        // A replacement may be a chain of ops: splice from the back so earlier indices hold.
        reps.sort_by_key(|(i, _)| std::cmp::Reverse(*i));
        for (i, ops) in reps {
            f.block.operations.splice(i..i + 1, ops);
        }
    }
    Ok(outcome)
}

/// The weights `sel` picks for `method`: (const op index, consumer) per function, plus the
/// ones skipped as indivisible. Refuses what the pass refuses.
fn plan_jobs(model: &Model, method: &Method, sel: &Selection) -> Result<(Vec<Job>, Vec<Skipped>)> {
    let mut jobs = Vec::new();
    let mut skipped = Vec::new();
    for (fname, f) in &model.program.functions {
        if f.opset < Opset::Ios18 {
            bail!(
                "compression emits iOS18 constexpr ops, but function `{fname}` targets {}; export with --target ios18",
                f.opset
            );
        }
        let producers: HashMap<&str, usize> = f
            .block
            .operations
            .iter()
            .enumerate()
            .filter(|(_, o)| o.op_type == "const")
            .map(|(i, o)| (o.outputs[0].name.as_str(), i))
            .collect();
        let mut seen = std::collections::HashSet::new();
        for op in &f.block.operations {
            let Some(param) = weight_input(op) else {
                continue;
            };
            if !sel.op_types.contains(&op.op_type) {
                continue;
            }
            let Some(Arg::Var(w)) = op.arg(param) else {
                continue;
            };
            let Some(&ci) = producers.get(w.as_str()) else {
                continue;
            };
            let c = &f.block.operations[ci];
            if !sel.op_names.is_empty()
                && !sel.op_names.iter().any(|n| *n == op.name || *n == c.name)
            {
                continue;
            }
            let Some(Value::Tensor(t)) = c.const_val() else {
                continue;
            };
            if t.dtype != DType::F16 || t.num_elements() <= sel.weight_threshold {
                continue;
            }
            if is_positional(&c.name) {
                continue;
            }
            if crate::ops::weight(&op.op_type)
                .is_some_and(|w| w.layout == crate::ops::WeightLayout::Operand)
            {
                bail!("op `{}`: compressing a matmul operand is not supported (weights of conv/linear are)", op.name);
            }
            if let Some(why) = indivisible(method, &t.shape) {
                if sel.skip_indivisible {
                    skipped.push(Skipped {
                        op: op.name.clone(),
                        weight: c.name.clone(),
                        shape: t.shape.clone(),
                        reason: why,
                    });
                    continue;
                }
                bail!(
                    "cannot compress the weight `{}` {:?} of op `{}` ({}): {why}; or pass --skip-indivisible to leave such weights uncompressed (they are listed)",
                    c.name,
                    t.shape,
                    op.name,
                    op.op_type
                );
            }
            if seen.insert(ci) {
                jobs.push(Job {
                    func: fname.clone(),
                    const_idx: ci,
                    op: op.name.clone(),
                    op_type: op.op_type.clone(),
                });
            }
        }
    }
    for name in &sel.op_names {
        let found = model
            .program
            .functions
            .values()
            .any(|f| f.block.operations.iter().any(|o| o.name == *name));
        if !found {
            bail!("--op-names: no op named `{name}` in the program (see `milkit inspect --mil`)");
        }
    }
    Ok((jobs, skipped))
}

/// A weight the pass would compress: its constant's name, its consumer op, and its value.
pub struct SelectedWeight {
    pub weight: String,
    pub op: String,
    pub tensor: Tensor,
}

/// The weights [`compress`] would compress with these arguments, without compressing.
pub fn selected_weights(
    model: &Model,
    method: &Method,
    sel: &Selection,
) -> Result<Vec<SelectedWeight>> {
    let (jobs, _) = plan_jobs(model, method, sel)?;
    Ok(jobs
        .iter()
        .filter_map(|j| {
            let c = &model.program.functions[&j.func].block.operations[j.const_idx];
            match c.const_val() {
                Some(Value::Tensor(t)) => Some(SelectedWeight {
                    weight: c.name.clone(),
                    op: j.op.clone(),
                    tensor: t.clone(),
                }),
                _ => None,
            }
        })
        .collect())
}

/// The fp16 values of `t`: its bytes viewed in place where they are aligned (on a
/// little-endian machine, as the file stores them), else a copy.
fn f16_values(t: &Tensor) -> Cow<'_, [f16]> {
    let bytes = t.data.as_slice();
    if cfg!(target_endian = "little") {
        if let Ok(v) = bytemuck::try_cast_slice::<u8, f16>(bytes) {
            return Cow::Borrowed(v);
        }
    }
    Cow::Owned(t.data.to_f16_vec())
}

/// The constexpr op(s) that replace const `c` (the last one defines the same output
/// variable), and the record.
fn replace(
    c: &Operation,
    t: &Tensor,
    method: &Method,
    importance: Option<&[f32]>,
    factor: Option<&[f64]>,
) -> Result<(Vec<Operation>, Compressed)> {
    let w = f16_values(t);
    let before = t.data.len() as u64;
    let out = Var {
        name: c.outputs[0].name.clone(),
        ty: ValueType::Tensor(t.tensor_type()),
    };
    let mut inputs = BTreeMap::new();
    // With per-channel scales: the fp16 scale tensor that follows the LUT op.
    let mut row_scale: Option<Tensor> = None;
    // Each method measures its error from its own codes, without a decoded copy of the weight.
    let (op_type, err, after) = match method {
        Method::Palettize(cfg) => {
            let p = match factor {
                Some(u) => palettize_with_feedback(&w, &t.shape, cfg, importance, u)?,
                None => palettize(&w, &t.shape, cfg, importance)?,
            };
            let idx_dtype = match p.nbits {
                1 => DType::U1,
                2 => DType::U2,
                3 => DType::U3,
                4 => DType::U4,
                6 => DType::U6,
                8 => DType::U8,
                n => bail!("unsupported nbits {n}"),
            };
            let err = p.rel_rms_error(&w)?;
            let packed = p.packed_indices()?;
            let idx = Tensor::new(
                idx_dtype,
                p.indices_shape(),
                crate::ir::Bytes::from_vec(packed),
            )?;
            let lut = Tensor::f16(&p.lut_shape, &p.lut);
            let mut after = (idx.data.len() + lut.data.len()) as u64;
            if let Some(s) = &p.row_scale {
                let st = Tensor::f16(&p.row_scale_shape(), s);
                after += st.data.len() as u64;
                row_scale = Some(st);
            }
            inputs.insert("indices".to_string(), vec![Arg::Value(Value::Tensor(idx))]);
            inputs.insert("lut".to_string(), vec![Arg::Value(Value::Tensor(lut))]);
            if p.cluster_dim > 1 {
                // The vectors lie along the output channels (axis 0), as coremltools lays them.
                inputs.insert(
                    "vector_axis".to_string(),
                    vec![Arg::Value(Value::i32_scalar(0))],
                );
                after += 4;
            }
            ("constexpr_lut_to_dense", err, after)
        }
        Method::Quantize(cfg) => {
            let q = match factor {
                Some(u) => quantize_packed_with_feedback(&w, &t.shape, cfg, u)?,
                None => quantize_packed(&w, &t.shape, cfg)?,
            };
            let dd = match q.dtype {
                QuantDtype::Int4 => DType::I4,
                QuantDtype::Uint4 => DType::U4,
                QuantDtype::Int8 => DType::I8,
                QuantDtype::Uint8 => DType::U8,
            };
            let data = Tensor::new(dd, t.shape.clone(), crate::ir::Bytes::from_vec(q.data))?;
            let scale = Tensor::f16(&q.scale_shape, &q.scale);
            let mut after = (data.data.len() + scale.data.len()) as u64;
            inputs.insert("data".to_string(), vec![Arg::Value(Value::Tensor(data))]);
            inputs.insert("scale".to_string(), vec![Arg::Value(Value::Tensor(scale))]);
            if let Some(o) = q.offset {
                let off = Tensor::new(dd, q.scale_shape.clone(), crate::ir::Bytes::from_vec(o))?;
                after += off.data.len() as u64;
                inputs.insert("offset".to_string(), vec![Arg::Value(Value::Tensor(off))]);
            }
            ("constexpr_blockwise_shift_scale", q.rel_rms_error, after)
        }
    };
    let suffix = if op_type == "constexpr_lut_to_dense" {
        "palettized"
    } else {
        "quantized"
    };
    let name = format!("{}_{suffix}", c.name);
    let ops = match row_scale {
        None => vec![Operation {
            op_type: op_type.to_string(),
            name,
            inputs,
            outputs: vec![out],
            blocks: vec![],
            attributes: BTreeMap::new(),
        }],
        Some(scale) => {
            // As coremltools: `<w>_palettized` (the normalized weight) feeds
            // `<w>_palettized_pcs`, whose output is the weight the consumers read.
            let mid = Var {
                name: format!("{}_palettized_normalized", out.name),
                ty: out.ty.clone(),
            };
            let mut sinputs = BTreeMap::new();
            sinputs.insert("data".to_string(), vec![Arg::Var(mid.name.clone())]);
            sinputs.insert("scale".to_string(), vec![Arg::Value(Value::Tensor(scale))]);
            vec![
                Operation {
                    op_type: op_type.to_string(),
                    name: name.clone(),
                    inputs,
                    outputs: vec![mid],
                    blocks: vec![],
                    attributes: BTreeMap::new(),
                },
                Operation {
                    op_type: "constexpr_blockwise_shift_scale".to_string(),
                    name: format!("{name}_pcs"),
                    inputs: sinputs,
                    outputs: vec![out],
                    blocks: vec![],
                    attributes: BTreeMap::new(),
                },
            ]
        }
    };
    Ok((
        ops,
        Compressed {
            op: String::new(),
            op_type: String::new(),
            weight: c.name.clone(),
            shape: t.shape.clone(),
            mode: if factor.is_some() {
                format!("{}-error-feedback", mode_name(method))
            } else {
                mode_name(method)
            },
            bytes_before: before,
            bytes_after: after,
            rel_rms_error: err,
        },
    ))
}
