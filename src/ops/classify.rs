//! `classify` (iOS15), the op that makes a program a classifier, as coremltools 9 defines it
//! (`ops/defs/iOS15/classify.py`): `probabilities` (fp32, any shape) and a constant list of
//! `classes` (int64 or string scalars, as many as `probabilities` has elements) give two
//! outputs, the predicted label (a scalar of the class type) and a dictionary class →
//! probability (`dict<class, fp64>`). The label is the class of the largest probability in
//! row-major order, the first one on a tie (numpy's `argmax`; a NaN counts as largest);
//! the dictionary holds every class with its probability widened to fp64, in class order.
//! Only the last op of a classifier's main block, its outputs read by no other op.

use super::eval::{DictKeys, DictVal, EvalCx, RValue};
use super::infer::InferCx;
use super::{req, req_c, InputSpec, OpDef};
use crate::ir::{DType, Dim, TensorType, Value, ValueType};
use crate::kernels;
use anyhow::{anyhow, bail, ensure, Result};
use std::collections::BTreeSet;

/// The classes of a `classify`, from their constant list.
fn classes(v: &Value) -> Result<DictKeys> {
    let Value::List { values, .. } = v else {
        bail!("`classes` must be a list, is {}", v.value_type())
    };
    if values.iter().all(|c| c.as_str().is_some()) {
        let k: Vec<String> = values
            .iter()
            .filter_map(|c| c.as_str().map(String::from))
            .collect();
        return Ok(DictKeys::Str(k));
    }
    values
        .iter()
        .map(|c| match c {
            Value::Tensor(t) if t.dtype == DType::I64 && t.num_elements() == 1 => {
                Ok(t.to_i64_vec()?[0])
            }
            o => bail!(
                "`classes` must hold int64 or string scalars, holds a {}",
                o.value_type()
            ),
        })
        .collect::<Result<Vec<i64>>>()
        .map(DictKeys::Int64)
}

fn infer_classify(cx: &InferCx) -> Result<Vec<ValueType>> {
    let p = cx.t("probabilities")?;
    ensure!(
        p.dtype == DType::F32,
        "`classify`: probabilities must be fp32, are {}",
        p.dtype
    );
    let list = cx.val("classes")?;
    let keys = classes(list)?;
    ensure!(!keys.is_empty(), "`classify`: the list of classes is empty");
    let distinct = match &keys {
        DictKeys::Int64(k) => k.iter().collect::<BTreeSet<_>>().len(),
        DictKeys::Str(k) => k.iter().collect::<BTreeSet<_>>().len(),
    };
    ensure!(
        distinct == keys.len(),
        "`classify`: the classes repeat a class ({} classes, {distinct} distinct); each is a \
         key of the output dictionary",
        keys.len()
    );
    if let Some(n) = p.num_elements() {
        ensure!(
            n == keys.len(),
            "`classify`: {} classes for probabilities {p} ({n} elements); coremltools needs \
             one class per element",
            keys.len()
        );
    }
    ensure!(
        !p.shape.contains(&Dim::Fixed(0)),
        "`classify`: probabilities {p} are empty"
    );
    let key = ValueType::Tensor(TensorType::scalar(keys.dtype()));
    Ok(vec![
        key.clone(),
        ValueType::Dict {
            key: Box::new(key),
            value: Box::new(ValueType::Tensor(TensorType::scalar(DType::F64))),
        },
    ])
}

/// Index of the largest value, the first on a tie; a NaN is larger than any number.
fn argmax(v: &[f64]) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, &x) in v.iter().enumerate() {
        best = match best {
            None => Some(i),
            Some(b) if v[b].is_nan() => Some(b),
            Some(_) if x.is_nan() => Some(i),
            Some(b) if x > v[b] => Some(i),
            keep => keep,
        };
    }
    best
}

fn eval_classify(cx: &EvalCx) -> Result<Vec<RValue>> {
    let list = cx
        .konst("classes")
        .ok_or_else(|| anyhow!("`classify`: classes must be a constant list"))?;
    let keys = classes(list)?;
    let probs = cx.floats("probabilities")?;
    ensure!(
        probs.len() == keys.len(),
        "`classify`: {} probabilities for {} classes",
        probs.len(),
        keys.len()
    );
    let best = argmax(&probs).ok_or_else(|| anyhow!("`classify`: no probabilities"))?;
    let label = match &keys {
        DictKeys::Str(k) => RValue::Str(vec![k[best].clone()]),
        DictKeys::Int64(k) => RValue::T(kernels::from_vec(vec![k[best]], &[])?),
    };
    let n = probs.len();
    let values = kernels::data::from_f64(probs, &[n], candle_core::DType::F64)?;
    Ok(vec![label, RValue::Dict(DictVal { keys, values })])
}

const CLASSIFY: &[InputSpec] = &[req("probabilities"), req_c("classes")];

pub static DEFS: &[OpDef] = &[super::def(
    "classify",
    CLASSIFY,
    infer_classify,
    eval_classify,
)];

#[cfg(test)]
mod tests {
    use super::argmax;

    #[test]
    fn argmax_takes_the_first_of_ties_and_a_nan_as_largest() {
        assert_eq!(argmax(&[0.1, 0.7, 0.7, 0.2]), Some(1));
        assert_eq!(argmax(&[0.1, f64::NAN, 0.9, f64::NAN]), Some(1));
        assert_eq!(argmax(&[-1.0]), Some(0));
        assert_eq!(argmax(&[]), None);
    }
}
