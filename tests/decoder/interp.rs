//! Test support for tests/decoder.rs: a deliberately naive f32 evaluator for exactly the MIL ops
//! the decoder graphs use, so their semantics can be checked against the f32 reference before
//! milkit's runtime exists. Integers ride along as f32 (exact below 2^24). Op semantics follow
//! coremltools 9's op docs; anything outside what the decoder emits is an error, not a guess.

use anyhow::{anyhow, bail, ensure, Context, Result};
use milkit::ir::{Arg, Model, Operation, Value, ValueType};
use std::collections::HashMap;

#[derive(Clone, Debug)]
pub struct T {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl T {
    pub fn new(shape: &[usize], data: Vec<f32>) -> T {
        assert_eq!(
            shape.iter().product::<usize>(),
            data.len(),
            "shape/data mismatch"
        );
        T {
            shape: shape.to_vec(),
            data,
        }
    }
}

#[derive(Clone, Debug)]
enum Val {
    T(T),
    S(String),
}

fn strides(s: &[usize]) -> Vec<usize> {
    let mut st = vec![1; s.len()];
    for i in (0..s.len().saturating_sub(1)).rev() {
        st[i] = st[i + 1] * s[i + 1];
    }
    st
}

fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for a in (0..shape.len()).rev() {
        idx[a] = i % shape[a];
        i /= shape[a];
    }
    idx
}

fn broadcast(a: &T, b: &T, f: impl Fn(f32, f32) -> f32) -> Result<T> {
    let n = a.shape.len().max(b.shape.len());
    let pad = |s: &[usize]| [vec![1; n - s.len()], s.to_vec()].concat();
    let (sa, sb) = (pad(&a.shape), pad(&b.shape));
    let mut out = vec![0; n];
    for i in 0..n {
        ensure!(
            sa[i] == sb[i] || sa[i] == 1 || sb[i] == 1,
            "cannot broadcast {:?} and {:?}",
            a.shape,
            b.shape
        );
        out[i] = sa[i].max(sb[i]);
    }
    let (ta, tb) = (strides(&sa), strides(&sb));
    let total: usize = out.iter().product();
    let data = (0..total)
        .map(|i| {
            let idx = unravel(i, &out);
            let ia: usize = (0..n)
                .map(|k| if sa[k] == 1 { 0 } else { idx[k] * ta[k] })
                .sum();
            let ib: usize = (0..n)
                .map(|k| if sb[k] == 1 { 0 } else { idx[k] * tb[k] })
                .sum();
            f(a.data[ia], b.data[ib])
        })
        .collect();
    Ok(T { shape: out, data })
}

fn axis(a: f32, rank: usize) -> usize {
    let a = a as i64;
    (if a < 0 { a + rank as i64 } else { a }) as usize
}

/// (outer, len, inner) around `ax`.
fn around(shape: &[usize], ax: usize) -> (usize, usize, usize) {
    (
        shape[..ax].iter().product(),
        shape[ax],
        shape[ax + 1..].iter().product(),
    )
}

/// Runs a single-function model. `states` holds the state tensors by input name; they are
/// read and written in place.
pub struct Interp<'a> {
    m: &'a Model,
}

impl<'a> Interp<'a> {
    pub fn new(m: &'a Model) -> Interp<'a> {
        Interp { m }
    }

    pub fn run(
        &self,
        inputs: &HashMap<&str, T>,
        states: &mut HashMap<String, T>,
    ) -> Result<HashMap<String, T>> {
        let f = self
            .m
            .program
            .main()
            .ok_or_else(|| anyhow!("no main function"))?;
        let mut env: HashMap<String, Val> = HashMap::new();
        for v in &f.inputs {
            match &v.ty {
                ValueType::Tensor(_) => {
                    let t = inputs
                        .get(v.name.as_str())
                        .ok_or_else(|| anyhow!("missing input {}", v.name))?;
                    env.insert(v.name.clone(), Val::T(t.clone()));
                }
                ValueType::State(_) => {
                    ensure!(states.contains_key(&v.name), "missing state {}", v.name)
                }
                t => bail!("unsupported input type {t}"),
            }
        }
        for op in &f.block.operations {
            let outs = self
                .eval(op, &env, states)
                .with_context(|| format!("op {} ({})", op.name, op.op_type))?;
            ensure!(
                outs.len() == op.outputs.len(),
                "op {} produced {} outputs",
                op.name,
                outs.len()
            );
            for (o, v) in op.outputs.iter().zip(outs) {
                if let (Val::T(t), ValueType::Tensor(tt)) = (&v, &o.ty) {
                    ensure!(
                        Some(t.shape.clone()) == tt.fixed_shape(),
                        "op {}: evaluated shape {:?}, declared {}",
                        op.name,
                        t.shape,
                        tt
                    );
                }
                env.insert(o.name.clone(), v);
            }
        }
        let mut res = HashMap::new();
        for o in &f.block.outputs {
            match env.get(o) {
                Some(Val::T(t)) => res.insert(o.clone(), t.clone()),
                _ => bail!("output {o} missing"),
            };
        }
        Ok(res)
    }

    fn eval(
        &self,
        op: &Operation,
        env: &HashMap<String, Val>,
        states: &mut HashMap<String, T>,
    ) -> Result<Vec<Val>> {
        let get = |p: &str| -> Result<Val> {
            let a = op
                .inputs
                .get(p)
                .and_then(|v| v.first())
                .ok_or_else(|| anyhow!("no input {p}"))?;
            match a {
                Arg::Var(n) => env.get(n).cloned().ok_or_else(|| anyhow!("undefined {n}")),
                Arg::Value(v) => from_value(v),
            }
        };
        let t = |p: &str| -> Result<T> {
            match get(p)? {
                Val::T(t) => Ok(t),
                Val::S(_) => bail!("{p} is a string"),
            }
        };
        let opt_t = |p: &str| {
            if op.inputs.contains_key(p) {
                t(p).map(Some)
            } else {
                Ok(None)
            }
        };
        let scalar = |p: &str, d: f32| -> Result<f32> { Ok(opt_t(p)?.map_or(d, |t| t.data[0])) };
        let state_name = |p: &str| -> Result<String> {
            match op.inputs.get(p).and_then(|v| v.first()) {
                Some(Arg::Var(n)) => Ok(n.clone()),
                _ => bail!("{p} is not a state variable"),
            }
        };
        let one = |t: T| Ok(vec![Val::T(t)]);
        match op.op_type.as_str() {
            "const" => Ok(vec![from_value(
                op.const_val().ok_or_else(|| anyhow!("const without val"))?,
            )?]),
            "identity" => one(t("x")?),
            "add" => one(broadcast(&t("x")?, &t("y")?, |a, b| a + b)?),
            "sub" => one(broadcast(&t("x")?, &t("y")?, |a, b| a - b)?),
            "mul" => one(broadcast(&t("x")?, &t("y")?, |a, b| a * b)?),
            "gelu" => {
                if let Val::S(mode) = get("mode")? {
                    ensure!(mode == "EXACT", "gelu mode {mode} is not supported");
                }
                let x = t("x")?;
                one(T {
                    data: x.data.iter().map(|&v| super::reference::gelu(v)).collect(),
                    shape: x.shape,
                })
            }
            "reshape" => {
                let x = t("x")?;
                let s = t("shape")?.data;
                let known: usize = s
                    .iter()
                    .filter(|&&d| d > 0.0)
                    .map(|&d| d as usize)
                    .product();
                let shape: Vec<usize> = s
                    .iter()
                    .map(|&d| {
                        if d < 0.0 {
                            x.data.len() / known
                        } else {
                            d as usize
                        }
                    })
                    .collect();
                ensure!(
                    shape.iter().product::<usize>() == x.data.len(),
                    "bad reshape {:?} → {shape:?}",
                    x.shape
                );
                one(T {
                    shape,
                    data: x.data,
                })
            }
            "gather" => {
                let (x, idx) = (t("x")?, t("indices")?);
                let a = axis(scalar("axis", 0.0)?, x.shape.len());
                let (outer, len, inner) = around(&x.shape, a);
                let mut data = vec![];
                for o in 0..outer {
                    for &i in &idx.data {
                        let i = if i < 0.0 {
                            i as i64 + len as i64
                        } else {
                            i as i64
                        } as usize;
                        ensure!(i < len, "gather index {i} out of range {len}");
                        data.extend_from_slice(
                            &x.data[(o * len + i) * inner..(o * len + i + 1) * inner],
                        );
                    }
                }
                let shape = [&x.shape[..a], &idx.shape[..], &x.shape[a + 1..]].concat();
                one(T { shape, data })
            }
            "split" => {
                let x = t("x")?;
                let a = axis(scalar("axis", 0.0)?, x.shape.len());
                let k = scalar("num_splits", 0.0)? as usize;
                ensure!(
                    k > 0 && !op.inputs.contains_key("split_sizes"),
                    "only num_splits is supported"
                );
                let (outer, len, inner) = around(&x.shape, a);
                let part = len / k;
                Ok((0..k)
                    .map(|p| {
                        let mut data = vec![];
                        for o in 0..outer {
                            let s = (o * len + p * part) * inner;
                            data.extend_from_slice(&x.data[s..s + part * inner]);
                        }
                        let mut shape = x.shape.clone();
                        shape[a] = part;
                        Val::T(T { shape, data })
                    })
                    .collect())
            }
            "concat" => {
                let vals: Vec<T> = op.inputs["values"]
                    .iter()
                    .map(|a| match a {
                        Arg::Var(n) => match env.get(n) {
                            Some(Val::T(t)) => Ok(t.clone()),
                            _ => bail!("undefined {n}"),
                        },
                        Arg::Value(v) => match from_value(v)? {
                            Val::T(t) => Ok(t),
                            _ => bail!("string in concat"),
                        },
                    })
                    .collect::<Result<_>>()?;
                let a = axis(scalar("axis", 0.0)?, vals[0].shape.len());
                let outer = around(&vals[0].shape, a).0;
                let mut data = vec![];
                for o in 0..outer {
                    for v in &vals {
                        let (_, len, inner) = around(&v.shape, a);
                        data.extend_from_slice(&v.data[o * len * inner..(o + 1) * len * inner]);
                    }
                }
                let mut shape = vals[0].shape.clone();
                shape[a] = vals.iter().map(|v| v.shape[a]).sum();
                one(T { shape, data })
            }
            "conv" => {
                let (x, w) = (t("x")?, t("weight")?);
                let b = opt_t("bias")?;
                ensure!(
                    x.shape.len() == 4 && w.shape[2..] == [1, 1] && x.shape[0] == 1,
                    "only 1x1 convs on [1, C, 1, S]"
                );
                ensure!(scalar("groups", 1.0)? == 1.0, "only groups = 1");
                if let Val::S(p) = get("pad_type")? {
                    ensure!(p == "valid", "pad_type {p} is not supported");
                }
                let (cout, cin, s) = (w.shape[0], w.shape[1], x.shape[2] * x.shape[3]);
                ensure!(cin == x.shape[1], "conv channels");
                let mut data = vec![0.0; cout * s];
                for o in 0..cout {
                    for c in 0..cin {
                        let wv = w.data[o * cin + c];
                        for j in 0..s {
                            data[o * s + j] += wv * x.data[c * s + j];
                        }
                    }
                    if let Some(b) = &b {
                        data[o * s..(o + 1) * s]
                            .iter_mut()
                            .for_each(|v| *v += b.data[o]);
                    }
                }
                one(T {
                    shape: vec![1, cout, x.shape[2], x.shape[3]],
                    data,
                })
            }
            "layer_norm" => {
                let x = t("x")?;
                let axes = t("axes")?.data;
                ensure!(axes.len() == 1, "layer_norm over one axis only");
                let a = axis(axes[0], x.shape.len());
                let (g, b) = (opt_t("gamma")?, opt_t("beta")?);
                let eps = scalar("epsilon", 1e-5)?;
                let (outer, len, inner) = around(&x.shape, a);
                let mut data = x.data.clone();
                for o in 0..outer {
                    for i in 0..inner {
                        let at = |k: usize| (o * len + k) * inner + i;
                        let mean = (0..len).map(|k| x.data[at(k)]).sum::<f32>() / len as f32;
                        let var = (0..len)
                            .map(|k| (x.data[at(k)] - mean).powi(2))
                            .sum::<f32>()
                            / len as f32;
                        for k in 0..len {
                            let v = (x.data[at(k)] - mean) / (var + eps).sqrt();
                            data[at(k)] = v * g.as_ref().map_or(1.0, |g| g.data[k])
                                + b.as_ref().map_or(0.0, |b| b.data[k]);
                        }
                    }
                }
                one(T {
                    shape: x.shape,
                    data,
                })
            }
            "matmul" => {
                let (x, y) = (t("x")?, t("y")?);
                let (tx, ty) = (
                    scalar("transpose_x", 0.0)? != 0.0,
                    scalar("transpose_y", 0.0)? != 0.0,
                );
                let r = x.shape.len();
                ensure!(
                    r >= 2 && y.shape.len() == r && x.shape[..r - 2] == y.shape[..r - 2],
                    "matmul needs equal batch dims"
                );
                let batch: usize = x.shape[..r - 2].iter().product();
                let (xr, xc) = (x.shape[r - 2], x.shape[r - 1]);
                let (yr, yc) = (y.shape[r - 2], y.shape[r - 1]);
                let (m, k) = if tx { (xc, xr) } else { (xr, xc) };
                let (k2, n) = if ty { (yc, yr) } else { (yr, yc) };
                ensure!(k == k2, "matmul inner dims");
                let mut data = vec![0.0; batch * m * n];
                for bi in 0..batch {
                    let xb = &x.data[bi * xr * xc..];
                    let yb = &y.data[bi * yr * yc..];
                    for i in 0..m {
                        for j in 0..n {
                            let mut s = 0.0;
                            for kk in 0..k {
                                let a = if tx { xb[kk * xc + i] } else { xb[i * xc + kk] };
                                let b = if ty { yb[j * yc + kk] } else { yb[kk * yc + j] };
                                s += a * b;
                            }
                            data[(bi * m + i) * n + j] = s;
                        }
                    }
                }
                let shape = [&x.shape[..r - 2], &[m, n][..]].concat();
                one(T { shape, data })
            }
            "softmax" => {
                let x = t("x")?;
                let a = axis(scalar("axis", -1.0)?, x.shape.len());
                let (outer, len, inner) = around(&x.shape, a);
                let mut data = x.data.clone();
                for o in 0..outer {
                    for i in 0..inner {
                        let at = |k: usize| (o * len + k) * inner + i;
                        let m = (0..len)
                            .map(|k| x.data[at(k)])
                            .fold(f32::NEG_INFINITY, f32::max);
                        let z: f32 = (0..len).map(|k| (x.data[at(k)] - m).exp()).sum();
                        for k in 0..len {
                            data[at(k)] = (x.data[at(k)] - m).exp() / z;
                        }
                    }
                }
                one(T {
                    shape: x.shape,
                    data,
                })
            }
            "reduce_mean" => {
                let x = t("x")?;
                let axes: Vec<usize> = t("axes")?
                    .data
                    .iter()
                    .map(|&a| axis(a, x.shape.len()))
                    .collect();
                let keep = scalar("keep_dims", 0.0)? != 0.0;
                let kshape: Vec<usize> = x
                    .shape
                    .iter()
                    .enumerate()
                    .map(|(i, &d)| if axes.contains(&i) { 1 } else { d })
                    .collect();
                let n: usize = axes.iter().map(|&a| x.shape[a]).product();
                let ks = strides(&kshape);
                let mut data = vec![0.0; kshape.iter().product()];
                for (i, v) in x.data.iter().enumerate() {
                    let idx = unravel(i, &x.shape);
                    let o: usize = idx
                        .iter()
                        .enumerate()
                        .map(|(k, &j)| if axes.contains(&k) { 0 } else { j * ks[k] })
                        .sum();
                    data[o] += v / n as f32;
                }
                let shape = if keep {
                    kshape
                } else {
                    x.shape
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| !axes.contains(i))
                        .map(|(_, &d)| d)
                        .collect()
                };
                one(T { shape, data })
            }
            "slice_by_index" | "slice_update" => {
                let x = t("x")?;
                for p in ["stride", "begin_mask", "end_mask", "squeeze_mask"] {
                    ensure!(!op.inputs.contains_key(p), "{p} is not supported here");
                }
                let (b, e) = (t("begin")?.data, t("end")?.data);
                let r = x.shape.len();
                let b: Vec<usize> = (0..r).map(|i| b[i] as usize).collect();
                let sshape: Vec<usize> = (0..r).map(|i| e[i] as usize - b[i]).collect();
                ensure!(
                    (0..r).all(|i| b[i] + sshape[i] <= x.shape[i]),
                    "slice {b:?}..{e:?} outside {:?}",
                    x.shape
                );
                let xs = strides(&x.shape);
                let n: usize = sshape.iter().product();
                let offset = |i: usize| -> usize {
                    unravel(i, &sshape)
                        .iter()
                        .enumerate()
                        .map(|(k, &j)| (j + b[k]) * xs[k])
                        .sum()
                };
                if op.op_type == "slice_by_index" {
                    one(T {
                        data: (0..n).map(|i| x.data[offset(i)]).collect(),
                        shape: sshape,
                    })
                } else {
                    let u = t("update")?;
                    ensure!(
                        u.data.len() == n,
                        "update {:?} vs slice {sshape:?}",
                        u.shape
                    );
                    let mut data = x.data.clone();
                    (0..n).for_each(|i| data[offset(i)] = u.data[i]);
                    one(T {
                        shape: x.shape,
                        data,
                    })
                }
            }
            "read_state" => {
                let n = state_name("input")?;
                one(states
                    .get(&n)
                    .cloned()
                    .ok_or_else(|| anyhow!("no state {n}"))?)
            }
            "write_state" => {
                let n = state_name("input")?;
                let v = t("data")?;
                let s = states.get_mut(&n).ok_or_else(|| anyhow!("no state {n}"))?;
                ensure!(s.shape == v.shape, "write_state shape");
                *s = v;
                Ok(vec![])
            }
            o => bail!("op {o} is not supported by the test evaluator"),
        }
    }
}

fn from_value(v: &Value) -> Result<Val> {
    match v {
        Value::Tensor(t) => Ok(Val::T(T {
            shape: t.shape.clone(),
            data: t.to_f64_vec()?.into_iter().map(|x| x as f32).collect(),
        })),
        Value::Strings { values, .. } if values.len() == 1 => Ok(Val::S(values[0].clone())),
        v => bail!("unsupported constant {:?}", v.value_type()),
    }
}
