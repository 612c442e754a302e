//! The context type inference reads: each input's type and, when known at compile time, its
//! value; plus shared shape helpers (broadcasting, axis normalisation).

use super::{default_of, DefaultValue, InputSpec};
use crate::ir::{DType, Dim, Opset, Tensor, TensorType, Value, ValueType};
use anyhow::{anyhow, bail, ensure, Result};
use std::collections::BTreeMap;

/// What inference knows about one binding.
#[derive(Clone, Debug)]
pub struct ArgInfo<'a> {
    pub ty: std::borrow::Cow<'a, ValueType>,
    pub val: Option<&'a Value>,
}

/// The types of one nested block (of `cond` or `while_loop`): its inputs and outputs.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockSig {
    pub inputs: Vec<ValueType>,
    pub outputs: Vec<ValueType>,
}

pub struct InferCx<'a> {
    pub op_type: &'a str,
    pub op_name: &'a str,
    pub opset: Opset,
    pub args: BTreeMap<&'a str, Vec<ArgInfo<'a>>>,
    pub attributes: &'a BTreeMap<String, Value>,
    /// The op's nested blocks, in order (empty for ops without any).
    pub blocks: Vec<BlockSig>,
    /// The op's parameters (where their defaults are).
    pub spec: &'static [InputSpec],
}

impl<'a> InferCx<'a> {
    fn one(&self, name: &str) -> Option<&ArgInfo<'a>> {
        self.args.get(name).and_then(|v| v.first())
    }
    pub fn has(&self, name: &str) -> bool {
        self.args.contains_key(name)
    }
    /// All bindings of a (variadic) parameter.
    pub fn all(&self, name: &str) -> &[ArgInfo<'a>] {
        self.args.get(name).map(|v| v.as_slice()).unwrap_or(&[])
    }
    /// Tensor type of a required input.
    pub fn t(&self, name: &str) -> Result<&TensorType> {
        let a = self
            .one(name)
            .ok_or_else(|| anyhow!("missing input `{name}`"))?;
        a.ty.as_tensor()
            .ok_or_else(|| anyhow!("input `{name}` must be a tensor, is {}", a.ty))
    }
    pub fn opt_t(&self, name: &str) -> Result<Option<&TensorType>> {
        if self.has(name) {
            self.t(name).map(Some)
        } else {
            Ok(None)
        }
    }
    /// Fixed shape of a required tensor input.
    pub fn shape(&self, name: &str) -> Result<Vec<usize>> {
        let t = self.t(name)?;
        t.fixed_shape()
            .ok_or_else(|| anyhow!("input `{name}` needs a fixed shape, has {t}"))
    }
    pub fn opt_val(&self, name: &str) -> Option<&'a Value> {
        self.one(name).and_then(|a| a.val)
    }
    pub fn val(&self, name: &str) -> Result<&'a Value> {
        self.opt_val(name)
            .ok_or_else(|| anyhow!("input `{name}` must be a compile-time constant"))
    }
    pub fn opt_tensor_val(&self, name: &str) -> Result<Option<&'a Tensor>> {
        match self.opt_val(name) {
            None => Ok(None),
            Some(v) => v
                .as_tensor()
                .map(Some)
                .ok_or_else(|| anyhow!("input `{name}` must be a tensor constant")),
        }
    }
    pub fn opt_ints(&self, name: &str) -> Result<Option<Vec<i64>>> {
        match self.opt_tensor_val(name)? {
            None => Ok(None),
            Some(t) => Ok(Some(t.to_i64_vec()?)),
        }
    }
    pub fn ints(&self, name: &str) -> Result<Vec<i64>> {
        self.opt_ints(name)?
            .ok_or_else(|| anyhow!("input `{name}` must be a constant"))
    }
    pub fn int(&self, name: &str) -> Result<i64> {
        let v = self.ints(name)?;
        ensure!(v.len() == 1, "input `{name}` must be a scalar");
        Ok(v[0])
    }
    pub fn opt_int(&self, name: &str) -> Result<Option<i64>> {
        if self.opt_val(name).is_none() {
            return Ok(None);
        }
        self.int(name).map(Some)
    }
    pub fn opt_bool(&self, name: &str) -> Result<Option<bool>> {
        Ok(self.opt_int(name)?.map(|v| v != 0))
    }
    pub fn opt_str(&self, name: &str) -> Result<Option<&'a str>> {
        match self.opt_val(name) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| anyhow!("input `{name}` must be a string")),
        }
    }
    fn default(&self, name: &str) -> Result<DefaultValue> {
        default_of(self.spec, self.op_type, name)
    }
    /// A constant integer parameter, or its declared default.
    pub fn int_or_default(&self, name: &str) -> Result<i64> {
        match self.opt_int(name)? {
            Some(v) => Ok(v),
            None => self.default(name)?.int(name),
        }
    }
    /// A constant bool parameter, or its declared default.
    pub fn bool_or_default(&self, name: &str) -> Result<bool> {
        match self.opt_bool(name)? {
            Some(v) => Ok(v),
            None => self.default(name)?.bool(name),
        }
    }
    /// A constant string parameter, or its declared default.
    pub fn str_or_default(&self, name: &str) -> Result<&'a str> {
        match self.opt_str(name)? {
            Some(v) => Ok(v),
            None => self.default(name)?.str(name),
        }
    }
    /// A constant integer list parameter, or its declared default repeated `len` times.
    pub fn ints_or_default(&self, name: &str, len: usize) -> Result<Vec<i64>> {
        match self.opt_ints(name)? {
            Some(v) => Ok(v),
            None => self.default(name)?.ints(name, len),
        }
    }
    /// Input dtype equal across several inputs (MIL's binary ops require it).
    pub fn same_dtype(&self, names: &[&str]) -> Result<DType> {
        let d = self.t(names[0])?.dtype;
        for n in &names[1..] {
            if let Some(t) = self.opt_t(n)? {
                ensure!(
                    t.dtype == d,
                    "`{}` is {} but `{n}` is {}",
                    names[0],
                    d,
                    t.dtype
                );
            }
        }
        Ok(d)
    }
}

/// Numpy-style broadcast of two shapes.
pub fn broadcast(a: &[Dim], b: &[Dim]) -> Result<Vec<Dim>> {
    let n = a.len().max(b.len());
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let da = if i + a.len() >= n {
            &a[i + a.len() - n]
        } else {
            &Dim::Fixed(1)
        };
        let db = if i + b.len() >= n {
            &b[i + b.len() - n]
        } else {
            &Dim::Fixed(1)
        };
        out.push(match (da, db) {
            (Dim::Fixed(1), d) | (d, Dim::Fixed(1)) => d.clone(),
            (Dim::Fixed(x), Dim::Fixed(y)) if x == y => Dim::Fixed(*x),
            (Dim::Fixed(x), Dim::Fixed(y)) => {
                bail!(
                    "shapes {} and {} do not broadcast ({x} vs {y})",
                    fmt(a),
                    fmt(b)
                )
            }
            (Dim::Unknown, d) | (d, Dim::Unknown) => {
                if matches!(d, Dim::Fixed(_)) {
                    d.clone()
                } else {
                    Dim::Unknown
                }
            }
        });
    }
    Ok(out)
}

pub fn fmt(s: &[Dim]) -> String {
    let v: Vec<String> = s.iter().map(|d| d.to_string()).collect();
    format!("[{}]", v.join(", "))
}

/// Normalises a possibly negative axis for a tensor of `rank`.
pub fn axis(a: i64, rank: usize) -> Result<usize> {
    let r = rank as i64;
    ensure!(
        a >= -r && a < r.max(1),
        "axis {a} out of range for rank {rank}"
    );
    Ok(if a < 0 { (a + r) as usize } else { a as usize })
}

pub fn tensor(dtype: DType, shape: Vec<Dim>) -> ValueType {
    ValueType::Tensor(TensorType { dtype, shape })
}

pub fn float_only(t: &TensorType, what: &str) -> Result<()> {
    ensure!(
        t.dtype.is_float(),
        "`{what}` must be fp16 or fp32, is {}",
        t.dtype
    );
    Ok(())
}
