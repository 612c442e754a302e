//! Op conformance: one table ([`cases`]) of op × opset × compute dtype, each case a small
//! program built with `ops::Builder`, saved as an `.mlpackage`, loaded back and run by the
//! runtime, compared with float64 reference maths written here (never milkit's kernels):
//! fp32 outputs allclose (rtol 1e-4, atol 1e-5 × the case's scale, e.g. the number of
//! terms of a reduction), fp16 outputs PSNR ≥ 40 dB, exact equality for indexing, data
//! movement, comparisons and integer outputs. [`COREML_OPS`] is coremltools 9's public
//! iOS15–iOS18 op list (the opsets each defines a version in); a test keeps it, milkit's
//! op definitions, the table and [`MISSING`] consistent, and prints the count per opset.
//! Every case also runs from the package coremltools 9 makes of it with its own MIL builder
//! and serializer (tests/coremltools_rebuild.py), against the same references.
//! An op milkit lacks fails to load with an error naming the op and the opset.

mod common;

use anyhow::{ensure, Context, Result};
use common::rng::Rng;
use half::f16;
use milkit::ir::{
    ArrayDType, Block, DType, Description, DictKey, Feature, FeatureKind, Function, Model, Opset,
    Program, Tensor as ITensor, TensorType, Value, ValueType,
};
use milkit::ops::{Builder, In, V};
use milkit::runtime::{DictKeys, Output, Session, Tensor};
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

/// Ops of [`COREML_OPS`] the interpreter does not run yet, and why (none left).
const MISSING: &[(&str, &str)] = &[];

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

/// A class of a `classify`: int64 or string.
#[derive(Clone, Debug, PartialEq)]
enum Class {
    I(i64),
    S(String),
}

/// What a `classify` must return: the label (exact) and every class with its probability
/// (in class order; probabilities compared as [`CLOSE`] floats of the case's dtype).
#[derive(Clone, Debug)]
struct ClassWant {
    label: Class,
    probs: Vec<(Class, f64)>,
}

/// A program under construction, its inputs and its expected outputs.
struct Prog {
    b: Builder,
    /// The opset the case is built for.
    opset: Opset,
    /// The compute dtype of the case (float inputs and constants are of it).
    dt: DType,
    rng: Rng,
    feeds: Vec<(String, Tensor)>,
    states: Vec<(String, Tensor)>,
    outs: Vec<(V, Vec<usize>, Vec<f64>, Cmp)>,
    /// A `classify`'s (label, dictionary) outputs and their reference.
    class: Option<(V, V, ClassWant)>,
}

fn cpu() -> candle_core::Device {
    candle_core::Device::Cpu
}

impl Prog {
    fn new(opset: Opset, dt: DType, seed: u64) -> Prog {
        Prog {
            b: Builder::new(opset),
            opset,
            dt,
            rng: Rng(seed),
            feeds: vec![],
            states: vec![],
            outs: vec![],
            class: None,
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

    /// Expects a `classify`'s outputs (label, dictionary) to hold `want`. They become the
    /// model's outputs `label` and `label_probs`, first, with the classifier description
    /// coremltools writes (a classify's outputs feed no op, not even an identity).
    fn want_class(&mut self, outs: &[V], want: ClassWant) -> Result<()> {
        ensure!(
            outs.len() == 2 && self.class.is_none(),
            "one classify (2 outputs) per case"
        );
        self.class = Some((outs[0].clone(), outs[1].clone(), want));
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

/// One case built for one opset and compute dtype: the model, what to feed it and what it
/// must return (output name, shape, reference values, comparison).
struct Built {
    model: Model,
    feeds: Vec<(String, Tensor)>,
    states: Vec<(String, Tensor)>,
    outs: Vec<(String, Vec<usize>, Vec<f64>, Cmp)>,
    class: Option<ClassWant>,
    dt: DType,
}

/// Builds one case into a model whose outputs are `y0`, `y1`, …. With `core_ml_outputs`,
/// only outputs Core ML can return (fp16, fp32, int32) are kept: a bool one, or an 8- or
/// 16-bit integer one from iOS17 on, through a cast to int32; a sub-byte one (a sparse
/// mask) is left out. coremltools refuses the others ("ML Program models only support fp32
/// and int32 outputs"); milkit's own run checks them as they are.
fn build_case(
    case: &Case,
    opset: Opset,
    dt: DType,
    seed: u64,
    core_ml_outputs: bool,
) -> Result<Built> {
    let mut p = Prog::new(opset, dt, seed);
    (case.f)(&mut p).context("building")?;
    let Prog {
        mut b,
        feeds,
        states,
        mut outs,
        class,
        ..
    } = p;
    if core_ml_outputs {
        let mut kept = vec![];
        for (v, shape, want, cmp) in outs {
            let d = b.ty(&v)?.as_tensor().map(|t| t.dtype);
            let castable = d == Some(Bool)
                || (opset >= I17
                    && matches!(d, Some(DType::U8 | DType::I8 | DType::U16 | DType::I16)));
            if matches!(d, Some(F16 | F32 | I32)) {
                kept.push((v, shape, want, cmp));
            } else if castable {
                let c = b.op1(
                    "cast",
                    "cast",
                    vec![("x", In::V(v)), ("dtype", cstr("int32"))],
                )?;
                kept.push((c, shape, want, cmp));
            }
        }
        ensure!(
            !kept.is_empty() || class.is_some(),
            "no output Core ML can return"
        );
        outs = kept;
    }
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
    let mut pairs: Vec<(V, &str)> = vec![];
    if let Some((label, probs, _)) = &class {
        pairs.push((label.clone(), "label"));
        pairs.push((probs.clone(), "label_probs"));
    }
    pairs.extend(
        outs.iter()
            .zip(&names)
            .map(|((v, ..), n)| (v.clone(), n.as_str())),
    );
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
    if let Some((_, _, want)) = &class {
        let (label, key) = match want.label {
            Class::I(_) => (FeatureKind::Int64, DictKey::Int64),
            Class::S(_) => (FeatureKind::String, DictKey::String),
        };
        desc.outputs.push(Feature::of_kind("label", label));
        desc.outputs
            .push(Feature::of_kind("label_probs", FeatureKind::Dict(key)));
        desc.predicted_feature = "label".into();
        desc.predicted_probabilities = "label_probs".into();
    }
    for ((_, shape, ..), (n, ty)) in outs.iter().zip(names.iter().zip(&out_types)) {
        let mut f = feature(n, ty);
        f.shape = shape.clone();
        desc.outputs.push(f);
    }
    let model = Model::single(opset, inputs, block, desc);
    let outs = outs
        .into_iter()
        .zip(names)
        .map(|((_, shape, want, cmp), n)| (n, shape, want, cmp))
        .collect();
    Ok(Built {
        model,
        feeds,
        states,
        outs,
        class: class.map(|(_, _, w)| w),
        dt,
    })
}

/// Loads the package at `pkg`, sets the case's states, feeds it and checks every output
/// (found by name) against its reference.
fn check_package(pkg: &std::path::Path, built: &Built) -> Result<()> {
    let mut s = Session::load(pkg).context("loading")?;
    for (n, t) in &built.states {
        s.set_state(n, t.clone())?;
    }
    let feeds: Vec<(&str, Tensor)> = built
        .feeds
        .iter()
        .map(|(n, t)| (n.as_str(), t.clone()))
        .collect();
    let got = s.predict_values(None, &feeds).context("running")?;
    let n_class = if built.class.is_some() { 2 } else { 0 };
    ensure!(
        got.len() == built.outs.len() + n_class,
        "{} outputs",
        got.len()
    );
    let output = |name: &str| {
        got.iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
            .with_context(|| format!("no output {name}"))
    };
    for (name, shape, want, cmp) in &built.outs {
        let Output::Tensor(t) = output(name)? else {
            anyhow::bail!("output {name} is not a tensor");
        };
        compare(t, shape, want, *cmp).with_context(|| format!("output {name}"))?;
    }
    if let Some(want) = &built.class {
        check_class(output("label")?, output("label_probs")?, want, built.dt)?;
    }
    Ok(())
}

/// A `classify`'s label (exact) and dictionary (the classes exactly, in order; the
/// probabilities as [`CLOSE`] floats: allclose for fp32 compute, PSNR for fp16).
fn check_class(label: &Output, probs: &Output, want: &ClassWant, dt: DType) -> Result<()> {
    let got_label = match label {
        Output::Strings(s) if s.len() == 1 => Class::S(s[0].clone()),
        Output::Tensor(t) if t.dims().is_empty() && t.dtype() == candle_core::DType::I64 => {
            Class::I(t.to_scalar::<i64>()?)
        }
        o => anyhow::bail!("label: {} instead of one class", o.kind()),
    };
    ensure!(
        got_label == want.label,
        "label {got_label:?}, want {:?}",
        want.label
    );
    let Output::Dict(d) = probs else {
        anyhow::bail!("label_probs: {} instead of a dictionary", probs.kind());
    };
    let keys: Vec<Class> = match &d.keys {
        DictKeys::Int64(k) => k.iter().map(|&x| Class::I(x)).collect(),
        DictKeys::Str(k) => k.iter().map(|x| Class::S(x.clone())).collect(),
    };
    let want_keys: Vec<Class> = want.probs.iter().map(|(k, _)| k.clone()).collect();
    ensure!(keys == want_keys, "classes {keys:?}, want {want_keys:?}");
    ensure!(
        d.values.dtype() == candle_core::DType::F64,
        "probabilities stored as {:?}, not fp64",
        d.values.dtype()
    );
    let got: Vec<f64> = d.values.to_vec1()?;
    let w: Vec<f64> = want.probs.iter().map(|(_, p)| *p).collect();
    compare_values(&got, &w, CLOSE, dt == F16).context("label_probs")
}

/// Builds, saves, loads and runs one case; checks every expected output.
fn run_case(case: &Case, opset: Opset, dt: DType, seed: u64) -> Result<()> {
    let built = build_case(case, opset, dt, seed, false)?;
    let dir = tempfile::tempdir()?;
    let pkg = dir.path().join("case.mlpackage");
    milkit::package::save_package(&built.model, &pkg, false, &mut |_| {}).context("saving")?;
    check_package(&pkg, &built)
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
    compare_values(&got, want, cmp, t.dtype() == candle_core::DType::F16)
}

/// [`compare`] on values; `fp16`: a float comparison is by PSNR.
fn compare_values(got: &[f64], want: &[f64], cmp: Cmp, fp16: bool) -> Result<()> {
    ensure!(
        got.len() == want.len(),
        "{} values, expected {}",
        got.len(),
        want.len()
    );
    match cmp {
        Cmp::Exact => {
            for (i, (g, w)) in got.iter().zip(want).enumerate() {
                ensure!(
                    g == w || (g.is_nan() && w.is_nan()),
                    "[{i}]: got {g}, want {w} (exact)"
                );
            }
        }
        Cmp::Float(scale) if fp16 => {
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
        "alpha per channel, rank 4",
        &versions("prelu"),
        FP,
        |p| {
            let s = [2, 3, 2, 2];
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
        case(
            "reduce_argmax",
            "iOS17 output_dtype uint16",
            &[I17],
            FP,
            |p| {
                let xv = vec![0.5, -1.0, 2.0, 2.0, 0.25, -3.0];
                let dt = p.dt;
                let x = p.input_of("x", dt, &[2, 3], &xv);
                let y = p.op(
                    "reduce_argmax",
                    vec![("x", In::V(x)), ("output_dtype", cstr("uint16"))],
                )?;
                ensure!(p.b.ty(&y)?.as_tensor().map(|t| t.dtype) == Some(DType::U16));
                // First maximum of each row.
                p.want(&y, &[2], vec![2.0, 0.0], Cmp::Exact)
            },
        ),
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
        "conv",
        "3-D, stride 2 on depth, dilation on width, custom pad, bias",
        &versions("conv"),
        FP,
        |p| {
            let (cin, d, h, wd, co, k) = (2usize, 5usize, 4usize, 6usize, 3usize, 2usize);
            let (x, xv) = p.xs("x", &[1, cin, d, h, wd]);
            let wv = p.rand(co * cin * k * k * k, -1.0, 1.0);
            let bv = p.rand(co, -1.0, 1.0);
            let ins = vec![
                ("x", In::V(x)),
                ("weight", p.cf(&[co, cin, k, k, k], &wv)),
                ("bias", p.cf(&[co], &bv)),
                ("strides", ci(&[2, 1, 1])),
                ("pad_type", cstr("custom")),
                ("pad", ci(&[1, 0, 0, 1, 0, 0])),
                ("dilations", ci(&[1, 1, 2])),
            ];
            let y = p.op("conv", ins)?;
            // Padded depth 6 → 3 positions at stride 2; height 5 → 4; width 6 - 2 = 4.
            let (od, oh, ow) = ((d + 1 - k) / 2 + 1, h + 1 - k + 1, wd - (k - 1) * 2);
            let mut w = vec![0.0; co * od * oh * ow];
            for o in 0..co {
                for z in 0..od {
                    for i in 0..oh {
                        for j in 0..ow {
                            let mut acc = bv[o];
                            for c in 0..cin {
                                for a in 0..k {
                                    for b in 0..k {
                                        for e in 0..k {
                                            let zz = (z * 2 + a) as i64 - 1;
                                            let (yy, xx) = (i + b, j + e * 2);
                                            if zz >= 0 && (zz as usize) < d && yy < h && xx < wd {
                                                acc += wv
                                                    [(((o * cin + c) * k + a) * k + b) * k + e]
                                                    * xv[((c * d + zz as usize) * h + yy) * wd
                                                        + xx];
                                            }
                                        }
                                    }
                                }
                            }
                            w[((o * od + z) * oh + i) * ow + j] = acc;
                        }
                    }
                }
            }
            p.want(&y, &[1, co, od, oh, ow], w, Cmp::Float(18.0))
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
        "reshape",
        "0 counted from the right, 1 where no axis lines up (iOS17)",
        &[I17],
        FP,
        |p| {
            let (x, xv) = p.xs("x", &[2, 3]);
            let y = p.op(
                "reshape",
                vec![("x", In::V(x)), ("shape", ci(&[1, 0, -1, 0]))],
            )?;
            p.want(&y, &[1, 1, 2, 3], xv, Cmp::Exact)
        },
    ));
    v.push(case(
        "reshape",
        "0 counted from the right in a shorter target (iOS17)",
        &[I17],
        FP,
        |p| {
            let (x, xv) = p.xs("x", &[2, 3, 4]);
            let y = p.op("reshape", vec![("x", In::V(x)), ("shape", ci(&[-1, 0]))])?;
            p.want(&y, &[6, 4], xv, Cmp::Exact)
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
    // A squeezed axis reads the element at `begin` whatever `end` says (here end = begin,
    // as coremltools writes for a causal mask's row).
    v.push(case(
        "slice_by_index",
        "squeeze with end = begin",
        &versions("slice_by_index"),
        FP,
        |p| {
            let s = [3, 4];
            let (x, xv) = p.xs("x", &s);
            let y = p.op(
                "slice_by_index",
                vec![
                    ("x", In::V(x)),
                    ("begin", ci(&[2, 0])),
                    ("end", ci(&[2, 4])),
                    (
                        "squeeze_mask",
                        In::C(Value::Tensor(ITensor::bools(&[2], &[true, false]))),
                    ),
                ],
            )?;
            let w = (0..4).map(|c| xv[ravel(&s, &[2, c])]).collect();
            p.want(&y, &[4], w, Cmp::Exact)
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
    // A negative axis counts as a Python slice does: -1 keeps the last dimension apart.
    v.push(case("flatten2d", "axis -1", &[I15], FP, |p| {
        let (x, xv) = p.xs("x", &[2, 3, 4]);
        let y = p.op("flatten2d", vec![("x", In::V(x)), ("axis", ci0(-1))])?;
        p.want(&y, &[6, 4], xv, Cmp::Exact)
    }));
    v.push(case("flatten2d", "axis -3", &[I15], FP, |p| {
        let (x, xv) = p.xs("x", &[2, 3, 4]);
        let y = p.op("flatten2d", vec![("x", In::V(x)), ("axis", ci0(-3))])?;
        p.want(&y, &[1, 24], xv, Cmp::Exact)
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
            let idx = In::C(Value::Tensor(ITensor::i32(&[2, 2], &[2, 0, 2, 2])));
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
    // ---- transposed / quantized convolution, resampling, recurrent ----
    v.extend(conv_resample_cases());
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
        "iOS18, 3-bit, vector size 2 on axis 0, 2 groups",
        &[I18],
        FP,
        |p| {
            // indices [4, 3] → output [8, 3]: rows 2r and 2r+1 take components 0 and 1 of
            // entry indices[r, j] of table r / 2.
            let codes: Vec<u8> = (0..12).map(|i| (i * 5 % 8) as u8).collect();
            let lut: Vec<f64> = (0..32).map(|i| i as f64 * 0.25 - 4.0).collect();
            let ins = vec![
                ("indices", In::Inline(sub_byte(DType::U3, &[4, 3], &codes)?)),
                ("lut", In::Inline(p.fval(&[2, 1, 8, 2], &lut))),
                ("vector_axis", ci0(0)),
            ];
            let w = p.op("constexpr_lut_to_dense", ins)?;
            let want = (0..24)
                .map(|i| {
                    let (o, j) = (i / 3, i % 3);
                    let code = codes[(o / 2) * 3 + j] as usize;
                    p.r(lut[((o / 4) * 8 + code) * 2 + o % 2])
                })
                .collect();
            p.want(&w, &[8, 3], want, Cmp::Exact)
        },
    ));
    v.push(case(
        "constexpr_lut_to_dense",
        "iOS18, 2-bit, vector size 2 on axis 1 (the last)",
        &[I18],
        FP,
        |p| {
            // indices [2, 3] → output [2, 6]: columns 2j and 2j+1 from entry indices[i, j].
            let codes: Vec<u8> = vec![0, 3, 1, 2, 2, 0];
            let lut: Vec<f64> = vec![1.0, -1.0, 0.5, 2.0, -3.0, 0.25, 4.0, -0.5];
            let ins = vec![
                ("indices", In::Inline(sub_byte(DType::U2, &[2, 3], &codes)?)),
                ("lut", In::Inline(p.fval(&[1, 1, 4, 2], &lut))),
                ("vector_axis", ci0(-1)),
            ];
            let w = p.op("constexpr_lut_to_dense", ins)?;
            let want = (0..12)
                .map(|i| {
                    let (r, c) = (i / 6, i % 6);
                    p.r(lut[codes[r * 3 + c / 2] as usize * 2 + c % 2])
                })
                .collect();
            p.want(&w, &[2, 6], want, Cmp::Exact)
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
            // The offset is of data's dtype (coremltools allows that or a float).
            let off = [1u8, 0, 15, 2];
            let ins = vec![
                ("data", In::Inline(sub_byte(DType::I4, &[2, 4], &codes)?)),
                ("scale", In::Inline(p.fval(&[2, 2], &sc))),
                ("offset", In::Inline(sub_byte(DType::I4, &[2, 2], &off)?)),
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
            // Core ML has no rank-0 inputs: a [1] input squeezed to the scalar index.
            let i = p.input_of("i", I32, &[1], &[1.0]);
            let i = p.op("squeeze", vec![("x", In::V(i))])?;
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
// Transposed and quantized convolution, resampling, recurrent ops.

/// Transposed convolution by its definition, gathered per output element:
/// `y[n, g·Cog+oc, o] = b + Σ x[n, g·Cig+ic, i] · w[g·Cig+ic, oc, k]` over `i·s + k·d = o + before`.
#[allow(clippy::too_many_arguments)]
fn conv_transpose_ref(
    xv: &[f64],
    xs: &[usize],
    wv: &[f64],
    ws: &[usize],
    bias: Option<&[f64]>,
    groups: usize,
    s: &[usize],
    d: &[usize],
    before: &[usize],
    out_sp: &[usize],
) -> (Vec<f64>, Vec<usize>) {
    let (n, cin, cog) = (xs[0], xs[1], ws[1]);
    let (cig, cout) = (cin / groups, cog * groups);
    let mut os = vec![n, cout];
    os.extend_from_slice(out_sp);
    let (din, k) = (&xs[2..], &ws[2..]);
    let out = (0..numel(&os))
        .map(|e| {
            let c = unravel(&os, e);
            let (b, co) = (c[0], c[1]);
            let (g, oc) = (co / cog, co % cog);
            let mut acc = bias.map_or(0.0, |bv| bv[co]);
            for ic in 0..cig {
                let ci = g * cig + ic;
                for kk in 0..numel(k) {
                    let kc = unravel(k, kk);
                    // The input position this tap reads, if integral and inside.
                    let mut ipos = vec![];
                    for a in 0..din.len() {
                        let num = (c[2 + a] + before[a]) as i64 - (kc[a] * d[a]) as i64;
                        if num < 0
                            || num % s[a] as i64 != 0
                            || (num / s[a] as i64) as usize >= din[a]
                        {
                            break;
                        }
                        ipos.push((num / s[a] as i64) as usize);
                    }
                    if ipos.len() < din.len() {
                        continue;
                    }
                    let mut xi = vec![b, ci];
                    xi.extend_from_slice(&ipos);
                    let mut wi = vec![ci, oc];
                    wi.extend_from_slice(&kc);
                    acc += xv[ravel(xs, &xi)] * wv[ravel(ws, &wi)];
                }
            }
            acc
        })
        .collect();
    (out, os)
}

fn conv_resample_cases() -> Vec<Case> {
    let mut v = vec![];
    // (what, x shape, weight shape, groups, strides, dilations, pad_type, pad, output_shape,
    //  before pads of the reference, output spatial shape)
    type Ct = (
        &'static str,
        Vec<usize>,
        Vec<usize>,
        usize,
        Vec<usize>,
        Vec<usize>,
        &'static str,
        Option<Vec<i32>>,
        Option<Vec<i32>>,
        Vec<usize>,
        Vec<usize>,
    );
    let cts: Vec<Ct> = vec![
        (
            "2-D, groups 2, strides 2x1, dilations 1x2, custom pad, bias",
            vec![1, 4, 3, 4],
            vec![4, 3, 3, 2],
            2,
            vec![2, 1],
            vec![1, 2],
            "custom",
            Some(vec![1, 0, 0, 2]),
            None,
            vec![1, 0],
            // (3-1)·2 + 3 - 1 = 6; (4-1)·1 + (2-1)·2 + 1 - 2 = 4
            vec![6, 4],
        ),
        (
            "1-D, same, stride 2 (output D·s)",
            vec![2, 3, 5],
            vec![3, 2, 3],
            1,
            vec![2],
            vec![1],
            "same",
            None,
            None,
            // full (5-1)·2 + 3 = 11, out 10: one cut, before 0
            vec![0],
            vec![10],
        ),
        (
            "2-D, same with output_shape [1, 4, 5, 7], stride 2, groups 2",
            vec![1, 2, 3, 4],
            vec![2, 2, 3, 3],
            2,
            vec![2, 2],
            vec![1, 1],
            "same",
            None,
            Some(vec![1, 4, 5, 7]),
            // full 7 and 9: cuts 2 and 2, before 1 and 1
            vec![1, 1],
            vec![5, 7],
        ),
        (
            "3-D, valid, strides 1x2x1",
            vec![1, 2, 2, 3, 2],
            vec![2, 2, 2, 2, 3],
            1,
            vec![1, 2, 1],
            vec![1, 1, 1],
            "valid",
            None,
            None,
            vec![0, 0, 0],
            vec![3, 6, 4],
        ),
    ];
    for (what, xs, ws, groups, st, dl, pt, pad, os, before, out_sp) in cts {
        v.push(case(
            "conv_transpose",
            what,
            &versions("conv_transpose"),
            FP,
            move |p| {
                let (x, xv) = p.xs("x", &xs);
                let wv = p.rand(numel(&ws), -1.0, 1.0);
                let bv = p.rand(ws[1] * groups, -1.0, 1.0);
                let i32s = |v: &[usize]| v.iter().map(|&e| e as i32).collect::<Vec<_>>();
                let mut ins = vec![
                    ("x", In::V(x)),
                    ("weight", p.cf(&ws, &wv)),
                    ("bias", p.cf(&[ws[1] * groups], &bv)),
                    ("strides", ci(&i32s(&st))),
                    ("dilations", ci(&i32s(&dl))),
                    ("pad_type", cstr(pt)),
                    ("groups", ci0(groups as i32)),
                ];
                if let Some(pd) = &pad {
                    ins.push(("pad", ci(pd)));
                }
                if let Some(o) = &os {
                    ins.push(("output_shape", ci(o)));
                }
                let y = p.op("conv_transpose", ins)?;
                let (w, shape) = conv_transpose_ref(
                    &xv,
                    &xs,
                    &wv,
                    &ws,
                    Some(&bv),
                    groups,
                    &st,
                    &dl,
                    &before,
                    &out_sp,
                );
                let terms = (xs[1] / groups * numel(&ws[2..])) as f64;
                p.want(&y, &shape, w, Cmp::Float(terms))
            },
        ));
    }
    v.push(case(
        "conv_transpose",
        "1-D, weight decompressed by constexpr_lut_to_dense (iOS16), stride 3",
        &[I16],
        FP,
        |p| {
            let codes: Vec<u8> = (0..2 * 3 * 4).map(|i| (i * 7 % 16) as u8).collect();
            let lut: Vec<f64> = (0..16).map(|i| i as f64 / 8.0 - 1.0).collect();
            let ins = vec![
                ("lut", p.cf(&[16], &lut)),
                (
                    "indices",
                    In::C(Value::Tensor(ITensor::new(
                        DType::U8,
                        vec![12],
                        milkit::ir::Bytes::from_vec(pack(&codes, 4)),
                    )?)),
                ),
                (
                    "shape",
                    In::C(Value::Tensor(ITensor::new(
                        DType::U32,
                        vec![3],
                        milkit::ir::Bytes::from_vec(
                            [2u32, 3, 4].iter().flat_map(|v| v.to_le_bytes()).collect(),
                        ),
                    )?)),
                ),
            ];
            let w = p.op("constexpr_lut_to_dense", ins)?;
            let (x, xv) = p.xs("x", &[1, 2, 5]);
            let ins = vec![("x", In::V(x)), ("weight", In::V(w)), ("strides", ci(&[3]))];
            let y = p.op("conv_transpose", ins)?;
            let wv: Vec<f64> = codes.iter().map(|&c| p.r(lut[c as usize])).collect();
            // (5 - 1)·3 + 4 = 16
            let (want, shape) = conv_transpose_ref(
                &xv,
                &[1, 2, 5],
                &wv,
                &[2, 3, 4],
                None,
                1,
                &[3],
                &[1],
                &[0],
                &[16],
            );
            p.want(&y, &shape, want, Cmp::Float(8.0))
        },
    ));
    v.push(case(
        "conv_quantized",
        "2-D linear uint8 weight, per-channel scale, scalar quant_bias, same pad",
        &versions("conv_quantized"),
        FP,
        |p| {
            let (x, xv) = p.xs("x", &[1, 2, 4, 5]);
            let codes: Vec<u8> = (0..3 * 2 * 3 * 3).map(|i| (i * 37 % 256) as u8).collect();
            let scale = [0.01, -0.02, 0.005];
            let qbias = -0.5;
            let bv = [0.0; 3];
            let ins = vec![
                ("x", In::V(x)),
                (
                    "weight",
                    In::C(Value::Tensor(ITensor::new(
                        DType::U8,
                        vec![3, 2, 3, 3],
                        milkit::ir::Bytes::from_vec(codes.clone()),
                    )?)),
                ),
                ("quantization_type", cstr("linear")),
                ("nbits", ci0(8)),
                ("quant_scale", p.cf(&[3], &scale)),
                ("quant_bias", p.cs(qbias)),
                ("pad_type", cstr("same")),
            ];
            let y = p.op("conv_quantized", ins)?;
            let (sc, qb) = (scale.map(|s| p.r(s)), p.r(qbias));
            let wv: Vec<f64> = codes
                .iter()
                .enumerate()
                .map(|(i, &c)| c as f64 * sc[i / 18] + qb)
                .collect();
            let mut w = vec![0.0; 3 * 4 * 5];
            for o in 0..3 {
                for i in 0..4 {
                    for j in 0..5 {
                        let mut acc = bv[o];
                        for c in 0..2 {
                            for a in 0..3 {
                                for b in 0..3 {
                                    let (yy, xx) =
                                        (i as i64 + a as i64 - 1, j as i64 + b as i64 - 1);
                                    if (0..4).contains(&yy) && (0..5).contains(&xx) {
                                        acc += wv[((o * 2 + c) * 3 + a) * 3 + b]
                                            * xv[(c * 4 + yy as usize) * 5 + xx as usize];
                                    }
                                }
                            }
                        }
                        w[(o * 4 + i) * 5 + j] = acc;
                    }
                }
            }
            p.want(&y, &[1, 3, 4, 5], w, Cmp::Float(18.0))
        },
    ));
    v.extend(resize_cases());
    v.extend(recurrent_cases());
    v.extend(nms_cases());
    v.extend(resample_cases());
    v.extend(crop_resize_cases());
    v.extend(classify_cases());
    v
}

/// TF's `crop_and_resize` of one plane for a box `[y1, x1, y2, x2]` in pixel coordinates.
fn crop_and_resize_ref(
    img: &[f64],
    (h, w): (usize, usize),
    bx: [f64; 4],
    (th, tw): (usize, usize),
    one_at_centre: bool,
    pad: f64,
) -> Vec<f64> {
    let at = |a: f64, b: f64, i: usize, t: usize| {
        if t > 1 {
            a + i as f64 * (b - a) / (t as f64 - 1.0)
        } else if one_at_centre {
            0.5 * (a + b)
        } else {
            a
        }
    };
    let mut out = vec![];
    for i in 0..th {
        let iy = at(bx[0], bx[2], i, th);
        for j in 0..tw {
            let ix = at(bx[1], bx[3], j, tw);
            if iy < 0.0 || iy > (h - 1) as f64 || ix < 0.0 || ix > (w - 1) as f64 {
                out.push(pad);
                continue;
            }
            let (t, b, l, r) = (
                iy.floor() as usize,
                iy.ceil() as usize,
                ix.floor() as usize,
                ix.ceil() as usize,
            );
            let (dy, dx) = (iy - iy.floor(), ix - ix.floor());
            let top = img[t * w + l] + (img[t * w + r] - img[t * w + l]) * dx;
            let bot = img[b * w + l] + (img[b * w + r] - img[b * w + l]) * dx;
            out.push(top + (bot - top) * dy);
        }
    }
    out
}

/// A box in `mode` → `[y1, x1, y2, x2]`.
fn box_corners(c: &[f64], mode: &str) -> [f64; 4] {
    match mode {
        "CORNERS_HEIGHT_FIRST" => [c[0], c[1], c[2], c[3]],
        "CORNERS_WIDTH_FIRST" => [c[1], c[0], c[3], c[2]],
        "CENTER_SIZE_HEIGHT_FIRST" => [
            c[0] - 0.5 * c[2],
            c[1] - 0.5 * c[3],
            c[0] + 0.5 * c[2],
            c[1] + 0.5 * c[3],
        ],
        _ => [
            c[1] - 0.5 * c[3],
            c[0] - 0.5 * c[2],
            c[1] + 0.5 * c[3],
            c[0] + 0.5 * c[2],
        ],
    }
}

fn crop_resize_cases() -> Vec<Case> {
    let mut v = vec![];
    // (what, opset, box mode, sampling, normalized, spatial_scale, pad, with batch index, target)
    type Cr = (
        &'static str,
        Opset,
        &'static str,
        &'static str,
        bool,
        f64,
        Option<f64>,
        bool,
        (usize, usize),
    );
    let crs: Vec<Cr> = vec![
        (
            "iOS15 roi of 4: every box on every image, corners, ALIGN_CORNERS",
            I15,
            "CORNERS_HEIGHT_FIRST",
            "ALIGN_CORNERS",
            false,
            1.0,
            None,
            false,
            (3, 4),
        ),
        (
            "iOS15 roi of 5: batch index, normalized centre-size, STRICT_ALIGN_CORNERS, one row",
            I15,
            "CENTER_SIZE_WIDTH_FIRST",
            "STRICT_ALIGN_CORNERS",
            true,
            1.0,
            None,
            true,
            (1, 3),
        ),
        (
            "iOS16 pad_value 0.75, corners width first, spatial_scale 0.5, one row",
            I16,
            "CORNERS_WIDTH_FIRST",
            "ALIGN_CORNERS",
            false,
            0.5,
            Some(0.75),
            false,
            (1, 4),
        ),
        (
            "iOS17 boxes and box_indices, centre-size, pad_value -0.25",
            I17,
            "CENTER_SIZE_HEIGHT_FIRST",
            "ALIGN_CORNERS",
            false,
            1.0,
            Some(-0.25),
            true,
            (3, 2),
        ),
    ];
    for (what, opset, bm, sm, norm, scale, pad, indexed, (th, tw)) in crs {
        v.push(case("crop_resize", what, &[opset], FP, move |p| {
            // A roi of 5 picks its image by index; coremltools leaves B > 1 rows undefined.
            let b = if indexed && opset < I17 { 1 } else { 2 };
            let (c, h, w, n) = (2usize, 5usize, 6usize, 3usize);
            let (x, xv) = p.xs("x", &[b, c, h, w]);
            // Boxes spanning the image and a little beyond it.
            let hi = if norm { 1.2 } else { 6.5 };
            let coords: Vec<Vec<f64>> = (0..n).map(|_| p.rand(4, -0.3, hi)).collect();
            let img_of: Vec<usize> = (0..n).map(|i| (i + 1) % b).collect();
            let dt = p.dt;
            let mut ins = vec![("x", In::V(x))];
            if opset >= I17 {
                let flat: Vec<f64> = coords.iter().flatten().copied().collect();
                let bx = p.input_of("boxes", dt, &[n, 4], &flat);
                let idx: Vec<f64> = img_of.iter().map(|&i| i as f64).collect();
                let bi = p.input_of("box_indices", I32, &[n], &idx);
                ins.push(("boxes", In::V(bx)));
                ins.push(("box_indices", In::V(bi)));
            } else {
                let k = if indexed { 5 } else { 4 };
                let mut flat = vec![];
                for (i, cd) in coords.iter().enumerate() {
                    if indexed {
                        flat.push(img_of[i] as f64);
                    }
                    flat.extend_from_slice(cd);
                }
                let r = p.input_of("roi", dt, &[n, 1, k, 1, 1], &flat);
                ins.push(("roi", In::V(r)));
            }
            ins.extend([
                ("target_height", ci0(th as i32)),
                ("target_width", ci0(tw as i32)),
                ("normalized_coordinates", cb(norm)),
                ("spatial_scale", In::C(Value::f32_scalar(scale as f32))),
                ("box_coordinate_mode", cstr(bm)),
                ("sampling_mode", cstr(sm)),
            ]);
            if let Some(pv) = pad {
                ins.push(("pad_value", p.cs(pv)));
            }
            let y = p.op("crop_resize", ins)?;
            let padv = p.r(pad.unwrap_or(0.0));
            let mut want = vec![];
            for (i, cd) in coords.iter().enumerate() {
                let bx = box_corners(cd, bm);
                let (sy, sx) = if norm {
                    ((h - 1) as f64, (w - 1) as f64)
                } else {
                    (1.0, 1.0)
                };
                let bx = [
                    bx[0] * sy * scale,
                    bx[1] * sx * scale,
                    bx[2] * sy * scale,
                    bx[3] * sx * scale,
                ];
                let imgs: Vec<usize> = if indexed || opset >= I17 {
                    vec![img_of[i]]
                } else {
                    (0..b).collect()
                };
                for j in imgs {
                    for ci in 0..c {
                        let img = &xv[(j * c + ci) * h * w..(j * c + ci + 1) * h * w];
                        want.extend(crop_and_resize_ref(
                            img,
                            (h, w),
                            bx,
                            (th, tw),
                            sm == "ALIGN_CORNERS",
                            padv,
                        ));
                    }
                }
            }
            let shape: Vec<usize> = if opset >= I17 {
                vec![n, c, th, tw]
            } else {
                vec![n, if indexed { 1 } else { b }, c, th, tw]
            };
            p.want(&y, &shape, want, CLOSE)
        }));
    }
    v
}

/// `resample`'s reading of plane `img` (`h × w`) at point `(px, py)`, by its docstring:
/// coordinates to pixels, the padded image's value at each neighbour (the padding
/// bounced back into the image step by step), bilinear or nearest.
#[allow(clippy::too_many_arguments)]
fn sample_ref(
    img: &[f64],
    (h, w): (usize, usize),
    (px, py): (f64, f64),
    coords: &str,
    align: bool,
    nearest: bool,
    padding: &str,
    pad: f64,
) -> f64 {
    let to_pixel = |c: f64, n: usize| {
        let n = n as f64;
        match coords {
            "unnormalized" => c,
            "normalized_minus_one_to_one" if align => (c + 1.0) * (n - 1.0) / 2.0,
            "normalized_minus_one_to_one" => ((c + 1.0) * n - 1.0) / 2.0,
            "normalized_zero_to_one" if align => c * (n - 1.0),
            _ => c * n - 0.5,
        }
    };
    let fold = |mut i: i64, n: i64| -> Option<usize> {
        loop {
            if (0..n).contains(&i) {
                return Some(i as usize);
            }
            match padding {
                "constant" => return None,
                "border" => return Some(i.max(0).min(n - 1) as usize),
                "reflection" if n == 1 => return Some(0),
                "reflection" => i = if i < 0 { -i } else { 2 * (n - 1) - i },
                _ => i = if i < 0 { -i - 1 } else { 2 * n - 1 - i },
            }
        }
    };
    let val = |y: i64, x: i64| match (fold(y, h as i64), fold(x, w as i64)) {
        (Some(y), Some(x)) => img[y * w + x],
        _ => pad,
    };
    let (u, v) = (to_pixel(px, w), to_pixel(py, h));
    if nearest {
        return val((v + 0.5).floor() as i64, (u + 0.5).floor() as i64);
    }
    let (x0, y0) = (u.floor() as i64, v.floor() as i64);
    let (fx, fy) = (u - u.floor(), v - v.floor());
    val(y0, x0) * (1.0 - fx) * (1.0 - fy)
        + val(y0, x0 + 1) * fx * (1.0 - fy)
        + val(y0 + 1, x0) * (1.0 - fx) * fy
        + val(y0 + 1, x0 + 1) * fx * fy
}

fn resample_cases() -> Vec<Case> {
    let mut v = vec![];
    type R = (&'static str, &'static str, &'static str, bool, (f64, f64));
    let modes: Vec<R> = vec![
        (
            "bilinear",
            "constant",
            "normalized_minus_one_to_one",
            false,
            (-1.3, 1.3),
        ),
        (
            "bilinear",
            "border",
            "normalized_zero_to_one",
            true,
            (-0.3, 1.3),
        ),
        ("nearest", "reflection", "unnormalized", false, (-6.0, 10.0)),
        ("bilinear", "symmetric", "unnormalized", true, (-6.0, 10.0)),
        (
            "bilinear",
            "reflection",
            "normalized_minus_one_to_one",
            true,
            (-2.5, 2.5),
        ),
    ];
    for (sampling, padding, coords, align, (lo, hi)) in modes {
        v.push(case(
            "resample",
            &format!("{sampling}, {padding} padding, {coords}, align_corners {align}"),
            &versions("resample"),
            FP,
            move |p| {
                let (b, c, h, w, oh, ow) = (2, 2, 4, 5, 3, 6);
                let (x, xv) = p.xs("x", &[b, c, h, w]);
                let cv: Vec<f64> = p
                    .rand(b * oh * ow * 2, lo, hi)
                    .iter()
                    .map(|&e| e as f32 as f64)
                    .collect();
                let ct = p.input_of("coordinates", F32, &[b, oh, ow, 2], &cv);
                let ins = vec![
                    ("x", In::V(x)),
                    ("coordinates", In::V(ct)),
                    ("sampling_mode", cstr(sampling)),
                    ("padding_mode", cstr(padding)),
                    ("padding_value", p.cs(0.5)),
                    ("coordinates_mode", cstr(coords)),
                    ("align_corners", cb(align)),
                ];
                let y = p.op("resample", ins)?;
                let pad = p.r(0.5);
                let mut want = vec![];
                for bi in 0..b {
                    for ci in 0..c {
                        let img = &xv[(bi * c + ci) * h * w..(bi * c + ci + 1) * h * w];
                        for q in 0..oh * ow {
                            let at = (bi * oh * ow + q) * 2;
                            want.push(sample_ref(
                                img,
                                (h, w),
                                (cv[at], cv[at + 1]),
                                coords,
                                align,
                                sampling == "nearest",
                                padding,
                                pad,
                            ));
                        }
                    }
                }
                p.want(&y, &[b, c, oh, ow], want, CLOSE)
            },
        ));
    }
    for (what, rows) in [("one matrix per batch", 2usize), ("one matrix for all", 1)] {
        v.push(case("affine", what, &versions("affine"), FP, move |p| {
            let (b, c, h, w, oh, ow) = (2, 2, 4, 5, 3, 6);
            let (x, xv) = p.xs("x", &[b, c, h, w]);
            let base = [
                0.9, 0.2, 0.1, -0.15, 1.1, -0.05, 1.2, -0.3, -0.2, 0.25, 0.8, 0.3,
            ];
            let mv: Vec<f64> = base[..rows * 6].iter().map(|&e| p.r(e)).collect();
            let dt = p.dt;
            let m = p.input_of("m", dt, &[rows, 6], &mv);
            let ins = vec![
                ("x", In::V(x)),
                ("transform_matrix", In::V(m)),
                ("output_height", ci0(oh as i32)),
                ("output_width", ci0(ow as i32)),
                ("sampling_mode", cstr("bilinear")),
                ("padding_mode", cstr("constant")),
                ("padding_value", p.cs(0.0)),
                ("coordinates_mode", cstr("normalized_minus_one_to_one")),
                ("align_corners", cb(true)),
            ];
            let y = p.op("affine", ins)?;
            let mut want = vec![];
            for bi in 0..b {
                let t = &mv[(bi % rows) * 6..(bi % rows) * 6 + 6];
                for ci in 0..c {
                    let img = &xv[(bi * c + ci) * h * w..(bi * c + ci + 1) * h * w];
                    for i in 0..oh {
                        for j in 0..ow {
                            let (xn, yn) = (
                                2.0 * j as f64 / (ow - 1) as f64 - 1.0,
                                2.0 * i as f64 / (oh - 1) as f64 - 1.0,
                            );
                            let pt = (t[0] * xn + t[1] * yn + t[2], t[3] * xn + t[4] * yn + t[5]);
                            want.push(sample_ref(
                                img,
                                (h, w),
                                pt,
                                "normalized_minus_one_to_one",
                                true,
                                false,
                                "constant",
                                0.0,
                            ));
                        }
                    }
                }
            }
            p.want(&y, &[b, c, oh, ow], want, CLOSE)
        }));
    }
    v
}

/// coremltools' numpy reference of NMS (TF's greedy `non_max_suppression` per batch):
/// the kept box indices.
fn nms_ref(
    boxes: &[[f64; 4]],
    scores: &[Vec<f64>],
    iou_t: f64,
    score_t: f64,
    max: usize,
    per_class: bool,
) -> Vec<usize> {
    let iou = |a: &[f64; 4], b: &[f64; 4]| {
        let (top, bot) = (
            (a[1] + 0.5 * a[3]).min(b[1] + 0.5 * b[3]),
            (a[1] - 0.5 * a[3]).max(b[1] - 0.5 * b[3]),
        );
        let (right, left) = (
            (a[0] + 0.5 * a[2]).min(b[0] + 0.5 * b[2]),
            (a[0] - 0.5 * a[2]).max(b[0] - 0.5 * b[2]),
        );
        let inter = (top - bot).max(0.0) * (right - left).max(0.0);
        inter / (a[2] * a[3] + b[2] * b[3] - inter)
    };
    let best: Vec<f64> = scores
        .iter()
        .map(|r| r.iter().cloned().fold(f64::NEG_INFINITY, f64::max))
        .collect();
    let class: Vec<usize> = scores
        .iter()
        .map(|r| {
            (0..r.len())
                .find(|&c| r[c] == r.iter().cloned().fold(f64::NEG_INFINITY, f64::max))
                .unwrap()
        })
        .collect();
    // TF: candidates above the score threshold in descending score, greedily kept.
    let tf = |cands: &[usize]| {
        let mut kept: Vec<usize> = vec![];
        for &i in cands {
            if best[i] > score_t
                && kept.len() < max
                && kept.iter().all(|&j| iou(&boxes[i], &boxes[j]) <= iou_t)
            {
                kept.push(i);
            }
        }
        kept
    };
    let mut sorted: Vec<usize> = (0..boxes.len()).collect();
    sorted.sort_by(|&a, &b| best[b].partial_cmp(&best[a]).unwrap());
    let mut ids = if per_class {
        let mut pos: Vec<usize> = vec![];
        let mut classes: Vec<usize> = sorted.iter().map(|&i| class[i]).collect();
        classes.dedup();
        let mut seen = BTreeSet::new();
        for c in classes {
            if !seen.insert(c) {
                continue;
            }
            let mine: Vec<usize> = sorted.iter().copied().filter(|&i| class[i] == c).collect();
            for k in tf(&mine) {
                pos.push(sorted.iter().position(|&i| i == k).unwrap());
            }
        }
        pos.sort();
        pos.into_iter().map(|p| sorted[p]).collect()
    } else {
        tf(&sorted)
    };
    if ids.is_empty() {
        ids.push(sorted[0]);
    }
    ids.truncate(max);
    ids
}

fn nms_cases() -> Vec<Case> {
    let mut v = vec![];
    let (n, nb, k, max) = (2usize, 7usize, 3usize, 4usize);
    for (what, per_class, score_t, opsets) in [
        ("iOS15 layout, score threshold 0.3", false, 0.3, vec![I15]),
        ("iOS15 layout, per-class suppression", true, 0.1, vec![I15]),
        (
            "iOS15 layout, nothing above the threshold: the best box",
            false,
            5.0,
            vec![I15],
        ),
        (
            "iOS17 layout (boxes last)",
            false,
            f64::NEG_INFINITY,
            vec![I17],
        ),
        (
            "iOS17 layout, per-class suppression",
            true,
            f64::NEG_INFINITY,
            vec![I17],
        ),
    ] {
        v.push(case(
            "non_maximum_suppression",
            what,
            &opsets,
            FP,
            move |p| {
                let last = p.opset >= I17;
                // Box centres in [0, 3), sizes in [0.5, 2): plenty of overlaps.
                let mut boxes = vec![[0.0; 4]; n * nb];
                for bx in boxes.iter_mut() {
                    let c = p.rand(2, 0.0, 3.0);
                    let wh = p.rand(2, 0.5, 2.0);
                    *bx = [c[0], c[1], wh[0], wh[1]];
                }
                let scores: Vec<Vec<f64>> = (0..n * nb).map(|_| p.rand(k, 0.0, 1.0)).collect();
                let (bv, bs, sv, ss): (Vec<f64>, Vec<usize>, Vec<f64>, Vec<usize>) = if last {
                    let mut bv = vec![0.0; n * 4 * nb];
                    let mut sv = vec![0.0; n * k * nb];
                    for b in 0..n {
                        for i in 0..nb {
                            for c in 0..4 {
                                bv[(b * 4 + c) * nb + i] = boxes[b * nb + i][c];
                            }
                            for c in 0..k {
                                sv[(b * k + c) * nb + i] = scores[b * nb + i][c];
                            }
                        }
                    }
                    (bv, vec![n, 4, nb], sv, vec![n, k, nb])
                } else {
                    (
                        boxes.iter().flatten().copied().collect(),
                        vec![n, nb, 4],
                        scores.iter().flatten().copied().collect(),
                        vec![n, nb, k],
                    )
                };
                let dt = p.dt;
                let bx = p.input_of("boxes", dt, &bs, &bv);
                let sc = p.input_of("scores", dt, &ss, &sv);
                let mut ins = vec![
                    ("boxes", In::V(bx)),
                    ("scores", In::V(sc)),
                    ("iou_threshold", p.cs(0.2)),
                    ("max_boxes", ci0(max as i32)),
                    ("per_class_suppression", cb(per_class)),
                ];
                if !last {
                    ins.push(("score_threshold", p.cs(score_t)));
                }
                let outs = p.ops("non_maximum_suppression", ins)?;
                let (iou_t, st) = (p.r(0.2), p.r(score_t));
                let mut ob = vec![0.0; n * max * 4];
                let mut os = vec![0.0; n * max * k];
                let mut oi = vec![-1.0; n * max];
                let mut oc = vec![0.0; n];
                for b in 0..n {
                    let ids = nms_ref(
                        &boxes[b * nb..(b + 1) * nb],
                        &scores[b * nb..(b + 1) * nb],
                        iou_t,
                        st,
                        max,
                        per_class,
                    );
                    oc[b] = ids.len() as f64;
                    for (slot, &i) in ids.iter().enumerate() {
                        oi[b * max + slot] = i as f64;
                        for (c, &e) in boxes[b * nb + i].iter().enumerate() {
                            let at = if last {
                                (b * 4 + c) * max + slot
                            } else {
                                (b * max + slot) * 4 + c
                            };
                            ob[at] = e;
                        }
                        for (c, &e) in scores[b * nb + i].iter().enumerate() {
                            let at = if last {
                                (b * k + c) * max + slot
                            } else {
                                (b * max + slot) * k + c
                            };
                            os[at] = e;
                        }
                    }
                }
                if last {
                    p.want(&outs[0], &[n, 4, max], ob, Cmp::Exact)?;
                    p.want(&outs[1], &[n, k, max], os, Cmp::Exact)?;
                } else {
                    p.want(&outs[0], &[n, max, 4], ob, Cmp::Exact)?;
                    p.want(&outs[1], &[n, max, k], os, Cmp::Exact)?;
                    p.want(&outs[3], &[n], oc, Cmp::Exact)?;
                }
                p.want(&outs[2], &[n, max], oi, Cmp::Exact)
            },
        ));
    }
    v
}

/// `w · v` for a row-major `[rows, v.len()]` matrix (rows `r0..r0 + n`).
fn mv(w: &[f64], r0: usize, n: usize, v: &[f64]) -> Vec<f64> {
    (r0..r0 + n)
        .map(|r| (0..v.len()).map(|c| w[r * v.len() + c] * v[c]).sum())
        .collect()
}

/// Per batch row, the (h, c) after each processed step.
type Steps = Vec<Vec<(Vec<f64>, Vec<f64>)>>;

/// One recurrent cell: (x_t, h, c) → (h', c').
type Cell<'a> = &'a dyn Fn(&[f64], &[f64], &[f64]) -> (Vec<f64>, Vec<f64>);

/// Runs `cell` over x `[s, b, I]` for each batch row from (h0, c0) `[b, H]`, in reverse
/// time when `rev`; per batch row the states after each processed step, in processing order.
fn run_cell(
    xv: &[f64],
    (s, b, isz): (usize, usize, usize),
    h0: &[Vec<f64>],
    c0: &[Vec<f64>],
    rev: bool,
    cell: Cell,
) -> Steps {
    (0..b)
        .map(|bi| {
            let (mut h, mut c) = (h0[bi].clone(), c0[bi].clone());
            let mut steps = vec![];
            for k in 0..s {
                let t = if rev { s - 1 - k } else { k };
                let x = &xv[(t * b + bi) * isz..(t * b + bi + 1) * isz];
                (h, c) = cell(x, &h, &c);
                steps.push((h.clone(), c.clone()));
            }
            steps
        })
        .collect()
}

fn act_ref(name: &str, x: f64) -> f64 {
    match name {
        "sigmoid" => sigmoid(x),
        "tanh" => x.tanh(),
        "relu" => x.max(0.0),
        "linear" => x,
        "hard_sigmoid" => (0.2 * x + 0.5).clamp(0.0, 1.0),
        n => panic!("activation {n}"),
    }
}

/// A recurrent case at every version in fp32, and in fp16 from iOS17 (iOS15 is fp32 only).
fn rec_cases(
    op: &'static str,
    what: &str,
    from: Opset,
    f: impl Fn(&mut Prog) -> Result<()> + Clone + 'static,
) -> Vec<Case> {
    let all: Vec<Opset> = versions(op).into_iter().filter(|&o| o >= from).collect();
    let later: Vec<Opset> = [I17, I18].into_iter().filter(|&o| o >= from).collect();
    vec![
        case(op, &format!("{what}, fp32"), &all, &[F32], f.clone()),
        case(op, &format!("{what}, fp16"), &later, &[F16], f),
    ]
}

/// Builds the op's outputs' expectations: y `[s or 1, b, W]` from per-row step states,
/// final h (and c).
#[allow(clippy::too_many_arguments)]
fn want_rec(
    p: &mut Prog,
    outs: &[V],
    runs: &[Steps],
    seq: bool,
    (s, b): (usize, usize),
    bidir: bool,
    lstm: bool,
    terms: f64,
) -> Result<()> {
    let hsz = runs[0][0][0].0.len();
    let width = hsz * runs.len();
    let os = if seq { s } else { 1 };
    let mut y = vec![0.0; os * b * width];
    let (mut hn, mut cn) = (vec![0.0; b * width], vec![0.0; b * width]);
    for (di, run) in runs.iter().enumerate() {
        for (bi, steps) in run.iter().enumerate() {
            for (k, (h, _)) in steps.iter().enumerate() {
                // A backward direction of a bidirectional op is aligned with input time.
                let t = if bidir && di == 1 { s - 1 - k } else { k };
                if seq {
                    y[(t * b + bi) * width + di * hsz..][..hsz].copy_from_slice(h);
                }
            }
            let (h, c) = steps.last().unwrap();
            if !seq {
                y[bi * width + di * hsz..][..hsz].copy_from_slice(h);
            }
            hn[bi * width + di * hsz..][..hsz].copy_from_slice(h);
            cn[bi * width + di * hsz..][..hsz].copy_from_slice(c);
        }
    }
    let sc = Cmp::Float(terms);
    p.want(&outs[0], &[os, b, width], y, sc)?;
    p.want(&outs[1], &[b, width], hn, sc)?;
    if lstm {
        p.want(&outs[2], &[b, width], cn, sc)?;
    }
    Ok(())
}

fn split_rows(v: &[f64], n: usize) -> Vec<Vec<f64>> {
    v.chunks(n).map(|c| c.to_vec()).collect()
}

fn recurrent_cases() -> Vec<Case> {
    let mut v = vec![];
    let (s, b, isz, hsz) = (4usize, 2usize, 3usize, 5usize);
    // rnn: h' = act(W_ih x + W_hh h + b).
    for (what, dir, seq, act) in [
        (
            "forward, output_sequence, tanh, bias",
            "forward",
            true,
            "tanh",
        ),
        ("reverse, last step, relu", "reverse", false, "relu"),
    ] {
        v.extend(rec_cases("rnn", what, I15, move |p| {
            let (x, xv) = p.xs("x", &[s, b, isz]);
            let (h0, h0v) = p.xs("h0", &[b, hsz]);
            let wi = p.rand(hsz * isz, -0.7, 0.7);
            let wh = p.rand(hsz * hsz, -0.7, 0.7);
            let bias = p.rand(hsz, -0.5, 0.5);
            let ins = vec![
                ("x", In::V(x)),
                ("initial_h", In::V(h0)),
                ("weight_ih", p.cf(&[hsz, isz], &wi)),
                ("weight_hh", p.cf(&[hsz, hsz], &wh)),
                ("bias", p.cf(&[hsz], &bias)),
                ("direction", cstr(dir)),
                ("output_sequence", cb(seq)),
                ("activation", cstr(act)),
            ];
            let outs = p.ops("rnn", ins)?;
            let cell = |x: &[f64], h: &[f64], _: &[f64]| {
                let (a, c) = (mv(&wi, 0, hsz, x), mv(&wh, 0, hsz, h));
                (
                    (0..hsz)
                        .map(|k| act_ref(act, a[k] + c[k] + bias[k]))
                        .collect(),
                    vec![0.0; hsz],
                )
            };
            let h0s = split_rows(&h0v, hsz);
            let run = run_cell(&xv, (s, b, isz), &h0s, &h0s, dir == "reverse", &cell);
            want_rec(
                p,
                &outs,
                &[run],
                seq,
                (s, b),
                false,
                false,
                (isz + hsz) as f64,
            )
        }));
    }
    // gru: gates [r, o, z]; as coremltools' numpy reference (reset applied to h before
    // R_o), or iOS18's reset_after (r ∘ (R_o h + b_ho)) with a separate input_bias.
    type G = (
        &'static str,
        &'static str,
        bool,
        &'static str,
        &'static str,
        bool,
        bool,
        Opset,
    );
    let grus: Vec<G> = vec![
        (
            "forward, output_sequence, sigmoid / tanh, bias",
            "forward",
            true,
            "sigmoid",
            "tanh",
            true,
            false,
            I15,
        ),
        (
            "reverse, last step, tanh / sigmoid, no bias",
            "reverse",
            false,
            "tanh",
            "sigmoid",
            false,
            false,
            I15,
        ),
        (
            "iOS18 reset_after with input_bias, output_sequence",
            "forward",
            true,
            "sigmoid",
            "tanh",
            true,
            true,
            I18,
        ),
    ];
    for (what, dir, seq, rec, act, has_bias, reset_after, from) in grus {
        v.extend(rec_cases("gru", what, from, move |p| {
            let (x, xv) = p.xs("x", &[s, b, isz]);
            let (h0, h0v) = p.xs("h0", &[b, hsz]);
            let wi = p.rand(3 * hsz * isz, -0.7, 0.7);
            let wh = p.rand(3 * hsz * hsz, -0.7, 0.7);
            let bias = if has_bias {
                p.rand(3 * hsz, -0.5, 0.5)
            } else {
                vec![0.0; 3 * hsz]
            };
            let ibias = if reset_after {
                p.rand(3 * hsz, -0.5, 0.5)
            } else {
                vec![0.0; 3 * hsz]
            };
            let mut ins = vec![
                ("x", In::V(x)),
                ("initial_h", In::V(h0)),
                ("weight_ih", p.cf(&[3 * hsz, isz], &wi)),
                ("weight_hh", p.cf(&[3 * hsz, hsz], &wh)),
                ("direction", cstr(dir)),
                ("output_sequence", cb(seq)),
                ("recurrent_activation", cstr(rec)),
                ("activation", cstr(act)),
            ];
            if has_bias {
                ins.push(("bias", p.cf(&[3 * hsz], &bias)));
            }
            if reset_after {
                ins.push(("reset_after", cb(true)));
                ins.push(("input_bias", p.cf(&[3 * hsz], &ibias)));
            }
            let outs = p.ops("gru", ins)?;
            let cell = |x: &[f64], h: &[f64], _: &[f64]| {
                let gx = |g: usize| mv(&wi, g * hsz, hsz, x);
                let gh = |g: usize, v: &[f64]| mv(&wh, g * hsz, hsz, v);
                let (xr, xo, xz) = (gx(0), gx(1), gx(2));
                let (hr, hz) = (gh(0, h), gh(2, h));
                let r: Vec<f64> = (0..hsz)
                    .map(|k| act_ref(rec, xr[k] + ibias[k] + hr[k] + bias[k]))
                    .collect();
                let z: Vec<f64> = (0..hsz)
                    .map(|k| act_ref(rec, xz[k] + ibias[2 * hsz + k] + hz[k] + bias[2 * hsz + k]))
                    .collect();
                let o: Vec<f64> = if reset_after {
                    let ho = gh(1, h);
                    (0..hsz)
                        .map(|k| {
                            act_ref(act, xo[k] + ibias[hsz + k] + r[k] * (ho[k] + bias[hsz + k]))
                        })
                        .collect()
                } else {
                    let rh: Vec<f64> = (0..hsz).map(|k| h[k] * r[k]).collect();
                    let ho = gh(1, &rh);
                    (0..hsz)
                        .map(|k| act_ref(act, xo[k] + ibias[hsz + k] + ho[k] + bias[hsz + k]))
                        .collect()
                };
                (
                    (0..hsz)
                        .map(|k| (1.0 - z[k]) * o[k] + z[k] * h[k])
                        .collect(),
                    vec![0.0; hsz],
                )
            };
            let h0s = split_rows(&h0v, hsz);
            let run = run_cell(&xv, (s, b, isz), &h0s, &h0s, dir == "reverse", &cell);
            want_rec(
                p,
                &outs,
                &[run],
                seq,
                (s, b),
                false,
                false,
                (isz + hsz) as f64,
            )
        }));
    }
    // lstm: gates [i, f, o, z], peephole [i, f, o] (o reads the new cell), cell clipped.
    type L = (&'static str, &'static str, bool, &'static str, Option<f64>);
    let lstms: Vec<L> = vec![
        (
            "forward, output_sequence, peephole, clip 0.6",
            "forward",
            true,
            "sigmoid",
            Some(0.6),
        ),
        (
            "reverse, last step, hard_sigmoid gates",
            "reverse",
            false,
            "hard_sigmoid",
            None,
        ),
        (
            "bidirectional, output_sequence",
            "bidirectional",
            true,
            "sigmoid",
            None,
        ),
        (
            "bidirectional, last step, clip 0.5",
            "bidirectional",
            false,
            "sigmoid",
            Some(0.5),
        ),
    ];
    for (what, dir, seq, rec, clip) in lstms {
        v.extend(rec_cases("lstm", what, I15, move |p| {
            let nd = if dir == "bidirectional" { 2 } else { 1 };
            let (x, xv) = p.xs("x", &[s, b, isz]);
            let (h0, h0v) = p.xs("h0", &[b, nd * hsz]);
            let (c0, c0v) = p.xs("c0", &[b, nd * hsz]);
            let mut ins = vec![
                ("x", In::V(x)),
                ("initial_h", In::V(h0)),
                ("initial_c", In::V(c0)),
                ("direction", cstr(dir)),
                ("output_sequence", cb(seq)),
                ("recurrent_activation", cstr(rec)),
            ];
            if let Some(c) = clip {
                ins.push(("clip", p.cs(c)));
            }
            let mut params = vec![];
            for (di, suffix) in ["", "_back"].iter().take(nd).enumerate() {
                let wi = p.rand(4 * hsz * isz, -0.7, 0.7);
                let wh = p.rand(4 * hsz * hsz, -0.7, 0.7);
                let bias = p.rand(4 * hsz, -0.5, 0.5);
                let peep = p.rand(3 * hsz, -0.5, 0.5);
                let names: [&'static str; 4] = if di == 0 {
                    ["weight_ih", "weight_hh", "bias", "peephole"]
                } else {
                    [
                        "weight_ih_back",
                        "weight_hh_back",
                        "bias_back",
                        "peephole_back",
                    ]
                };
                let _ = suffix;
                ins.push((names[0], p.cf(&[4 * hsz, isz], &wi)));
                ins.push((names[1], p.cf(&[4 * hsz, hsz], &wh)));
                ins.push((names[2], p.cf(&[4 * hsz], &bias)));
                ins.push((names[3], p.cf(&[3 * hsz], &peep)));
                params.push((wi, wh, bias, peep));
            }
            let outs = p.ops("lstm", ins)?;
            let clip_v = clip.map(|c| p.r(c));
            let mut runs = vec![];
            for (di, (wi, wh, bias, peep)) in params.iter().enumerate() {
                let cell = |x: &[f64], h: &[f64], c: &[f64]| {
                    let pre = |g: usize| -> Vec<f64> {
                        let (a, r) = (mv(wi, g * hsz, hsz, x), mv(wh, g * hsz, hsz, h));
                        (0..hsz).map(|k| a[k] + r[k] + bias[g * hsz + k]).collect()
                    };
                    let (pi, pf, po, pz) = (pre(0), pre(1), pre(2), pre(3));
                    let (mut nh, mut nc) = (vec![0.0; hsz], vec![0.0; hsz]);
                    for k in 0..hsz {
                        let i = act_ref(rec, pi[k] + c[k] * peep[k]);
                        let f = act_ref(rec, pf[k] + c[k] * peep[hsz + k]);
                        let z = pz[k].tanh();
                        let mut cc = f * c[k] + i * z;
                        if let Some(t) = clip_v {
                            cc = cc.max(-t).min(t);
                        }
                        let o = act_ref(rec, po[k] + cc * peep[2 * hsz + k]);
                        nh[k] = o * cc.tanh();
                        nc[k] = cc;
                    }
                    (nh, nc)
                };
                let rows = |v: &[f64]| -> Vec<Vec<f64>> {
                    (0..b)
                        .map(|bi| v[(bi * nd + di) * hsz..(bi * nd + di + 1) * hsz].to_vec())
                        .collect()
                };
                let rev = dir == "reverse" || di == 1;
                runs.push(run_cell(
                    &xv,
                    (s, b, isz),
                    &rows(&h0v),
                    &rows(&c0v),
                    rev,
                    &cell,
                ));
            }
            want_rec(
                p,
                &outs,
                &runs,
                seq,
                (s, b),
                nd == 2,
                true,
                (isz + hsz) as f64,
            )
        }));
    }
    v
}

/// The input coordinate output index `i` of `out` samples in `resize_bilinear`'s sampling
/// `mode`, as coremltools' docstring states it.
fn grid_ref(mode: &str, i: usize, xin: usize, xout: usize) -> f64 {
    let (i, xin, xout) = (i as f64, xin as f64, xout as f64);
    let g = match mode {
        "STRICT_ALIGN_CORNERS" if xout == 1.0 => 0.0,
        "ALIGN_CORNERS" if xout == 1.0 => (xin - 1.0) / 2.0,
        "STRICT_ALIGN_CORNERS" | "ALIGN_CORNERS" => i * (xin - 1.0) / (xout - 1.0),
        "DEFAULT" => i * (xin - xin / xout) / (xout - 1.0).max(1.0),
        "OFFSET_CORNERS" => {
            let delta = (xin - 1.0).max(1.0) / xout;
            0.5 * delta + i * ((xout - 1.0) * delta) / (xout - 1.0).max(1.0)
        }
        "UNALIGN_CORNERS" => i * xin / xout + 0.5 * xin / xout - 0.5,
        m => panic!("mode {m}"),
    };
    g.max(0.0).min(xin - 1.0)
}

/// Bilinear resampling of the last two axes of `x` (shape `s`) to `oh × ow`.
fn bilinear_ref(x: &[f64], s: &[usize], oh: usize, ow: usize, mode: &str) -> Vec<f64> {
    let r = s.len();
    let (h, w) = (s[r - 2], s[r - 1]);
    let planes = numel(&s[..r - 2]);
    let mut out = vec![];
    for pl in 0..planes {
        let at = |a: usize, b: usize| x[(pl * h + a) * w + b];
        for i in 0..oh {
            let gy = grid_ref(mode, i, h, oh);
            let (y0, fy) = (gy.floor() as usize, gy - gy.floor());
            let y1 = (y0 + 1).min(h - 1);
            for j in 0..ow {
                let gx = grid_ref(mode, j, w, ow);
                let (x0, fx) = (gx.floor() as usize, gx - gx.floor());
                let x1 = (x0 + 1).min(w - 1);
                out.push(
                    (1.0 - fy) * (1.0 - fx) * at(y0, x0)
                        + (1.0 - fy) * fx * at(y0, x1)
                        + fy * (1.0 - fx) * at(y1, x0)
                        + fy * fx * at(y1, x1),
                );
            }
        }
    }
    out
}

/// Nearest-neighbour resampling of the last two axes with input index `pick(i, in, out)`.
fn nearest_ref(
    x: &[f64],
    s: &[usize],
    oh: usize,
    ow: usize,
    pick: &dyn Fn(usize, usize, usize) -> usize,
) -> Vec<f64> {
    let r = s.len();
    let (h, w) = (s[r - 2], s[r - 1]);
    let mut out = vec![];
    for pl in 0..numel(&s[..r - 2]) {
        for i in 0..oh {
            for j in 0..ow {
                out.push(x[(pl * h + pick(i, h, oh)) * w + pick(j, w, ow)]);
            }
        }
    }
    out
}

fn resize_cases() -> Vec<Case> {
    let mut v = vec![];
    // coremltools' docstring lists the grid points of Xin = 2 ([0, 1]) for Xout = 5 and 6
    // in each sampling mode (two decimals): resizing [0, 1] samples exactly them.
    let documented: Vec<(&str, usize, Vec<f64>)> = vec![
        ("UNALIGN_CORNERS", 5, vec![0., 0.1, 0.5, 0.9, 1.]),
        ("STRICT_ALIGN_CORNERS", 5, vec![0., 0.25, 0.5, 0.75, 1.]),
        ("ALIGN_CORNERS", 5, vec![0., 0.25, 0.5, 0.75, 1.]),
        ("DEFAULT", 5, vec![0., 0.4, 0.8, 1., 1.]),
        ("OFFSET_CORNERS", 5, vec![0.1, 0.3, 0.5, 0.7, 0.9]),
        ("UNALIGN_CORNERS", 6, vec![0., 0., 0.33, 0.67, 1., 1.]),
        ("STRICT_ALIGN_CORNERS", 6, vec![0., 0.2, 0.4, 0.6, 0.8, 1.]),
        ("DEFAULT", 6, vec![0., 0.33, 0.67, 1., 1., 1.]),
        (
            "OFFSET_CORNERS",
            6,
            vec![0.08, 0.25, 0.42, 0.58, 0.75, 0.92],
        ),
    ];
    for (mode, n, want) in documented {
        v.push(case(
            "resize_bilinear",
            &format!("[0, 1] to {n} in {mode}: coremltools' documented grid"),
            &[I15],
            &[F32],
            move |p| {
                let x = p.input_of("x", F32, &[1, 1, 2], &[0.0, 1.0]);
                let ins = vec![
                    ("x", In::V(x)),
                    ("target_size_height", ci0(1)),
                    ("target_size_width", ci0(n as i32)),
                    ("sampling_mode", cstr(mode)),
                ];
                let y = p.op("resize_bilinear", ins)?;
                // Two decimals: atol 1e-5 · 500.
                p.want(&y, &[1, 1, n], want.clone(), Cmp::Float(500.0))
            },
        ));
    }
    for mode in [
        "STRICT_ALIGN_CORNERS",
        "ALIGN_CORNERS",
        "DEFAULT",
        "OFFSET_CORNERS",
        "UNALIGN_CORNERS",
    ] {
        v.push(case(
            "resize_bilinear",
            &format!("[2, 3, 4, 5] to 7 x 3, {mode}"),
            &versions("resize_bilinear"),
            FP,
            move |p| {
                let s = [2, 3, 4, 5];
                let (x, xv) = p.xs("x", &s);
                let ins = vec![
                    ("x", In::V(x)),
                    ("target_size_height", ci0(7)),
                    ("target_size_width", ci0(3)),
                    ("sampling_mode", cstr(mode)),
                ];
                let y = p.op("resize_bilinear", ins)?;
                p.want(&y, &[2, 3, 7, 3], bilinear_ref(&xv, &s, 7, 3, mode), CLOSE)
            },
        ));
    }
    // upsample_bilinear: align_corners → STRICT_ALIGN_CORNERS, else the half-pixel
    // (UNALIGN_CORNERS) grid; iOS16's half_pixel_centers = false without align → DEFAULT.
    type Up = (
        &'static str,
        Vec<Opset>,
        Option<bool>,
        Option<bool>,
        &'static str,
    );
    let ups: Vec<Up> = vec![
        (
            "align_corners default (true)",
            versions("upsample_bilinear"),
            None,
            None,
            "STRICT_ALIGN_CORNERS",
        ),
        (
            "align_corners false",
            versions("upsample_bilinear"),
            Some(false),
            None,
            "UNALIGN_CORNERS",
        ),
        (
            "align_corners false, half_pixel_centers false",
            vec![I16],
            Some(false),
            Some(false),
            "DEFAULT",
        ),
    ];
    for (what, opsets, align, half, mode) in ups {
        v.push(case("upsample_bilinear", what, &opsets, FP, move |p| {
            let s = [1, 2, 3, 4];
            let (x, xv) = p.xs("x", &s);
            let mut ins = vec![
                ("x", In::V(x)),
                ("scale_factor_height", In::C(Value::f32_scalar(2.0))),
                ("scale_factor_width", In::C(Value::f32_scalar(3.0))),
            ];
            if let Some(a) = align {
                ins.push(("align_corners", cb(a)));
            }
            if let Some(h) = half {
                ins.push(("half_pixel_centers", cb(h)));
            }
            let y = p.op("upsample_bilinear", ins)?;
            p.want(
                &y,
                &[1, 2, 6, 12],
                bilinear_ref(&xv, &s, 6, 12, mode),
                CLOSE,
            )
        }));
    }
    v.push(case(
        "upsample_nearest_neighbor",
        "scale 2 x 1.5: input index floor(i / scale)",
        &versions("upsample_nearest_neighbor"),
        FP,
        |p| {
            let s = [2, 1, 3, 4];
            let (x, xv) = p.xs("x", &s);
            let ins = vec![
                ("x", In::V(x)),
                ("scale_factor_height", In::C(Value::f32_scalar(2.0))),
                ("scale_factor_width", In::C(Value::f32_scalar(1.5))),
            ];
            let y = p.op("upsample_nearest_neighbor", ins)?;
            // The scales are exactly out / in here (2 = 6 / 3, 1.5 = 6 / 4).
            let w = nearest_ref(&xv, &s, 6, 6, &|i, h, o| {
                ((i as f64 / (o as f64 / h as f64)).floor() as usize).min(h - 1)
            });
            p.want(&y, &[2, 1, 6, 6], w, Cmp::Exact)
        },
    ));
    v.push(case(
        "resize_nearest_neighbor",
        "[1, 2, 5, 4] to 3 x 7: input index floor(i · in / out)",
        &versions("resize_nearest_neighbor"),
        FP,
        |p| {
            let s = [1, 2, 5, 4];
            let (x, xv) = p.xs("x", &s);
            let ins = vec![
                ("x", In::V(x)),
                ("target_size_height", ci0(3)),
                ("target_size_width", ci0(7)),
            ];
            let y = p.op("resize_nearest_neighbor", ins)?;
            let w = nearest_ref(&xv, &s, 3, 7, &|i, h, o| (i * h / o).min(h - 1));
            p.want(&y, &[1, 2, 3, 7], w, Cmp::Exact)
        },
    ));
    v.push(case(
        "resize",
        "LINEAR, the last 2 of shape [9, 6, 0] (0 keeps x's length), ALIGN_CORNERS",
        &versions("resize"),
        FP,
        |p| {
            let s = [2, 3, 4, 5];
            let (x, xv) = p.xs("x", &s);
            let ins = vec![
                ("x", In::V(x)),
                ("shape", ci(&[9, 6, 0])),
                (
                    "resized_dims",
                    In::C(Value::Tensor(ITensor::new(
                        DType::U32,
                        vec![],
                        milkit::ir::Bytes::from_vec(2u32.to_le_bytes().to_vec()),
                    )?)),
                ),
                ("interpolation_mode", cstr("LINEAR")),
                ("sampling_mode", cstr("ALIGN_CORNERS")),
            ];
            let y = p.op("resize", ins)?;
            p.want(
                &y,
                &[2, 3, 6, 5],
                bilinear_ref(&xv, &s, 6, 5, "ALIGN_CORNERS"),
                CLOSE,
            )
        },
    ));
    v.push(case(
        "resize",
        "NEAREST_NEIGHBOR, DEFAULT, a computed shape, int32 x",
        &versions("resize"),
        &[I32],
        |p| {
            let s = [1, 2, 3];
            let xv: Vec<f64> = (0..6).map(|i| (i * 7 % 11) as f64 - 5.0).collect();
            let x = p.input_of("x", I32, &s, &xv);
            let sh = p.input_of("shape", I32, &[2], &[4.0, 5.0]);
            let ins = vec![
                ("x", In::V(x)),
                ("shape", In::V(sh)),
                (
                    "resized_dims",
                    In::C(Value::Tensor(ITensor::new(
                        DType::U32,
                        vec![],
                        milkit::ir::Bytes::from_vec(2u32.to_le_bytes().to_vec()),
                    )?)),
                ),
                ("interpolation_mode", cstr("NEAREST_NEIGHBOR")),
            ];
            let y = p.op("resize", ins)?;
            // The DEFAULT grid point i·h/o rounded half up: floor((2·i·h + o) / 2o).
            let w = nearest_ref(&xv, &s, 4, 5, &|i, h, o| {
                ((2 * i * h + o) / (2 * o)).min(h - 1)
            });
            p.want(&y, &[1, 4, 5], w, Cmp::Exact)
        },
    ));
    v.push(case(
        "crop",
        "[2, 3, 6, 7] cropped [1, 2] x [0, 3]",
        &versions("crop"),
        FP,
        |p| {
            let s = [2, 3, 6, 7];
            let (x, xv) = p.xs("x", &s);
            let ins = vec![
                ("x", In::V(x)),
                ("crop_height", ci(&[1, 2])),
                ("crop_width", ci(&[0, 3])),
            ];
            let y = p.op("crop", ins)?;
            let mut w = vec![];
            for pl in 0..6 {
                for i in 1..4 {
                    for j in 0..4 {
                        w.push(xv[(pl * 6 + i) * 7 + j]);
                    }
                }
            }
            p.want(&y, &[2, 3, 3, 4], w, Cmp::Exact)
        },
    ));
    v
}

/// Index of the largest value, the first on a tie (numpy's argmax on finite values).
fn argmax_ref(v: &[f64]) -> usize {
    (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b })
}

/// `classify` on probabilities an op computed (coremltools takes a classifier's
/// probabilities from an op, never straight from an input), cast to fp32 as coremltools
/// does for fp16 ones: string classes on a softmax of shape [1, 5], int64 classes on a
/// sigmoid of shape [2, 3] (one class per element, row-major). The inputs are spaced so
/// that no two probabilities tie in fp16.
fn classify_cases() -> Vec<Case> {
    fn to_fp32(p: &mut Prog, y: V) -> Result<V> {
        if p.dt == F32 {
            return Ok(y);
        }
        p.op("cast", vec![("x", In::V(y)), ("dtype", cstr("fp32"))])
    }
    let strings = |v: &[&str]| Value::List {
        elem: ValueType::Tensor(TensorType::scalar(DType::Str)),
        values: v.iter().map(|s| Value::str(s)).collect(),
    };
    let int64s = |v: &[i64]| Value::List {
        elem: ValueType::Tensor(TensorType::scalar(DType::I64)),
        values: v
            .iter()
            .map(|&x| {
                Value::Tensor(
                    ITensor::new(
                        DType::I64,
                        vec![],
                        milkit::ir::Bytes::from_vec(x.to_le_bytes().to_vec()),
                    )
                    .unwrap(),
                )
            })
            .collect(),
    };
    vec![
        case(
            "classify",
            "string classes, softmax [1, 5]",
            &versions("classify"),
            FP,
            move |p| {
                let xv: Vec<f64> = [0.4, -1.1, 2.3, 0.9, -0.2]
                    .iter()
                    .map(|&v| p.r(v))
                    .collect();
                let dt = p.dt;
                let x = p.input_of("x", dt, &[1, 5], &xv);
                let y = p.op("softmax", vec![("x", In::V(x)), ("axis", ci0(-1))])?;
                let y = to_fp32(p, y)?;
                let names = ["cat", "dog", "eel", "fox", "gnu"];
                let outs = p.ops(
                    "classify",
                    vec![
                        ("probabilities", In::V(y)),
                        ("classes", In::Inline(strings(&names))),
                    ],
                )?;
                let m = xv.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = xv.iter().map(|v| (v - m).exp()).collect();
                let sum: f64 = e.iter().sum();
                let probs: Vec<f64> = e.iter().map(|v| v / sum).collect();
                let class = |i: usize| Class::S(names[i].to_string());
                p.want_class(
                    &outs,
                    ClassWant {
                        label: class(argmax_ref(&probs)),
                        probs: probs
                            .iter()
                            .enumerate()
                            .map(|(i, &q)| (class(i), q))
                            .collect(),
                    },
                )
            },
        ),
        case(
            "classify",
            "int64 classes, sigmoid [2, 3]",
            &versions("classify"),
            FP,
            move |p| {
                let xv: Vec<f64> = [-0.7, 1.6, 0.2, -2.0, 0.9, 2.4]
                    .iter()
                    .map(|&v| p.r(v))
                    .collect();
                let dt = p.dt;
                let x = p.input_of("x", dt, &[2, 3], &xv);
                let y = p.op("sigmoid", vec![("x", In::V(x))])?;
                let y = to_fp32(p, y)?;
                let ids = [10i64, -3, 7, 1 << 40, 0, 5];
                let outs = p.ops(
                    "classify",
                    vec![
                        ("probabilities", In::V(y)),
                        ("classes", In::Inline(int64s(&ids))),
                    ],
                )?;
                let probs: Vec<f64> = xv.iter().map(|v| 1.0 / (1.0 + (-v).exp())).collect();
                p.want_class(
                    &outs,
                    ClassWant {
                        label: Class::I(ids[argmax_ref(&probs)]),
                        probs: probs
                            .iter()
                            .zip(ids)
                            .map(|(&q, i)| (Class::I(i), q))
                            .collect(),
                    },
                )
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
    // What README states: every op of every opset runs.
    let want_counts = [(I15, 151), (I16, 158), (I17, 161), (I18, 167)];
    for (opset, want) in want_counts {
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
        if (defined.len(), exists) != (want, want) {
            problems.push(format!(
                "{}: milkit runs {} of {exists} ops, README says {want} of {want}",
                opset.opset_name(),
                defined.len()
            ));
        }
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

fn target_of(o: Opset) -> u32 {
    match o {
        I15 => 15,
        I16 => 16,
        I17 => 17,
        I18 => 18,
    }
}

/// The same table, each run through a package coremltools' own MIL builder made: the
/// milkit-built package is parsed by coremltools 9 (`milproto.load`, which calls
/// `mb.<op>(**inputs)` for every op and re-types it) and written back out by `ct.convert`
/// with no graph pass (tests/coremltools_rebuild.py), so the package milkit then runs holds
/// the case's ops in coremltools' serialization: its constants and blobs, attributes and
/// description. Outputs are checked against the same float64 references; every op of
/// [`COREML_OPS`] but [`MISSING`] must pass on at least one such package.
#[test]
fn every_case_also_runs_from_a_package_coremltools_builder_made() {
    let Some(py) = common::python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cases = cases();
    let mut built = vec![];
    let mut jobs = vec![];
    let mut failures = vec![];
    for (i, c) in cases.iter().enumerate() {
        for &o in &c.opsets {
            for &dt in &c.dts {
                let label = format!("{} ({}) {} {dt}", c.op, c.what, o.opset_name());
                let k = built.len();
                let src = dir.path().join(format!("{k}.mlpackage"));
                let dst = dir.path().join(format!("{k}.ct.mlpackage"));
                let b = build_case(c, o, dt, 1000 + i as u64, true).and_then(|b| {
                    milkit::package::save_package(&b.model, &src, false, &mut |_| {})?;
                    Ok(b)
                });
                match b {
                    Ok(b) => {
                        jobs.push(serde_json::json!({
                            "src": src, "dst": dst, "target": target_of(o)
                        }));
                        built.push((label, c.op.clone(), dst, b));
                    }
                    Err(e) => failures.push(format!("{label}: building: {e:#}")),
                }
            }
        }
    }
    // Two coremltools processes side by side, each rebuilding every other case.
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/coremltools_rebuild.py");
    let children: Vec<_> = (0..2)
        .map(|half| {
            let mine: Vec<_> = jobs.iter().skip(half).step_by(2).collect();
            let jobs_path = dir.path().join(format!("jobs{half}.json"));
            std::fs::write(&jobs_path, serde_json::to_vec(&mine).unwrap()).unwrap();
            std::process::Command::new(&py)
                .arg(&script)
                .arg(&jobs_path)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("run tests/coremltools_rebuild.py")
        })
        .collect();
    let mut stdout = String::new();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "coremltools_rebuild.py failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout.push_str(&String::from_utf8_lossy(&out.stdout));
    }
    let mut rebuilt = std::collections::BTreeMap::new();
    for line in stdout.lines() {
        let Ok(r) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let dst = r["dst"].as_str().unwrap_or_default().to_string();
        let err = (r["ok"] != true).then(|| r["error"].as_str().unwrap_or("?").to_string());
        rebuilt.insert(dst, err);
    }
    let mut covered = BTreeSet::new();
    for (label, op, dst, b) in &built {
        match rebuilt.get(dst.to_str().unwrap()) {
            None => failures.push(format!("{label}: coremltools wrote no result")),
            Some(Some(e)) => failures.push(format!("{label}: coremltools refused it: {e}")),
            Some(None) => {
                // The op under test is in coremltools' package, not folded away.
                let has = milkit::package::load_package(dst).map(|m| {
                    m.program
                        .functions
                        .values()
                        .any(|f| f.block.walk().iter().any(|x| &x.op_type == op))
                });
                if let Err(e) = has {
                    failures.push(format!("{label}: loading coremltools' package: {e:#}"));
                } else if has.is_ok_and(|h| !h) {
                    failures.push(format!("{label}: no {op} op in coremltools' package"));
                } else if let Err(e) = check_package(dst, b) {
                    failures.push(format!("{label}: {e:#}"));
                } else {
                    covered.insert(op.clone());
                }
            }
        }
    }
    let uncovered: Vec<&str> = COREML_OPS
        .iter()
        .map(|(n, _)| *n)
        .filter(|n| !covered.contains(*n) && !MISSING.iter().any(|(m, _)| m == n))
        .collect();
    eprintln!(
        "{} case runs from coremltools-made packages; {} ops covered",
        built.len(),
        covered.len()
    );
    assert!(
        failures.is_empty() && uncovered.is_empty(),
        "{} of {} failed:\n{}\nops on no coremltools-made package: {uncovered:?}",
        failures.len(),
        built.len(),
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

/// Runs tests/coremltools_nn_ops.py (coremltools' own MIL builder) into a temp dir; None
/// (skipped) without a coremltools python unless MILKIT_REQUIRE_FIXTURES=1.
fn coremltools_made() -> Option<tempfile::TempDir> {
    let py = common::python()?;
    let dir = tempfile::tempdir().unwrap();
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/coremltools_nn_ops.py");
    let out = std::process::Command::new(py)
        .arg(script)
        .arg(dir.path())
        .output()
        .expect("run tests/coremltools_nn_ops.py");
    assert!(
        out.status.success(),
        "coremltools_nn_ops.py failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(dir)
}

fn npy(dir: &std::path::Path, name: &str) -> Vec<f64> {
    values(&milkit::runtime::io::read_npy(&dir.join(format!("{name}.npy"))).unwrap()).unwrap()
}

/// Loads `name`.mlpackage, feeds `x` (f32, shape `xs`) and returns the outputs.
fn run_made(
    dir: &std::path::Path,
    name: &str,
    xs: &[usize],
    seed: u64,
) -> (Vec<f64>, Vec<(String, Tensor)>) {
    let mut rng = Rng(seed);
    let xv: Vec<f64> = (0..numel(xs))
        .map(|_| (rng.next() as f64) as f32 as f64)
        .collect();
    let t = Tensor::from_vec(xv.iter().map(|&v| v as f32).collect::<Vec<_>>(), xs, &cpu()).unwrap();
    let mut s = Session::load(&dir.join(format!("{name}.mlpackage")))
        .unwrap_or_else(|e| panic!("{name}: {e:#}"));
    let got = s
        .predict(&[("x", t)])
        .unwrap_or_else(|e| panic!("{name}: {e:#}"));
    (xv, got)
}

#[test]
fn coremltools_made_conv_transpose_and_conv_quantized_match_float64_references() {
    let Some(dir) = coremltools_made() else {
        return;
    };
    let d = dir.path();
    for name in ["conv_transpose_ios15", "conv_transpose_ios17"] {
        let (xv, got) = run_made(d, name, &[1, 4, 3, 4], 11);
        let (wv, bv) = (npy(d, &format!("{name}.w")), npy(d, &format!("{name}.b")));
        let (want, shape) = conv_transpose_ref(
            &xv,
            &[1, 4, 3, 4],
            &wv,
            &[4, 3, 3, 2],
            Some(&bv),
            2,
            &[2, 1],
            &[1, 2],
            &[1, 0],
            &[6, 4],
        );
        assert_eq!(got.len(), 1, "{name}");
        compare(&got[0].1, &shape, &want, Cmp::Float(12.0))
            .unwrap_or_else(|e| panic!("{name}: {e:#}"));
    }
    let (xv, got) = run_made(d, "conv_quantized", &[1, 2, 4, 5], 12);
    let (codes, sc) = (npy(d, "conv_quantized.w"), npy(d, "conv_quantized.s"));
    let wv: Vec<f64> = codes
        .iter()
        .enumerate()
        .map(|(i, &c)| c * sc[i / 18] - 0.5)
        .collect();
    // W = codes · scale[channel] + quant_bias (−0.5); conv with "same" padding (1 each side).
    let mut want = vec![0.0; 3 * 4 * 5];
    for o in 0..3 {
        for i in 0..4 {
            for j in 0..5 {
                let mut acc = 0.0;
                for c in 0..2 {
                    for a in 0..3 {
                        for b in 0..3 {
                            let (yy, xx) = (i as i64 + a as i64 - 1, j as i64 + b as i64 - 1);
                            if (0..4).contains(&yy) && (0..5).contains(&xx) {
                                acc += wv[((o * 2 + c) * 3 + a) * 3 + b]
                                    * xv[(c * 4 + yy as usize) * 5 + xx as usize];
                            }
                        }
                    }
                }
                want[(o * 4 + i) * 5 + j] = acc;
            }
        }
    }
    compare(&got[0].1, &[1, 3, 4, 5], &want, Cmp::Float(18.0 * 2.0)).unwrap();
}

#[test]
fn coremltools_made_resize_family_matches_float64_references() {
    let Some(dir) = coremltools_made() else {
        return;
    };
    let s = [1, 2, 3, 4];
    let (xv, got) = run_made(dir.path(), "resize_family", &s, 13);
    let mut crop = vec![];
    for pl in 0..2 {
        for i in 1..3 {
            crop.push(xv[(pl * 3 + i) * 4 + 1]);
        }
    }
    let want: Vec<(&str, Vec<usize>, Vec<f64>, Cmp)> = vec![
        (
            "up_bi",
            vec![1, 2, 6, 12],
            bilinear_ref(&xv, &s, 6, 12, "UNALIGN_CORNERS"),
            CLOSE,
        ),
        (
            "up_nn",
            vec![1, 2, 6, 8],
            nearest_ref(&xv, &s, 6, 8, &|i, _, _| i / 2),
            Cmp::Exact,
        ),
        (
            "rs_bi",
            vec![1, 2, 5, 7],
            bilinear_ref(&xv, &s, 5, 7, "ALIGN_CORNERS"),
            CLOSE,
        ),
        (
            "rs_nn",
            vec![1, 2, 2, 6],
            nearest_ref(&xv, &s, 2, 6, &|i, h, o| i * h / o),
            Cmp::Exact,
        ),
        ("crop", vec![1, 2, 2, 1], crop, Cmp::Exact),
        (
            "resize",
            vec![1, 2, 6, 3],
            bilinear_ref(&xv, &s, 6, 3, "UNALIGN_CORNERS"),
            CLOSE,
        ),
    ];
    assert_eq!(got.len(), want.len());
    for ((n, t), (wn, shape, w, cmp)) in got.iter().zip(&want) {
        assert_eq!(n, wn);
        compare(t, shape, w, *cmp).unwrap_or_else(|e| panic!("{n}: {e:#}"));
    }
}

/// Loads `name`.mlpackage and runs it on the given f32 inputs.
fn run_made_on(
    dir: &std::path::Path,
    name: &str,
    feeds: &[(&str, &[usize], &[f64])],
) -> Vec<(String, Tensor)> {
    let mut s = Session::load(&dir.join(format!("{name}.mlpackage")))
        .unwrap_or_else(|e| panic!("{name}: {e:#}"));
    let ts: Vec<(&str, Tensor)> = feeds
        .iter()
        .map(|(n, sh, v)| {
            let f: Vec<f32> = v.iter().map(|&e| e as f32).collect();
            (*n, Tensor::from_vec(f, *sh, &cpu()).unwrap())
        })
        .collect();
    s.predict(&ts).unwrap_or_else(|e| panic!("{name}: {e:#}"))
}

fn lcg_vals(seed: u64, n: usize) -> Vec<f64> {
    let mut r = Rng(seed);
    (0..n).map(|_| r.next() as f64).collect()
}

#[test]
fn coremltools_made_rnn_gru_lstm_and_nms_match_float64_references() {
    let Some(dir) = coremltools_made() else {
        return;
    };
    let d = dir.path();
    let (s, b, isz, hsz) = (4, 2, 3, 5);
    let xv = lcg_vals(21, s * b * isz);
    let h0 = lcg_vals(22, b * hsz);
    let hb = lcg_vals(23, b * 2 * hsz);
    let cb = lcg_vals(24, b * 2 * hsz);
    let got = run_made_on(
        d,
        "recurrent",
        &[
            ("x", &[s, b, isz], &xv),
            ("h0", &[b, hsz], &h0),
            ("hb", &[b, 2 * hsz], &hb),
            ("cb", &[b, 2 * hsz], &cb),
        ],
    );
    let w = |n: &str| npy(d, &format!("recurrent.{n}"));
    let h0s = split_rows(&h0, hsz);
    // rnn, reverse: outputs in processing order.
    let (wi, wh, bias) = (w("rnn_wi"), w("rnn_wh"), w("rnn_b"));
    let rnn = |x: &[f64], h: &[f64], _: &[f64]| {
        let (a, c) = (mv(&wi, 0, hsz, x), mv(&wh, 0, hsz, h));
        let h: Vec<f64> = (0..hsz).map(|k| (a[k] + c[k] + bias[k]).tanh()).collect();
        (h, vec![0.0; hsz])
    };
    let run_rnn = run_cell(&xv, (s, b, isz), &h0s, &h0s, true, &rnn);
    // gru [r, o, z], reset before R_o.
    let (gwi, gwh, gb) = (w("gru_wi"), w("gru_wh"), w("gru_b"));
    let gru = |x: &[f64], h: &[f64], _: &[f64]| {
        let (gx, gh) = (mv(&gwi, 0, 3 * hsz, x), mv(&gwh, 0, 3 * hsz, h));
        let r: Vec<f64> = (0..hsz).map(|k| sigmoid(gx[k] + gh[k] + gb[k])).collect();
        let z: Vec<f64> = (0..hsz)
            .map(|k| sigmoid(gx[2 * hsz + k] + gh[2 * hsz + k] + gb[2 * hsz + k]))
            .collect();
        let rh: Vec<f64> = (0..hsz).map(|k| r[k] * h[k]).collect();
        let ho = mv(&gwh, hsz, hsz, &rh);
        let h: Vec<f64> = (0..hsz)
            .map(|k| {
                let o = (gx[hsz + k] + ho[k] + gb[hsz + k]).tanh();
                (1.0 - z[k]) * o + z[k] * h[k]
            })
            .collect();
        (h, vec![0.0; hsz])
    };
    let run_gru = run_cell(&xv, (s, b, isz), &h0s, &h0s, false, &gru);
    // lstm, bidirectional, peephole, clip 0.7.
    let mut lstm_runs = vec![];
    for (di, sfx) in ["", "b"].iter().enumerate() {
        let (wi, wh, bias, peep) = (
            w(&format!("lstm_wi{sfx}")),
            w(&format!("lstm_wh{sfx}")),
            w(&format!("lstm_b{sfx}")),
            w(&format!("lstm_p{sfx}")),
        );
        let cell = |x: &[f64], h: &[f64], c: &[f64]| {
            let (gx, gh) = (mv(&wi, 0, 4 * hsz, x), mv(&wh, 0, 4 * hsz, h));
            let pre = |g: usize, k: usize| gx[g * hsz + k] + gh[g * hsz + k] + bias[g * hsz + k];
            let (mut nh, mut nc) = (vec![0.0; hsz], vec![0.0; hsz]);
            for k in 0..hsz {
                let i = sigmoid(pre(0, k) + c[k] * peep[k]);
                let f = sigmoid(pre(1, k) + c[k] * peep[hsz + k]);
                let cc = (f * c[k] + i * pre(3, k).tanh()).clamp(-0.7, 0.7);
                let o = sigmoid(pre(2, k) + cc * peep[2 * hsz + k]);
                nh[k] = o * cc.tanh();
                nc[k] = cc;
            }
            (nh, nc)
        };
        let rows = |v: &[f64]| -> Vec<Vec<f64>> {
            (0..b)
                .map(|bi| v[(bi * 2 + di) * hsz..(bi * 2 + di + 1) * hsz].to_vec())
                .collect()
        };
        lstm_runs.push(run_cell(
            &xv,
            (s, b, isz),
            &rows(&hb),
            &rows(&cb),
            di == 1,
            &cell,
        ));
    }
    // The expectations, through the conformance harness's layout helper.
    let mut p = Prog::new(I17, F32, 0);
    let vs: Vec<V> = (0..7)
        .map(|i| p.input_of(&format!("o{i}"), F32, &[1], &[0.0]))
        .collect();
    want_rec(
        &mut p,
        &vs[0..2],
        &[run_rnn],
        true,
        (s, b),
        false,
        false,
        8.0,
    )
    .unwrap();
    want_rec(
        &mut p,
        &vs[2..4],
        &[run_gru],
        true,
        (s, b),
        false,
        false,
        8.0,
    )
    .unwrap();
    want_rec(&mut p, &vs[4..7], &lstm_runs, true, (s, b), true, true, 8.0).unwrap();
    assert_eq!(got.len(), 7);
    for ((n, t), (_, shape, want, cmp)) in got.iter().zip(&p.outs) {
        compare(t, shape, want, *cmp).unwrap_or_else(|e| panic!("{n}: {e:#}"));
    }

    // non_maximum_suppression, iOS15, per class: centres in [-1, 1), sizes in [0.5, 1.5).
    let raw = lcg_vals(25, 8 * 4);
    let boxes: Vec<[f64; 4]> = raw
        .chunks(4)
        .map(|c| [c[0], c[1], c[2].abs() + 0.5, c[3].abs() + 0.5])
        .map(|bx| bx.map(|e| e as f32 as f64))
        .collect();
    let scores: Vec<Vec<f64>> = lcg_vals(26, 8 * 2)
        .chunks(2)
        .map(|c| c.iter().map(|e| (e.abs() as f32) as f64).collect())
        .collect();
    let bflat: Vec<f64> = boxes.iter().flatten().copied().collect();
    let sflat: Vec<f64> = scores.iter().flatten().copied().collect();
    let got = run_made_on(
        d,
        "nms",
        &[
            ("boxes", &[1, 8, 4], &bflat),
            ("scores", &[1, 8, 2], &sflat),
        ],
    );
    let ids = nms_ref(&boxes, &scores, 0.2f32 as f64, 0.1f32 as f64, 5, true);
    let mut ob = vec![0.0; 5 * 4];
    let mut os = vec![0.0; 5 * 2];
    let mut oi = vec![-1.0; 5];
    for (slot, &i) in ids.iter().enumerate() {
        ob[slot * 4..slot * 4 + 4].copy_from_slice(&boxes[i]);
        os[slot * 2..slot * 2 + 2].copy_from_slice(&scores[i]);
        oi[slot] = i as f64;
    }
    let want: [(&[usize], Vec<f64>); 4] = [
        (&[1, 5, 4], ob),
        (&[1, 5, 2], os),
        (&[1, 5], oi),
        (&[1], vec![ids.len() as f64]),
    ];
    assert_eq!(got.len(), 4);
    for ((n, t), (shape, w)) in got.iter().zip(&want) {
        compare(t, shape, w, Cmp::Exact).unwrap_or_else(|e| panic!("{n}: {e:#}"));
    }
    assert!(ids.len() >= 2, "the case keeps several boxes: {ids:?}");
}

#[test]
fn coremltools_made_resample_affine_and_crop_resize_match_float64_references() {
    let Some(dir) = coremltools_made() else {
        return;
    };
    let d = dir.path();
    let (b, c, h, w) = (2, 2, 4, 5);
    let xv = lcg_vals(31, b * c * h * w);
    // Coordinates in [-0.25, 1.25): some outside the image (border padding).
    let cv: Vec<f64> = lcg_vals(32, b * 3 * 6 * 2)
        .iter()
        .map(|e| (e * 0.75 + 0.5) as f32 as f64)
        .collect();
    let got = run_made_on(
        d,
        "sampling",
        &[("x", &[b, c, h, w], &xv), ("coords", &[b, 3, 6, 2], &cv)],
    );
    assert_eq!(got.len(), 3);
    let plane = |bi: usize, ci: usize| &xv[(bi * c + ci) * h * w..(bi * c + ci + 1) * h * w];
    let mut resample = vec![];
    for bi in 0..b {
        for ci in 0..c {
            for q in 0..18 {
                let at = (bi * 18 + q) * 2;
                resample.push(sample_ref(
                    plane(bi, ci),
                    (h, w),
                    (cv[at], cv[at + 1]),
                    "normalized_zero_to_one",
                    true,
                    false,
                    "border",
                    0.0,
                ));
            }
        }
    }
    let t = npy(d, "sampling.aff");
    let mut affine = vec![];
    for bi in 0..b {
        for ci in 0..c {
            for i in 0..3 {
                for j in 0..6 {
                    let (xn, yn) = (2.0 * j as f64 / 5.0 - 1.0, 2.0 * i as f64 / 2.0 - 1.0);
                    let pt = (t[0] * xn + t[1] * yn + t[2], t[3] * xn + t[4] * yn + t[5]);
                    affine.push(sample_ref(
                        plane(bi, ci),
                        (h, w),
                        pt,
                        "normalized_minus_one_to_one",
                        true,
                        false,
                        "constant",
                        0.0,
                    ));
                }
            }
        }
    }
    let boxes = npy(d, "sampling.boxes");
    let mut crop = vec![];
    for (k, img) in [1usize, 0].iter().enumerate() {
        let bx = [
            boxes[k * 4],
            boxes[k * 4 + 1],
            boxes[k * 4 + 2],
            boxes[k * 4 + 3],
        ];
        for ci in 0..c {
            crop.extend(crop_and_resize_ref(
                plane(*img, ci),
                (h, w),
                bx,
                (3, 4),
                true,
                0.5,
            ));
        }
    }
    let want: [(&[usize], Vec<f64>); 3] = [
        (&[b, c, 3, 6], resample),
        (&[b, c, 3, 6], affine),
        (&[2, c, 3, 4], crop),
    ];
    for ((n, t), (shape, w)) in got.iter().zip(&want) {
        compare(t, shape, w, CLOSE).unwrap_or_else(|e| panic!("{n}: {e:#}"));
    }
}

/// Classifiers `ct.convert` made from a `ClassifierConfig` (coremltools appends its
/// `classify` and writes the classifier description): string classes on an fp32 softmax
/// (iOS15), int64 classes on an fp16 sigmoid cast to fp32 (iOS18); label exact, the
/// dictionary's probabilities against float64 softmax / sigmoid of the same inputs.
#[test]
fn coremltools_made_classifiers_match_float64_references() {
    let Some(dir) = coremltools_made() else {
        return;
    };
    let cases = [
        (
            "classifier_str",
            "classLabel",
            vec![1usize, 5],
            vec![0.4, -1.1, 2.3, 0.9, -0.2],
            F32,
        ),
        (
            "classifier_int",
            "id",
            vec![2, 3],
            vec![-0.7, 1.6, 0.2, -2.0, 0.9, 2.4],
            F16,
        ),
    ];
    for (name, label, shape, xv, dt) in cases {
        let pkg = dir.path().join(format!("{name}.mlpackage"));
        let m = milkit::package::load_package(&pkg).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        let d = &m.description;
        let probs_name = format!("{label}_probs");
        assert_eq!(
            (
                d.predicted_feature.as_str(),
                d.predicted_probabilities.as_str()
            ),
            (label, probs_name.as_str()),
            "{name}"
        );
        let kinds: Vec<FeatureKind> = d.outputs.iter().map(|f| f.kind).collect();
        let want = match dt {
            F32 => ClassWant {
                label: Class::S(String::new()),
                probs: {
                    let m = xv.iter().cloned().fold(f64::MIN, f64::max);
                    let e: Vec<f64> = xv.iter().map(|v| (v - m).exp()).collect();
                    let sum: f64 = e.iter().sum();
                    let names = ["cat", "dog", "eel", "fox", "gnu"];
                    e.iter()
                        .zip(names)
                        .map(|(v, n)| (Class::S(n.into()), v / sum))
                        .collect()
                },
            },
            _ => ClassWant {
                label: Class::I(0),
                probs: xv
                    .iter()
                    .zip([10i64, -3, 7, 1 << 40, 0, 5])
                    .map(|(v, i)| (Class::I(i), 1.0 / (1.0 + (-v).exp())))
                    .collect(),
            },
        };
        let (label_kind, key) = match want.label {
            Class::S(_) => (FeatureKind::String, DictKey::String),
            Class::I(_) => (FeatureKind::Int64, DictKey::Int64),
        };
        assert_eq!(kinds, [label_kind, FeatureKind::Dict(key)], "{name}");
        let ps: Vec<f64> = want.probs.iter().map(|(_, p)| *p).collect();
        let want = ClassWant {
            label: want.probs[argmax_ref(&ps)].0.clone(),
            ..want
        };
        let x = Tensor::from_vec(
            xv.iter().map(|&v| v as f32).collect::<Vec<_>>(),
            shape,
            &cpu(),
        )
        .unwrap();
        let mut s = Session::load(&pkg).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        let got = s
            .predict_values(None, &[("x", x)])
            .unwrap_or_else(|e| panic!("{name}: {e:#}"));
        let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, [label, probs_name.as_str()], "{name}");
        check_class(&got[0].1, &got[1].1, &want, dt).unwrap_or_else(|e| panic!("{name}: {e:#}"));
    }
}

#[test]
fn crop_resize_refuses_a_sampling_mode_coremltools_leaves_undefined_naming_it() {
    let mut p = Prog::new(I17, F32, 1);
    let (x, _) = p.xs("x", &[1, 1, 3, 3]);
    let bx = p.input_of("boxes", F32, &[1, 4], &[0.0, 0.0, 2.0, 2.0]);
    let e = p
        .op(
            "crop_resize",
            vec![
                ("x", In::V(x)),
                ("boxes", In::V(bx)),
                ("sampling_mode", cstr("OFFSET_CORNERS")),
            ],
        )
        .unwrap_err();
    let e = format!("{e:#}");
    assert!(
        e.contains("crop_resize") && e.contains("OFFSET_CORNERS"),
        "{e}"
    );
}

/// Inputs coremltools 9's type inference refuses are refused by milkit's too, each error
/// naming the op and the rule (found by running every case through coremltools' builder).
#[test]
fn inputs_coremltools_refuses_are_refused_naming_the_op_and_the_rule() {
    let err = |opset: Opset, op: &str, f: &dyn Fn(&mut Prog) -> Vec<(&'static str, In)>| {
        let mut p = Prog::new(opset, F32, 1);
        let ins = f(&mut p);
        format!("{:#}", p.op(op, ins).unwrap_err())
    };
    // prelu on rank 3 with per-channel alpha.
    let e = err(I15, "prelu", &|p| {
        let (x, _) = p.xs("x", &[1, 3, 4]);
        vec![("x", In::V(x)), ("alpha", p.cf(&[3], &[0.1, 0.2, 0.3]))]
    });
    assert!(e.contains("prelu") && e.contains("rank 3"), "{e}");
    // conv_quantized with a bias (typed uint8 by coremltools, with no stated meaning).
    let e = err(I15, "conv_quantized", &|p| {
        let (x, _) = p.xs("x", &[1, 1, 3, 3]);
        let w = ITensor::new(
            DType::U8,
            vec![1, 1, 1, 1],
            milkit::ir::Bytes::from_vec(vec![3]),
        );
        vec![
            ("x", In::V(x)),
            ("weight", In::C(Value::Tensor(w.unwrap()))),
            ("bias", p.cf(&[1], &[0.5])),
            ("quantization_type", cstr("linear")),
            ("quant_scale", p.cs(0.1)),
            ("quant_bias", p.cs(0.0)),
        ]
    });
    assert!(e.contains("conv_quantized") && e.contains("bias"), "{e}");
    // constexpr_blockwise_shift_scale with an int8 offset on int4 data.
    let e = err(I18, "constexpr_blockwise_shift_scale", &|p| {
        let off = ITensor::new(DType::I8, vec![1, 1], milkit::ir::Bytes::from_vec(vec![1]));
        vec![
            (
                "data",
                In::Inline(sub_byte(DType::I4, &[1, 2], &[1, 2]).unwrap()),
            ),
            ("scale", In::Inline(p.fval(&[1, 1], &[0.5]))),
            ("offset", In::Inline(Value::Tensor(off.unwrap()))),
        ]
    });
    assert!(e.contains("offset") && e.contains("int8"), "{e}");
    // crop_resize (iOS15) with a batch-index roi on a batch of 2.
    let e = err(I15, "crop_resize", &|p| {
        let (x, _) = p.xs("x", &[2, 1, 3, 3]);
        let r = p.input_of("roi", F32, &[1, 1, 5, 1, 1], &[1.0, 0.0, 0.0, 2.0, 2.0]);
        vec![
            ("x", In::V(x)),
            ("roi", In::V(r)),
            ("sampling_mode", cstr("ALIGN_CORNERS")),
        ]
    });
    assert!(e.contains("crop_resize") && e.contains("batch"), "{e}");
    // reduce_argmax (iOS17) with an output dtype coremltools does not allow; iOS15 has no
    // output_dtype at all.
    let e = err(I17, "reduce_argmax", &|p| {
        let (x, _) = p.xs("x", &[2, 3]);
        vec![("x", In::V(x)), ("output_dtype", cstr("int8"))]
    });
    assert!(e.contains("output_dtype") && e.contains("int8"), "{e}");
    let e = err(I15, "reduce_argmax", &|p| {
        let (x, _) = p.xs("x", &[2, 3]);
        vec![("x", In::V(x)), ("output_dtype", cstr("int32"))]
    });
    assert!(e.contains("output_dtype"), "{e}");
}

/// Every case's program written as `model.mil` text and read back is the same program: in
/// both printer dialects with every constant inline, and as a compiled folder whose large
/// constants are `BLOBFILE` references into its weight file.
#[test]
fn every_case_round_trips_through_model_mil_text_unchanged() {
    use milkit::package::compiled::open_compiled;
    use milkit::package::mil_text::{parse_program, Weights};
    use milkit::package::mil_write::{write_compiled_dir, write_program, Dialect};
    let mut failures = vec![];
    let mut runs = 0;
    let none = Weights::Absent("every constant is inline".into());
    for (i, c) in cases().iter().enumerate() {
        for &o in &c.opsets {
            for &dt in &c.dts {
                runs += 1;
                let what = format!("{} ({}) {} {dt}", c.op, c.what, o.opset_name());
                let built = match build_case(c, o, dt, 1000 + i as u64, false) {
                    Ok(b) => b,
                    Err(e) => {
                        failures.push(format!("{what}: building: {e:#}"));
                        continue;
                    }
                };
                let p = &built.model.program;
                let r = (|| -> Result<()> {
                    for d in [Dialect::V1_0, Dialect::V1_3] {
                        let text = write_program(p, d, None)?;
                        let back = parse_program(&text, "case.mil", &none, None)
                            .with_context(|| format!("reading back:\n{text}"))?;
                        ensure!(back.version == d.version(), "dialect {}", back.version);
                        ensure!(
                            back.program == *p,
                            "dialect {}: the program changed:\n{text}",
                            d.version()
                        );
                    }
                    let dir = tempfile::tempdir()?;
                    let m = dir.path().join("case.mlmodelc");
                    std::fs::create_dir(&m)?;
                    write_compiled_dir(&built.model, &m)?;
                    let back = open_compiled(&m).context("opening the compiled folder")?;
                    ensure!(
                        back.model.program == *p,
                        "the compiled folder's program changed"
                    );
                    Ok(())
                })();
                if let Err(e) = r {
                    failures.push(format!("{what}: {e:#}"));
                }
            }
        }
    }
    eprintln!("{runs} case round trips");
    assert!(
        failures.is_empty(),
        "{} of {runs} failed:\n{}",
        failures.len(),
        failures
            .iter()
            .map(|f| f.chars().take(1500).collect::<String>())
            .collect::<Vec<_>>()
            .join("\n")
    );
}
