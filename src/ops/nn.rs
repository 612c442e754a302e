//! Neural-network ops: `conv`, `linear`, `matmul`, `einsum`, normalisations, activations
//! with parameters, softmax and reductions.

use super::def;
use super::eval::{one, out0, EvalCx, RValue};
use super::infer::{axis, broadcast, float_only, tensor, InferCx};
use super::placement::Flops;
use super::DefaultValue;
use super::{opt, opt_c, req, req_c, Axis, OpDef, Weight, WeightLayout};
use crate::ir::{DType, Dim, Opset, ValueType};
use crate::kernels::{self, fastmath};
use anyhow::{anyhow, bail, ensure, Result};

/// Output length of one convolution axis.
pub fn conv_out_len(
    input: usize,
    kernel: usize,
    stride: usize,
    dilation: usize,
    pad_type: &str,
    pad: (usize, usize),
) -> Result<usize> {
    ensure!(
        stride > 0 && dilation > 0,
        "conv strides and dilations must be positive"
    );
    let eff = dilation * (kernel - 1) + 1;
    Ok(match pad_type {
        "valid" => {
            ensure!(
                input >= eff,
                "conv kernel span {eff} exceeds input length {input}"
            );
            (input - eff) / stride + 1
        }
        "same" | "same_lower" => input.div_ceil(stride),
        "custom" => {
            let padded = input + pad.0 + pad.1;
            ensure!(
                padded >= eff,
                "conv kernel span {eff} exceeds padded length {padded}"
            );
            (padded - eff) / stride + 1
        }
        other => bail!("unknown conv pad_type `{other}`"),
    })
}

fn infer_conv(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    let w = cx.t("weight")?;
    float_only(x, "x")?;
    ensure!(x.rank() >= 3, "conv input must be rank 3..5, is {x}");
    ensure!(
        w.rank() == x.rank(),
        "conv weight {w} and input {x} differ in rank"
    );
    let ws = w
        .fixed_shape()
        .ok_or_else(|| anyhow!("conv weight needs a fixed shape"))?;
    let nsp = x.rank() - 2;
    let groups = cx.int_or_default("groups")? as usize;
    ensure!(groups >= 1, "conv groups must be ≥ 1");
    if let Dim::Fixed(cin) = x.shape[1] {
        ensure!(
            ws[1] * groups == cin,
            "conv weight {w} with groups={groups} needs {} input channels, input is {x}",
            ws[1] * groups
        );
    }
    if let Some(b) = cx.opt_t("bias")? {
        ensure!(
            b.fixed_shape() == Some(vec![ws[0]]),
            "conv bias {b} must be [{}]",
            ws[0]
        );
    }
    let strides = cx.ints_or_default("strides", nsp)?;
    let dil = cx.ints_or_default("dilations", nsp)?;
    let pad_type = cx.str_or_default("pad_type")?;
    let pad = cx.ints_or_default("pad", 2 * nsp)?;
    ensure!(
        strides.len() == nsp && dil.len() == nsp,
        "conv strides/dilations need {nsp} values"
    );
    ensure!(pad.len() == 2 * nsp, "conv pad needs {} values", 2 * nsp);
    let mut out = vec![x.shape[0].clone(), Dim::Fixed(ws[0])];
    for i in 0..nsp {
        out.push(match x.shape[2 + i] {
            Dim::Fixed(n) => Dim::Fixed(conv_out_len(
                n,
                ws[2 + i],
                strides[i] as usize,
                dil[i] as usize,
                pad_type,
                (pad[2 * i] as usize, pad[2 * i + 1] as usize),
            )?),
            Dim::Unknown => Dim::Unknown,
        });
    }
    Ok(vec![tensor(x.dtype, out)])
}

fn infer_linear(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    let w = cx.shape("weight")?;
    float_only(x, "x")?;
    ensure!(w.len() == 2, "linear weight must be rank 2, is {w:?}");
    ensure!(x.rank() >= 1, "linear input must have rank ≥ 1");
    if let Some(Dim::Fixed(k)) = x.shape.last() {
        ensure!(
            *k == w[1],
            "linear weight {w:?} does not take an input of width {k}"
        );
    }
    if let Some(b) = cx.opt_t("bias")? {
        ensure!(
            b.fixed_shape() == Some(vec![w[0]]),
            "linear bias {b} must be [{}]",
            w[0]
        );
    }
    let mut s = x.shape.clone();
    *s.last_mut().unwrap() = Dim::Fixed(w[0]);
    Ok(vec![tensor(x.dtype, s)])
}

/// matmul's result dtype: that of `x` and `y`; from iOS17 one of them may be a constant
/// of another dtype, and the result takes the other one's.
fn matmul_dtype(cx: &InferCx) -> Result<DType> {
    let (x, y) = (cx.t("x")?.dtype, cx.t("y")?.dtype);
    if x != y && cx.opset >= Opset::Ios17 {
        match (cx.opt_val("x").is_some(), cx.opt_val("y").is_some()) {
            (true, false) => return Ok(y),
            (false, true) => return Ok(x),
            _ => {}
        }
    }
    cx.same_dtype(&["x", "y"])
}

fn infer_matmul(cx: &InferCx) -> Result<Vec<ValueType>> {
    let d = matmul_dtype(cx)?;
    let (x, y) = (cx.t("x")?, cx.t("y")?);
    let tx = cx.bool_or_default("transpose_x")?;
    let ty = cx.bool_or_default("transpose_y")?;
    let mut xs = x.shape.clone();
    let mut ys = y.shape.clone();
    let (x1, y1) = (xs.len() == 1, ys.len() == 1);
    if x1 {
        xs.insert(0, Dim::Fixed(1));
    }
    if y1 {
        ys.push(Dim::Fixed(1));
    }
    ensure!(!xs.is_empty() && !ys.is_empty(), "matmul of scalars");
    let (xn, yn) = (xs.len(), ys.len());
    if tx {
        xs.swap(xn - 1, xn - 2);
    }
    if ty && !y1 {
        ys.swap(yn - 1, yn - 2);
    }
    if let (Dim::Fixed(a), Dim::Fixed(b)) = (&xs[xn - 1], &ys[yn - 2]) {
        ensure!(
            a == b,
            "matmul inner dimensions differ: {x} × {y} (transpose {tx}/{ty})"
        );
    }
    let mut out = broadcast(&xs[..xn - 2], &ys[..yn - 2])?;
    if !x1 {
        out.push(xs[xn - 2].clone());
    }
    if !y1 {
        out.push(ys[yn - 1].clone());
    }
    Ok(vec![tensor(d, out)])
}

/// `einsum` with single-letter subscripts, two operands: "lhs,rhs->out".
fn infer_einsum(cx: &InferCx) -> Result<Vec<ValueType>> {
    let eq = cx
        .opt_str("equation")?
        .ok_or_else(|| anyhow!("einsum needs `equation`"))?;
    let vals = cx.all("values");
    let (lhs, out) = eq
        .split_once("->")
        .ok_or_else(|| anyhow!("einsum equation `{eq}` lacks ->"))?;
    let terms: Vec<&str> = lhs.split(',').collect();
    ensure!(
        terms.len() == vals.len(),
        "einsum `{eq}` has {} operands, got {}",
        terms.len(),
        vals.len()
    );
    let mut dims = std::collections::BTreeMap::new();
    let mut dtype = None;
    for (term, a) in terms.iter().zip(vals) {
        let t =
            a.ty.as_tensor()
                .ok_or_else(|| anyhow!("einsum operand is not a tensor"))?;
        ensure!(
            term.len() == t.rank(),
            "einsum term `{term}` vs operand {t}"
        );
        ensure!(
            dtype.is_none_or(|d| d == t.dtype),
            "einsum operands differ in dtype"
        );
        dtype = Some(t.dtype);
        for (c, d) in term.chars().zip(&t.shape) {
            match (dims.get(&c), d) {
                (Some(Dim::Fixed(a)), Dim::Fixed(b)) if a != b && *a != 1 && *b != 1 => {
                    bail!("einsum `{eq}`: subscript {c} is {a} and {b}")
                }
                (Some(Dim::Fixed(a)), _) if *a != 1 => {}
                _ => {
                    dims.insert(c, d.clone());
                }
            }
        }
    }
    let shape = out
        .chars()
        .map(|c| {
            dims.get(&c)
                .cloned()
                .ok_or_else(|| anyhow!("einsum output subscript {c} unknown"))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(vec![tensor(dtype.unwrap(), shape)])
}

pub(super) fn norm_axes(cx: &InferCx, name: &str, rank: usize) -> Result<Option<Vec<usize>>> {
    cx.opt_ints(name)?
        .map(|v| {
            v.into_iter()
                .map(|a| axis(a, rank))
                .collect::<Result<Vec<_>>>()
        })
        .transpose()
}

fn infer_layer_norm(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    float_only(x, "x")?;
    let axes = norm_axes(cx, "axes", x.rank())?.unwrap_or((0..x.rank()).collect());
    let want: Vec<Dim> = axes.iter().map(|&a| x.shape[a].clone()).collect();
    for p in ["gamma", "beta"] {
        if let Some(g) = cx.opt_t(p)? {
            ensure!(
                g.shape == want,
                "layer_norm `{p}` {g} must have the normalised shape {}",
                super::infer::fmt(&want)
            );
        }
    }
    Ok(vec![ValueType::Tensor(x.clone())])
}

fn infer_batch_norm(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    float_only(x, "x")?;
    ensure!(x.rank() >= 3, "batch_norm input must be rank ≥ 3");
    Ok(vec![ValueType::Tensor(x.clone())])
}

fn infer_softmax(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    float_only(x, "x")?;
    axis(cx.int_or_default("axis")?, x.rank())?;
    Ok(vec![ValueType::Tensor(x.clone())])
}

fn infer_gelu(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    float_only(x, "x")?;
    let mode = cx.str_or_default("mode")?;
    ensure!(
        matches!(
            mode,
            "EXACT" | "TANH_APPROXIMATION" | "SIGMOID_APPROXIMATION"
        ),
        "unknown gelu mode `{mode}`"
    );
    Ok(vec![ValueType::Tensor(x.clone())])
}

// ---- evaluation: contractions in f32 (cached f32 copies of constant weights), results
// rounded once to the output dtype ----

/// (before, after) padding per spatial axis for a MIL `pad_type`.
pub fn conv_pads(
    pad_type: &str,
    input: &[usize],
    kernel: &[usize],
    strides: &[usize],
    dilations: &[usize],
    custom: &[i64],
) -> Result<Vec<(usize, usize)>> {
    (0..input.len())
        .map(|i| {
            let eff = dilations[i] * (kernel[i] - 1) + 1;
            Ok(match pad_type {
                "valid" => (0, 0),
                "custom" => {
                    let (b, a) = (
                        custom.get(2 * i).copied().unwrap_or(0),
                        custom.get(2 * i + 1).copied().unwrap_or(0),
                    );
                    ensure!(b >= 0 && a >= 0, "negative conv padding {custom:?}");
                    (b as usize, a as usize)
                }
                "same" | "same_lower" => {
                    // Total padding that makes the output ceil(input / stride) long.
                    let s = strides[i];
                    let total = input[i].div_ceil(s).saturating_sub(1) * s + eff;
                    let total = total.saturating_sub(input[i]);
                    let small = total / 2;
                    if pad_type == "same" {
                        (small, total - small)
                    } else {
                        (total - small, small)
                    }
                }
                other => bail!("unknown conv pad_type `{other}`"),
            })
        })
        .collect()
}

fn usizes(v: Vec<i64>, what: &str) -> Result<Vec<usize>> {
    v.into_iter()
        .map(|x| usize::try_from(x).map_err(|_| anyhow!("negative {what} {x}")))
        .collect()
}

fn eval_conv(cx: &EvalCx) -> Result<Vec<RValue>> {
    conv_then(cx, None)
}

/// A `conv` and the `gelu` that is the only reader of its result, as the runtime fuses them
/// (`runtime::conv_fusion`): the conv's arguments, the gelu's mode as attribute
/// `gelu_mode`. The GELU runs in the GEMM's store where that path runs, else on the conv's
/// result: either way the bits of the two ops (the conv's result rounded to its dtype, the
/// GELU in f32, rounded again).
pub fn eval_conv_gelu(cx: &EvalCx) -> Result<Vec<RValue>> {
    let mode = cx
        .attributes
        .get("gelu_mode")
        .and_then(|v| v.as_str())
        .ok_or_else(|| anyhow!("fused conv+gelu lacks `gelu_mode`"))?;
    conv_then(cx, Some(gelu_mode(mode)?))
}

/// The conv's result in its dtype, then `post` if any.
fn conv_out(
    cx: &EvalCx,
    y: candle_core::Tensor,
    post: Option<fastmath::Gelu>,
) -> Result<Vec<RValue>> {
    match post {
        None => out0(cx, y),
        Some(g) => one(kernels::map_gelu(&kernels::cast(&y, cx.out_dtype(0)?)?, g)?),
    }
}

fn conv_then(cx: &EvalCx, post: Option<fastmath::Gelu>) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let packed = cx.packed("weight");
    let wdims = match packed {
        Some(p) => p.shape.clone(),
        None => cx.t("weight")?.dims().to_vec(),
    };
    let nsp = x.rank().saturating_sub(2);
    let strides = usizes(cx.ints_or_default("strides", nsp)?, "stride")?;
    let dilations = usizes(cx.ints_or_default("dilations", nsp)?, "dilation")?;
    let custom = cx.ints_or_default("pad", 2 * nsp)?;
    let pad_type = cx.str_or_default("pad_type")?;
    ensure!(
        strides.len() == nsp && dilations.len() == nsp,
        "conv needs {nsp} strides and dilations"
    );
    let pads = conv_pads(
        pad_type,
        &x.dims()[2..],
        wdims.get(2..).unwrap_or(&[]),
        &strides,
        &dilations,
        &custom,
    )?;
    let groups = cx.int_or_default("groups")?;
    ensure!(groups >= 1, "conv groups must be ≥ 1");
    let p = kernels::ConvParams {
        strides,
        dilations,
        pads,
        groups: groups as usize,
    };
    let bias = cx.opt_f32("bias")?;
    // A decode-sized 1x1 conv on a kept (fp16 / compressed) weight: the GEMV kernels.
    let pointwise = wdims.len() == x.rank()
        && wdims[2..].iter().all(|&k| k == 1)
        && p.strides.iter().all(|&s| s == 1)
        && p.pads.iter().all(|&(a, b)| a + b == 0)
        && p.groups == 1;
    if let (Some(pw), true) = (packed, pointwise) {
        // Bias and the rounding to the output dtype happen in the GEMV's epilogue (the same
        // f32 sum rounded once, as op by op), without two more passes and tensors.
        let b = bias.as_ref().map(kernels::to_f32_vec).transpose()?;
        if let Some(y) = kernels::gemv::conv1x1(x, pw, b.as_deref(), cx.out_dtype(0)?)? {
            return conv_out(cx, y, post);
        }
        // Encoder-sized, where the CPU has AVX-512: the blocked GEMM on `x` as it lies, the
        // same epilogue. Elsewhere the general path below (candle's gemm has tuned AVX2
        // kernels; `kernels::gemm`'s portable micro-kernel is its tested fallback, not fast).
        // A session computing bf16 products takes the GEMM's bf16 kernel (which fails
        // where the CPU lacks AVX512-BF16).
        let isa = kernels::gemv::Isa::best();
        let inputs = cx.products();
        if isa == kernels::gemv::Isa::Avx512 || inputs == kernels::gemm::Inputs::Bf16 {
            let y = kernels::gemm::conv1x1_then(
                x,
                pw,
                b.as_deref(),
                post,
                cx.out_dtype(0)?,
                isa,
                inputs,
            )?;
            return out0(cx, y);
        }
    }
    // Other convs with a packed weight (a Whisper encoder's 3-wide stem) in a session
    // computing bf16 products: im2col columns through the bf16 GEMM, the same epilogue.
    if let (Some(pw), kernels::gemm::Inputs::Bf16) = (packed, cx.products()) {
        let b = bias.as_ref().map(kernels::to_f32_vec).transpose()?;
        let dtype = cx.out_dtype(0)?;
        if let Some(y) = kernels::linalg::conv_bf16(x, pw, b.as_deref(), post, dtype, &p)? {
            return out0(cx, y);
        }
    }
    let w = cx.weight_f32("weight")?;
    let y = kernels::conv(x, &w, bias.as_ref(), &p)?;
    conv_out(cx, y, post)
}

/// `conv_quantized` (iOS15, experimental): `conv` with a uint8 weight dequantized as
/// `W = W_q · quant_scale + quant_bias` (`linear`; scale and bias scalars or one value per
/// output channel). The `lut` type is refused: coremltools 9 gives it no table input.
fn infer_conv_quantized(cx: &InferCx) -> Result<Vec<ValueType>> {
    let w = cx.t("weight")?;
    ensure!(
        w.dtype == crate::ir::DType::U8,
        "conv_quantized weight must be uint8, is {w}"
    );
    let qt = cx
        .opt_str("quantization_type")?
        .ok_or_else(|| anyhow!("conv_quantized needs `quantization_type`"))?;
    ensure!(
        qt == "linear",
        "conv_quantized quantization_type `{qt}`: only `linear` is defined (coremltools 9's \
         `lut` has no table input)"
    );
    let nbits = cx.int_or_default("nbits")?;
    ensure!(
        (1..=8).contains(&nbits),
        "conv_quantized nbits {nbits} must be 1..8"
    );
    // coremltools 9 types `bias` with the weight's type domain (uint8) and states nothing of
    // how a uint8 bias would apply: a float bias is refused as it refuses it, a uint8 one as
    // undefined.
    if let Some(b) = cx.opt_t("bias")? {
        bail!(
            "conv_quantized `bias` {b}: coremltools 9 requires the weight's dtype (uint8) and \
             defines no meaning for it; fold a bias into a following `add`"
        );
    }
    let cout = w.fixed_shape().map(|s| s[0]);
    for p in ["quant_scale", "quant_bias"] {
        let t = cx.t(p)?;
        let n = t.fixed_shape().map(|s| s.iter().product::<usize>());
        ensure!(
            n == Some(1) || n == cout,
            "conv_quantized `{p}` {t} must be a scalar or one value per output channel"
        );
    }
    // `conv`'s checks read the weight's shape only.
    infer_conv(cx)
}

fn eval_conv_quantized(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let wq = cx.t("weight")?;
    let dims = wq.dims().to_vec();
    let nbits = cx.int_or_default("nbits")?;
    let q = kernels::to_vec::<f32>(wq)?;
    let limit = (1u32 << nbits) as f32;
    ensure!(
        q.iter().all(|&v| v < limit),
        "conv_quantized `{}`: weight codes exceed {nbits} bits",
        cx.op_name
    );
    let per = |n: &str| -> Result<Vec<f32>> { kernels::to_vec::<f32>(cx.t(n)?) };
    let (scale, qbias) = (per("quant_scale")?, per("quant_bias")?);
    let inner: usize = dims[1..].iter().product();
    let pick = |v: &[f32], o: usize| if v.len() == 1 { v[0] } else { v[o] };
    let w: Vec<f32> = q
        .iter()
        .enumerate()
        .map(|(i, &c)| c * pick(&scale, i / inner) + pick(&qbias, i / inner))
        .collect();
    let w = kernels::from_vec(w, &dims)?;
    let nsp = x.rank().saturating_sub(2);
    let strides = usizes(cx.ints_or_default("strides", nsp)?, "stride")?;
    let dilations = usizes(cx.ints_or_default("dilations", nsp)?, "dilation")?;
    let custom = cx.ints_or_default("pad", 2 * nsp)?;
    let pads = conv_pads(
        cx.str_or_default("pad_type")?,
        &x.dims()[2..],
        &dims[2..],
        &strides,
        &dilations,
        &custom,
    )?;
    let p = kernels::ConvParams {
        strides,
        dilations,
        pads,
        groups: cx.int_or_default("groups")?.max(1) as usize,
    };
    let bias = cx.opt_f32("bias")?;
    out0(
        cx,
        kernels::conv(&kernels::to_f32(x)?, &w, bias.as_ref(), &p)?,
    )
}

fn eval_linear(cx: &EvalCx) -> Result<Vec<RValue>> {
    let y = match cx.packed("weight") {
        Some(p) => kernels::gemv::linear(cx.t("x")?, p)?,
        None => kernels::matmul(cx.t("x")?, &cx.f32("weight")?, false, true)?,
    };
    let y = match cx.opt_f32("bias")? {
        Some(b) => kernels::binary(&y, &b, kernels::BinOp::Add)?,
        None => y,
    };
    out0(cx, y)
}

fn eval_matmul(cx: &EvalCx) -> Result<Vec<RValue>> {
    let tx = cx.bool_or_default("transpose_x")?;
    let ty = cx.bool_or_default("transpose_y")?;
    out0(cx, kernels::matmul(&cx.f32("x")?, &cx.f32("y")?, tx, ty)?)
}

fn eval_einsum(cx: &EvalCx) -> Result<Vec<RValue>> {
    let eq = cx
        .opt_str("equation")?
        .ok_or_else(|| anyhow!("einsum needs `equation`"))?;
    let vals = cx.ts("values")?;
    out0(cx, kernels::einsum(eq, &vals)?)
}

pub(super) fn sorted_axes(cx: &EvalCx, name: &str, rank: usize) -> Result<Vec<usize>> {
    let mut a = match cx.opt_ints(name)? {
        Some(v) => v
            .into_iter()
            .map(|a| axis(a, rank))
            .collect::<Result<Vec<_>>>()?,
        None => (0..rank).collect(),
    };
    a.sort();
    a.dedup();
    Ok(a)
}

fn eval_layer_norm(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let axes = sorted_axes(cx, "axes", x.rank())?;
    let g = cx
        .opt_f32("gamma")?
        .map(|t| kernels::to_vec::<f32>(&t))
        .transpose()?;
    let b = cx
        .opt_f32("beta")?
        .map(|t| kernels::to_vec::<f32>(&t))
        .transpose()?;
    let eps = cx.f64_or_default("epsilon")? as f32;
    one(kernels::layer_norm(
        x,
        &axes,
        g.as_deref(),
        b.as_deref(),
        eps,
    )?)
}

fn eval_batch_norm(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let c = x.dims().get(1).copied().unwrap_or(0);
    let get = |n: &str, d: f32| -> Result<Vec<f32>> {
        Ok(match cx.opt_f32(n)? {
            Some(t) => kernels::to_vec::<f32>(&t)?,
            None => vec![d; c],
        })
    };
    let (mean, var, g, b) = (
        get("mean", 0.0)?,
        get("variance", 1.0)?,
        get("gamma", 1.0)?,
        get("beta", 0.0)?,
    );
    let eps = cx.f64_or_default("epsilon")? as f32;
    ensure!(
        [&mean, &var, &g, &b].iter().all(|v| v.len() == c),
        "batch_norm parameters must have {c} values"
    );
    let scale: Vec<f32> = (0..c).map(|i| g[i] / (var[i] + eps).sqrt()).collect();
    let shift: Vec<f32> = (0..c).map(|i| b[i] - mean[i] * scale[i]).collect();
    one(kernels::channel_affine(x, 1, &scale, &shift)?)
}

fn eval_softmax(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    one(kernels::softmax(
        x,
        axis(cx.int_or_default("axis")?, x.rank())?,
    )?)
}

/// The GELU form a `gelu` op's `mode` names (coremltools' three).
pub fn gelu_mode(mode: &str) -> Result<fastmath::Gelu> {
    Ok(match mode {
        "EXACT" => fastmath::Gelu::Exact,
        "TANH_APPROXIMATION" => fastmath::Gelu::Tanh,
        "SIGMOID_APPROXIMATION" => fastmath::Gelu::Sigmoid,
        m => bail!("unknown gelu mode `{m}`"),
    })
}

fn eval_gelu(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let g = gelu_mode(cx.str_or_default("mode")?)?;
    one(kernels::map_gelu(x, g)?)
}

// ---- cost: floating-point operations of one run (see `placement::Flops`)

/// 2 · outputs · (C_in / groups) · kernel area: the weight is `[C_out, C_in / groups, k…]`.
fn conv_flops(cx: &InferCx, out: u64) -> Option<u64> {
    let w = cx.t("weight").ok()?.fixed_shape()?;
    Some(2 * out * w.iter().skip(1).product::<usize>() as u64)
}

/// 2 · outputs · C_in: the weight is `[C_out, C_in]`.
fn linear_flops(cx: &InferCx, out: u64) -> Option<u64> {
    let w = cx.t("weight").ok()?.fixed_shape()?;
    Some(2 * out * *w.get(1)? as u64)
}

/// 2 · outputs · K, K the contracted axis of `x` (its last, or next to last when transposed).
fn matmul_flops(cx: &InferCx, out: u64) -> Option<u64> {
    let s = cx.t("x").ok()?.fixed_shape()?;
    let tx = cx.bool_or_default("transpose_x").ok()?;
    let k = match s.len() {
        1 => s[0],
        n if tx => *s.get(n.checked_sub(2)?)?,
        _ => *s.last()?,
    };
    Some(2 * out * k as u64)
}

/// 2 · the product of the sizes of every distinct subscript (one multiply-add per point of
/// the iteration space).
fn einsum_flops(cx: &InferCx, _out: u64) -> Option<u64> {
    let eq = cx.opt_str("equation").ok()??;
    let lhs = eq.split("->").next().unwrap_or("");
    let mut sizes: std::collections::BTreeMap<char, usize> = Default::default();
    for (term, arg) in lhs.split(',').zip(cx.all("values")) {
        let shape = arg.ty.as_tensor()?.fixed_shape()?;
        for (c, d) in term.chars().zip(shape) {
            let e = sizes.entry(c).or_insert(d);
            *e = (*e).max(d);
        }
    }
    Some(2 * sizes.values().map(|&d| d as u64).product::<u64>())
}

/// conv's weight `[C_out, C_in / groups, k…]`, read packed, on `x` `[N, C_in, …]`.
const CONV_WEIGHT: Weight = Weight {
    input: "weight",
    layout: WeightLayout::OutIn,
    x_channel_axis: Axis::At(1),
    out_channel_axis: Axis::At(1),
    packed: true,
};
/// linear's weight `[C_out, C_in]`, read packed, on `x` `[…, C_in]`.
const LINEAR_WEIGHT: Weight = Weight {
    input: "weight",
    layout: WeightLayout::OutIn,
    x_channel_axis: Axis::Last,
    out_channel_axis: Axis::Last,
    packed: true,
};
/// matmul's `y`, `[…, K, N]` (compression does not take it: its layout is no weight's).
const MATMUL_WEIGHT: Weight = Weight {
    input: "y",
    layout: WeightLayout::Operand,
    x_channel_axis: Axis::Last,
    out_channel_axis: Axis::Last,
    packed: false,
};

pub static DEFS: &[OpDef] = &[
    def(
        "conv",
        &[
            req("x"),
            req("weight"),
            opt("bias"),
            opt_c("strides").or(DefaultValue::Ints(1)),
            opt_c("pad_type").or(DefaultValue::Str("valid")),
            opt_c("pad").or(DefaultValue::Ints(0)),
            opt_c("dilations").or(DefaultValue::Ints(1)),
            opt_c("groups").or(DefaultValue::Int(1)),
        ],
        infer_conv,
        eval_conv,
    )
    .with_weight(CONV_WEIGHT)
    .with_f32_inputs(&["weight", "bias"])
    .fresh()
    .with_flops(Flops::Formula(conv_flops)),
    def(
        "conv_quantized",
        &[
            req("x"),
            req("weight"),
            opt_c("bias"),
            req_c("quantization_type"),
            opt_c("nbits").or(DefaultValue::Int(8)),
            req_c("quant_scale"),
            req_c("quant_bias"),
            opt_c("strides").or(DefaultValue::Ints(1)),
            opt_c("pad_type").or(DefaultValue::Str("valid")),
            opt_c("pad").or(DefaultValue::Ints(0)),
            opt_c("dilations").or(DefaultValue::Ints(1)),
            opt_c("groups").or(DefaultValue::Int(1)),
        ],
        infer_conv_quantized,
        eval_conv_quantized,
    ),
    def(
        "linear",
        &[req("x"), req("weight"), opt("bias")],
        infer_linear,
        eval_linear,
    )
    .with_weight(LINEAR_WEIGHT)
    .with_f32_inputs(&["weight", "bias"])
    .fresh()
    .with_flops(Flops::Formula(linear_flops)),
    def(
        "matmul",
        &[
            req("x"),
            req("y"),
            opt_c("transpose_x").or(DefaultValue::Bool(false)),
            opt_c("transpose_y").or(DefaultValue::Bool(false)),
        ],
        infer_matmul,
        eval_matmul,
    )
    .with_weight(MATMUL_WEIGHT)
    .with_f32_inputs(&["x", "y"])
    .fresh()
    .with_flops(Flops::Formula(matmul_flops)),
    def(
        "einsum",
        &[super::var("values"), req_c("equation")],
        infer_einsum,
        eval_einsum,
    )
    .with_flops(Flops::Formula(einsum_flops)),
    def(
        "layer_norm",
        &[
            req("x"),
            opt_c("axes"),
            opt("gamma"),
            opt("beta"),
            opt_c("epsilon").or(DefaultValue::Float(1e-5)),
        ],
        infer_layer_norm,
        eval_layer_norm,
    )
    .with_flops(Flops::PerOutput(8)),
    def(
        "batch_norm",
        &[
            req("x"),
            req("mean"),
            req("variance"),
            opt("gamma"),
            opt("beta"),
            opt_c("epsilon").or(DefaultValue::Float(1e-5)),
        ],
        infer_batch_norm,
        eval_batch_norm,
    )
    .with_flops(Flops::PerOutput(8)),
    def(
        "softmax",
        &[req("x"), opt_c("axis").or(DefaultValue::Int(-1))],
        infer_softmax,
        eval_softmax,
    )
    .with_flops(Flops::PerOutput(5)),
    def(
        "gelu",
        &[req("x"), opt_c("mode").or(DefaultValue::Str("EXACT"))],
        infer_gelu,
        eval_gelu,
    )
    .with_flops(Flops::PerOutput(8)),
];
