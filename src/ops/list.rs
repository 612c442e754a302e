//! List ops (iOS15), as coremltools 9's `defs/iOS15/control_flow.py` defines them:
//! `make_list` (a list of `init_length` elements of one tensor type, growing on writes past
//! its end when `dynamic_length`), `list_length`, `list_write`, `list_read`, `list_gather`
//! (elements stacked on a new axis 0) and `list_scatter` (rows of `value` written at
//! `indices`). Lists are values ([`ListVal`]): every write returns a new list. An element
//! never written reads as zeros where its shape is known, else is an error naming the op.

use super::eval::{storage_dtype, EvalCx, ListVal, RValue};
use super::infer::InferCx;
use super::DefaultValue;
use super::{opt, opt_c, req, var, InputSpec, OpDef};
use crate::ir::{DType, Dim, TensorType, ValueType};
use crate::kernels;
use anyhow::{anyhow, bail, ensure, Result};
use candle_core::Tensor;

fn list_type<'a>(cx: &'a InferCx, name: &str) -> Result<(&'a ValueType, Option<usize>)> {
    let a = cx
        .all(name)
        .first()
        .ok_or_else(|| anyhow!("missing input `{name}`"))?;
    match a.ty.as_ref() {
        ValueType::List { elem, len } => Ok((elem.as_ref(), *len)),
        t => bail!("input `{name}` must be a list, is {t}"),
    }
}

fn elem_tensor(e: &ValueType) -> Result<&TensorType> {
    e.as_tensor()
        .ok_or_else(|| anyhow!("list elements must be tensors, are {e}"))
}

fn infer_make_list(cx: &InferCx) -> Result<Vec<ValueType>> {
    let name = cx.str_or_default("dtype")?;
    let dtype = DType::from_name(name).ok_or_else(|| anyhow!("unsupported dtype `{name}`"))?;
    ensure!(
        matches!(dtype, DType::F16 | DType::F32 | DType::I32 | DType::Bool),
        "list elements must be fp16, fp32, int32 or bool, not {name}"
    );
    let mut shape = vec![];
    for (i, a) in cx.all("elem_shape").iter().enumerate() {
        let v = a
            .val
            .ok_or_else(|| anyhow!("`elem_shape` value {i} must be a constant"))?;
        shape.push(match v.as_str() {
            Some(_) => Dim::Unknown,
            None => {
                let n = v
                    .as_tensor()
                    .map(|t| t.to_i64_vec())
                    .transpose()?
                    .filter(|n| n.len() == 1 && n[0] >= 0)
                    .ok_or_else(|| {
                        anyhow!("`elem_shape` value {i} must be a non-negative int or a string")
                    })?;
                Dim::Fixed(n[0] as usize)
            }
        });
    }
    let len = match cx.opt_val("init_length") {
        _ if !cx.has("init_length") => Some(1),
        None => None,
        Some(_) => {
            let n = cx.int("init_length")?;
            ensure!(n >= 0, "`init_length` is negative ({n})");
            Some(n as usize)
        }
    };
    Ok(vec![ValueType::List {
        elem: Box::new(ValueType::Tensor(TensorType { dtype, shape })),
        len,
    }])
}

fn eval_make_list(cx: &EvalCx) -> Result<Vec<RValue>> {
    let n = cx.int_or_default("init_length")?;
    ensure!(n >= 0, "`init_length` is negative ({n})");
    Ok(vec![RValue::List(ListVal {
        elems: vec![None; n as usize],
        dynamic: cx.bool_or_default("dynamic_length")?,
    })])
}

fn infer_list_length(cx: &InferCx) -> Result<Vec<ValueType>> {
    list_type(cx, "ls")?;
    Ok(vec![ValueType::tensor(DType::I32, &[])])
}

fn eval_list_length(cx: &EvalCx) -> Result<Vec<RValue>> {
    let n = cx.list("ls")?.elems.len();
    let n = i32::try_from(n).map_err(|_| anyhow!("list length {n} overflows int32"))?;
    Ok(vec![RValue::T(kernels::from_vec(vec![n], &[])?)])
}

/// `value` (of `what`) must fit the list's element type.
fn check_elem(elem: &ValueType, value: &TensorType, what: &str) -> Result<()> {
    let e = elem_tensor(elem)?;
    ensure!(
        super::control::subtype(&ValueType::Tensor(value.clone()), elem),
        "{what} {value} does not match the list's element type {e}"
    );
    Ok(())
}

fn infer_list_write(cx: &InferCx) -> Result<Vec<ValueType>> {
    let (elem, _) = list_type(cx, "ls")?;
    let i = cx.t("index")?;
    ensure!(i.dtype == DType::I32, "`index` must be int32, is {i}");
    check_elem(elem, cx.t("value")?, "`value`")?;
    Ok(vec![cx.all("ls")[0].ty.as_ref().clone()])
}

/// A list index at run time: in range, or (for a write to a dynamic list) past the end.
fn index(cx: &EvalCx, ls: &ListVal, i: i64, write: bool) -> Result<usize> {
    ensure!(i >= 0, "`{}`: index {i} is negative", cx.op_name);
    let i = i as usize;
    ensure!(
        i < ls.elems.len() || (write && ls.dynamic),
        "`{}`: index {i} is out of range for a list of length {}{}",
        cx.op_name,
        ls.elems.len(),
        if write { " (its length is fixed)" } else { "" }
    );
    Ok(i)
}

fn put(ls: &mut ListVal, i: usize, t: Tensor) {
    if i >= ls.elems.len() {
        ls.elems.resize(i + 1, None);
    }
    ls.elems[i] = Some(t);
}

fn eval_list_write(cx: &EvalCx) -> Result<Vec<RValue>> {
    let mut ls = cx.list("ls")?.clone();
    let i = index(cx, &ls, cx.int("index")?, true)?;
    put(&mut ls, i, cx.t("value")?.clone());
    Ok(vec![RValue::List(ls)])
}

fn infer_list_read(cx: &InferCx) -> Result<Vec<ValueType>> {
    let (elem, _) = list_type(cx, "ls")?;
    elem_tensor(elem)?;
    let i = cx.t("index")?;
    ensure!(i.dtype == DType::I32, "`index` must be int32, is {i}");
    Ok(vec![elem.clone()])
}

/// The element at `i`; zeros of the element type when never written (and its shape is
/// known).
fn element(cx: &EvalCx, ls: &ListVal, i: usize, elem: &TensorType) -> Result<Tensor> {
    match &ls.elems[i] {
        Some(t) => Ok(t.clone()),
        None => {
            let shape = elem.fixed_shape().ok_or_else(|| {
                anyhow!(
                    "`{}`: element {i} of the list was never written and its shape {elem} is \
                     not known",
                    cx.op_name
                )
            })?;
            Ok(Tensor::zeros(
                shape,
                storage_dtype(elem.dtype)?,
                &candle_core::Device::Cpu,
            )?)
        }
    }
}

fn eval_list_read(cx: &EvalCx) -> Result<Vec<RValue>> {
    let ls = cx.list("ls")?;
    let i = index(cx, ls, cx.int("index")?, false)?;
    let t = element(cx, ls, i, cx.out(0)?)?;
    Ok(vec![RValue::T(t)])
}

fn infer_list_gather(cx: &InferCx) -> Result<Vec<ValueType>> {
    let (elem, _) = list_type(cx, "ls")?;
    let e = elem_tensor(elem)?;
    let ix = cx.t("indices")?;
    ensure!(
        ix.dtype == DType::I32 && ix.rank() == 1,
        "`indices` must be a 1-D int32 tensor, is {ix}"
    );
    let mut shape = vec![ix.shape[0].clone()];
    shape.extend(e.shape.iter().cloned());
    Ok(vec![ValueType::Tensor(TensorType {
        dtype: e.dtype,
        shape,
    })])
}

fn eval_list_gather(cx: &EvalCx) -> Result<Vec<RValue>> {
    let ls = cx.list("ls")?;
    let out = cx.out(0)?;
    let elem = TensorType {
        dtype: out.dtype,
        shape: out.shape[1..].to_vec(),
    };
    let ts = cx
        .ints("indices")?
        .into_iter()
        .map(|i| element(cx, ls, index(cx, ls, i, false)?, &elem))
        .collect::<Result<Vec<_>>>()?;
    if ts.is_empty() {
        let mut shape = vec![0];
        shape.extend(elem.fixed_shape().ok_or_else(|| {
            anyhow!(
                "`{}`: no indices and an element shape {elem} not known",
                cx.op_name
            )
        })?);
        return Ok(vec![RValue::T(Tensor::zeros(
            shape,
            storage_dtype(elem.dtype)?,
            &candle_core::Device::Cpu,
        )?)]);
    }
    let dims = ts[0].dims().to_vec();
    for t in &ts {
        ensure!(
            t.dims() == dims,
            "`{}`: list elements of shapes {:?} and {:?} cannot be stacked",
            cx.op_name,
            dims,
            t.dims()
        );
    }
    Ok(vec![RValue::T(Tensor::stack(&ts, 0)?)])
}

fn infer_list_scatter(cx: &InferCx) -> Result<Vec<ValueType>> {
    let (elem, _) = list_type(cx, "ls")?;
    let ix = cx.t("indices")?;
    ensure!(
        ix.dtype == DType::I32 && ix.rank() == 1,
        "`indices` must be a 1-D int32 tensor, is {ix}"
    );
    let v = cx.t("value")?;
    ensure!(v.rank() >= 1, "`value` must have a leading axis, is {v}");
    if let (Dim::Fixed(a), Dim::Fixed(b)) = (&ix.shape[0], &v.shape[0]) {
        ensure!(a == b, "cannot scatter {b} values to {a} indices");
    }
    let row = TensorType {
        dtype: v.dtype,
        shape: v.shape[1..].to_vec(),
    };
    check_elem(elem, &row, "a row of `value`")?;
    Ok(vec![cx.all("ls")[0].ty.as_ref().clone()])
}

fn eval_list_scatter(cx: &EvalCx) -> Result<Vec<RValue>> {
    let mut ls = cx.list("ls")?.clone();
    let v = cx.t("value")?;
    let ix = cx.ints("indices")?;
    ensure!(
        v.dims()[0] == ix.len(),
        "`{}`: {} values for {} indices",
        cx.op_name,
        v.dims()[0],
        ix.len()
    );
    for (k, i) in ix.into_iter().enumerate() {
        let i = index(cx, &ls, i, true)?;
        put(&mut ls, i, v.get(k)?);
    }
    Ok(vec![RValue::List(ls)])
}

const MAKE_IN: &[InputSpec] = &[
    opt("init_length").or(DefaultValue::Int(1)),
    opt_c("dynamic_length").or(DefaultValue::Bool(true)),
    var("elem_shape"),
    opt_c("dtype").or(DefaultValue::Str("fp32")),
];
const LS_IN: &[InputSpec] = &[req("ls")];
const WRITE_IN: &[InputSpec] = &[req("ls"), req("index"), req("value")];
const READ_IN: &[InputSpec] = &[req("ls"), req("index")];
const GATHER_IN: &[InputSpec] = &[req("ls"), req("indices")];
const SCATTER_IN: &[InputSpec] = &[req("ls"), req("indices"), req("value")];

pub const DEFS: &[OpDef] = &[
    super::def("make_list", MAKE_IN, infer_make_list, eval_make_list),
    super::def("list_length", LS_IN, infer_list_length, eval_list_length),
    super::def("list_write", WRITE_IN, infer_list_write, eval_list_write),
    super::def("list_read", READ_IN, infer_list_read, eval_list_read),
    super::def(
        "list_gather",
        GATHER_IN,
        infer_list_gather,
        eval_list_gather,
    ),
    super::def(
        "list_scatter",
        SCATTER_IN,
        infer_list_scatter,
        eval_list_scatter,
    ),
];
