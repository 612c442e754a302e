//! What an op's evaluation sees and returns: runtime values ([`RValue`]: candle CPU tensors,
//! strings, state cells, lists, dictionaries), the MIL dtype → candle storage dtype map, constant conversion from
//! `ir` values, and [`EvalCx`], which hands an op its inputs by parameter name (with the
//! compile-time value where there is one), its constant parameters as numbers or strings,
//! cached f32 copies of constant weights, and its inferred output types.

use super::{DefaultValue, InputSpec};
use crate::ir::{self, DType as MilType, Opset, TensorType, Value, ValueType};
use crate::kernels;
use anyhow::{anyhow, bail, ensure, Result};
use candle_core::{DType, Tensor};
use half::{bf16, f16};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Evaluates one op: its output values, in output order.
pub type EvalFn = fn(&EvalCx) -> Result<Vec<RValue>>;

/// A value at run time.
#[derive(Clone, Debug)]
pub enum RValue {
    /// A tensor, stored as [`storage_dtype`] of its MIL dtype.
    T(Tensor),
    /// A string tensor (flattened).
    Str(Vec<String>),
    /// A Core ML state: the session owns the cell, ops read and replace its tensor.
    State(StateCell),
    /// A MIL list (`make_list` … `list_gather`). Lists are values: a write makes a new
    /// list (sharing the unchanged elements' storage).
    List(ListVal),
    /// A MIL dictionary (`classify`'s class → probability).
    Dict(DictVal),
}

/// A dictionary at run time: its keys in order and one value per key, as a rank-1 tensor
/// of the value type's storage dtype (`classify`: fp64).
#[derive(Clone, Debug)]
pub struct DictVal {
    pub keys: DictKeys,
    pub values: Tensor,
}

/// The keys of a dictionary (MIL allows int64 and string keys).
#[derive(Clone, Debug, PartialEq)]
pub enum DictKeys {
    Int64(Vec<i64>),
    Str(Vec<String>),
}

impl DictKeys {
    pub fn len(&self) -> usize {
        match self {
            DictKeys::Int64(k) => k.len(),
            DictKeys::Str(k) => k.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The MIL dtype of the keys.
    pub fn dtype(&self) -> MilType {
        match self {
            DictKeys::Int64(_) => MilType::I64,
            DictKeys::Str(_) => MilType::Str,
        }
    }
}

/// A list at run time: its elements in order, `None` where nothing was written yet, and
/// whether writes past the end grow it (`dynamic_length`). A list's type records its
/// initial length only (coremltools serializes a dynamic list's type so), so the length
/// is checked here, not against the type.
#[derive(Clone, Debug)]
pub struct ListVal {
    pub elems: Vec<Option<Tensor>>,
    pub dynamic: bool,
}

/// What an op with nested blocks (`cond`, `while_loop`) or with randomness needs from the
/// interpreter that runs it: its blocks compiled, the session's limits and its random
/// stream. The runtime implements it; the op's definition holds the semantics.
pub trait ExecEnv {
    /// Runs nested block `block` of the op on `inputs` (the block's inputs, in order) and
    /// returns its outputs.
    fn run_block(&self, block: usize, inputs: Vec<RValue>) -> Result<Vec<RValue>>;
    /// The most iterations one `while_loop` may run before it is stopped with an error.
    fn max_iterations(&self) -> u64;
    /// The session's memory cap in bytes (`u64::MAX`: none).
    fn max_memory(&self) -> u64;
    /// A fresh 64-bit seed from the session's random stream (seeded by `--seed`).
    fn next_seed(&self) -> u64;
    /// What encoder-sized products multiply (`--compute bf16`: bf16-rounded inputs).
    fn products(&self) -> kernels::gemm::Inputs {
        kernels::gemm::Inputs::F32
    }
}

/// Shared, replaceable tensor holding a state's current value, and whether the cell is
/// known to hold the only reference to that tensor's storage (then it may be written in
/// place, see [`StateCell::update_in_place`]). Handing the tensor out (`get`) or taking one
/// in (`set`, `new`) gives that up: the other holder would see later writes.
#[derive(Clone, Debug)]
pub struct StateCell(Arc<Mutex<(Tensor, bool)>>);

impl StateCell {
    pub fn new(t: Tensor) -> StateCell {
        StateCell(Arc::new(Mutex::new((t, false))))
    }
    fn lock(&self) -> std::sync::MutexGuard<'_, (Tensor, bool)> {
        match self.0.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }
    pub fn get(&self) -> Tensor {
        let mut g = self.lock();
        g.1 = false;
        g.0.clone()
    }
    pub fn set(&self, t: Tensor) {
        *self.lock() = (t, false);
    }
    /// Runs `f` on the state's tensor for it to write in place, after giving the cell a
    /// private contiguous copy when it may share its storage; `f` must not let the tensor
    /// (or a view of it) escape, unless the caller proves the view dead before the next
    /// in-place write (`runtime::state_fusion::allow_views`). One copy per hand-out instead
    /// of one per update.
    pub fn update_in_place<R>(&self, f: impl FnOnce(&Tensor) -> Result<R>) -> Result<R> {
        let mut g = self.lock();
        if !g.1 {
            g.0 = g.0.force_contiguous()?;
            g.1 = true;
        }
        f(&g.0)
    }
}

impl RValue {
    pub fn tensor(&self) -> Result<&Tensor> {
        match self {
            RValue::T(t) => Ok(t),
            RValue::Str(_) => bail!("expected a tensor, got a string"),
            RValue::State(_) => bail!("expected a tensor, got a state"),
            RValue::List(_) => bail!("expected a tensor, got a list"),
            RValue::Dict(_) => bail!("expected a tensor, got a dictionary"),
        }
    }
}

/// The candle dtype that holds a MIL dtype at run time: bool as u8, narrow or sub-byte
/// integers widened (int8/int4 → i16, uint1..uint8 → u8, uint16 → u32, uint64 → i64).
pub fn storage_dtype(d: MilType) -> Result<DType> {
    Ok(match d {
        MilType::Bool
        | MilType::U1
        | MilType::U2
        | MilType::U3
        | MilType::U4
        | MilType::U6
        | MilType::U8 => DType::U8,
        MilType::F16 => DType::F16,
        MilType::F32 => DType::F32,
        MilType::F64 => DType::F64,
        MilType::BF16 => DType::BF16,
        MilType::I4 | MilType::I8 | MilType::I16 => DType::I16,
        MilType::I32 => DType::I32,
        MilType::I64 | MilType::U64 => DType::I64,
        MilType::U16 | MilType::U32 => DType::U32,
        MilType::Str => bail!("string tensors have no numeric storage"),
    })
}

fn le<const N: usize, T>(b: &[u8], f: fn([u8; N]) -> T) -> Vec<T> {
    b.chunks_exact(N)
        .map(|c| f(c.try_into().unwrap_or([0; N])))
        .collect()
}

/// Converts an `ir` tensor (little-endian bytes, sub-byte types packed) to a candle tensor
/// of its storage dtype.
pub fn tensor_from_ir(t: &ir::Tensor) -> Result<Tensor> {
    let b = t.data.as_slice();
    let n = t.num_elements();
    let s = t.shape.as_slice();
    ensure!(
        b.len() == t.dtype.storage_bytes(n),
        "{} tensor {s:?} has {} bytes",
        t.dtype,
        b.len()
    );
    match t.dtype {
        MilType::F16 => kernels::from_vec(le(b, f16::from_le_bytes), s),
        MilType::BF16 => kernels::from_vec(le(b, bf16::from_le_bytes), s),
        MilType::F32 => kernels::from_vec(le(b, f32::from_le_bytes), s),
        MilType::F64 => kernels::from_vec(le(b, f64::from_le_bytes), s),
        MilType::I16 => kernels::from_vec(le(b, i16::from_le_bytes), s),
        MilType::I32 => kernels::from_vec(le(b, i32::from_le_bytes), s),
        MilType::I64 => kernels::from_vec(le(b, i64::from_le_bytes), s),
        MilType::U64 => kernels::from_vec(le(b, |x| u64::from_le_bytes(x) as i64), s),
        MilType::U16 => kernels::from_vec(le(b, |x| u16::from_le_bytes(x) as u32), s),
        MilType::U32 => kernels::from_vec(le(b, u32::from_le_bytes), s),
        MilType::U8 => kernels::from_vec(b.to_vec(), s),
        MilType::Bool => {
            kernels::from_vec(b.iter().map(|&x| (x != 0) as u8).collect::<Vec<u8>>(), s)
        }
        MilType::I8 => {
            kernels::from_vec(b.iter().map(|&x| x as i8 as i16).collect::<Vec<i16>>(), s)
        }
        MilType::I4 => {
            let codes = kernels::unpack_bits(b, 4, n)?;
            kernels::from_vec(
                codes
                    .into_iter()
                    .map(|c| (((c << 4) as i8) >> 4) as i16)
                    .collect::<Vec<i16>>(),
                s,
            )
        }
        d @ (MilType::U1 | MilType::U2 | MilType::U3 | MilType::U4 | MilType::U6) => {
            kernels::from_vec(kernels::unpack_bits(b, d.bits(), n)?, s)
        }
        MilType::Str => bail!("string tensors are not numeric"),
    }
}

/// A constant as a runtime value.
pub fn value_from_ir(v: &Value) -> Result<RValue> {
    match v {
        Value::Tensor(t) => Ok(RValue::T(tensor_from_ir(t)?)),
        Value::Strings { values, .. } => Ok(RValue::Str(values.clone())),
        // A constant list (`classify`'s classes): tensor elements as a list value, scalar
        // strings as their strings (ops that take one read the constant itself).
        Value::List { values, .. } if values.iter().all(|v| v.as_str().is_some()) => {
            Ok(RValue::Str(
                values
                    .iter()
                    .filter_map(|v| v.as_str())
                    .map(String::from)
                    .collect(),
            ))
        }
        Value::List { values, .. } => Ok(RValue::List(ListVal {
            elems: values
                .iter()
                .map(|v| match v {
                    Value::Tensor(t) => tensor_from_ir(t).map(Some),
                    o => bail!(
                        "a constant list of {} is not supported at run time",
                        o.value_type()
                    ),
                })
                .collect::<Result<_>>()?,
            dynamic: false,
        })),
        other => bail!(
            "constants of type {} are not supported at run time",
            other.value_type()
        ),
    }
}

/// Checks that an op produced exactly its inferred type (storage dtype and every fixed dim).
pub fn check_output(v: &RValue, ty: &ValueType) -> Result<()> {
    match (v, ty) {
        (RValue::T(t), ValueType::Tensor(tt)) if tt.dtype != MilType::Str => {
            let want = storage_dtype(tt.dtype)?;
            ensure!(
                t.dtype() == want,
                "produced {:?} for a {} output ({want:?} expected)",
                t.dtype(),
                tt
            );
            ensure!(
                t.rank() == tt.rank(),
                "produced shape {:?} for {}",
                t.dims(),
                tt
            );
            for (d, w) in t.dims().iter().zip(&tt.shape) {
                if let ir::Dim::Fixed(w) = w {
                    ensure!(d == w, "produced shape {:?} for {}", t.dims(), tt);
                }
            }
            Ok(())
        }
        (RValue::Str(_), ValueType::Tensor(tt)) if tt.dtype == MilType::Str => Ok(()),
        // A constant list of string scalars (`classify`'s classes) is held as its strings.
        (RValue::Str(_), ValueType::List { elem, .. })
            if elem.as_tensor().is_some_and(|t| t.dtype == MilType::Str) =>
        {
            Ok(())
        }
        (RValue::State(_), ValueType::State(_)) => Ok(()),
        (RValue::List(v), ValueType::List { elem, .. }) => {
            for t in v.elems.iter().flatten() {
                check_output(&RValue::T(t.clone()), elem)?;
            }
            Ok(())
        }
        (RValue::Dict(d), ValueType::Dict { key, value }) => {
            let want_key = key.as_tensor().map(|t| (t.dtype, t.rank()));
            ensure!(
                want_key == Some((d.keys.dtype(), 0)),
                "produced {} keys for a {ty} output",
                d.keys.dtype()
            );
            let vt = value
                .as_tensor()
                .filter(|t| t.rank() == 0)
                .ok_or_else(|| anyhow!("a {ty} output: only scalar dictionary values run"))?;
            ensure!(
                d.values.dtype() == storage_dtype(vt.dtype)? && d.values.dims() == [d.keys.len()],
                "produced {:?} values {:?} for {} keys of a {ty} output",
                d.values.dtype(),
                d.values.dims(),
                d.keys.len()
            );
            Ok(())
        }
        (v, ty) => bail!("produced {} for a {ty} output", kind(v)),
    }
}

fn kind(v: &RValue) -> &'static str {
    match v {
        RValue::T(_) => "a tensor",
        RValue::Str(_) => "strings",
        RValue::State(_) => "a state",
        RValue::List(_) => "a list",
        RValue::Dict(_) => "a dictionary",
    }
}

/// One binding of an op input at evaluation time.
#[derive(Clone, Copy)]
pub struct Bound<'a> {
    pub val: &'a RValue,
    /// The program's compile-time value, when the binding is a constant.
    pub konst: Option<&'a Value>,
    /// Where an f32 copy of a constant tensor is kept between calls.
    pub f32_cache: Option<&'a OnceLock<Tensor>>,
    /// A constant weight the plan keeps in its stored (fp16 / compressed) form; `val` is
    /// then a placeholder and readers go through [`EvalCx::weight_f32`] or the packed
    /// kernels.
    pub packed: Option<&'a kernels::PackedWeight>,
}

/// Everything one op's evaluation reads.
pub struct EvalCx<'a> {
    pub op_type: &'a str,
    pub op_name: &'a str,
    pub opset: Opset,
    /// Parameter name → bindings (several for variadic parameters).
    pub inputs: BTreeMap<&'a str, Vec<Bound<'a>>>,
    pub attributes: &'a BTreeMap<String, Value>,
    /// Inferred output types.
    pub outputs: &'a [ValueType],
    /// The interpreter's services (nested blocks, limits, random stream); `None` where
    /// an op is evaluated outside a session run (constant folding).
    pub env: Option<&'a dyn ExecEnv>,
    /// The op's parameters (where their defaults are); empty for the runtime's fused steps.
    pub spec: &'static [InputSpec],
}

impl<'a> EvalCx<'a> {
    /// What the session's encoder-sized products multiply (f32 outside a session run).
    pub fn products(&self) -> kernels::gemm::Inputs {
        self.env.map(|e| e.products()).unwrap_or_default()
    }
    pub fn has(&self, name: &str) -> bool {
        self.inputs.contains_key(name)
    }
    fn one(&self, name: &str) -> Result<&Bound<'a>> {
        match self.inputs.get(name).map(|v| v.as_slice()) {
            Some([b]) => Ok(b),
            Some(v) => bail!("input `{name}` has {} bindings, expected one", v.len()),
            None => bail!("missing input `{name}`"),
        }
    }
    /// All bindings of a (variadic) parameter.
    pub fn all(&self, name: &str) -> &[Bound<'a>] {
        self.inputs.get(name).map(|v| v.as_slice()).unwrap_or(&[])
    }
    pub fn t(&self, name: &str) -> Result<&'a Tensor> {
        self.one(name)?
            .val
            .tensor()
            .map_err(|e| anyhow!("input `{name}`: {e}"))
    }
    pub fn opt_t(&self, name: &str) -> Result<Option<&'a Tensor>> {
        if self.has(name) {
            self.t(name).map(Some)
        } else {
            Ok(None)
        }
    }
    /// Tensors of a variadic parameter.
    pub fn ts(&self, name: &str) -> Result<Vec<&'a Tensor>> {
        self.all(name)
            .iter()
            .map(|b| b.val.tensor().map_err(|e| anyhow!("input `{name}`: {e}")))
            .collect()
    }
    /// The compile-time value of an input, if it is a program constant.
    pub fn konst(&self, name: &str) -> Option<&'a Value> {
        self.one(name).ok().and_then(|b| b.konst)
    }
    /// An input as f32; constants are converted once and cached in the session.
    pub fn f32(&self, name: &str) -> Result<Tensor> {
        let b = self.one(name)?;
        let t = b.val.tensor().map_err(|e| anyhow!("input `{name}`: {e}"))?;
        match b.f32_cache {
            Some(c) => {
                if let Some(v) = c.get() {
                    return Ok(v.clone());
                }
                let v = kernels::to_f32(t)?;
                let _ = c.set(v.clone());
                Ok(v)
            }
            None => kernels::to_f32(t),
        }
    }
    /// The packed form of a constant weight, when the plan kept one.
    pub fn packed(&self, name: &str) -> Option<&'a kernels::PackedWeight> {
        self.one(name).ok().and_then(|b| b.packed)
    }
    /// A weight as a dense f32 tensor: decoded from its packed form on each call (no f32
    /// copy is kept, see `kernels::gemv`), else as [`EvalCx::f32`].
    pub fn weight_f32(&self, name: &str) -> Result<Tensor> {
        match self.packed(name) {
            Some(p) => kernels::from_vec(p.to_f32(), &p.shape),
            None => self.f32(name),
        }
    }
    pub fn opt_f32(&self, name: &str) -> Result<Option<Tensor>> {
        if self.has(name) {
            self.f32(name).map(Some)
        } else {
            Ok(None)
        }
    }
    /// Integer elements of an input (constant or computed).
    pub fn ints(&self, name: &str) -> Result<Vec<i64>> {
        let b = self.one(name)?;
        if let Some(Value::Tensor(t)) = b.konst {
            if t.dtype.is_int() || t.dtype == MilType::Bool {
                return t.to_i64_vec();
            }
        }
        let t = b.val.tensor().map_err(|e| anyhow!("input `{name}`: {e}"))?;
        kernels::to_vec::<i64>(t)
    }
    pub fn opt_ints(&self, name: &str) -> Result<Option<Vec<i64>>> {
        if self.has(name) {
            self.ints(name).map(Some)
        } else {
            Ok(None)
        }
    }
    pub fn int(&self, name: &str) -> Result<i64> {
        match self.ints(name)?.as_slice() {
            [v] => Ok(*v),
            v => bail!("input `{name}` must be a scalar, has {} values", v.len()),
        }
    }
    pub fn opt_int(&self, name: &str) -> Result<Option<i64>> {
        if self.has(name) {
            self.int(name).map(Some)
        } else {
            Ok(None)
        }
    }
    pub fn opt_bool(&self, name: &str) -> Result<Option<bool>> {
        Ok(self.opt_int(name)?.map(|v| v != 0))
    }
    /// Float elements of an input.
    pub fn floats(&self, name: &str) -> Result<Vec<f64>> {
        kernels::to_vec::<f64>(self.t(name)?)
    }
    pub fn opt_f64(&self, name: &str) -> Result<Option<f64>> {
        if !self.has(name) {
            return Ok(None);
        }
        match self.floats(name)?.as_slice() {
            [v] => Ok(Some(*v)),
            v => bail!("input `{name}` must be a scalar, has {} values", v.len()),
        }
    }
    pub fn opt_str(&self, name: &str) -> Result<Option<&'a str>> {
        if !self.has(name) {
            return Ok(None);
        }
        match self.one(name)?.val {
            RValue::Str(v) if v.len() == 1 => Ok(Some(v[0].as_str())),
            _ => bail!("input `{name}` must be a single string"),
        }
    }
    fn default(&self, name: &str) -> Result<DefaultValue> {
        super::default_of(self.spec, self.op_type, name)
    }
    /// An integer parameter, or its declared default.
    pub fn int_or_default(&self, name: &str) -> Result<i64> {
        match self.opt_int(name)? {
            Some(v) => Ok(v),
            None => self.default(name)?.int(name),
        }
    }
    /// A bool parameter, or its declared default.
    pub fn bool_or_default(&self, name: &str) -> Result<bool> {
        match self.opt_bool(name)? {
            Some(v) => Ok(v),
            None => self.default(name)?.bool(name),
        }
    }
    /// A float parameter, or its declared default.
    pub fn f64_or_default(&self, name: &str) -> Result<f64> {
        match self.opt_f64(name)? {
            Some(v) => Ok(v),
            None => self.default(name)?.float(name),
        }
    }
    /// A string parameter, or its declared default.
    pub fn str_or_default(&self, name: &str) -> Result<&'a str> {
        match self.opt_str(name)? {
            Some(v) => Ok(v),
            None => self.default(name)?.str(name),
        }
    }
    /// An integer list parameter, or its declared default repeated `len` times.
    pub fn ints_or_default(&self, name: &str, len: usize) -> Result<Vec<i64>> {
        match self.opt_ints(name)? {
            Some(v) => Ok(v),
            None => self.default(name)?.ints(name, len),
        }
    }
    pub fn state(&self, name: &str) -> Result<&'a StateCell> {
        match self.one(name)?.val {
            RValue::State(s) => Ok(s),
            _ => bail!("input `{name}` must be a state"),
        }
    }
    /// The interpreter's services, for ops that need them.
    pub fn env(&self) -> Result<&'a dyn ExecEnv> {
        self.env.ok_or_else(|| {
            anyhow!(
                "`{}` ({}) needs the interpreter (nested blocks or randomness) and cannot \
                 be evaluated here",
                self.op_type,
                self.op_name
            )
        })
    }
    /// A list input.
    pub fn list(&self, name: &str) -> Result<&'a ListVal> {
        match self.one(name)?.val {
            RValue::List(v) => Ok(v),
            _ => bail!("input `{name}` must be a list"),
        }
    }
    /// Inferred type of output `i`.
    pub fn out(&self, i: usize) -> Result<&'a TensorType> {
        self.outputs
            .get(i)
            .and_then(|t| t.as_tensor())
            .ok_or_else(|| anyhow!("output {i} of `{}` is not a tensor", self.op_type))
    }
    /// Storage dtype of output `i`.
    pub fn out_dtype(&self, i: usize) -> Result<DType> {
        storage_dtype(self.out(i)?.dtype)
    }
    /// Fixed shape of output `i`, when inference knew it.
    pub fn out_shape(&self, i: usize) -> Option<Vec<usize>> {
        self.out(i).ok().and_then(|t| t.fixed_shape())
    }
    /// Normalises an axis for `rank`.
    pub fn axis(&self, a: i64, rank: usize) -> Result<usize> {
        super::infer::axis(a, rank)
    }
}

/// A single tensor result.
pub fn one(t: Tensor) -> Result<Vec<RValue>> {
    Ok(vec![RValue::T(t)])
}

/// Rounds an f32 result to output 0's storage dtype.
pub fn out0(cx: &EvalCx, t: Tensor) -> Result<Vec<RValue>> {
    one(kernels::cast(&t, cx.out_dtype(0)?)?)
}
