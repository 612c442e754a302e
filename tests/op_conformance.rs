//! Op conformance: one table ([`cases`]) of op × opset × compute dtype, each case a small
//! program built with `ops::Builder`, saved as an `.mlpackage`, loaded back and run by the
//! runtime, compared with float64 reference maths written here (never milkit's kernels):
//! fp32 outputs allclose (rtol 1e-4, atol 1e-5 × the case's scale, e.g. the number of
//! terms of a reduction), fp16 outputs PSNR ≥ 40 dB, exact equality for indexing, data
//! movement, comparisons and integer outputs. [`COREML_OPS`] is coremltools 9's public
//! iOS15–iOS18 op list (the opsets each defines a version in); a test keeps it, milkit's
//! op definitions, the table and [`MISSING`] consistent, and prints the count per opset.
//! An op milkit lacks fails to load with an error naming the op and the opset.

mod runtime_common;

use anyhow::{ensure, Context, Result};
use half::f16;
use milkit::ir::{
    ArrayDType, Block, DType, Description, Feature, Function, Model, Opset, Program,
    Tensor as ITensor, TensorType, Value, ValueType,
};
use milkit::ops::{Builder, In, V};
use milkit::runtime::{Session, Tensor};
use runtime_common::Lcg;
use std::collections::BTreeSet;

use DType::{Bool, F16, F32, I32};
use Opset::{Ios15 as I15, Ios16 as I16, Ios17 as I17, Ios18 as I18};

// ---------------------------------------------------------------------------------------
// The op list.

/// coremltools 9's public ops of `mil/ops/defs/iOS15..iOS18` (base classes left out), with
/// the opsets in which a version of the op is defined.
const COREML_OPS: &[(&str, &[Opset])] = &[
    ("abs", &[I15]),
    ("acos", &[I15]),
    ("add", &[I15]),
    ("affine", &[I15]),
    ("argsort", &[I15]),
    ("asin", &[I15]),
    ("atan", &[I15]),
    ("atanh", &[I15]),
    ("avg_pool", &[I15]),
    ("band_part", &[I15]),
    ("batch_norm", &[I15, I17]),
    ("batch_to_space", &[I15]),
    ("cast", &[I15, I17]),
    ("ceil", &[I15]),
    ("clamped_relu", &[I15, I17]),
    ("classify", &[I15]),
    ("clip", &[I15, I17]),
    ("concat", &[I15]),
    ("cond", &[I15]),
    ("const", &[I15]),
    ("constexpr_affine_dequantize", &[I16]),
    ("constexpr_blockwise_shift_scale", &[I18]),
    ("constexpr_cast", &[I16, I18]),
    ("constexpr_lut_to_dense", &[I16, I18]),
    ("constexpr_lut_to_sparse", &[I18]),
    ("constexpr_sparse_blockwise_shift_scale", &[I18]),
    ("constexpr_sparse_to_dense", &[I16, I18]),
    ("conv", &[I15, I17]),
    ("conv_quantized", &[I15]),
    ("conv_transpose", &[I15, I17]),
    ("cos", &[I15]),
    ("cosh", &[I15]),
    ("crop", &[I15]),
    ("crop_resize", &[I15, I16, I17]),
    ("cumsum", &[I15]),
    ("depth_to_space", &[I15]),
    ("dequantize", &[I17]),
    ("einsum", &[I15]),
    ("elu", &[I15, I17]),
    ("equal", &[I15]),
    ("erf", &[I15]),
    ("exp", &[I15]),
    ("exp2", &[I15]),
    ("expand_dims", &[I15, I17]),
    ("fill", &[I15]),
    ("fill_like", &[I16]),
    ("flatten2d", &[I15]),
    ("floor", &[I15]),
    ("floor_div", &[I15]),
    ("gather", &[I15, I16, I17]),
    ("gather_along_axis", &[I15, I16, I17]),
    ("gather_nd", &[I15, I16, I17]),
    ("gelu", &[I15]),
    ("greater", &[I15]),
    ("greater_equal", &[I15]),
    ("gru", &[I15, I17, I18]),
    ("identity", &[I15]),
    ("instance_norm", &[I15, I17]),
    ("inverse", &[I15, I17]),
    ("l2_norm", &[I15, I17]),
    ("l2_pool", &[I15]),
    ("layer_norm", &[I15, I17]),
    ("leaky_relu", &[I15, I17]),
    ("less", &[I15]),
    ("less_equal", &[I15]),
    ("linear", &[I15, I17]),
    ("linear_activation", &[I15, I17]),
    ("list_gather", &[I15]),
    ("list_length", &[I15]),
    ("list_read", &[I15]),
    ("list_scatter", &[I15]),
    ("list_write", &[I15]),
    ("local_response_norm", &[I15, I17]),
    ("log", &[I15, I17]),
    ("logical_and", &[I15]),
    ("logical_not", &[I15]),
    ("logical_or", &[I15]),
    ("logical_xor", &[I15]),
    ("lstm", &[I15, I17]),
    ("make_list", &[I15]),
    ("matmul", &[I15, I17]),
    ("max_pool", &[I15]),
    ("maximum", &[I15]),
    ("minimum", &[I15]),
    ("mod", &[I15]),
    ("mul", &[I15]),
    ("non_maximum_suppression", &[I15, I17]),
    ("non_zero", &[I15]),
    ("not_equal", &[I15]),
    ("one_hot", &[I15]),
    ("pad", &[I15]),
    ("pixel_shuffle", &[I15]),
    ("pixel_unshuffle", &[I16]),
    ("pow", &[I15]),
    ("prelu", &[I15, I17]),
    ("quantize", &[I17]),
    ("random_bernoulli", &[I15]),
    ("random_categorical", &[I15]),
    ("random_normal", &[I15]),
    ("random_uniform", &[I15]),
    ("range_1d", &[I15]),
    ("read_state", &[I18]),
    ("real_div", &[I15]),
    ("reduce_argmax", &[I15, I17]),
    ("reduce_argmin", &[I15, I17]),
    ("reduce_l1_norm", &[I15]),
    ("reduce_l2_norm", &[I15]),
    ("reduce_log_sum", &[I15]),
    ("reduce_log_sum_exp", &[I15]),
    ("reduce_max", &[I15]),
    ("reduce_mean", &[I15]),
    ("reduce_min", &[I15]),
    ("reduce_prod", &[I15]),
    ("reduce_sum", &[I15]),
    ("reduce_sum_square", &[I15]),
    ("relu", &[I15]),
    ("relu6", &[I15]),
    ("resample", &[I15, I16, I17]),
    ("reshape", &[I15, I17]),
    ("reshape_like", &[I16, I17]),
    ("resize", &[I17]),
    ("resize_bilinear", &[I15]),
    ("resize_nearest_neighbor", &[I15]),
    ("reverse", &[I15, I17]),
    ("reverse_sequence", &[I15, I17]),
    ("rnn", &[I15, I17]),
    ("round", &[I15]),
    ("rsqrt", &[I15, I17]),
    ("scaled_dot_product_attention", &[I18]),
    ("scaled_tanh", &[I15, I17]),
    ("scatter", &[I15, I17]),
    ("scatter_along_axis", &[I15, I17]),
    ("scatter_nd", &[I15, I17]),
    ("select", &[I15]),
    ("shape", &[I15]),
    ("sigmoid", &[I15]),
    ("sigmoid_hard", &[I15, I17]),
    ("sign", &[I15]),
    ("silu", &[I15]),
    ("sin", &[I15]),
    ("sinh", &[I15]),
    ("slice_by_index", &[I15, I17]),
    ("slice_by_size", &[I15, I17]),
    ("slice_update", &[I18]),
    ("sliding_windows", &[I15, I17]),
    ("softmax", &[I15]),
    ("softplus", &[I15]),
    ("softplus_parametric", &[I15, I17]),
    ("softsign", &[I15]),
    ("space_to_batch", &[I15]),
    ("space_to_depth", &[I15]),
    ("split", &[I15]),
    ("sqrt", &[I15]),
    ("square", &[I15]),
    ("squeeze", &[I15, I17]),
    ("stack", &[I15]),
    ("sub", &[I15]),
    ("tan", &[I15]),
    ("tanh", &[I15]),
    ("threshold", &[I15]),
    ("thresholded_relu", &[I15, I17]),
    ("tile", &[I15]),
    ("topk", &[I15, I16, I17]),
    ("transpose", &[I15, I17]),
    ("upsample_bilinear", &[I15, I16]),
    ("upsample_nearest_neighbor", &[I15]),
    ("while_loop", &[I15]),
];

/// Ops of [`COREML_OPS`] the interpreter does not run yet, and why.
const MISSING: &[(&str, &str)] = &[
    ("affine", "image resampling family not implemented yet"),
    ("classify", "classifier output (dictionary) not supported"),
    ("conv_quantized", "not implemented yet"),
    ("conv_transpose", "not implemented yet"),
    ("crop", "image resampling family not implemented yet"),
    ("crop_resize", "image resampling family not implemented yet"),
    ("gru", "recurrent ops not implemented yet"),
    ("lstm", "recurrent ops not implemented yet"),
    ("non_maximum_suppression", "not implemented yet"),
    ("resample", "image resampling family not implemented yet"),
    ("resize", "resize family not implemented yet"),
    ("resize_bilinear", "resize family not implemented yet"),
    (
        "resize_nearest_neighbor",
        "resize family not implemented yet",
    ),
    ("rnn", "recurrent ops not implemented yet"),
    ("upsample_bilinear", "resize family not implemented yet"),
    (
        "upsample_nearest_neighbor",
        "resize family not implemented yet",
    ),
];

// ---------------------------------------------------------------------------------------
// The harness.

/// How an output is compared with its reference.
#[derive(Clone, Copy, Debug)]
enum Cmp {
    /// fp32: |got − want| ≤ 1e-5·scale + 1e-4·|want|; fp16: PSNR ≥ 40 dB.
    Float(f64),
    /// Bit-for-bit (as f64; NaN equals NaN).
    Exact,
}
const CLOSE: Cmp = Cmp::Float(1.0);

/// A program under construction, its inputs and its expected outputs.
struct Prog {
    b: Builder,
    /// The compute dtype of the case (float inputs and constants are of it).
    dt: DType,
    rng: Lcg,
    feeds: Vec<(String, Tensor)>,
    states: Vec<(String, Tensor)>,
    outs: Vec<(V, Vec<usize>, Vec<f64>, Cmp)>,
}

fn cpu() -> candle_core::Device {
    candle_core::Device::Cpu
}

impl Prog {
    fn new(opset: Opset, dt: DType, seed: u64) -> Prog {
        Prog {
            b: Builder::new(opset),
            dt,
            rng: Lcg(seed),
            feeds: vec![],
            states: vec![],
            outs: vec![],
        }
    }

    /// `v` rounded to the case's float dtype.
    fn r(&self, v: f64) -> f64 {
        round_to(v, self.dt)
    }

    /// Random values in [lo, hi), rounded to the compute dtype.
    fn rand(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f64> {
        (0..n)
            .map(|_| {
                let u = (self.rng.next() as f64 + 1.0) / 2.0;
                self.r(lo + (hi - lo) * u)
            })
            .collect()
    }

    /// A function input of `dtype` fed with `vals`. Core ML inputs are fp16 / fp32 / int32
    /// arrays: a bool or uint8 value is an int32 input cast in the program.
    fn input_of(&mut self, name: &str, dtype: DType, shape: &[usize], vals: &[f64]) -> V {
        if matches!(dtype, Bool | DType::U8) {
            let i = self.input_of(name, I32, shape, vals);
            let to = if dtype == Bool { "bool" } else { "uint8" };
            return self
                .b
                .op1("cast", "cast", vec![("x", In::V(i)), ("dtype", cstr(to))])
                .unwrap();
        }
        let v = self.b.input(name, ValueType::tensor(dtype, shape));
        let t = match dtype {
            F16 | F32 => Tensor::from_vec(
                vals.iter().map(|&x| x as f32).collect::<Vec<_>>(),
                shape,
                &cpu(),
            ),
            Bool => Tensor::from_vec(
                vals.iter().map(|&x| (x != 0.0) as u8).collect::<Vec<_>>(),
                shape,
                &cpu(),
            ),
            _ => Tensor::from_vec(
                vals.iter().map(|&x| x as i32).collect::<Vec<_>>(),
                shape,
                &cpu(),
            ),
        }
        .unwrap();
        self.feeds.push((v.0.clone(), t));
        v
    }

    /// A float input of the compute dtype with random values in [lo, hi).
    fn x(&mut self, name: &str, shape: &[usize], lo: f64, hi: f64) -> (V, Vec<f64>) {
        let vals = self.rand(shape.iter().product(), lo, hi);
        let dt = self.dt;
        (self.input_of(name, dt, shape, &vals), vals)
    }

    /// A float input in [-1, 1).
    fn xs(&mut self, name: &str, shape: &[usize]) -> (V, Vec<f64>) {
        self.x(name, shape, -1.0, 1.0)
    }

    /// A float constant of the compute dtype (values rounded to it).
    fn cf(&self, shape: &[usize], vals: &[f64]) -> In {
        In::C(self.fval(shape, vals))
    }
    fn fval(&self, shape: &[usize], vals: &[f64]) -> Value {
        Value::Tensor(match self.dt {
            F16 => ITensor::f16(
                shape,
                &vals.iter().map(|&v| f16::from_f64(v)).collect::<Vec<_>>(),
            ),
            _ => ITensor::f32(shape, &vals.iter().map(|&v| v as f32).collect::<Vec<_>>()),
        })
    }
    /// A float scalar constant of the compute dtype.
    fn cs(&self, v: f64) -> In {
        self.cf(&[], &[v])
    }

    fn op(&mut self, op: &str, inputs: Vec<(&str, In)>) -> Result<V> {
        self.b.op1(op, op, inputs)
    }
    fn ops(&mut self, op: &str, inputs: Vec<(&str, In)>) -> Result<Vec<V>> {
        self.b.op(op, op, inputs)
    }

    /// Expects `v` to hold `want` (shape `shape`).
    fn want(&mut self, v: &V, shape: &[usize], want: Vec<f64>, cmp: Cmp) -> Result<()> {
        ensure!(
            want.len() == shape.iter().product::<usize>(),
            "reference of {} values for shape {shape:?}",
            want.len()
        );
        // Through an identity, so one value can be several outputs (or feed other ops).
        let o = self.b.op1("identity", "out", vec![("x", v.into())])?;
        self.outs.push((o, shape.to_vec(), want, cmp));
        Ok(())
    }
}

fn round_to(v: f64, dt: DType) -> f64 {
    match dt {
        F16 => f16::from_f64(v).to_f64(),
        F32 => v as f32 as f64,
        _ => v,
    }
}

fn ci(v: &[i32]) -> In {
    In::C(Value::i32s(v))
}
fn ci0(v: i32) -> In {
    In::C(Value::i32_scalar(v))
}
fn cb(v: bool) -> In {
    In::C(Value::bool_scalar(v))
}
fn cstr(s: &str) -> In {
    In::C(Value::str(s))
}
fn cbools(shape: &[usize], v: &[bool]) -> In {
    In::C(Value::Tensor(ITensor::bools(shape, v)))
}

/// Builds, saves, loads and runs one case; checks every expected output.
fn run_case(case: &Case, opset: Opset, dt: DType, seed: u64) -> Result<()> {
    let mut p = Prog::new(opset, dt, seed);
    (case.f)(&mut p).context("building")?;
    let Prog {
        b,
        feeds,
        states,
        outs,
        ..
    } = p;
    let names: Vec<String> = (0..outs.len()).map(|i| format!("y{i}")).collect();
    let out_types: Vec<TensorType> = outs
        .iter()
        .map(|(v, ..)| {
            b.ty(v)
                .ok()
                .and_then(|t| t.as_tensor().cloned())
                .ok_or_else(|| anyhow::anyhow!("output {} is not a tensor", v.0))
        })
        .collect::<Result<_>>()?;
    let pairs: Vec<(V, &str)> = outs
        .iter()
        .zip(&names)
        .map(|((v, ..), n)| (v.clone(), n.as_str()))
        .collect();
    let (inputs, block) = b.finish(&pairs)?;
    // The description is the ABI: each input, state and output with its array type.
    let array = |t: &TensorType| match t.dtype {
        F16 => ArrayDType::F16,
        F32 => ArrayDType::F32,
        _ => ArrayDType::I32,
    };
    let feature =
        |n: &str, t: &TensorType| Feature::new(n, array(t), &t.fixed_shape().unwrap_or_default());
    let mut desc = Description::default();
    for i in &inputs {
        match &i.ty {
            ValueType::State(t) => desc.states.push(feature(&i.name, t)),
            ValueType::Tensor(t) => desc.inputs.push(feature(&i.name, t)),
            other => anyhow::bail!("input {} of type {other}", i.name),
        }
    }
    for ((_, shape, ..), (n, ty)) in outs.iter().zip(names.iter().zip(&out_types)) {
        let mut f = feature(n, ty);
        f.shape = shape.clone();
        desc.outputs.push(f);
    }
    let mut program = Program::default();
    program.functions.insert(
        "main".into(),
        Function {
            inputs,
            opset,
            block,
        },
    );
    let m = Model {
        spec_version: opset.spec_version(),
        description: desc,
        program,
    };
    let dir = tempfile::tempdir()?;
    let pkg = dir.path().join("case.mlpackage");
    milkit::package::save_package(&m, &pkg, false, &mut |_| {}).context("saving")?;
    let mut s = Session::load(&pkg).context("loading")?;
    for (n, t) in states {
        s.set_state(&n, t)?;
    }
    let feeds: Vec<(&str, Tensor)> = feeds.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    let got = s.predict(&feeds).context("running")?;
    ensure!(got.len() == outs.len(), "{} outputs", got.len());
    for ((name, t), (_, shape, want, cmp)) in got.iter().zip(&outs) {
        compare(t, shape, want, *cmp).with_context(|| format!("output {name}"))?;
    }
    Ok(())
}

fn values(t: &Tensor) -> Result<Vec<f64>> {
    Ok(t.to_dtype(candle_core::DType::F64)?
        .flatten_all()?
        .to_vec1::<f64>()?)
}

fn compare(t: &Tensor, shape: &[usize], want: &[f64], cmp: Cmp) -> Result<()> {
    ensure!(
        t.dims() == shape,
        "shape {:?}, expected {shape:?}",
        t.dims()
    );
    let got = values(t)?;
    match cmp {
        Cmp::Exact => {
            for (i, (g, w)) in got.iter().zip(want).enumerate() {
                ensure!(
                    g == w || (g.is_nan() && w.is_nan()),
                    "[{i}]: got {g}, want {w} (exact)"
                );
            }
        }
        Cmp::Float(scale) if t.dtype() == candle_core::DType::F16 => {
            let finite: Vec<(f64, f64)> = got
                .iter()
                .zip(want)
                .filter(|(g, w)| !(g.is_infinite() && g == w || g.is_nan() && w.is_nan()))
                .map(|(g, w)| (*g, *w))
                .collect();
            let peak = finite.iter().fold(0f64, |m, (_, w)| m.max(w.abs()));
            let mse = finite.iter().map(|(g, w)| (g - w).powi(2)).sum::<f64>()
                / finite.len().max(1) as f64;
            if mse > 0.0 {
                let psnr = 20.0 * (peak.max(1e-3) / mse.sqrt()).log10();
                ensure!(
                    psnr >= 40.0,
                    "PSNR {psnr:.1} dB < 40 (peak {peak}, got {:?}, want {:?})",
                    &got[..got.len().min(8)],
                    &want[..want.len().min(8)]
                );
            }
            let _ = scale;
        }
        Cmp::Float(scale) => {
            for (i, (g, w)) in got.iter().zip(want).enumerate() {
                let ok = (g - w).abs() <= 1e-5 * scale + 1e-4 * w.abs()
                    || (g.is_nan() && w.is_nan())
                    || (g.is_infinite() && g == w);
                ensure!(ok, "[{i}]: got {g}, want {w}");
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Reference helpers (row-major f64 tensors).

fn numel(s: &[usize]) -> usize {
    s.iter().product()
}
fn strides(s: &[usize]) -> Vec<usize> {
    let mut st = vec![1; s.len()];
    for i in (0..s.len().saturating_sub(1)).rev() {
        st[i] = st[i + 1] * s[i + 1];
    }
    st
}
fn unravel(s: &[usize], mut i: usize) -> Vec<usize> {
    let mut c = vec![0; s.len()];
    for d in (0..s.len()).rev() {
        c[d] = i % s[d];
        i /= s[d];
    }
    c
}
fn ravel(s: &[usize], c: &[usize]) -> usize {
    c.iter().zip(strides(s)).map(|(a, b)| a * b).sum()
}
/// Numpy broadcast of `a` (shape `sa`) and `b` with `f`.
fn bcast(
    a: &[f64],
    sa: &[usize],
    b: &[f64],
    sb: &[usize],
    f: impl Fn(f64, f64) -> f64,
) -> (Vec<f64>, Vec<usize>) {
    let n = sa.len().max(sb.len());
    let pad = |s: &[usize]| {
        let mut p = vec![1; n - s.len()];
        p.extend_from_slice(s);
        p
    };
    let (pa, pb) = (pad(sa), pad(sb));
    let so: Vec<usize> = (0..n).map(|i| pa[i].max(pb[i])).collect();
    let out = (0..numel(&so))
        .map(|i| {
            let c = unravel(&so, i);
            let ca: Vec<usize> = c
                .iter()
                .zip(&pa)
                .map(|(x, d)| if *d == 1 { 0 } else { *x })
                .collect();
            let cb: Vec<usize> = c
                .iter()
                .zip(&pb)
                .map(|(x, d)| if *d == 1 { 0 } else { *x })
                .collect();
            f(a[ravel(&pa, &ca)], b[ravel(&pb, &cb)])
        })
        .collect();
    (out, so)
}
/// Reduces `axes` of `x` with `f` over each lane's values.
fn reduce_ref(
    x: &[f64],
    s: &[usize],
    axes: &[usize],
    keep: bool,
    f: &dyn Fn(&[f64]) -> f64,
) -> (Vec<f64>, Vec<usize>) {
    let kept: Vec<usize> = s
        .iter()
        .enumerate()
        .map(|(i, &d)| if axes.contains(&i) { 1 } else { d })
        .collect();
    let mut lanes = vec![vec![]; numel(&kept)];
    for (i, &v) in x.iter().enumerate() {
        let mut c = unravel(s, i);
        for &a in axes {
            c[a] = 0;
        }
        lanes[ravel(&kept, &c)].push(v);
    }
    let out = lanes.iter().map(|l| f(l)).collect();
    let shape = if keep {
        kept
    } else {
        s.iter()
            .enumerate()
            .filter(|(i, _)| !axes.contains(i))
            .map(|(_, &d)| d)
            .collect()
    };
    (out, shape)
}
/// `x` permuted by `perm`.
fn permute(x: &[f64], s: &[usize], perm: &[usize]) -> (Vec<f64>, Vec<usize>) {
    let so: Vec<usize> = perm.iter().map(|&p| s[p]).collect();
    let out = (0..numel(&so))
        .map(|i| {
            let c = unravel(&so, i);
            let mut ci = vec![0; s.len()];
            for (k, &p) in perm.iter().enumerate() {
                ci[p] = c[k];
            }
            x[ravel(s, &ci)]
        })
        .collect();
    (out, so)
}
fn erf(x: f64) -> f64 {
    // Abramowitz–Stegun 7.1.26 is too coarse; a series / continued fraction to 1e-15.
    if x.abs() < 3.0 {
        let mut sum = x;
        let mut term = x;
        for n in 1..200 {
            term *= -x * x / n as f64;
            let add = term / (2 * n + 1) as f64;
            sum += add;
            if add.abs() < 1e-17 {
                break;
            }
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        x.signum() * (1.0 - erfc_large(x.abs()))
    }
}
fn erfc_large(x: f64) -> f64 {
    // Continued fraction for erfc at x ≥ 3.
    let mut f = 0.0;
    for k in (1..60).rev() {
        f = k as f64 / 2.0 / (x + f);
    }
    (-x * x).exp() / std::f64::consts::PI.sqrt() / (x + f)
}
fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}
fn softmax_rows(x: &[f64], n: usize) -> Vec<f64> {
    x.chunks(n)
        .flat_map(|r| {
            let m = r.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = r.iter().map(|v| (v - m).exp()).collect();
            let z: f64 = e.iter().sum();
            e.into_iter().map(move |v| v / z)
        })
        .collect()
}
/// [.., m, k] · [.., k, n] with equal batch.
fn bmm(a: &[f64], b: &[f64], nb: usize, m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut out = vec![0.0; nb * m * n];
    for z in 0..nb {
        for i in 0..m {
            for j in 0..n {
                out[(z * m + i) * n + j] = (0..k)
                    .map(|t| a[(z * m + i) * k + t] * b[(z * k + t) * n + j])
                    .sum();
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// The table.

type Build = Box<dyn Fn(&mut Prog) -> Result<()>>;
/// A scalar reference function.
type Ref1 = fn(f64) -> f64;

/// One row: an op run at each of `opsets` for each compute dtype of `dts`.
struct Case {
    op: String,
    what: String,
    opsets: Vec<Opset>,
    dts: Vec<DType>,
    f: Build,
}

const FP: &[DType] = &[F32, F16];

fn case(
    op: &str,
    what: &str,
    opsets: &[Opset],
    dts: &[DType],
    f: impl Fn(&mut Prog) -> Result<()> + 'static,
) -> Case {
    Case {
        op: op.into(),
        what: what.into(),
        opsets: opsets.to_vec(),
        dts: dts.to_vec(),
        f: Box::new(f),
    }
}

/// Every version of `op` coremltools defines (its opsets in [`COREML_OPS`]).
fn versions(op: &str) -> Vec<Opset> {
    COREML_OPS
        .iter()
        .find(|(n, _)| *n == op)
        .map(|(_, v)| v.to_vec())
        .unwrap_or(vec![I15])
}

/// An elementwise float map on random data in [lo, hi).
fn unary(op: &'static str, lo: f64, hi: f64, f: fn(f64) -> f64) -> Case {
    unary_with(op, lo, hi, vec![], f)
}

fn unary_with(
    op: &'static str,
    lo: f64,
    hi: f64,
    params: Vec<(&'static str, f64)>,
    f: fn(f64) -> f64,
) -> Case {
    case(op, "elementwise", &versions(op), FP, move |p| {
        let s = [2, 3, 5];
        let (x, xv) = p.x("x", &s, lo, hi);
        let mut ins = vec![("x", In::V(x))];
        for (n, v) in &params {
            ins.push((*n, p.cs(*v)));
        }
        let y = p.op(op, ins)?;
        p.want(&y, &s, xv.iter().map(|&v| f(v)).collect(), CLOSE)
    })
}

/// Two-parameter activations: f(x, alpha, beta).
fn act2(op: &'static str, a: f64, b: f64, f: fn(f64, f64, f64) -> f64) -> Case {
    case(op, "alpha, beta", &versions(op), FP, move |p| {
        let s = [2, 3, 4];
        let (x, xv) = p.x("x", &s, -3.0, 3.0);
        let (ra, rb) = (p.r(a), p.r(b));
        let ins = vec![("x", In::V(x)), ("alpha", p.cs(a)), ("beta", p.cs(b))];
        let y = p.op(op, ins)?;
        p.want(&y, &s, xv.iter().map(|&v| f(v, ra, rb)).collect(), CLOSE)
    })
}

fn act1(op: &'static str, a: f64, f: fn(f64, f64) -> f64) -> Case {
    case(op, "alpha", &versions(op), FP, move |p| {
        let s = [2, 3, 4];
        let (x, xv) = p.x("x", &s, -3.0, 3.0);
        let ra = p.r(a);
        let ins = vec![("x", In::V(x)), ("alpha", p.cs(a))];
        let y = p.op(op, ins)?;
        p.want(&y, &s, xv.iter().map(|&v| f(v, ra)).collect(), CLOSE)
    })
}

/// A broadcasting binary float op: [2, 3, 4] ∘ [3, 1].
fn binary(op: &'static str, xr: (f64, f64), yr: (f64, f64), f: fn(f64, f64) -> f64) -> Case {
    case(op, "broadcast [2,3,4] · [3,1]", &[I15], FP, move |p| {
        let (x, xv) = p.x("x", &[2, 3, 4], xr.0, xr.1);
        let (y, yv) = p.x("y", &[3, 1], yr.0, yr.1);
        let z = p.op(op, vec![("x", In::V(x)), ("y", In::V(y))])?;
        let (w, s) = bcast(&xv, &[2, 3, 4], &yv, &[3, 1], f);
        p.want(&z, &s, w, CLOSE)
    })
}

/// The same op on int32 data (exact).
fn binary_int(op: &'static str, f: fn(f64, f64) -> f64, nonzero_y: bool) -> Case {
    case(op, "int32", &[I15], &[I32], move |p| {
        let xv: Vec<f64> = (0..12).map(|i| ((i * 7) % 11) as f64 - 5.0).collect();
        let yv: Vec<f64> = (0..4)
            .map(|i| {
                let v = (i * 3 % 7) as f64 - 3.0;
                if nonzero_y && v == 0.0 {
                    2.0
                } else {
                    v
                }
            })
            .collect();
        let x = p.input_of("x", I32, &[3, 4], &xv);
        let y = p.input_of("y", I32, &[4], &yv);
        let z = p.op(op, vec![("x", In::V(x)), ("y", In::V(y))])?;
        let (w, s) = bcast(&xv, &[3, 4], &yv, &[4], f);
        p.want(&z, &s, w, Cmp::Exact)
    })
}

/// A comparison on values with ties (exact bool output).
fn compare_op(op: &'static str, f: fn(f64, f64) -> bool) -> Case {
    case(op, "ties, broadcast", &[I15], FP, move |p| {
        let xv: Vec<f64> = (0..12).map(|i| ((i % 5) as f64 - 2.0) / 2.0).collect();
        let yv: Vec<f64> = vec![-0.5, 0.0, 0.5, 1.0];
        let dt = p.dt;
        let x = p.input_of("x", dt, &[3, 4], &xv);
        let y = p.input_of("y", dt, &[4], &yv);
        let z = p.op(op, vec![("x", In::V(x)), ("y", In::V(y))])?;
        let (w, s) = bcast(&xv, &[3, 4], &yv, &[4], |a, b| f(a, b) as u8 as f64);
        p.want(&z, &s, w, Cmp::Exact)
    })
}

fn logical(op: &'static str, f: fn(bool, bool) -> bool) -> Case {
    case(op, "bool", &[I15], &[Bool], move |p| {
        let xv = vec![0.0, 1.0, 0.0, 1.0];
        let yv = vec![0.0, 0.0, 1.0, 1.0];
        let x = p.input_of("x", Bool, &[4], &xv);
        let y = p.input_of("y", Bool, &[4], &yv);
        let z = p.op(op, vec![("x", In::V(x)), ("y", In::V(y))])?;
        let w = xv
            .iter()
            .zip(&yv)
            .map(|(a, b)| f(*a != 0.0, *b != 0.0) as u8 as f64)
            .collect();
        p.want(&z, &[4], w, Cmp::Exact)
    })
}

/// A reduction over axis 1 (dropped) and over axes 0 and 2 (kept).
fn reduction(op: &'static str, lo: f64, hi: f64, f: fn(&[f64]) -> f64) -> Case {
    case(op, "axes [1] and [0, 2] keep_dims", &[I15], FP, move |p| {
        let s = [3, 4, 5];
        let (x, xv) = p.x("x", &s, lo, hi);
        let y1 = p.op(
            op,
            vec![
                ("x", In::V(x.clone())),
                ("axes", ci(&[1])),
                ("keep_dims", cb(false)),
            ],
        )?;
        let y2 = p.op(
            op,
            vec![
                ("x", In::V(x)),
                ("axes", ci(&[0, -1])),
                ("keep_dims", cb(true)),
            ],
        )?;
        let (w1, s1) = reduce_ref(&xv, &s, &[1], false, &f);
        let (w2, s2) = reduce_ref(&xv, &s, &[0, 2], true, &f);
        // Tolerances scale with the number of terms reduced.
        p.want(&y1, &s1, w1, Cmp::Float(4.0))?;
        p.want(&y2, &s2, w2, Cmp::Float(15.0))
    })
}

fn arg_reduction(op: &'static str, max: bool) -> Case {
    case(op, "axis 1, keep_dims", &versions(op), FP, move |p| {
        let s = [3, 4, 5];
        let (x, xv) = p.xs("x", &s);
        let y = p.op(
            op,
            vec![("x", In::V(x)), ("axis", ci0(1)), ("keep_dims", cb(true))],
        )?;
        // Index of the first extreme along axis 1.
        let mut w = vec![];
        for a in 0..3 {
            for c in 0..5 {
                let lane: Vec<f64> = (0..4).map(|b| xv[a * 20 + b * 5 + c]).collect();
                let mut best = 0;
                for (i, &v) in lane.iter().enumerate() {
                    if (max && v > lane[best]) || (!max && v < lane[best]) {
                        best = i;
                    }
                }
                w.push(best as f64);
            }
        }
        p.want(&y, &[3, 1, 5], w, Cmp::Exact)
    })
}

fn cases() -> Vec<Case> {
    let mut v = vec![
        // ---- elementwise unary ----
        unary("abs", -2.0, 2.0, f64::abs),
        unary("sign", -2.0, 2.0, |x| {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                0.0
            }
        }),
        unary("square", -2.0, 2.0, |x| x * x),
        unary("sqrt", 0.1, 4.0, f64::sqrt),
        unary("rsqrt", 0.1, 4.0, |x| 1.0 / (x + 1e-12).sqrt()),
        unary("inverse", 0.5, 2.0, |x| 1.0 / (x + 1e-4)),
        unary("exp", -3.0, 3.0, f64::exp),
        unary("exp2", -3.0, 3.0, f64::exp2),
        unary("log", 0.1, 4.0, |x| (x + 1e-45).ln()),
        unary("tanh", -3.0, 3.0, f64::tanh),
        unary("sin", -3.0, 3.0, f64::sin),
        unary("cos", -3.0, 3.0, f64::cos),
        unary("tan", -1.2, 1.2, f64::tan),
        unary("asin", -0.95, 0.95, f64::asin),
        unary("acos", -0.95, 0.95, f64::acos),
        unary("atan", -3.0, 3.0, f64::atan),
        unary("atanh", -0.9, 0.9, f64::atanh),
        unary("sinh", -3.0, 3.0, f64::sinh),
        unary("cosh", -3.0, 3.0, f64::cosh),
        unary("erf", -3.0, 3.0, erf),
        unary("floor", -3.0, 3.0, f64::floor),
        unary("ceil", -3.0, 3.0, f64::ceil),
        unary("round", -3.0, 3.0, f64::round_ties_even),
        unary("relu", -2.0, 2.0, |x| x.max(0.0)),
        unary("relu6", -8.0, 8.0, |x| x.clamp(0.0, 6.0)),
        unary("sigmoid", -5.0, 5.0, sigmoid),
        unary("silu", -5.0, 5.0, |x| x * sigmoid(x)),
        unary("softsign", -5.0, 5.0, |x| x / (1.0 + x.abs())),
        unary("softplus", -5.0, 5.0, |x| (1.0 + x.exp()).ln()),
        unary_with(
            "clip",
            -2.0,
            2.0,
            vec![("alpha", -0.5), ("beta", 0.75)],
            |x| x.clamp(-0.5, 0.75),
        ),
        unary_with("threshold", -2.0, 2.0, vec![("alpha", 0.25)], |x| {
            x.max(0.25)
        }),
        act1(
            "elu",
            0.5,
            |x, a| if x > 0.0 { x } else { a * (x.exp() - 1.0) },
        ),
        act1("leaky_relu", 0.1, |x, a| if x >= 0.0 { x } else { a * x }),
        act1("thresholded_relu", 0.3, |x, a| if x >= a { x } else { 0.0 }),
        act2("clamped_relu", 0.1, 0.6, |x, a, b| {
            if x >= 0.0 {
                x.min(b)
            } else {
                (a * x).min(b)
            }
        }),
        act2("linear_activation", 2.0, -0.5, |x, a, b| a * x + b),
        act2("scaled_tanh", 1.5, 0.7, |x, a, b| a * (b * x).tanh()),
        act2("sigmoid_hard", 0.3, 0.4, |x, a, b| {
            (a * x + b).clamp(0.0, 1.0)
        }),
    ];
    let gelus: [(&str, Ref1); 3] = [
        ("EXACT", |x: f64| 0.5 * x * (1.0 + erf(x / 2f64.sqrt()))),
        ("TANH_APPROXIMATION", |x: f64| {
            0.5 * x
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
        }),
        ("SIGMOID_APPROXIMATION", |x: f64| x * sigmoid(1.702 * x)),
    ];
    for (mode, f) in gelus {
        v.push(case("gelu", mode, &[I15], FP, move |p| {
            let s = [4, 6];
            let (x, xv) = p.x("x", &s, -3.0, 3.0);
            let y = p.op("gelu", vec![("x", In::V(x)), ("mode", cstr(mode))])?;
            p.want(&y, &s, xv.iter().map(|&v| f(v)).collect(), CLOSE)
        }));
    }
    // Per-channel activations.
    v.push(case(
        "prelu",
        "alpha per channel",
        &versions("prelu"),
        FP,
        |p| {
            let s = [2, 3, 4];
            let (x, xv) = p.xs("x", &s);
            let a = [0.1, -0.5, 2.0];
            let ins = vec![("x", In::V(x)), ("alpha", p.cf(&[3], &a))];
            let y = p.op("prelu", ins)?;
            let w = xv
                .iter()
                .enumerate()
                .map(|(i, &e)| if e > 0.0 { e } else { a[(i / 4) % 3] * e })
                .collect();
            p.want(&y, &s, w, CLOSE)
        },
    ));
    v.push(case(
        "softplus_parametric",
        "alpha, beta per channel",
        &versions("softplus_parametric"),
        FP,
        |p| {
            let s = [2, 3, 4];
            let (x, xv) = p.x("x", &s, -3.0, 3.0);
            let (a, b) = ([0.5, 1.0, 2.0], [1.0, 0.5, 2.0]);
            let ins = vec![
                ("x", In::V(x)),
                ("alpha", p.cf(&[3], &a)),
                ("beta", p.cf(&[3], &b)),
            ];
            let y = p.op("softplus_parametric", ins)?;
            let w = xv
                .iter()
                .enumerate()
                .map(|(i, &e)| {
                    let c = (i / 4) % 3;
                    a[c] * (1.0 + (b[c] * e).exp()).ln()
                })
                .collect();
            p.want(&y, &s, w, CLOSE)
        },
    ));

    // ---- elementwise binary ----
    v.extend([
        binary("add", (-1.0, 1.0), (-1.0, 1.0), |a, b| a + b),
        binary("sub", (-1.0, 1.0), (-1.0, 1.0), |a, b| a - b),
        binary("mul", (-1.0, 1.0), (-1.0, 1.0), |a, b| a * b),
        binary("real_div", (-1.0, 1.0), (0.5, 2.0), |a, b| a / b),
        binary("maximum", (-1.0, 1.0), (-1.0, 1.0), f64::max),
        binary("minimum", (-1.0, 1.0), (-1.0, 1.0), f64::min),
        binary("pow", (0.5, 2.0), (-1.5, 1.5), f64::powf),
        binary("floor_div", (-4.0, 4.0), (0.5, 2.0), |a, b| (a / b).floor()),
        binary("mod", (-4.0, 4.0), (0.5, 2.0), |a, b| {
            a - (a / b).floor() * b
        }),
        binary_int("add", |a, b| a + b, false),
        binary_int("sub", |a, b| a - b, false),
        binary_int("mul", |a, b| a * b, false),
        binary_int("floor_div", |a, b| (a / b).floor(), true),
        binary_int("mod", |a, b| a - (a / b).floor() * b, true),
        binary_int("maximum", f64::max, false),
        binary_int("minimum", f64::min, false),
        compare_op("equal", |a, b| a == b),
        compare_op("not_equal", |a, b| a != b),
        compare_op("less", |a, b| a < b),
        compare_op("less_equal", |a, b| a <= b),
        compare_op("greater", |a, b| a > b),
        compare_op("greater_equal", |a, b| a >= b),
        logical("logical_and", |a, b| a && b),
        logical("logical_or", |a, b| a || b),
        logical("logical_xor", |a, b| a ^ b),
    ]);
    v.push(case("logical_not", "bool", &[I15], &[Bool], |p| {
        let xv = vec![0.0, 1.0, 1.0, 0.0];
        let x = p.input_of("x", Bool, &[4], &xv);
        let y = p.op("logical_not", vec![("x", In::V(x))])?;
        p.want(
            &y,
            &[4],
            xv.iter().map(|&b| (b == 0.0) as u8 as f64).collect(),
            Cmp::Exact,
        )
    }));
    v.push(case("select", "broadcast cond", &[I15], FP, |p| {
        let (a, av) = p.xs("a", &[2, 3]);
        let (b, bv) = p.xs("b", &[3]);
        let cv = vec![1.0, 0.0, 1.0, 0.0, 0.0, 1.0];
        let c = p.input_of("cond", Bool, &[2, 3], &cv);
        let y = p.op(
            "select",
            vec![("cond", In::V(c)), ("a", In::V(a)), ("b", In::V(b))],
        )?;
        let w = (0..6)
            .map(|i| if cv[i] != 0.0 { av[i] } else { bv[i % 3] })
            .collect();
        p.want(&y, &[2, 3], w, Cmp::Exact)
    }));
    v.push(case(
        "cast",
        "fp → int32 (toward zero), int32 → fp, fp → bool",
        &versions("cast"),
        FP,
        |p| {
            let xv = vec![-2.75, -0.5, 0.0, 0.5, 1.5, 3.25];
            let dt = p.dt;
            let x = p.input_of("x", dt, &[6], &xv);
            let i = p.op(
                "cast",
                vec![("x", In::V(x.clone())), ("dtype", cstr("int32"))],
            )?;
            let b = p.op("cast", vec![("x", In::V(x)), ("dtype", cstr("bool"))])?;
            let f = p.op(
                "cast",
                vec![("x", In::V(i.clone())), ("dtype", cstr("fp32"))],
            )?;
            let t: Vec<f64> = xv.iter().map(|v| v.trunc()).collect();
            p.want(&i, &[6], t.clone(), Cmp::Exact)?;
            p.want(
                &b,
                &[6],
                xv.iter().map(|&v| (v != 0.0) as u8 as f64).collect(),
                Cmp::Exact,
            )?;
            p.want(&f, &[6], t, Cmp::Exact)
        },
    ));
    v.push(case("identity", "", &[I15], FP, |p| {
        let (x, xv) = p.xs("x", &[3, 2]);
        let y = p.op("identity", vec![("x", In::V(x))])?;
        p.want(&y, &[3, 2], xv, Cmp::Exact)
    }));
    v.push(case("const", "as an output", &[I15], FP, |p| {
        let vals = [1.5, -2.0, 0.25];
        let c = p.b.konst("k", p.fval(&[3], &vals));
        let w = vals.iter().map(|&x| p.r(x)).collect();
        p.want(&c, &[3], w, Cmp::Exact)
    }));

    // ---- reductions ----
    v.extend([
        reduction("reduce_sum", -1.0, 1.0, |l| l.iter().sum()),
        reduction("reduce_mean", -1.0, 1.0, |l| {
            l.iter().sum::<f64>() / l.len() as f64
        }),
        reduction("reduce_max", -1.0, 1.0, |l| {
            l.iter().cloned().fold(f64::NEG_INFINITY, f64::max)
        }),
        reduction("reduce_min", -1.0, 1.0, |l| {
            l.iter().cloned().fold(f64::INFINITY, f64::min)
        }),
        reduction("reduce_prod", 0.5, 1.5, |l| l.iter().product()),
        reduction("reduce_l1_norm", -1.0, 1.0, |l| {
            l.iter().map(|x| x.abs()).sum()
        }),
        reduction("reduce_l2_norm", -1.0, 1.0, |l| {
            l.iter().map(|x| x * x).sum::<f64>().sqrt()
        }),
        reduction("reduce_sum_square", -1.0, 1.0, |l| {
            l.iter().map(|x| x * x).sum()
        }),
        reduction("reduce_log_sum", 0.1, 1.0, |l| l.iter().sum::<f64>().ln()),
        reduction("reduce_log_sum_exp", -3.0, 3.0, |l| {
            l.iter().map(|x| x.exp()).sum::<f64>().ln()
        }),
        arg_reduction("reduce_argmax", true),
        arg_reduction("reduce_argmin", false),
    ]);
    v.push(case(
        "cumsum",
        "axis 1, exclusive, reverse",
        &[I15],
        FP,
        |p| {
            let s = [2, 5, 3];
            let (x, xv) = p.xs("x", &s);
            let mut ys = vec![];
            for (excl, rev) in [(false, false), (true, false), (false, true), (true, true)] {
                ys.push(p.op(
                    "cumsum",
                    vec![
                        ("x", In::V(x.clone())),
                        ("axis", ci0(1)),
                        ("exclusive", cb(excl)),
                        ("reverse", cb(rev)),
                    ],
                )?);
            }
            for (k, (excl, rev)) in [(false, false), (true, false), (false, true), (true, true)]
                .into_iter()
                .enumerate()
            {
                let mut w = vec![0.0; xv.len()];
                for a in 0..2 {
                    for c in 0..3 {
                        let at = |b: usize| a * 15 + b * 3 + c;
                        for b in 0..5 {
                            let range: Vec<usize> = if rev {
                                (b..5).collect()
                            } else {
                                (0..=b).collect()
                            };
                            w[at(b)] = range
                                .into_iter()
                                .filter(|&j| !(excl && j == b))
                                .map(|j| xv[at(j)])
                                .sum();
                        }
                    }
                }
                p.want(&ys[k], &s, w, Cmp::Float(5.0))?;
            }
            Ok(())
        },
    ));

    // ---- nn ----
    v.push(case("softmax", "axis 1", &[I15], FP, |p| {
        let s = [2, 5, 3];
        let (x, xv) = p.x("x", &s, -3.0, 3.0);
        let y = p.op("softmax", vec![("x", In::V(x)), ("axis", ci0(1))])?;
        let (t, ts) = permute(&xv, &s, &[0, 2, 1]);
        let (w, _) = permute(&softmax_rows(&t, 5), &ts, &[0, 2, 1]);
        p.want(&y, &s, w, CLOSE)
    }));
    v.push(case(
        "matmul",
        "transpose_y, batch broadcast",
        &versions("matmul"),
        FP,
        |p| {
            let (x, xv) = p.xs("x", &[2, 3, 4]);
            let (y, yv) = p.xs("y", &[5, 4]);
            let z = p.op(
                "matmul",
                vec![
                    ("x", In::V(x)),
                    ("y", In::V(y)),
                    ("transpose_x", cb(false)),
                    ("transpose_y", cb(true)),
                ],
            )?;
            let (yt, _) = permute(&yv, &[5, 4], &[1, 0]);
            let yb: Vec<f64> = (0..2).flat_map(|_| yt.clone()).collect();
            p.want(&z, &[2, 3, 5], bmm(&xv, &yb, 2, 3, 4, 5), Cmp::Float(4.0))
        },
    ));
    v.push(case(
        "linear",
        "weight [N, K], bias",
        &versions("linear"),
        FP,
        |p| {
            let (x, xv) = p.xs("x", &[3, 6]);
            let wv = p.rand(4 * 6, -1.0, 1.0);
            let bv = p.rand(4, -1.0, 1.0);
            let ins = vec![
                ("x", In::V(x)),
                ("weight", p.cf(&[4, 6], &wv)),
                ("bias", p.cf(&[4], &bv)),
            ];
            let y = p.op("linear", ins)?;
            let (wt, _) = permute(&wv, &[4, 6], &[1, 0]);
            let mut w = bmm(&xv, &wt, 1, 3, 6, 4);
            w.iter_mut().enumerate().for_each(|(i, e)| *e += bv[i % 4]);
            p.want(&y, &[3, 4], w, Cmp::Float(6.0))
        },
    ));
    v.push(case("einsum", "nchw,nwhu->nchu", &[I15], FP, |p| {
        let (a, av) = p.xs("a", &[1, 2, 3, 4]);
        let (b, bv) = p.xs("b", &[1, 4, 3, 5]);
        let y = p.op(
            "einsum",
            vec![
                ("values", In::Vs(vec![a, b])),
                ("equation", cstr("nchw,nwhu->nchu")),
            ],
        )?;
        let mut w = vec![0.0; 2 * 3 * 5];
        for c in 0..2 {
            for h in 0..3 {
                for u in 0..5 {
                    w[(c * 3 + h) * 5 + u] = (0..4)
                        .map(|x| av[(c * 3 + h) * 4 + x] * bv[(x * 3 + h) * 5 + u])
                        .sum();
                }
            }
        }
        p.want(&y, &[1, 2, 3, 5], w, Cmp::Float(4.0))
    }));
    v.push(case(
        "conv",
        "2-D, groups 2, stride 2, dilation, custom pad, bias",
        &versions("conv"),
        FP,
        |p| {
            let (n, cin, h, wd, co, k) = (1usize, 4usize, 7usize, 6usize, 4usize, 3usize);
            let (x, xv) = p.xs("x", &[n, cin, h, wd]);
            let wv = p.rand(co * (cin / 2) * k * k, -1.0, 1.0);
            let bv = p.rand(co, -1.0, 1.0);
            let ins = vec![
                ("x", In::V(x)),
                ("weight", p.cf(&[co, cin / 2, k, k], &wv)),
                ("bias", p.cf(&[co], &bv)),
                ("strides", ci(&[2, 1])),
                ("pad_type", cstr("custom")),
                ("pad", ci(&[1, 1, 0, 2])),
                ("dilations", ci(&[1, 2])),
                ("groups", ci0(2)),
            ];
            let y = p.op("conv", ins)?;
            let (oh, ow) = ((h + 2 - 3) / 2 + 1, (wd + 2 - 5) + 1);
            let mut w = vec![0.0; co * oh * ow];
            for o in 0..co {
                let g = o / 2;
                for i in 0..oh {
                    for j in 0..ow {
                        let mut acc = bv[o];
                        for c in 0..2 {
                            for a in 0..k {
                                for b in 0..k {
                                    let (yy, xx) = ((i * 2 + a) as i64 - 1, (j + b * 2) as i64);
                                    if yy >= 0 && (yy as usize) < h && (xx as usize) < wd {
                                        acc += wv[((o * 2 + c) * k + a) * k + b]
                                            * xv[((g * 2 + c) * h + yy as usize) * wd
                                                + xx as usize];
                                    }
                                }
                            }
                        }
                        w[(o * oh + i) * ow + j] = acc;
                    }
                }
            }
            p.want(&y, &[n, co, oh, ow], w, Cmp::Float(18.0))
        },
    ));
    v.push(case(
        "layer_norm",
        "last axis, gamma, beta",
        &versions("layer_norm"),
        FP,
        |p| {
            let s = [3, 8];
            let (x, xv) = p.xs("x", &s);
            let g = p.rand(8, 0.5, 1.5);
            let b = p.rand(8, -0.5, 0.5);
            let ins = vec![
                ("x", In::V(x)),
                ("axes", ci(&[-1])),
                ("gamma", p.cf(&[8], &g)),
                ("beta", p.cf(&[8], &b)),
                ("epsilon", p.cs(1e-5)),
            ];
            let y = p.op("layer_norm", ins)?;
            let eps = p.r(1e-5);
            let w = xv
                .chunks(8)
                .flat_map(|r| {
                    let m = r.iter().sum::<f64>() / 8.0;
                    let var = r.iter().map(|v| (v - m).powi(2)).sum::<f64>() / 8.0;
                    let (g, b) = (g.clone(), b.clone());
                    r.iter()
                        .enumerate()
                        .map(move |(i, v)| (v - m) / (var + eps).sqrt() * g[i] + b[i])
                        .collect::<Vec<_>>()
                })
                .collect();
            p.want(&y, &s, w, Cmp::Float(8.0))
        },
    ));
    v.push(case(
        "batch_norm",
        "per channel",
        &versions("batch_norm"),
        FP,
        |p| {
            let s = [2, 3, 4];
            let (x, xv) = p.xs("x", &s);
            let (m, var, g, b) = (
                p.rand(3, -0.5, 0.5),
                p.rand(3, 0.5, 1.5),
                p.rand(3, 0.5, 1.5),
                p.rand(3, -0.5, 0.5),
            );
            let ins = vec![
                ("x", In::V(x)),
                ("mean", p.cf(&[3], &m)),
                ("variance", p.cf(&[3], &var)),
                ("gamma", p.cf(&[3], &g)),
                ("beta", p.cf(&[3], &b)),
                ("epsilon", p.cs(1e-3)),
            ];
            let y = p.op("batch_norm", ins)?;
            let eps = p.r(1e-3);
            let w = xv
                .iter()
                .enumerate()
                .map(|(i, &e)| {
                    let c = (i / 4) % 3;
                    (e - m[c]) / (var[c] + eps).sqrt() * g[c] + b[c]
                })
                .collect();
            p.want(&y, &s, w, CLOSE)
        },
    ));
    v.push(case(
        "instance_norm",
        "gamma, beta",
        &versions("instance_norm"),
        FP,
        |p| {
            let s = [2, 3, 4, 5];
            let (x, xv) = p.xs("x", &s);
            let (g, b) = (p.rand(3, 0.5, 1.5), p.rand(3, -0.5, 0.5));
            let ins = vec![
                ("x", In::V(x)),
                ("gamma", p.cf(&[3], &g)),
                ("beta", p.cf(&[3], &b)),
                ("epsilon", p.cs(1e-5)),
            ];
            let y = p.op("instance_norm", ins)?;
            let eps = p.r(1e-5);
            let mut w = vec![];
            for (pi, pl) in xv.chunks(20).enumerate() {
                let m = pl.iter().sum::<f64>() / 20.0;
                let var = pl.iter().map(|v| (v - m).powi(2)).sum::<f64>() / 20.0;
                w.extend(
                    pl.iter()
                        .map(|v| (v - m) / (var + eps).sqrt() * g[pi % 3] + b[pi % 3]),
                );
            }
            p.want(&y, &s, w, Cmp::Float(20.0))
        },
    ));
    v.push(case(
        "l2_norm",
        "rank 4: batch of [C, H, W]",
        &versions("l2_norm"),
        FP,
        |p| {
            let s = [2, 3, 2, 2];
            let (x, xv) = p.xs("x", &s);
            let y = p.op("l2_norm", vec![("x", In::V(x)), ("epsilon", p.cs(1e-6))])?;
            let eps = p.r(1e-6);
            let w = xv
                .chunks(12)
                .flat_map(|b| {
                    let n = (b.iter().map(|v| v * v).sum::<f64>() + eps).sqrt();
                    b.iter().map(move |v| v / n).collect::<Vec<_>>()
                })
                .collect();
            p.want(&y, &s, w, Cmp::Float(12.0))
        },
    ));
    v.push(case(
        "local_response_norm",
        "size 3",
        &versions("local_response_norm"),
        FP,
        |p| {
            let s = [1, 5, 2, 3];
            let (x, xv) = p.xs("x", &s);
            let ins = vec![
                ("x", In::V(x)),
                ("size", ci0(3)),
                ("alpha", p.cs(0.5)),
                ("beta", p.cs(0.75)),
                ("k", p.cs(2.0)),
            ];
            let y = p.op("local_response_norm", ins)?;
            let mut w = vec![0.0; xv.len()];
            for c in 0..5usize {
                for i in 0..6usize {
                    let sum: f64 = (c.saturating_sub(1)..=(c + 1).min(4))
                        .map(|j| xv[j * 6 + i].powi(2))
                        .sum();
                    w[c * 6 + i] = xv[c * 6 + i] / (2.0f64 + 0.5 / 3.0 * sum).powf(0.75);
                }
            }
            p.want(&y, &s, w, Cmp::Float(3.0))
        },
    ));
    for (op, pad_type, exclude) in [
        ("max_pool", "valid", false),
        ("avg_pool", "custom", false),
        ("avg_pool", "custom", true),
        ("l2_pool", "same", false),
    ] {
        v.push(case(
            op,
            &format!("2-D, {pad_type}, exclude_padding {exclude}"),
            &[I15],
            FP,
            move |p| {
                let (h, wd) = (5usize, 6usize);
                let (x, xv) = p.xs("x", &[1, 2, h, wd]);
                let mut ins = vec![
                    ("x", In::V(x)),
                    ("kernel_sizes", ci(&[2, 3])),
                    ("strides", ci(&[2, 2])),
                    ("pad_type", cstr(pad_type)),
                ];
                let pads: [usize; 4] = match pad_type {
                    "custom" => [1, 0, 1, 1],
                    // same: total = (ceil(in/s) - 1)·s + k - in, the smaller half first.
                    "same" => {
                        let th = ((h.div_ceil(2) - 1) * 2 + 2).saturating_sub(h);
                        let tw = ((wd.div_ceil(2) - 1) * 2 + 3).saturating_sub(wd);
                        [th / 2, th - th / 2, tw / 2, tw - tw / 2]
                    }
                    _ => [0; 4],
                };
                if pad_type == "custom" {
                    ins.push(("pad", ci(&[1, 0, 1, 1])));
                }
                if op == "avg_pool" {
                    ins.push(("exclude_padding_from_average", cb(exclude)));
                }
                let y = p.op(op, ins)?;
                let (oh, ow) = (
                    (h + pads[0] + pads[1] - 2) / 2 + 1,
                    (wd + pads[2] + pads[3] - 3) / 2 + 1,
                );
                let mut w = vec![];
                for c in 0..2 {
                    for i in 0..oh {
                        for j in 0..ow {
                            let mut vals = vec![];
                            for a in 0..2 {
                                for b in 0..3 {
                                    let (yy, xx) = (
                                        (i * 2 + a) as i64 - pads[0] as i64,
                                        (j * 2 + b) as i64 - pads[2] as i64,
                                    );
                                    if yy >= 0 && yy < h as i64 && xx >= 0 && xx < wd as i64 {
                                        vals.push(xv[(c * h + yy as usize) * wd + xx as usize]);
                                    }
                                }
                            }
                            w.push(match op {
                                "max_pool" => {
                                    vals.iter().cloned().fold(f64::NEG_INFINITY, f64::max)
                                }
                                "l2_pool" => vals.iter().map(|v| v * v).sum::<f64>().sqrt(),
                                _ if exclude => vals.iter().sum::<f64>() / vals.len() as f64,
                                _ => vals.iter().sum::<f64>() / 6.0,
                            });
                        }
                    }
                }
                p.want(&y, &[1, 2, oh, ow], w, Cmp::Float(6.0))
            },
        ));
    }
    for mask in ["none", "bool", "float"] {
        v.push(case(
            "scaled_dot_product_attention",
            &format!("mask {mask}"),
            &[I18],
            FP,
            move |p| {
                let (b, l, s, e, ev) = (2, 3, 5, 4, 6);
                let (q, qv) = p.xs("query", &[b, l, e]);
                let (k, kv) = p.xs("key", &[b, s, e]);
                let (vv_, vv) = p.xs("value", &[b, s, ev]);
                let mut ins = vec![
                    ("query", In::V(q)),
                    ("key", In::V(k)),
                    ("value", In::V(vv_)),
                ];
                // Mask [L, S] broadcast over the batch; every row keeps at least one key.
                let keep: Vec<bool> = (0..l * s).map(|i| (i % s) <= (i / s) + 1).collect();
                let fm: Vec<f64> = p.rand(l * s, -2.0, 0.0);
                let add: Vec<f64> = match mask {
                    "bool" => {
                        ins.push(("attn_mask", cbools(&[l, s], &keep)));
                        keep.iter()
                            .map(|&k| if k { 0.0 } else { f64::NEG_INFINITY })
                            .collect()
                    }
                    "float" => {
                        ins.push(("attn_mask", p.cf(&[l, s], &fm)));
                        fm.clone()
                    }
                    _ => vec![0.0; l * s],
                };
                let y = p.op("scaled_dot_product_attention", ins)?;
                let (kt, _) = permute(&kv, &[b, s, e], &[0, 2, 1]);
                let mut sc = bmm(&qv, &kt, b, l, e, s);
                for (i, x) in sc.iter_mut().enumerate() {
                    *x = *x / (e as f64).sqrt() + add[i % (l * s)];
                }
                let pr = softmax_rows(&sc, s);
                p.want(&y, &[b, l, ev], bmm(&pr, &vv, b, l, s, ev), Cmp::Float(5.0))
            },
        ));
    }

    // ---- shape and data movement (exact) ----
    v.push(case(
        "reshape",
        "with -1 and 0",
        &versions("reshape"),
        FP,
        |p| {
            let (x, xv) = p.xs("x", &[2, 3, 4]);
            let y = p.op("reshape", vec![("x", In::V(x)), ("shape", ci(&[0, -1, 2]))])?;
            p.want(&y, &[2, 6, 2], xv, Cmp::Exact)
        },
    ));
    v.push(case(
        "transpose",
        "perm [2, 0, 1]",
        &versions("transpose"),
        FP,
        |p| {
            let (x, xv) = p.xs("x", &[2, 3, 4]);
            let y = p.op("transpose", vec![("x", In::V(x)), ("perm", ci(&[2, 0, 1]))])?;
            let (w, s) = permute(&xv, &[2, 3, 4], &[2, 0, 1]);
            p.want(&y, &s, w, Cmp::Exact)
        },
    ));
    v.push(case(
        "expand_dims",
        "axes [0, -1]",
        &versions("expand_dims"),
        FP,
        |p| {
            let (x, xv) = p.xs("x", &[2, 3]);
            let y = p.op("expand_dims", vec![("x", In::V(x)), ("axes", ci(&[0, -1]))])?;
            p.want(&y, &[1, 2, 3, 1], xv, Cmp::Exact)
        },
    ));
    v.push(case("squeeze", "axes [1]", &versions("squeeze"), FP, |p| {
        let (x, xv) = p.xs("x", &[2, 1, 3, 1]);
        let y = p.op("squeeze", vec![("x", In::V(x)), ("axes", ci(&[1]))])?;
        p.want(&y, &[2, 3, 1], xv, Cmp::Exact)
    }));
    v.push(case("concat", "axis 1", &[I15], FP, |p| {
        let (a, av) = p.xs("a", &[2, 2]);
        let (b, bv) = p.xs("b", &[2, 3]);
        let y = p.op(
            "concat",
            vec![
                ("values", In::Vs(vec![a, b])),
                ("axis", ci0(1)),
                ("interleave", cb(false)),
            ],
        )?;
        let w = (0..2)
            .flat_map(|r| {
                av[r * 2..r * 2 + 2]
                    .iter()
                    .chain(&bv[r * 3..r * 3 + 3])
                    .cloned()
                    .collect::<Vec<_>>()
            })
            .collect();
        p.want(&y, &[2, 5], w, Cmp::Exact)
    }));
    v.push(case("stack", "axis 1", &[I15], FP, |p| {
        let (a, av) = p.xs("a", &[2, 3]);
        let (b, bv) = p.xs("b", &[2, 3]);
        let y = p.op(
            "stack",
            vec![("values", In::Vs(vec![a, b])), ("axis", ci0(1))],
        )?;
        let w = (0..2)
            .flat_map(|r| {
                av[r * 3..r * 3 + 3]
                    .iter()
                    .chain(&bv[r * 3..r * 3 + 3])
                    .cloned()
                    .collect::<Vec<_>>()
            })
            .collect();
        p.want(&y, &[2, 2, 3], w, Cmp::Exact)
    }));
    v.push(case(
        "split",
        "split_sizes [1, 3] on axis 1",
        &[I15],
        FP,
        |p| {
            let (x, xv) = p.xs("x", &[2, 4]);
            let ys = p.ops(
                "split",
                vec![
                    ("x", In::V(x)),
                    ("split_sizes", ci(&[1, 3])),
                    ("axis", ci0(1)),
                ],
            )?;
            ensure!(ys.len() == 2, "{} outputs", ys.len());
            p.want(&ys[0], &[2, 1], vec![xv[0], xv[4]], Cmp::Exact)?;
            p.want(
                &ys[1],
                &[2, 3],
                vec![xv[1], xv[2], xv[3], xv[5], xv[6], xv[7]],
                Cmp::Exact,
            )
        },
    ));
    v.push(case("tile", "reps [2, 1, 3]", &[I15], FP, |p| {
        let (x, xv) = p.xs("x", &[1, 2, 2]);
        let y = p.op("tile", vec![("x", In::V(x)), ("reps", ci(&[2, 1, 3]))])?;
        let s = [2, 2, 6];
        let w = (0..12 * 2)
            .map(|i| {
                let c = unravel(&s, i);
                xv[c[1] * 2 + c[2] % 2]
            })
            .collect();
        p.want(&y, &s, w, Cmp::Exact)
    }));
    v.push(case("shape", "", &[I15], FP, |p| {
        let (x, _) = p.xs("x", &[2, 3, 4]);
        let y = p.op("shape", vec![("x", In::V(x))])?;
        p.want(&y, &[3], vec![2.0, 3.0, 4.0], Cmp::Exact)
    }));
    v.push(case("fill", "constant shape", &[I15], FP, |p| {
        let val = p.cs(1.25);
        let y = p.op("fill", vec![("shape", ci(&[2, 3])), ("value", val)])?;
        p.want(&y, &[2, 3], vec![1.25; 6], Cmp::Exact)
    }));
    v.push(case(
        "fill_like",
        "fp32 value",
        &versions("fill_like"),
        FP,
        |p| {
            let (x, _) = p.xs("x", &[2, 3]);
            let y = p.op(
                "fill_like",
                vec![
                    ("ref_tensor", In::V(x)),
                    ("value", In::C(Value::f32_scalar(-0.5))),
                ],
            )?;
            p.want(&y, &[2, 3], vec![-0.5; 6], Cmp::Exact)
        },
    ));
    v.push(case("range_1d", "int32", &[I15], &[I32], |p| {
        let y = p.op(
            "range_1d",
            vec![("end", ci0(10)), ("start", ci0(1)), ("step", ci0(3))],
        )?;
        p.want(&y, &[3], vec![1.0, 4.0, 7.0], Cmp::Exact)
    }));
    v.push(case(
        "slice_by_index",
        "stride -1, squeeze, masks",
        &versions("slice_by_index"),
        FP,
        |p| {
            let s = [3, 4, 5];
            let (x, xv) = p.xs("x", &s);
            let y = p.op(
                "slice_by_index",
                vec![
                    ("x", In::V(x)),
                    ("begin", ci(&[1, 3, 0])),
                    ("end", ci(&[2, 0, 5])),
                    ("stride", ci(&[1, -2, 2])),
                    (
                        "begin_mask",
                        In::C(Value::Tensor(ITensor::bools(&[3], &[false, false, true]))),
                    ),
                    (
                        "end_mask",
                        In::C(Value::Tensor(ITensor::bools(&[3], &[false, false, true]))),
                    ),
                    (
                        "squeeze_mask",
                        In::C(Value::Tensor(ITensor::bools(&[3], &[true, false, false]))),
                    ),
                ],
            )?;
            let mut w = vec![];
            for b in [3, 1] {
                for c in [0, 2, 4] {
                    w.push(xv[ravel(&s, &[1, b, c])]);
                }
            }
            p.want(&y, &[2, 3], w, Cmp::Exact)
        },
    ));
    v.push(case(
        "slice_by_size",
        "size -1",
        &versions("slice_by_size"),
        FP,
        |p| {
            let s = [3, 4];
            let (x, xv) = p.xs("x", &s);
            let y = p.op(
                "slice_by_size",
                vec![
                    ("x", In::V(x)),
                    ("begin", ci(&[1, 1])),
                    ("size", ci(&[2, -1])),
                ],
            )?;
            let w = [1, 2]
                .iter()
                .flat_map(|&r| (1..4).map(move |c| r * 4 + c))
                .map(|i| xv[i])
                .collect();
            p.want(&y, &[2, 3], w, Cmp::Exact)
        },
    ));
    v.push(case(
        "gather",
        "axis 1, negative index",
        &versions("gather"),
        FP,
        |p| {
            let (x, xv) = p.xs("x", &[2, 4]);
            let y = p.op(
                "gather",
                vec![
                    ("x", In::V(x)),
                    ("indices", ci(&[3, -4, 1])),
                    ("axis", ci0(1)),
                ],
            )?;
            let w = [0, 1]
                .iter()
                .flat_map(|&r| [3, 0, 1].iter().map(move |&c| r * 4 + c))
                .map(|i| xv[i])
                .collect();
            p.want(&y, &[2, 3], w, Cmp::Exact)
        },
    ));
    v.push(case(
        "gather_along_axis",
        "axis 0",
        &versions("gather_along_axis"),
        FP,
        |p| {
            let (x, xv) = p.xs("x", &[3, 2]);
            let idx = In::C(Value::Tensor(ITensor::i32(&[2, 2], &[2, 0, 1, 1])));
            let y = p.op(
                "gather_along_axis",
                vec![("x", In::V(x)), ("indices", idx), ("axis", ci0(0))],
            )?;
            p.want(&y, &[2, 2], vec![xv[4], xv[1], xv[2], xv[3]], Cmp::Exact)
        },
    ));
    v.push(case(
        "gather_nd",
        "indices [2, 2] into [3, 4, 2]",
        &versions("gather_nd"),
        FP,
        |p| {
            let s = [3, 4, 2];
            let (x, xv) = p.xs("x", &s);
            let idx = In::C(Value::Tensor(ITensor::i32(&[2, 2], &[2, 1, 0, 3])));
            let y = p.op("gather_nd", vec![("x", In::V(x)), ("indices", idx)])?;
            let w = [(2, 1), (0, 3)]
                .iter()
                .flat_map(|&(a, b)| (0..2).map(move |c| (a * 4 + b) * 2 + c))
                .map(|i| xv[i])
                .collect();
            p.want(&y, &[2, 2], w, Cmp::Exact)
        },
    ));
    v.push(case("gather_nd", "batch_dims 1", &[I16, I17], FP, |p| {
        let s = [2, 3, 4];
        let (x, xv) = p.xs("x", &s);
        let idx = In::C(Value::Tensor(ITensor::i32(&[2, 1, 1], &[2, 0])));
        let y = p.op(
            "gather_nd",
            vec![("x", In::V(x)), ("indices", idx), ("batch_dims", ci0(1))],
        )?;
        let w = (0..4)
            .map(|c| xv[8 + c])
            .chain((0..4).map(|c| xv[12 + c]))
            .collect();
        p.want(&y, &[2, 1, 4], w, Cmp::Exact)
    }));
    v.push(case(
        "pad",
        "constant, reflect, replicate",
        &[I15],
        FP,
        |p| {
            let (x, xv) = p.xs("x", &[2, 3]);
            let mut ys = vec![];
            for mode in ["constant", "reflect", "replicate"] {
                ys.push(p.op(
                    "pad",
                    vec![
                        ("x", In::V(x.clone())),
                        ("pad", ci(&[0, 1, 2, 1])),
                        ("mode", cstr(mode)),
                        ("constant_val", p.cs(0.5)),
                    ],
                )?);
            }
            for (k, mode) in ["constant", "reflect", "replicate"].iter().enumerate() {
                let mut w = vec![];
                for r in 0..3i64 {
                    for c in -2..4i64 {
                        let at = |r: i64, c: i64| xv[(r * 3 + c) as usize];
                        let inside = r < 2 && (0..3).contains(&c);
                        w.push(match *mode {
                            _ if inside => at(r, c),
                            "constant" => 0.5,
                            "reflect" => {
                                // Reflect about the last row (index 1).
                                let rr = if r >= 2 { 2 - r } else { r };
                                let cc = if c < 0 {
                                    -c
                                } else if c > 2 {
                                    4 - c
                                } else {
                                    c
                                };
                                at(rr, cc)
                            }
                            _ => at(r.min(1), c.clamp(0, 2)),
                        });
                    }
                }
                p.want(&ys[k], &[3, 6], w, Cmp::Exact)?;
            }
            Ok(())
        },
    ));
    v.push(case("band_part", "lower 1, upper 0", &[I15], FP, |p| {
        let (x, xv) = p.xs("x", &[4, 4]);
        let y = p.op(
            "band_part",
            vec![("x", In::V(x)), ("lower", ci0(1)), ("upper", ci0(0))],
        )?;
        let w = (0..16)
            .map(|k| {
                let (i, j) = ((k / 4) as i64, (k % 4) as i64);
                if i - j <= 1 && j - i <= 0 {
                    xv[k]
                } else {
                    0.0
                }
            })
            .collect();
        p.want(&y, &[4, 4], w, Cmp::Exact)
    }));
    v.push(case("flatten2d", "axis 2", &[I15], FP, |p| {
        let (x, xv) = p.xs("x", &[2, 3, 4]);
        let y = p.op("flatten2d", vec![("x", In::V(x)), ("axis", ci0(2))])?;
        p.want(&y, &[6, 4], xv, Cmp::Exact)
    }));
    v.push(case(
        "reshape_like",
        "ref[0:2] ++ ref2[1:]",
        &versions("reshape_like"),
        FP,
        |p| {
            let (x, xv) = p.xs("x", &[24]);
            let (r1, _) = p.xs("r1", &[2, 3, 7]);
            let (r2, _) = p.xs("r2", &[5, 4]);
            let consts: Vec<V> = [
                Value::i32_scalar(0),
                Value::i32_scalar(1),
                Value::i32_scalar(2),
                Value::i32_scalar(0),
                Value::bool_scalar(false),
                Value::bool_scalar(true),
            ]
            .into_iter()
            .enumerate()
            .map(|(i, v)| p.b.konst(&format!("k{i}"), v))
            .collect();
            let y = p.op(
                "reshape_like",
                vec![
                    ("x", In::V(x)),
                    ("ref_tensors", In::Vs(vec![r1, r2])),
                    ("begins", In::Vs(vec![consts[0].clone(), consts[1].clone()])),
                    ("ends", In::Vs(vec![consts[2].clone(), consts[3].clone()])),
                    (
                        "end_masks",
                        In::Vs(vec![consts[4].clone(), consts[5].clone()]),
                    ),
                ],
            )?;
            p.want(&y, &[2, 3, 4], xv, Cmp::Exact)
        },
    ));
    v.push(case(
        "reverse",
        "axes [0, 2]",
        &versions("reverse"),
        FP,
        |p| {
            let s = [2, 3, 4];
            let (x, xv) = p.xs("x", &s);
            let y = p.op("reverse", vec![("x", In::V(x)), ("axes", ci(&[0, -1]))])?;
            let w = (0..24)
                .map(|i| {
                    let c = unravel(&s, i);
                    xv[ravel(&s, &[1 - c[0], c[1], 3 - c[2]])]
                })
                .collect();
            p.want(&y, &s, w, Cmp::Exact)
        },
    ));
    v.push(case(
        "reverse_sequence",
        "seq_axis 1, batch_axis 0",
        &versions("reverse_sequence"),
        FP,
        |p| {
            let s = [3, 4, 2];
            let (x, xv) = p.xs("x", &s);
            let lens = [4, 2, 0];
            let y = p.op(
                "reverse_sequence",
                vec![
                    ("x", In::V(x)),
                    ("lengths", ci(&lens)),
                    ("seq_axis", ci0(1)),
                    ("batch_axis", ci0(0)),
                ],
            )?;
            let w = (0..24)
                .map(|i| {
                    let c = unravel(&s, i);
                    let l = lens[c[0]] as usize;
                    let t = if c[1] < l { l - 1 - c[1] } else { c[1] };
                    xv[ravel(&s, &[c[0], t, c[2]])]
                })
                .collect();
            p.want(&y, &s, w, Cmp::Exact)
        },
    ));
    v.push(case(
        "sliding_windows",
        "axis 1, size 3, stride 2",
        &versions("sliding_windows"),
        FP,
        |p| {
            let s = [2, 7];
            let (x, xv) = p.xs("x", &s);
            let y = p.op(
                "sliding_windows",
                vec![
                    ("x", In::V(x)),
                    ("axis", ci0(1)),
                    ("size", ci0(3)),
                    ("stride", ci0(2)),
                ],
            )?;
            let w = (0..2)
                .flat_map(|r| (0..3).flat_map(move |k| (0..3).map(move |j| r * 7 + k * 2 + j)))
                .map(|i| xv[i])
                .collect();
            p.want(&y, &[2, 3, 3], w, Cmp::Exact)
        },
    ));
    for (op, param, to_space) in [
        ("depth_to_space", "block_size", true),
        ("space_to_depth", "block_size", false),
        ("pixel_shuffle", "upscale_factor", true),
        ("pixel_unshuffle", "downscale_factor", false),
    ] {
        v.push(case(op, "factor 2", &versions(op), FP, move |p| {
            let f = 2usize;
            let s_in = if to_space { [1, 8, 2, 3] } else { [1, 2, 4, 6] };
            let (x, xv) = p.xs("x", &s_in);
            let fac = if op == "pixel_unshuffle" {
                In::C(Value::Tensor(ITensor::new(
                    DType::U32,
                    vec![],
                    milkit::ir::Bytes::from_vec(2u32.to_le_bytes().to_vec()),
                )?))
            } else {
                ci0(2)
            };
            let y = p.op(op, vec![("x", In::V(x)), (param, fac)])?;
            // Space layout (c, h·f + i, w·f + j) ↔ depth channel: DCR (i·f + j)·C + c for
            // depth/space, CRD c·f² + i·f + j for the pixel shuffles.
            let dcr = op.ends_with("space") || op.ends_with("depth");
            let (cs, hs, ws) = if to_space {
                (s_in[1] / 4, s_in[2] * f, s_in[3] * f)
            } else {
                (s_in[1], s_in[2], s_in[3])
            };
            let depth_ch = |c: usize, i: usize, j: usize| {
                if dcr {
                    (i * f + j) * cs + c
                } else {
                    c * f * f + i * f + j
                }
            };
            let out_shape: Vec<usize> = if to_space {
                vec![1, cs, hs, ws]
            } else {
                vec![1, cs * 4, hs / f, ws / f]
            };
            let mut w = vec![0.0; numel(&out_shape)];
            for c in 0..cs {
                for hh in 0..hs {
                    for ww in 0..ws {
                        let (h0, i, w0, j) = (hh / f, hh % f, ww / f, ww % f);
                        let dc = depth_ch(c, i, j);
                        if to_space {
                            w[ravel(&out_shape, &[0, c, hh, ww])] =
                                xv[ravel(&s_in, &[0, dc, h0, w0])];
                        } else {
                            w[ravel(&out_shape, &[0, dc, h0, w0])] =
                                xv[ravel(&s_in, &[0, c, hh, ww])];
                        }
                    }
                }
            }
            p.want(&y, &out_shape, w, Cmp::Exact)
        }));
    }
    v.push(case(
        "space_to_batch",
        "block [2, 3], paddings [[1, 0], [0, 2]]; batch_to_space back",
        &[I15],
        FP,
        |p| {
            let (n, c, h, w) = (2usize, 2usize, 3usize, 4usize);
            let (x, xv) = p.xs("x", &[n, c, h, w]);
            let (b0, b1, top, left) = (2usize, 3usize, 1usize, 0usize);
            let (ph, pw) = (h + 1, w + 2);
            let pads = || In::C(Value::Tensor(ITensor::i32(&[2, 2], &[1, 0, 0, 2])));
            let y = p.op(
                "space_to_batch",
                vec![
                    ("x", In::V(x)),
                    ("block_shape", ci(&[2, 3])),
                    ("paddings", pads()),
                ],
            )?;
            let z = p.op(
                "batch_to_space",
                vec![
                    ("x", In::V(y.clone())),
                    ("block_shape", ci(&[2, 3])),
                    ("crops", pads()),
                ],
            )?;
            // TensorFlow: out[(i·b1 + j)·N + n, c, y, x] = padded[n, c, y·b0 + i, x·b1 + j].
            let os = [n * b0 * b1, c, ph / b0, pw / b1];
            let mut want = vec![0.0; numel(&os)];
            for k in 0..os[0] {
                let (ij, nn) = (k / n, k % n);
                let (i, j) = (ij / b1, ij % b1);
                for cc in 0..c {
                    for yy in 0..os[2] {
                        for xx in 0..os[3] {
                            let (sy, sx) = (
                                (yy * b0 + i) as i64 - top as i64,
                                (xx * b1 + j) as i64 - left as i64,
                            );
                            if sy >= 0 && sx >= 0 && (sy as usize) < h && (sx as usize) < w {
                                want[ravel(&os, &[k, cc, yy, xx])] =
                                    xv[ravel(&[n, c, h, w], &[nn, cc, sy as usize, sx as usize])];
                            }
                        }
                    }
                }
            }
            p.want(&y, &os, want, Cmp::Exact)?;
            p.want(&z, &[n, c, h, w], xv, Cmp::Exact)
        },
    ));
    v.push(case(
        "batch_to_space",
        "crops [[0, 1], [1, 0]]",
        &[I15],
        FP,
        |p| {
            let (x, xv) = p.xs("x", &[4, 1, 2, 2]);
            let crops = In::C(Value::Tensor(ITensor::i32(&[2, 2], &[0, 1, 1, 0])));
            let z = p.op(
                "batch_to_space",
                vec![
                    ("x", In::V(x)),
                    ("block_shape", ci(&[2, 2])),
                    ("crops", crops),
                ],
            )?;
            // out[0, 0, Y, X] = x[(Y % 2)·2 + X % 2, 0, Y / 2, X / 2] over the 4×4, then cropped.
            let mut want = vec![];
            for yy in 0..3usize {
                for xx in 1..4usize {
                    want.push(
                        xv[ravel(&[4, 1, 2, 2], &[(yy % 2) * 2 + xx % 2, 0, yy / 2, xx / 2])],
                    );
                }
            }
            p.want(&z, &[1, 1, 3, 3], want, Cmp::Exact)
        },
    ));
    v.push(case(
        "topk",
        "k 3, axis 1, descending and ascending",
        &versions("topk"),
        FP,
        |p| {
            let s = [2, 6];
            let (x, xv) = p.xs("x", &s);
            let hi = p.ops(
                "topk",
                vec![("x", In::V(x.clone())), ("k", ci0(3)), ("axis", ci0(1))],
            )?;
            let lo = p.ops(
                "topk",
                vec![
                    ("x", In::V(x)),
                    ("k", ci0(2)),
                    ("axis", ci0(-1)),
                    ("ascending", cb(true)),
                ],
            )?;
            for (outs, k, asc) in [(hi, 3, false), (lo, 2, true)] {
                let (mut vals, mut idx) = (vec![], vec![]);
                for r in 0..2 {
                    let mut o: Vec<usize> = (0..6).collect();
                    o.sort_by(|&a, &b| {
                        let c = xv[r * 6 + a].partial_cmp(&xv[r * 6 + b]).unwrap();
                        if asc {
                            c
                        } else {
                            c.reverse()
                        }
                    });
                    for &j in &o[..k] {
                        vals.push(xv[r * 6 + j]);
                        idx.push(j as f64);
                    }
                }
                p.want(&outs[0], &[2, k], vals, Cmp::Exact)?;
                p.want(&outs[1], &[2, k], idx, Cmp::Exact)?;
            }
            Ok(())
        },
    ));
    v.push(case("argsort", "axis 0, descending", &[I15], FP, |p| {
        let s = [4, 3];
        let (x, xv) = p.xs("x", &s);
        let y = p.op("argsort", vec![("x", In::V(x)), ("axis", ci0(0))])?;
        let mut w = vec![0.0; 12];
        for c in 0..3 {
            let mut o: Vec<usize> = (0..4).collect();
            o.sort_by(|&a, &b| xv[b * 3 + c].partial_cmp(&xv[a * 3 + c]).unwrap());
            for (r, &j) in o.iter().enumerate() {
                w[r * 3 + c] = j as f64;
            }
        }
        p.want(&y, &s, w, Cmp::Exact)
    }));
    v.push(case("one_hot", "axis 0, on 2.5, off -1", &[I15], FP, |p| {
        let idx = [2, 0, 3, 1];
        let i = p.input_of("indices", I32, &[2, 2], &idx.map(|v| v as f64));
        let ins = vec![
            ("indices", In::V(i)),
            ("one_hot_vector_size", ci0(4)),
            ("axis", ci0(0)),
            ("on_value", p.cs(2.5)),
            ("off_value", p.cs(-1.0)),
        ];
        let y = p.op("one_hot", ins)?;
        let w = (0..16)
            .map(|k| {
                let (d, pos) = (k / 4, k % 4);
                if idx[pos] == d as i32 {
                    2.5
                } else {
                    -1.0
                }
            })
            .collect();
        p.want(&y, &[4, 2, 2], w, Cmp::Exact)
    }));
    v.push(case("non_zero", "rank 2", &[I15], FP, |p| {
        let xv = vec![0.0, 1.0, 0.0, -2.0, 0.0, 0.5];
        let dt = p.dt;
        let x = p.input_of("x", dt, &[2, 3], &xv);
        let y = p.op("non_zero", vec![("x", In::V(x))])?;
        p.want(&y, &[3, 2], vec![0.0, 1.0, 1.0, 0.0, 1.0, 2.0], Cmp::Exact)
    }));
    for mode in ["update", "add", "sub", "mul", "div", "max", "min"] {
        let f: fn(f64, f64) -> f64 = match mode {
            "update" => |_, u| u,
            "add" => |a, u| a + u,
            "sub" => |a, u| a - u,
            "mul" => |a, u| a * u,
            "div" => |a, u| a / u,
            "max" => f64::max,
            _ => f64::min,
        };
        v.push(case(
            "scatter",
            &format!("axis 1, mode {mode}"),
            &versions("scatter"),
            FP,
            move |p| {
                let (d, dv) = p.x("data", &[2, 4], 0.5, 2.0);
                let (u, uv) = p.x("updates", &[2, 2], 0.5, 2.0);
                let y = p.op(
                    "scatter",
                    vec![
                        ("data", In::V(d)),
                        ("indices", ci(&[3, 1])),
                        ("updates", In::V(u)),
                        ("axis", ci0(1)),
                        ("mode", cstr(mode)),
                    ],
                )?;
                let mut w = dv.clone();
                for r in 0..2 {
                    for (k, &c) in [3usize, 1].iter().enumerate() {
                        w[r * 4 + c] = f(w[r * 4 + c], uv[r * 2 + k]);
                    }
                }
                p.want(&y, &[2, 4], w, CLOSE)
            },
        ));
    }
    v.push(case(
        "scatter_along_axis",
        "axis 0, add",
        &versions("scatter_along_axis"),
        FP,
        |p| {
            let (d, dv) = p.xs("data", &[3, 2]);
            let (u, uv) = p.xs("updates", &[2, 2]);
            let idx = In::C(Value::Tensor(ITensor::i32(&[2, 2], &[2, 0, 2, -1])));
            let y = p.op(
                "scatter_along_axis",
                vec![
                    ("data", In::V(d)),
                    ("indices", idx),
                    ("updates", In::V(u)),
                    ("axis", ci0(0)),
                    ("mode", cstr("add")),
                ],
            )?;
            let mut w = dv.clone();
            for (k, (r, c)) in [(2, 0), (0, 1), (2, 0), (2, 1)].iter().enumerate() {
                w[r * 2 + c] += uv[k];
            }
            p.want(&y, &[3, 2], w, CLOSE)
        },
    ));
    v.push(case(
        "scatter_nd",
        "slices, update",
        &versions("scatter_nd"),
        FP,
        |p| {
            let (d, dv) = p.xs("data", &[3, 2, 2]);
            let (u, uv) = p.xs("updates", &[2, 2]);
            let idx = In::C(Value::Tensor(ITensor::i32(&[2, 2], &[2, 1, 0, 0])));
            let y = p.op(
                "scatter_nd",
                vec![
                    ("data", In::V(d)),
                    ("indices", idx),
                    ("updates", In::V(u)),
                    ("mode", cstr("update")),
                ],
            )?;
            let mut w = dv.clone();
            for (k, (a, b)) in [(2, 1), (0, 0)].iter().enumerate() {
                for c in 0..2 {
                    w[(a * 2 + b) * 2 + c] = uv[k * 2 + c];
                }
            }
            p.want(&y, &[3, 2, 2], w, Cmp::Exact)
        },
    ));

    // ---- quantization ----
    v.push(case(
        "quantize",
        "int8 per axis, uint8 scalar",
        &[I17],
        FP,
        |p| {
            let s = [2, 3];
            let (x, xv) = p.x("input", &s, -3.0, 3.0);
            let sc = [0.02, 0.05, 0.5];
            let zp = In::C(Value::Tensor(ITensor::new(
                DType::I8,
                vec![3],
                milkit::ir::Bytes::from_vec(vec![0u8, 3, 253]),
            )?));
            let ins = vec![
                ("input", In::V(x.clone())),
                ("zero_point", zp),
                ("scale", p.cf(&[3], &sc)),
                ("axis", ci0(1)),
                ("output_dtype", cstr("int8")),
            ];
            let q = p.op("quantize", ins)?;
            let ins = vec![
                ("input", In::V(x)),
                ("scale", p.cs(0.1)),
                ("output_dtype", cstr("uint8")),
            ];
            let u = p.op("quantize", ins)?;
            let zpv = [0.0, 3.0, -3.0];
            let rs: Vec<f64> = sc.iter().map(|&s| p.r(s)).collect();
            let r01 = p.r(0.1);
            let wq = xv
                .iter()
                .enumerate()
                .map(|(i, &e)| {
                    ((e as f32 / rs[i % 3] as f32).round_ties_even() as f64 + zpv[i % 3])
                        .clamp(-128.0, 127.0)
                })
                .collect();
            let wu = xv
                .iter()
                .map(|&e| ((e as f32 / r01 as f32).round_ties_even() as f64).clamp(0.0, 255.0))
                .collect();
            p.want(&q, &s, wq, Cmp::Exact)?;
            p.want(&u, &s, wu, Cmp::Exact)
        },
    ));
    v.push(case(
        "dequantize",
        "uint8 per axis with zero point",
        &[I17],
        FP,
        |p| {
            let qv = [0.0, 17.0, 255.0, 128.0, 3.0, 200.0];
            let q = p.input_of("q", DType::U8, &[3, 2], &qv);
            let sc = [0.5, 0.25, 2.0];
            let zp = In::C(Value::Tensor(ITensor::new(
                DType::U8,
                vec![3],
                milkit::ir::Bytes::from_vec(vec![0u8, 128, 7]),
            )?));
            let ins = vec![
                ("input", In::V(q)),
                ("zero_point", zp),
                ("scale", p.cf(&[3], &sc)),
                ("axis", ci0(0)),
            ];
            let y = p.op("dequantize", ins)?;
            let zpv = [0.0, 128.0, 7.0];
            let w = qv
                .iter()
                .enumerate()
                .map(|(i, &e)| (e - zpv[i / 2]) * p.r(sc[i / 2]))
                .collect();
            p.want(&y, &[3, 2], w, CLOSE)
        },
    ));

    // ---- compressed weights (decoded as coremltools' materialized_val_inference) ----
    v.extend(compression_cases());
    // ---- states ----
    v.extend(state_cases());
    // ---- control flow, lists, random ops ----
    v.extend(control_cases());
    v.extend(list_cases());
    v.extend(random_cases());
    v
}

/// Packs `codes` of `bits` bits LSB-first, as MIL's sub-byte types and iOS16 masks are.
fn pack(codes: &[u8], bits: usize) -> Vec<u8> {
    let mut out = vec![0u8; (codes.len() * bits).div_ceil(8)];
    for (i, &c) in codes.iter().enumerate() {
        for b in 0..bits {
            if c >> b & 1 != 0 {
                let k = i * bits + b;
                out[k / 8] |= 1 << (k % 8);
            }
        }
    }
    out
}

fn sub_byte(dtype: DType, shape: &[usize], codes: &[u8]) -> Result<Value> {
    Ok(Value::Tensor(ITensor::new(
        dtype,
        shape.to_vec(),
        milkit::ir::Bytes::from_vec(pack(codes, dtype.bits())),
    )?))
}

fn compression_cases() -> Vec<Case> {
    let mut v = vec![];
    // A constexpr output goes through `add` with a zero input so the case runs an op on it.
    v.push(case(
        "constexpr_lut_to_dense",
        "iOS18, 2-bit, 2 groups on axis 0",
        &[I18],
        FP,
        |p| {
            let codes: Vec<u8> = (0..8).map(|i| (i * 3 % 4) as u8).collect();
            let lut: Vec<f64> = (0..8).map(|i| i as f64 * 0.5 - 1.0).collect();
            let ins = vec![
                ("indices", In::Inline(sub_byte(DType::U2, &[4, 2], &codes)?)),
                ("lut", In::Inline(p.fval(&[2, 1, 4, 1], &lut))),
            ];
            let w = p.op("constexpr_lut_to_dense", ins)?;
            let want = (0..8)
                .map(|i| p.r(lut[(i / 4) * 4 + codes[i] as usize]))
                .collect();
            p.want(&w, &[4, 2], want, Cmp::Exact)
        },
    ));
    v.push(case(
        "constexpr_lut_to_dense",
        "iOS16, 4-bit packed uint8",
        &[I16],
        FP,
        |p| {
            let codes: Vec<u8> = (0..6).map(|i| (i * 5 % 16) as u8).collect();
            let lut: Vec<f64> = (0..16).map(|i| i as f64 / 4.0 - 2.0).collect();
            let ins = vec![
                ("lut", p.cf(&[16], &lut)),
                (
                    "indices",
                    In::C(Value::Tensor(ITensor::new(
                        DType::U8,
                        vec![3],
                        milkit::ir::Bytes::from_vec(pack(&codes, 4)),
                    )?)),
                ),
                (
                    "shape",
                    In::C(Value::Tensor(ITensor::new(
                        DType::U32,
                        vec![2],
                        milkit::ir::Bytes::from_vec(
                            [2u32, 3].iter().flat_map(|v| v.to_le_bytes()).collect(),
                        ),
                    )?)),
                ),
            ];
            let w = p.op("constexpr_lut_to_dense", ins)?;
            let want = codes.iter().map(|&c| p.r(lut[c as usize])).collect();
            p.want(&w, &[2, 3], want, Cmp::Exact)
        },
    ));
    v.push(case(
        "constexpr_affine_dequantize",
        "uint8 per channel",
        &[I16],
        FP,
        |p| {
            let q: Vec<u8> = vec![0, 10, 200, 255, 128, 7];
            let (zp, sc) = ([128u8, 3], [0.5, 0.125]);
            let ins = vec![
                (
                    "quantized_data",
                    In::C(Value::Tensor(ITensor::new(
                        DType::U8,
                        vec![2, 3],
                        milkit::ir::Bytes::from_vec(q.clone()),
                    )?)),
                ),
                (
                    "zero_point",
                    In::C(Value::Tensor(ITensor::new(
                        DType::U8,
                        vec![2],
                        milkit::ir::Bytes::from_vec(zp.to_vec()),
                    )?)),
                ),
                ("scale", p.cf(&[2], &sc)),
                ("axis", ci0(0)),
            ];
            let w = p.op("constexpr_affine_dequantize", ins)?;
            let want = (0..6)
                .map(|i| p.r((q[i] as f64 - zp[i / 3] as f64) * sc[i / 3]))
                .collect();
            p.want(&w, &[2, 3], want, Cmp::Exact)
        },
    ));
    v.push(case(
        "constexpr_blockwise_shift_scale",
        "int4, blocks of 2 on axis 1, offset",
        &[I18],
        FP,
        |p| {
            let data: Vec<i8> = vec![-8, -3, 0, 7, 5, -1, 2, -6];
            let codes: Vec<u8> = data.iter().map(|&d| (d as u8) & 15).collect();
            let sc = [0.5, 0.25, 1.0, 2.0];
            let off = [1u8, 0, 255, 2];
            let ins = vec![
                ("data", In::Inline(sub_byte(DType::I4, &[2, 4], &codes)?)),
                ("scale", In::Inline(p.fval(&[2, 2], &sc))),
                (
                    "offset",
                    In::Inline(Value::Tensor(ITensor::new(
                        DType::I8,
                        vec![2, 2],
                        milkit::ir::Bytes::from_vec(off.to_vec()),
                    )?)),
                ),
            ];
            let w = p.op("constexpr_blockwise_shift_scale", ins)?;
            let offv = [1.0, 0.0, -1.0, 2.0];
            let want = (0..8)
                .map(|i| {
                    let b = (i / 4) * 2 + (i % 4) / 2;
                    p.r(p.r(sc[b]) * (data[i] as f64 - offv[b]))
                })
                .collect();
            p.want(&w, &[2, 4], want, Cmp::Exact)
        },
    ));
    v.push(case(
        "constexpr_cast",
        "fp16 → fp32",
        &versions("constexpr_cast"),
        &[F16],
        |p| {
            let vals = [1.5, -0.333, 65504.0];
            let hv: Vec<f16> = vals.iter().map(|&v| f16::from_f64(v)).collect();
            let ins = vec![
                ("source_val", In::C(Value::Tensor(ITensor::f16(&[3], &hv)))),
                ("output_dtype", cstr("fp32")),
            ];
            let w = p.op("constexpr_cast", ins)?;
            p.want(
                &w,
                &[3],
                hv.iter().map(|h| h.to_f64()).collect(),
                Cmp::Exact,
            )
        },
    ));
    v.push(case(
        "constexpr_sparse_to_dense",
        "iOS16, uint8 mask bytes",
        &[I16],
        FP,
        |p| {
            let mask = [
                true, false, false, true, true, false, false, false, false, true,
            ];
            let nz = [1.5, -2.0, 0.25, 4.0];
            let ins = vec![
                ("nonzero_data", p.cf(&[4], &nz)),
                (
                    "mask",
                    In::C(Value::Tensor(ITensor::new(
                        DType::U8,
                        vec![2],
                        milkit::ir::Bytes::from_vec(pack(&mask.map(|b| b as u8), 1)),
                    )?)),
                ),
                (
                    "shape",
                    In::C(Value::Tensor(ITensor::new(
                        DType::U32,
                        vec![2],
                        milkit::ir::Bytes::from_vec(
                            [2u32, 5].iter().flat_map(|v| v.to_le_bytes()).collect(),
                        ),
                    )?)),
                ),
            ];
            let w = p.op("constexpr_sparse_to_dense", ins)?;
            let mut k = 0;
            let want = mask
                .iter()
                .map(|&m| {
                    if m {
                        k += 1;
                        nz[k - 1]
                    } else {
                        0.0
                    }
                })
                .collect();
            p.want(&w, &[2, 5], want, Cmp::Exact)
        },
    ));
    v.push(case(
        "constexpr_sparse_to_dense",
        "iOS18, uint1 mask",
        &[I18],
        FP,
        |p| {
            let mask = [1u8, 0, 1, 1, 0, 0];
            let nz = [0.5, -1.0, 3.0];
            let ins = vec![
                ("nonzero_data", In::Inline(p.fval(&[3], &nz))),
                ("mask", In::Inline(sub_byte(DType::U1, &[2, 3], &mask)?)),
            ];
            let w = p.op("constexpr_sparse_to_dense", ins)?;
            p.want(&w, &[2, 3], vec![0.5, 0.0, -1.0, 3.0, 0.0, 0.0], Cmp::Exact)
        },
    ));
    v.push(case(
        "constexpr_lut_to_sparse",
        "1-bit LUT, vector size 2 on axis 0, then sparse_to_dense",
        &[I18],
        FP,
        |p| {
            // coremltools' docstring example.
            let mask = [
                1u8, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 1, 0, 1, 1, 0, 1, 0, 0, 0, 0, 1, 0, 0,
            ];
            let nzi = [0u8, 1, 1, 0, 1, 1, 0, 0, 1];
            let lut = [2.0, 2.0, 3.0, 3.0];
            let ins = vec![
                (
                    "indices_mask",
                    In::Inline(sub_byte(DType::U1, &[4, 6], &mask)?),
                ),
                (
                    "indices_nonzero_data",
                    In::Inline(sub_byte(DType::U1, &[9], &nzi)?),
                ),
                ("lut", In::Inline(p.fval(&[1, 1, 2, 2], &lut))),
                ("vector_axis", ci0(0)),
            ];
            let outs = p.ops("constexpr_lut_to_sparse", ins)?;
            ensure!(outs.len() == 2, "{} outputs", outs.len());
            let dense = p.op(
                "constexpr_sparse_to_dense",
                vec![
                    ("nonzero_data", In::V(outs[1].clone())),
                    ("mask", In::V(outs[0].clone())),
                ],
            )?;
            // Dense [8, 6]: row r of the mask repeated twice, each set entry the palette value.
            let mut want_mask = vec![];
            let mut want_dense = vec![];
            let mut k = 0;
            let mut row_vals = [0.0; 24];
            for (i, &m) in mask.iter().enumerate() {
                if m != 0 {
                    row_vals[i] = if nzi[k] == 0 { 2.0 } else { 3.0 };
                    k += 1;
                }
            }
            for r in 0..4 {
                for _ in 0..2 {
                    for c in 0..6 {
                        want_mask.push(mask[r * 6 + c] as f64);
                        want_dense.push(row_vals[r * 6 + c]);
                    }
                }
            }
            let want_nz: Vec<f64> = want_dense
                .iter()
                .zip(&want_mask)
                .filter(|(_, &m)| m != 0.0)
                .map(|(v, _)| *v)
                .collect();
            let n = want_nz.len();
            p.want(&outs[0], &[8, 6], want_mask, Cmp::Exact)?;
            p.want(&outs[1], &[n], want_nz, Cmp::Exact)?;
            p.want(&dense, &[8, 6], want_dense, Cmp::Exact)
        },
    ));
    v.push(case(
        "constexpr_sparse_blockwise_shift_scale",
        "int8 with offset, then sparse_to_dense",
        &[I18],
        FP,
        |p| {
            // coremltools' docstring example.
            let mask = [1u8, 1, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 0, 0];
            let nz: [i8; 9] = [10, 11, 3, 4, 5, 6, 7, 8, 9];
            let sc = [0.1, 0.2, 0.3, 0.4];
            let off = [1u8, 2, 3, 4];
            let ins = vec![
                (
                    "data_mask",
                    In::Inline(sub_byte(DType::U1, &[4, 4], &mask)?),
                ),
                (
                    "nonzero_data",
                    In::Inline(Value::Tensor(ITensor::new(
                        DType::I8,
                        vec![9],
                        milkit::ir::Bytes::from_vec(nz.iter().map(|&v| v as u8).collect()),
                    )?)),
                ),
                ("scale", In::Inline(p.fval(&[1, 4], &sc))),
                (
                    "offset",
                    In::Inline(Value::Tensor(ITensor::new(
                        DType::I8,
                        vec![1, 4],
                        milkit::ir::Bytes::from_vec(off.to_vec()),
                    )?)),
                ),
            ];
            let outs = p.ops("constexpr_sparse_blockwise_shift_scale", ins)?;
            ensure!(outs.len() == 2, "{} outputs", outs.len());
            let dense = p.op(
                "constexpr_sparse_to_dense",
                vec![
                    ("nonzero_data", In::V(outs[1].clone())),
                    ("mask", In::V(outs[0].clone())),
                ],
            )?;
            let mut k = 0;
            let (mut want_nz, mut want_dense) = (vec![], vec![]);
            for (i, &m) in mask.iter().enumerate() {
                if m != 0 {
                    let c = i % 4;
                    // fp16 programs compute scale · (data − offset) in f32, rounded once.
                    let v = p.r((p.r(sc[c]) as f32 * (nz[k] as f32 - off[c] as f32)) as f64);
                    want_nz.push(v);
                    want_dense.push(v);
                    k += 1;
                } else {
                    want_dense.push(0.0);
                }
            }
            p.want(
                &outs[0],
                &[4, 4],
                mask.iter().map(|&m| m as f64).collect(),
                Cmp::Exact,
            )?;
            p.want(&outs[1], &[9], want_nz, Cmp::Exact)?;
            p.want(&dense, &[4, 4], want_dense, Cmp::Exact)
        },
    ));
    v
}

fn state_cases() -> Vec<Case> {
    vec![
        case(
            "read_state",
            "initial value set by the session",
            &[I18],
            &[F16],
            |p| {
                let st =
                    p.b.input("st", ValueType::State(TensorType::new(F16, &[2, 3])));
                let init: Vec<f64> = p.rand(6, -1.0, 1.0);
                p.states.push((
                    "st".into(),
                    Tensor::from_vec(
                        init.iter().map(|&v| v as f32).collect::<Vec<_>>(),
                        (2, 3),
                        &cpu(),
                    )?,
                ));
                let r = p.op("read_state", vec![("input", In::V(st))])?;
                p.want(&r, &[2, 3], init, Cmp::Exact)
            },
        ),
        case("slice_update", "stride 2 on axis 1", &[I18], FP, |p| {
            let (x, xv) = p.xs("x", &[2, 5]);
            let (u, uv) = p.xs("update", &[2, 3]);
            let y = p.op(
                "slice_update",
                vec![
                    ("x", In::V(x)),
                    ("update", In::V(u)),
                    ("begin", ci(&[0, 0])),
                    ("end", ci(&[2, 5])),
                    ("stride", ci(&[1, 2])),
                ],
            )?;
            let mut w = xv.clone();
            for r in 0..2 {
                for k in 0..3 {
                    w[r * 5 + k * 2] = uv[r * 3 + k];
                }
            }
            p.want(&y, &[2, 5], w, Cmp::Exact)
        }),
    ]
}

/// `cond` on `pred`, both branches returning one value each (the true branch reads `x`
/// from the enclosing scope).
fn cond_of(p: &mut Prog, pred: V, x: &V) -> Result<V> {
    let (two, one) = (p.fval(&[], &[2.0]), p.fval(&[], &[1.0]));
    let xt = x.clone();
    let t = p.b.block(&[], |b, _| {
        Ok(vec![b.op1(
            "mul",
            "twice",
            vec![("x", In::V(xt)), ("y", In::C(two))],
        )?])
    })?;
    let xf = x.clone();
    let f = p.b.block(&[], |b, _| {
        Ok(vec![b.op1(
            "sub",
            "less_one",
            vec![("x", In::V(xf)), ("y", In::C(one))],
        )?])
    })?;
    let mut o =
        p.b.op_with_blocks("cond", "cond", vec![("pred", In::V(pred))], vec![t, f])?;
    Ok(o.remove(0))
}

/// `while i < bound: i += 1; acc = acc · 0.5 + x` from (0, x), `x` read from the enclosing
/// scope; returns (i, acc).
fn halving_loop(p: &mut Prog, x: &V, bound: i32) -> Result<Vec<V>> {
    let tx = p.b.ty(x)?.clone();
    let ti = ValueType::tensor(I32, &[]);
    let i0 = p.b.konst("i0", Value::i32_scalar(0));
    let c =
        p.b.block(&[("i", ti.clone()), ("acc", tx.clone())], |b, v| {
            Ok(vec![b.op1(
                "less",
                "more",
                vec![
                    ("x", In::V(v[0].clone())),
                    ("y", In::C(Value::i32_scalar(bound))),
                ],
            )?])
        })?;
    let half = p.fval(&[], &[0.5]);
    let xb = x.clone();
    let body = p.b.block(&[("i", ti), ("acc", tx)], |b, v| {
        let i = b.op1(
            "add",
            "next",
            vec![
                ("x", In::V(v[0].clone())),
                ("y", In::C(Value::i32_scalar(1))),
            ],
        )?;
        let h = b.op1(
            "mul",
            "halve",
            vec![("x", In::V(v[1].clone())), ("y", In::C(half))],
        )?;
        let a = b.op1("add", "plus_x", vec![("x", In::V(h)), ("y", In::V(xb))])?;
        Ok(vec![i, a])
    })?;
    p.b.op_with_blocks(
        "while_loop",
        "loop",
        vec![("loop_vars", In::Vs(vec![i0, x.clone()]))],
        vec![c, body],
    )
}

fn control_cases() -> Vec<Case> {
    vec![
        case("cond", "both branches, outer values", &[I15], FP, |p| {
            let (x, xv) = p.xs("x", &[2, 3]);
            let s = p.op(
                "reduce_sum",
                vec![("x", In::V(x.clone())), ("keep_dims", cb(false))],
            )?;
            let zero = p.cs(0.0);
            let pos = p.op("greater", vec![("x", In::V(s)), ("y", zero)])?;
            let neg = p.op("logical_not", vec![("x", In::V(pos.clone()))])?;
            let a = cond_of(p, pos, &x)?;
            let b = cond_of(p, neg, &x)?;
            let sum: f64 = xv.iter().sum();
            let t: Vec<f64> = xv.iter().map(|v| p.r(v * 2.0)).collect();
            let f: Vec<f64> = xv.iter().map(|v| p.r(v - 1.0)).collect();
            let (wa, wb) = if sum > 0.0 { (t, f) } else { (f, t) };
            p.want(&a, &[2, 3], wa, Cmp::Exact)?;
            p.want(&b, &[2, 3], wb, Cmp::Exact)
        }),
        case("while_loop", "5 iterations and none", &[I15], FP, |p| {
            let (x, xv) = p.xs("x", &[2, 3]);
            let five = halving_loop(p, &x, 5)?;
            let none = halving_loop(p, &x, 0)?;
            let mut acc = xv.clone();
            for _ in 0..5 {
                acc = acc
                    .iter()
                    .zip(&xv)
                    .map(|(a, x)| p.r(p.r(a * 0.5) + x))
                    .collect();
            }
            p.want(&five[0], &[], vec![5.0], Cmp::Exact)?;
            p.want(&five[1], &[2, 3], acc, CLOSE)?;
            p.want(&none[0], &[], vec![0.0], Cmp::Exact)?;
            p.want(&none[1], &[2, 3], xv, Cmp::Exact)
        }),
        case(
            "while_loop",
            "a cond in the body reads the function's input",
            &[I15],
            FP,
            |p| {
                let (x, xv) = p.xs("x", &[4]);
                let tx = p.b.ty(&x)?.clone();
                let ti = ValueType::tensor(I32, &[]);
                let i0 = p.b.konst("i0", Value::i32_scalar(0));
                let c =
                    p.b.block(&[("i", ti.clone()), ("acc", tx.clone())], |b, v| {
                        let four = In::C(Value::i32_scalar(4));
                        Ok(vec![b.op1(
                            "less",
                            "more",
                            vec![("x", In::V(v[0].clone())), ("y", four)],
                        )?])
                    })?;
                let half = p.fval(&[], &[0.5]);
                let xb = x.clone();
                let body = p.b.block(&[("i", ti), ("acc", tx)], |b, v| {
                    let two = In::C(Value::i32_scalar(2));
                    let early = b.op1(
                        "less",
                        "early",
                        vec![("x", In::V(v[0].clone())), ("y", two)],
                    )?;
                    let acc = v[1].clone();
                    let acc_t = acc.clone();
                    let t = b.block(&[], |b, _| {
                        Ok(vec![b.op1(
                            "add",
                            "plus_x",
                            vec![("x", In::V(acc_t)), ("y", In::V(xb))],
                        )?])
                    })?;
                    let f = b.block(&[], |b, _| {
                        Ok(vec![b.op1(
                            "mul",
                            "halve",
                            vec![("x", In::V(acc)), ("y", In::C(half))],
                        )?])
                    })?;
                    let a =
                        b.op_with_blocks("cond", "step", vec![("pred", In::V(early))], vec![t, f])?;
                    let one = In::C(Value::i32_scalar(1));
                    let i = b.op1("add", "next", vec![("x", In::V(v[0].clone())), ("y", one)])?;
                    Ok(vec![i, a[0].clone()])
                })?;
                let o = p.b.op_with_blocks(
                    "while_loop",
                    "loop",
                    vec![("loop_vars", In::Vs(vec![i0, x.clone()]))],
                    vec![c, body],
                )?;
                let mut acc = xv.clone();
                for k in 0..4 {
                    acc = acc
                        .iter()
                        .zip(&xv)
                        .map(|(a, x)| if k < 2 { p.r(a + x) } else { p.r(a * 0.5) })
                        .collect();
                }
                p.want(&o[1], &[4], acc, Cmp::Exact)
            },
        ),
        case("while_loop", "a list as a loop variable", &[I15], FP, |p| {
            let (x, xv) = p.xs("x", &[3]);
            let ls = make_list(p, 4, false, &[3])?;
            let tl = p.b.ty(&ls)?.clone();
            let tx = p.b.ty(&x)?.clone();
            let ti = ValueType::tensor(I32, &[]);
            let i0 = p.b.konst("i0", Value::i32_scalar(0));
            let c = p.b.block(
                &[("i", ti.clone()), ("acc", tx.clone()), ("ls", tl.clone())],
                |b, v| {
                    Ok(vec![b.op1(
                        "less",
                        "more",
                        vec![
                            ("x", In::V(v[0].clone())),
                            ("y", In::C(Value::i32_scalar(4))),
                        ],
                    )?])
                },
            )?;
            let xb = x.clone();
            let body = p.b.block(&[("i", ti), ("acc", tx), ("ls", tl)], |b, v| {
                let l = b.op1(
                    "list_write",
                    "put",
                    vec![
                        ("ls", In::V(v[2].clone())),
                        ("index", In::V(v[0].clone())),
                        ("value", In::V(v[1].clone())),
                    ],
                )?;
                let i = b.op1(
                    "add",
                    "next",
                    vec![
                        ("x", In::V(v[0].clone())),
                        ("y", In::C(Value::i32_scalar(1))),
                    ],
                )?;
                let a = b.op1(
                    "add",
                    "plus_x",
                    vec![("x", In::V(v[1].clone())), ("y", In::V(xb))],
                )?;
                Ok(vec![i, a, l])
            })?;
            let o = p.b.op_with_blocks(
                "while_loop",
                "loop",
                vec![("loop_vars", In::Vs(vec![i0, x.clone(), ls]))],
                vec![c, body],
            )?;
            let g = p.op(
                "list_gather",
                vec![("ls", In::V(o[2].clone())), ("indices", ci(&[0, 1, 2, 3]))],
            )?;
            // Row k holds (k + 1)·x, summed in k additions of the compute dtype.
            let mut w = vec![];
            let mut acc = xv.clone();
            for _ in 0..4 {
                w.extend(acc.iter().cloned());
                acc = acc.iter().zip(&xv).map(|(a, x)| p.r(a + x)).collect();
            }
            p.want(&g, &[4, 3], w, Cmp::Exact)
        }),
    ]
}

/// `make_list` of `n` elements of the case's dtype and shape `shape`.
fn make_list(p: &mut Prog, n: i32, dynamic: bool, shape: &[i32]) -> Result<V> {
    let dims: Vec<V> = shape
        .iter()
        .map(|&d| p.b.konst("elem_dim", Value::i32_scalar(d)))
        .collect();
    let dt = p.dt.name();
    p.op(
        "make_list",
        vec![
            ("init_length", ci0(n)),
            ("dynamic_length", cb(dynamic)),
            ("elem_shape", In::Vs(dims)),
            ("dtype", cstr(dt)),
        ],
    )
}

fn write(p: &mut Prog, ls: V, i: i32, v: &V) -> Result<V> {
    p.op(
        "list_write",
        vec![
            ("ls", In::V(ls)),
            ("index", ci0(i)),
            ("value", In::V(v.clone())),
        ],
    )
}

fn list_cases() -> Vec<Case> {
    vec![
        case(
            "make_list",
            "fixed length, never written elements read as zeros",
            &[I15],
            FP,
            |p| {
                let ls = make_list(p, 3, false, &[2, 2])?;
                let n = p.op("list_length", vec![("ls", In::V(ls.clone()))])?;
                let r = p.op("list_read", vec![("ls", In::V(ls)), ("index", ci0(2))])?;
                p.want(&n, &[], vec![3.0], Cmp::Exact)?;
                p.want(&r, &[2, 2], vec![0.0; 4], Cmp::Exact)
            },
        ),
        case(
            "list_length",
            "a dynamic list grows on a write past its end",
            &[I15],
            FP,
            |p| {
                let (x, _) = p.xs("x", &[2]);
                let ls = make_list(p, 1, true, &[2])?;
                let ls = write(p, ls, 4, &x)?;
                let n = p.op("list_length", vec![("ls", In::V(ls))])?;
                p.want(&n, &[], vec![5.0], Cmp::Exact)
            },
        ),
        case(
            "list_write",
            "overwrite and keep the old list",
            &[I15],
            FP,
            |p| {
                let (x, xv) = p.xs("x", &[2, 3]);
                let (y, yv) = p.xs("y", &[2, 3]);
                let l0 = make_list(p, 2, false, &[2, 3])?;
                let l1 = write(p, l0, 0, &x)?;
                let l2 = write(p, l1.clone(), 0, &y)?;
                let a = p.op("list_read", vec![("ls", In::V(l1)), ("index", ci0(0))])?;
                let b = p.op("list_read", vec![("ls", In::V(l2)), ("index", ci0(0))])?;
                p.want(&a, &[2, 3], xv, Cmp::Exact)?;
                p.want(&b, &[2, 3], yv, Cmp::Exact)
            },
        ),
        case("list_read", "an index from the data", &[I15], FP, |p| {
            let (x, xv) = p.xs("x", &[4]);
            let (y, yv) = p.xs("y", &[4]);
            let i = p.input_of("i", I32, &[], &[1.0]);
            let l = make_list(p, 2, false, &[4])?;
            let l = write(p, l, 0, &x)?;
            let l = write(p, l, 1, &y)?;
            let r = p.op(
                "list_read",
                vec![("ls", In::V(l.clone())), ("index", In::V(i))],
            )?;
            let r0 = p.op("list_read", vec![("ls", In::V(l)), ("index", ci0(0))])?;
            p.want(&r, &[4], yv, Cmp::Exact)?;
            p.want(&r0, &[4], xv, Cmp::Exact)
        }),
        case("list_gather", "repeated indices", &[I15], FP, |p| {
            let (x, xv) = p.xs("x", &[2, 2]);
            let (y, yv) = p.xs("y", &[2, 2]);
            let l = make_list(p, 3, false, &[2, 2])?;
            let l = write(p, l, 0, &x)?;
            let l = write(p, l, 2, &y)?;
            let g = p.op(
                "list_gather",
                vec![("ls", In::V(l)), ("indices", ci(&[2, 0, 2, 1]))],
            )?;
            let mut w = yv.clone();
            w.extend(&xv);
            w.extend(&yv);
            w.extend([0.0; 4]);
            p.want(&g, &[4, 2, 2], w, Cmp::Exact)
        }),
        case("list_scatter", "rows to a dynamic list", &[I15], FP, |p| {
            let (v, vv) = p.xs("v", &[2, 3]);
            let l = make_list(p, 1, true, &[3])?;
            let l = p.op(
                "list_scatter",
                vec![
                    ("ls", In::V(l)),
                    ("indices", ci(&[2, 0])),
                    ("value", In::V(v)),
                ],
            )?;
            let n = p.op("list_length", vec![("ls", In::V(l.clone()))])?;
            let g = p.op(
                "list_gather",
                vec![("ls", In::V(l)), ("indices", ci(&[0, 1, 2]))],
            )?;
            let mut w = vv[3..].to_vec();
            w.extend([0.0; 3]);
            w.extend(&vv[..3]);
            p.want(&n, &[], vec![3.0], Cmp::Exact)?;
            p.want(&g, &[3, 3], w, Cmp::Exact)
        }),
    ]
}

/// Degenerate distributions, whose draws are known exactly; the distributions themselves
/// are checked statistically in `tests/random_ops.rs`.
fn random_cases() -> Vec<Case> {
    vec![
        case("random_bernoulli", "prob 0 and 1", &[I15], FP, |p| {
            let (p0, p1) = (p.cs(0.0), p.cs(1.0));
            let a = p.op(
                "random_bernoulli",
                vec![("shape", ci(&[3, 4])), ("prob", p0)],
            )?;
            let b = p.op("random_bernoulli", vec![("shape", ci(&[5])), ("prob", p1)])?;
            p.want(&a, &[3, 4], vec![0.0; 12], Cmp::Exact)?;
            p.want(&b, &[5], vec![1.0; 5], Cmp::Exact)
        }),
        case("random_normal", "stddev 0", &[I15], FP, |p| {
            let (m, s) = (p.cs(0.75), p.cs(0.0));
            let a = p.op(
                "random_normal",
                vec![("shape", ci(&[2, 3])), ("mean", m), ("stddev", s)],
            )?;
            p.want(&a, &[2, 3], vec![0.75; 6], Cmp::Exact)
        }),
        case("random_uniform", "low = high", &[I15], FP, |p| {
            let (lo, hi) = (p.cs(-0.25), p.cs(-0.25));
            let a = p.op(
                "random_uniform",
                vec![
                    ("shape", ci(&[4])),
                    ("low", lo),
                    ("high", hi),
                    ("seed", ci0(7)),
                ],
            )?;
            p.want(&a, &[4], vec![-0.25; 4], Cmp::Exact)
        }),
        case(
            "random_categorical",
            "one-hot probabilities",
            &[I15],
            FP,
            |p| {
                let x = p.cf(&[2, 3], &[0.0, 0.0, 1.0, 1.0, 0.0, 0.0]);
                let a = p.op(
                    "random_categorical",
                    vec![("x", x), ("mode", cstr("probs")), ("size", ci0(3))],
                )?;
                p.want(&a, &[2, 3], vec![2.0, 2.0, 2.0, 0.0, 0.0, 0.0], Cmp::Exact)
            },
        ),
    ]
}

// ---------------------------------------------------------------------------------------
// The tests.

#[test]
fn the_op_list_the_definitions_and_the_table_agree() {
    let all: BTreeSet<&str> = COREML_OPS.iter().map(|(n, _)| *n).collect();
    assert_eq!(all.len(), 167, "coremltools 9 defines 167 public ops");
    let table = cases();
    let covered: BTreeSet<&str> = table.iter().map(|c| c.op.as_str()).collect();
    let missing: BTreeSet<&str> = MISSING.iter().map(|(n, _)| *n).collect();
    let mut problems = vec![];
    for (op, opsets) in COREML_OPS {
        let lacks = missing.contains(op);
        for &o in *opsets {
            match (milkit::ops::lookup(op, o), lacks) {
                (Some(d), false) if d.eval.is_none() => {
                    problems.push(format!("{op}: no evaluation"))
                }
                (Some(_), true) => problems.push(format!("{op} is defined but listed in MISSING")),
                (None, false) => {
                    problems.push(format!("{op} has no definition in {}", o.opset_name()))
                }
                _ => {}
            }
        }
        if !lacks && !covered.contains(op) {
            problems.push(format!("{op} has no conformance case"));
        }
    }
    for c in &table {
        for &o in &c.opsets {
            if milkit::ops::lookup(&c.op, o).is_none() {
                problems.push(format!(
                    "case {} ({}) at {}: op not defined there",
                    c.op,
                    c.what,
                    o.opset_name()
                ));
            }
        }
    }
    for opset in [I15, I16, I17, I18] {
        let defined: Vec<&str> = COREML_OPS
            .iter()
            .filter(|(n, _)| milkit::ops::lookup(n, opset).is_some())
            .map(|(n, _)| *n)
            .collect();
        let exists = COREML_OPS
            .iter()
            .filter(|(_, v)| v.iter().any(|&o| o <= opset))
            .count();
        eprintln!(
            "{}: milkit runs {} of the {exists} coremltools ops available",
            opset.opset_name(),
            defined.len()
        );
    }
    eprintln!(
        "still missing ({}): {}",
        MISSING.len(),
        MISSING
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(", ")
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_case_matches_its_float64_reference_at_every_opset_and_dtype() {
    let mut failures = vec![];
    let mut runs = 0;
    for (i, c) in cases().iter().enumerate() {
        for &o in &c.opsets {
            for &dt in &c.dts {
                runs += 1;
                if let Err(e) = run_case(c, o, dt, 1000 + i as u64) {
                    failures.push(format!(
                        "{} ({}) {} {dt}: {e:#}",
                        c.op,
                        c.what,
                        o.opset_name()
                    ));
                }
            }
        }
    }
    eprintln!("{runs} case runs");
    assert!(
        failures.is_empty(),
        "{} of {runs} failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// A function holding one op by hand (the Builder refuses ops it does not know).
fn raw_package(dir: &std::path::Path, opset: Opset, op_type: &str) -> std::path::PathBuf {
    let x = milkit::ir::Var {
        name: "x".into(),
        ty: ValueType::tensor(F32, &[2, 3]),
    };
    let mut inputs = std::collections::BTreeMap::new();
    for p in ["query", "key", "value", "x"] {
        inputs.insert(p.to_string(), vec![milkit::ir::Arg::Var("x".into())]);
    }
    let op = milkit::ir::Operation {
        op_type: op_type.into(),
        name: "y".into(),
        inputs,
        outputs: vec![milkit::ir::Var {
            name: "y".into(),
            ty: ValueType::tensor(F32, &[2, 3]),
        }],
        blocks: vec![],
        attributes: Default::default(),
    };
    let mut program = Program::default();
    program.functions.insert(
        "main".into(),
        Function {
            inputs: vec![x],
            opset,
            block: Block {
                inputs: vec![],
                operations: vec![op],
                outputs: vec!["y".into()],
            },
        },
    );
    let m = Model {
        spec_version: opset.spec_version(),
        description: Description::default(),
        program,
    };
    let p = dir.join(format!("{op_type}.mlpackage"));
    milkit::package::save_package(&m, &p, false, &mut |_| {}).unwrap();
    p
}

#[test]
fn an_op_the_interpreter_lacks_or_a_newer_opset_has_is_named_with_the_opset() {
    let dir = tempfile::tempdir().unwrap();
    for (opset, op, needs) in [
        (I15, "made_up_op", None),
        (I17, "scaled_dot_product_attention", Some("CoreML8")),
        (I15, "fill_like", Some("CoreML6")),
    ] {
        let pkg = raw_package(dir.path(), opset, op);
        let e = match Session::load(&pkg) {
            Ok(_) => panic!("{op} in {} loaded", opset.opset_name()),
            Err(e) => format!("{e:#}"),
        };
        assert!(e.contains(op) && e.contains(opset.opset_name()), "{e}");
        if let Some(n) = needs {
            assert!(e.contains(n), "{e}");
        }
    }
}
