//! Constant values: tensors with raw little-endian storage (sub-byte types packed), string
//! tensors, lists, tuples and dictionaries.

use super::bytes::Bytes;
use super::types::{DType, TensorType, ValueType};
use anyhow::{bail, ensure, Result};
use half::f16;

/// A tensor constant. `data` holds `dtype.storage_bytes(n)` bytes: little-endian elements,
/// bool one byte each, sub-byte integers packed (see `package::blob` for the bit order).
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub data: Bytes,
}

impl Tensor {
    /// Checks the byte length against dtype and shape.
    pub fn new(dtype: DType, shape: Vec<usize>, data: Bytes) -> Result<Tensor> {
        ensure!(dtype != DType::Str, "string tensors are Value::Strings");
        let n = shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .filter(|n| n.checked_mul(64).is_some());
        let Some(n) = n else {
            bail!("{dtype} tensor of shape {shape:?}: the element count overflows")
        };
        ensure!(
            data.len() == dtype.storage_bytes(n),
            "{dtype} tensor of shape {shape:?} needs {} bytes, got {}",
            dtype.storage_bytes(n),
            data.len()
        );
        Ok(Tensor { dtype, shape, data })
    }
    pub fn f16(shape: &[usize], v: &[f16]) -> Tensor {
        assert_eq!(
            shape.iter().product::<usize>(),
            v.len(),
            "shape/data mismatch"
        );
        Tensor {
            dtype: DType::F16,
            shape: shape.to_vec(),
            data: Bytes::from_f16(v),
        }
    }
    pub fn f32(shape: &[usize], v: &[f32]) -> Tensor {
        assert_eq!(
            shape.iter().product::<usize>(),
            v.len(),
            "shape/data mismatch"
        );
        Tensor {
            dtype: DType::F32,
            shape: shape.to_vec(),
            data: Bytes::from_f32(v),
        }
    }
    pub fn i32(shape: &[usize], v: &[i32]) -> Tensor {
        assert_eq!(
            shape.iter().product::<usize>(),
            v.len(),
            "shape/data mismatch"
        );
        Tensor {
            dtype: DType::I32,
            shape: shape.to_vec(),
            data: Bytes::from_vec(bytemuck::cast_slice(v).to_vec()),
        }
    }
    pub fn bools(shape: &[usize], v: &[bool]) -> Tensor {
        assert_eq!(
            shape.iter().product::<usize>(),
            v.len(),
            "shape/data mismatch"
        );
        Tensor {
            dtype: DType::Bool,
            shape: shape.to_vec(),
            data: Bytes::from_vec(v.iter().map(|&b| b as u8).collect()),
        }
    }
    pub fn num_elements(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn tensor_type(&self) -> TensorType {
        TensorType::new(self.dtype, &self.shape)
    }
    /// Elements as f64, for any dtype of 8 bits or more (ints and floats, bool as 0/1).
    pub fn to_f64_vec(&self) -> Result<Vec<f64>> {
        let b = self.data.as_slice();
        Ok(match self.dtype {
            DType::F16 => b
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f64())
                .collect(),
            DType::BF16 => b
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f64())
                .collect(),
            DType::F32 => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
                .collect(),
            DType::F64 => b
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                .collect(),
            DType::I8 => b.iter().map(|&x| x as i8 as f64).collect(),
            DType::U8 | DType::Bool => b.iter().map(|&x| x as f64).collect(),
            DType::I16 => b
                .chunks_exact(2)
                .map(|c| i16::from_le_bytes([c[0], c[1]]) as f64)
                .collect(),
            DType::U16 => b
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]) as f64)
                .collect(),
            DType::I32 => b
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as f64)
                .collect(),
            DType::U32 => b
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap()) as f64)
                .collect(),
            DType::I64 => b
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64)
                .collect(),
            DType::U64 => b
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap()) as f64)
                .collect(),
            d => bail!("cannot read {d} elements as numbers without unpacking"),
        })
    }
    /// Integer elements (errors on float tensors with a fractional value).
    pub fn to_i64_vec(&self) -> Result<Vec<i64>> {
        ensure!(
            self.dtype.is_int() || self.dtype == DType::Bool,
            "expected an integer tensor, got {}",
            self.dtype
        );
        Ok(self.to_f64_vec()?.into_iter().map(|x| x as i64).collect())
    }
}

/// A constant value of any MIL type.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Tensor(Tensor),
    Strings {
        shape: Vec<usize>,
        values: Vec<String>,
    },
    List {
        elem: ValueType,
        values: Vec<Value>,
    },
    Tuple(Vec<Value>),
    Dict {
        key: ValueType,
        value: ValueType,
        entries: Vec<(Value, Value)>,
    },
}

impl Value {
    pub fn str(s: &str) -> Value {
        Value::Strings {
            shape: vec![],
            values: vec![s.to_string()],
        }
    }
    pub fn i32_scalar(v: i32) -> Value {
        Value::Tensor(Tensor::i32(&[], &[v]))
    }
    pub fn i32s(v: &[i32]) -> Value {
        Value::Tensor(Tensor::i32(&[v.len()], v))
    }
    pub fn f32_scalar(v: f32) -> Value {
        Value::Tensor(Tensor::f32(&[], &[v]))
    }
    pub fn f16_scalar(v: f32) -> Value {
        Value::Tensor(Tensor::f16(&[], &[f16::from_f32(v)]))
    }
    pub fn bool_scalar(v: bool) -> Value {
        Value::Tensor(Tensor::bools(&[], &[v]))
    }
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::Tensor(t) => ValueType::Tensor(t.tensor_type()),
            Value::Strings { shape, .. } => ValueType::Tensor(TensorType::new(DType::Str, shape)),
            Value::List { elem, values } => ValueType::List {
                elem: Box::new(elem.clone()),
                len: Some(values.len()),
            },
            Value::Tuple(vs) => ValueType::Tuple(vs.iter().map(|v| v.value_type()).collect()),
            Value::Dict { key, value, .. } => ValueType::Dict {
                key: Box::new(key.clone()),
                value: Box::new(value.clone()),
            },
        }
    }
    pub fn as_tensor(&self) -> Option<&Tensor> {
        match self {
            Value::Tensor(t) => Some(t),
            _ => None,
        }
    }
    /// A scalar (or 1-element) string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Strings { values, .. } if values.len() == 1 => Some(&values[0]),
            _ => None,
        }
    }
}
