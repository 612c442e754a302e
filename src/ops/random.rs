//! Random ops (iOS15), as coremltools 9's `defs/iOS15/random.py` defines them:
//! `random_bernoulli` (1 with probability `prob`, default 0.5), `random_normal` (`mean`,
//! `stddev`, default 0, 1), `random_uniform` (in [`low`, `high`), default [0, 1)) of a
//! given `shape`, and `random_categorical` (`size` draws, with replacement, of a category
//! index per distribution along the last axis of `x`, read as `logits` or `probs`). The
//! output dtype is that of the distribution parameters (fp32 by default).
//!
//! Draws come from xoshiro256** seeded by splitmix64: from the op's `seed` input where it is
//! given (≥ 0; then every run of the op draws the same values), else from a fresh seed of
//! the session's stream ([`ExecEnv::next_seed`], set by `milkit run --seed`), so runs are
//! reproducible. The interpreter never folds these ops into constants.

use super::eval::{EvalCx, ExecEnv, RValue};
use super::infer::{tensor, InferCx};
use super::DefaultValue;
use super::{opt_c, req, InputSpec, OpDef};
use crate::ir::{DType, Dim, ValueType};
use crate::kernels;
use anyhow::{anyhow, bail, ensure, Result};

/// Whether `op_type` draws random values (its outputs differ between runs).
pub fn is_random(op_type: &str) -> bool {
    matches!(
        op_type,
        "random_bernoulli" | "random_categorical" | "random_normal" | "random_uniform"
    )
}

/// xoshiro256** (Blackman and Vigna), its state filled by splitmix64 from one seed.
pub struct Rng([u64; 4]);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut z = seed;
        let mut next = || {
            z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            x ^ (x >> 31)
        };
        Rng([next(), next(), next(), next()])
    }
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        let r = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        r
    }
    /// Uniform in [0, 1), 53 bits.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform();
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

/// The generator of one evaluation: the op's own `seed` when ≥ 0, else the session's.
fn rng(cx: &EvalCx) -> Result<Rng> {
    match cx.opt_int("seed")? {
        Some(s) if s >= 0 => Ok(Rng::new(s as u64)),
        _ => {
            let env: &dyn ExecEnv = cx.env()?;
            Ok(Rng::new(env.next_seed()))
        }
    }
}

/// The dtype of the distribution parameters `names` (all alike; fp32 when none is given).
fn param_dtype(cx: &InferCx, names: &[&str]) -> Result<DType> {
    let mut d = None;
    for n in names {
        if let Some(t) = cx.opt_t(n)? {
            ensure!(
                t.dtype == DType::F16 || t.dtype == DType::F32,
                "`{n}` must be fp16 or fp32, is {t}"
            );
            if let Some(d) = d {
                ensure!(d == t.dtype, "`{}` and `{n}` differ in dtype", names[0]);
            }
            d = Some(t.dtype);
        }
    }
    Ok(d.unwrap_or(DType::F32))
}

fn infer_shaped(cx: &InferCx, params: &[&str]) -> Result<Vec<ValueType>> {
    let dtype = param_dtype(cx, params)?;
    let s = cx.t("shape")?;
    ensure!(
        s.dtype == DType::I32 && s.rank() == 1,
        "`shape` must be a 1-D int32 tensor, is {s}"
    );
    let shape = match cx.opt_ints("shape")? {
        Some(v) => {
            ensure!(v.iter().all(|&d| d > 0), "`shape` {v:?} must be positive");
            v.into_iter().map(|d| Dim::Fixed(d as usize)).collect()
        }
        None => match s.shape[0] {
            Dim::Fixed(r) => vec![Dim::Unknown; r],
            Dim::Unknown => bail!("`shape` of unknown length: the output rank is not known"),
        },
    };
    Ok(vec![tensor(dtype, shape)])
}

fn infer_bernoulli(cx: &InferCx) -> Result<Vec<ValueType>> {
    infer_shaped(cx, &["prob"])
}
fn infer_normal(cx: &InferCx) -> Result<Vec<ValueType>> {
    infer_shaped(cx, &["mean", "stddev"])
}
fn infer_uniform(cx: &InferCx) -> Result<Vec<ValueType>> {
    infer_shaped(cx, &["low", "high"])
}

/// The output shape at run time (from the `shape` input's values).
fn run_shape(cx: &EvalCx) -> Result<Vec<usize>> {
    let v = cx.ints("shape")?;
    ensure!(v.iter().all(|&d| d > 0), "`shape` {v:?} must be positive");
    Ok(v.into_iter().map(|d| d as usize).collect())
}

fn scalar(cx: &EvalCx, name: &str, default: f64) -> Result<f64> {
    Ok(cx.opt_f64(name)?.unwrap_or(default))
}

/// Draws `n` values with `f` and returns them in the output dtype.
fn draw(cx: &EvalCx, shape: &[usize], f: impl FnMut(&mut Rng) -> f64) -> Result<Vec<RValue>> {
    let mut r = rng(cx)?;
    let mut f = f;
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|_| f(&mut r) as f32).collect();
    let t = kernels::from_vec(v, shape)?;
    Ok(vec![RValue::T(kernels::cast(&t, cx.out_dtype(0)?)?)])
}

fn eval_bernoulli(cx: &EvalCx) -> Result<Vec<RValue>> {
    let p = scalar(cx, "prob", 0.5)?;
    ensure!((0.0..=1.0).contains(&p), "`prob` {p} is not in [0, 1]");
    let shape = run_shape(cx)?;
    draw(cx, &shape, |r| (r.uniform() < p) as u8 as f64)
}

fn eval_normal(cx: &EvalCx) -> Result<Vec<RValue>> {
    let (m, s) = (scalar(cx, "mean", 0.0)?, scalar(cx, "stddev", 1.0)?);
    let shape = run_shape(cx)?;
    draw(cx, &shape, |r| m + s * r.normal())
}

fn eval_uniform(cx: &EvalCx) -> Result<Vec<RValue>> {
    let (lo, hi) = (scalar(cx, "low", 0.0)?, scalar(cx, "high", 1.0)?);
    ensure!(lo <= hi, "`low` {lo} is above `high` {hi}");
    let shape = run_shape(cx)?;
    draw(cx, &shape, |r| lo + (hi - lo) * r.uniform())
}

fn infer_categorical(cx: &InferCx) -> Result<Vec<ValueType>> {
    let x = cx.t("x")?;
    ensure!(
        x.dtype == DType::F16 || x.dtype == DType::F32,
        "`x` must be fp16 or fp32, is {x}"
    );
    ensure!(x.rank() >= 1, "`x` must have a category axis, is {x}");
    let mode = cx.str_or_default("mode")?;
    ensure!(
        mode == "logits" || mode == "probs",
        "`mode` must be `logits` or `probs`, is `{mode}`"
    );
    let size = cx.int_or_default("size")?;
    ensure!(size > 0, "`size` must be positive, is {size}");
    let mut shape = x.shape[..x.rank() - 1].to_vec();
    shape.push(Dim::Fixed(size as usize));
    Ok(vec![tensor(x.dtype, shape)])
}

fn eval_categorical(cx: &EvalCx) -> Result<Vec<RValue>> {
    let x = cx.t("x")?;
    let dims = x.dims().to_vec();
    let k = *dims.last().ok_or_else(|| anyhow!("`x` is a scalar"))?;
    ensure!(k > 0, "`x` has no categories");
    let size = cx.int_or_default("size")? as usize;
    let logits = cx.str_or_default("mode")? == "logits";
    let v = kernels::to_vec::<f64>(x)?;
    let mut r = rng(cx)?;
    let mut out = Vec::with_capacity(v.len() / k * size);
    for row in v.chunks(k) {
        // Unnormalised weights: exp(logit - max), or the probabilities as given.
        let w: Vec<f64> = if logits {
            let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            row.iter().map(|&l| (l - m).exp()).collect()
        } else {
            ensure!(
                row.iter().all(|&p| p >= 0.0 && p.is_finite()),
                "`x` holds a negative or non-finite probability"
            );
            row.to_vec()
        };
        let total: f64 = w.iter().sum();
        ensure!(
            total > 0.0 && total.is_finite(),
            "a distribution of `x` sums to {total}"
        );
        for _ in 0..size {
            let u = r.uniform() * total;
            let mut acc = 0.0;
            let mut pick = k - 1;
            for (j, &p) in w.iter().enumerate() {
                acc += p;
                if u < acc {
                    pick = j;
                    break;
                }
            }
            out.push(pick as f32);
        }
    }
    let mut shape = dims[..dims.len() - 1].to_vec();
    shape.push(size);
    let t = kernels::from_vec(out, &shape)?;
    Ok(vec![RValue::T(kernels::cast(&t, cx.out_dtype(0)?)?)])
}

const BERNOULLI_IN: &[InputSpec] = &[req("shape"), opt_c("prob"), opt_c("seed")];
const NORMAL_IN: &[InputSpec] = &[req("shape"), opt_c("mean"), opt_c("stddev"), opt_c("seed")];
const UNIFORM_IN: &[InputSpec] = &[req("shape"), opt_c("low"), opt_c("high"), opt_c("seed")];
const CATEGORICAL_IN: &[InputSpec] = &[
    req("x"),
    opt_c("mode").or(DefaultValue::Str("logits")),
    opt_c("size").or(DefaultValue::Int(1)),
    opt_c("seed"),
];

pub const DEFS: &[OpDef] = &[
    super::def(
        "random_bernoulli",
        BERNOULLI_IN,
        infer_bernoulli,
        eval_bernoulli,
    ),
    super::def(
        "random_categorical",
        CATEGORICAL_IN,
        infer_categorical,
        eval_categorical,
    ),
    super::def("random_normal", NORMAL_IN, infer_normal, eval_normal),
    super::def("random_uniform", UNIFORM_IN, infer_uniform, eval_uniform),
];
