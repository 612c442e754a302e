//! Conversions between IR types and the protobuf messages of `model.mlmodel`, both ways.
//! Tensors with more than [`INLINE_MAX_ELEMENTS`] elements of a blob-storable dtype go to
//! `weight.bin`; everything else is stored inline (as coremltools does).

use super::blob::BlobDType;
use crate::ir::{DType, Dim, Tensor, TensorType, Value, ValueType};
use crate::proto::mil;
use anyhow::{anyhow, bail, ensure, Context, Result};

/// Largest tensor kept inline in the program (coremltools' rule: more than 10 → weight file).
pub const INLINE_MAX_ELEMENTS: usize = 10;
/// The `fileName` of every blob reference, relative to the compiled model.
pub const WEIGHTS_REF: &str = "@model_path/weights/weight.bin";

/// The blob dtype for an IR dtype, if blobs can hold it.
pub fn blob_dtype(d: DType) -> Option<BlobDType> {
    Some(match d {
        DType::F16 => BlobDType::F16,
        DType::F32 => BlobDType::F32,
        DType::BF16 => BlobDType::BF16,
        DType::U8 => BlobDType::U8,
        DType::I8 => BlobDType::I8,
        DType::I16 => BlobDType::I16,
        DType::U16 => BlobDType::U16,
        DType::I4 => BlobDType::I4,
        DType::U1 => BlobDType::U1,
        DType::U2 => BlobDType::U2,
        DType::U3 => BlobDType::U3,
        DType::U4 => BlobDType::U4,
        DType::U6 => BlobDType::U6,
        DType::I32 => BlobDType::I32,
        DType::U32 => BlobDType::U32,
        _ => return None,
    })
}

pub fn dtype_from_blob(b: BlobDType) -> Option<DType> {
    [
        DType::F16,
        DType::F32,
        DType::BF16,
        DType::U8,
        DType::I8,
        DType::I16,
        DType::U16,
        DType::I4,
        DType::U1,
        DType::U2,
        DType::U3,
        DType::U4,
        DType::U6,
        DType::I32,
        DType::U32,
    ]
    .into_iter()
    .find(|d| blob_dtype(*d) == Some(b))
}

/// Whether a tensor of this dtype and size is written to the weight file. int32 stays inline:
/// older runtimes only map float and small-integer blobs.
pub fn goes_to_blob(t: &Tensor) -> bool {
    t.num_elements() > INLINE_MAX_ELEMENTS
        && t.dtype != DType::I32
        && t.dtype != DType::U32
        && blob_dtype(t.dtype).is_some()
}

pub fn tensor_type_to_proto(t: &TensorType) -> mil::TensorType {
    mil::TensorType {
        data_type: t.dtype.proto_code(),
        rank: t.rank() as i64,
        dimensions: t
            .shape
            .iter()
            .map(|d| mil::Dimension {
                dimension: Some(match d {
                    Dim::Fixed(n) => {
                        mil::dimension::Dimension::Constant(mil::dimension::ConstantDimension {
                            size: *n as u64,
                        })
                    }
                    Dim::Unknown => {
                        mil::dimension::Dimension::Unknown(mil::dimension::UnknownDimension {
                            variadic: false,
                        })
                    }
                }),
            })
            .collect(),
        attributes: Default::default(),
    }
}

pub fn value_type_to_proto(t: &ValueType) -> mil::ValueType {
    use mil::value_type::Type;
    let ty = match t {
        ValueType::Tensor(t) => Type::TensorType(tensor_type_to_proto(t)),
        ValueType::State(t) => Type::StateType(Box::new(mil::StateType {
            wrapped_type: Some(Box::new(value_type_to_proto(&ValueType::Tensor(t.clone())))),
        })),
        ValueType::List { elem, len } => Type::ListType(Box::new(mil::ListType {
            r#type: Some(Box::new(value_type_to_proto(elem))),
            length: Some(mil::Dimension {
                dimension: Some(match len {
                    Some(n) => {
                        mil::dimension::Dimension::Constant(mil::dimension::ConstantDimension {
                            size: *n as u64,
                        })
                    }
                    None => mil::dimension::Dimension::Unknown(mil::dimension::UnknownDimension {
                        variadic: false,
                    }),
                }),
            }),
        })),
        ValueType::Tuple(ts) => Type::TupleType(mil::TupleType {
            types: ts.iter().map(value_type_to_proto).collect(),
        }),
        ValueType::Dict { key, value } => Type::DictionaryType(Box::new(mil::DictionaryType {
            key_type: Some(Box::new(value_type_to_proto(key))),
            value_type: Some(Box::new(value_type_to_proto(value))),
        })),
    };
    mil::ValueType { r#type: Some(ty) }
}

fn dim_from_proto(d: &mil::Dimension) -> Result<Dim> {
    Ok(match &d.dimension {
        Some(mil::dimension::Dimension::Constant(c)) => Dim::Fixed(usize::try_from(c.size)?),
        Some(mil::dimension::Dimension::Unknown(_)) => Dim::Unknown,
        None => bail!("dimension without a value"),
    })
}

/// Most elements a tensor type read from a file may have (2^40): every byte count computed
/// from a checked type then fits 64-bit arithmetic, whatever the file claims.
pub const MAX_ELEMENTS: u64 = 1 << 40;

pub fn tensor_type_from_proto(t: &mil::TensorType) -> Result<TensorType> {
    let dtype = DType::from_proto_code(t.data_type)
        .ok_or_else(|| anyhow!("unknown data type code {}", t.data_type))?;
    let shape = t
        .dimensions
        .iter()
        .map(dim_from_proto)
        .collect::<Result<Vec<_>>>()?;
    let known = shape.iter().try_fold(1u64, |n, d| match d {
        Dim::Fixed(k) => n.checked_mul(*k as u64),
        Dim::Unknown => Some(n),
    });
    ensure!(
        known.is_some_and(|n| n <= MAX_ELEMENTS),
        "tensor type with dimensions {:?} has more than {MAX_ELEMENTS} elements",
        shape.iter().map(|d| d.to_string()).collect::<Vec<_>>()
    );
    ensure!(
        t.rank == shape.len() as i64,
        "tensor type of rank {} lists {} dimensions",
        t.rank,
        shape.len()
    );
    Ok(TensorType { dtype, shape })
}

pub fn value_type_from_proto(t: &mil::ValueType) -> Result<ValueType> {
    use mil::value_type::Type;
    Ok(
        match t
            .r#type
            .as_ref()
            .ok_or_else(|| anyhow!("value type missing"))?
        {
            Type::TensorType(t) => ValueType::Tensor(tensor_type_from_proto(t)?),
            Type::StateType(s) => {
                match value_type_from_proto(
                    s.wrapped_type
                        .as_deref()
                        .ok_or_else(|| anyhow!("state type without wrapped type"))?,
                )? {
                    ValueType::Tensor(t) => ValueType::State(t),
                    o => bail!("state wrapping a non-tensor {o}"),
                }
            }
            Type::ListType(l) => ValueType::List {
                elem: Box::new(value_type_from_proto(
                    l.r#type
                        .as_deref()
                        .ok_or_else(|| anyhow!("list type without element type"))?,
                )?),
                len: match l.length.as_ref().map(dim_from_proto).transpose()? {
                    Some(Dim::Fixed(n)) => Some(n),
                    _ => None,
                },
            },
            Type::TupleType(t) => ValueType::Tuple(
                t.types
                    .iter()
                    .map(value_type_from_proto)
                    .collect::<Result<_>>()?,
            ),
            Type::DictionaryType(d) => ValueType::Dict {
                key: Box::new(value_type_from_proto(
                    d.key_type
                        .as_deref()
                        .ok_or_else(|| anyhow!("dict without key type"))?,
                )?),
                value: Box::new(value_type_from_proto(
                    d.value_type
                        .as_deref()
                        .ok_or_else(|| anyhow!("dict without value type"))?,
                )?),
            },
        },
    )
}

/// Where blob-bound tensors go when writing.
pub trait BlobSink {
    /// Stores a tensor's bytes and returns the offset of its blob record.
    fn put(&mut self, t: &Tensor) -> Result<u64>;
}

/// Where blob references are resolved when reading.
pub trait BlobSource {
    fn get(&self, offset: u64) -> Result<(BlobDType, crate::ir::Bytes)>;
}

fn immediate_tensor(t: &Tensor) -> Result<mil::TensorValue> {
    use mil::tensor_value::{
        RepeatedBools, RepeatedBytes, RepeatedDoubles, RepeatedFloats, RepeatedInts,
        RepeatedLongInts, Value as TV,
    };
    let b = t.data.as_slice();
    let v = match t.dtype {
        DType::F32 => TV::Floats(RepeatedFloats {
            values: t.data.to_f32_vec(),
        }),
        DType::F64 => TV::Doubles(RepeatedDoubles {
            values: t.to_f64_vec()?,
        }),
        // uint32 goes to `bytes` with the 8-bit and sub-byte types (coremltools'
        // IMMEDIATE_VALUE_TYPES_IN_BYTES); 16-bit integers stay in `ints`, as it writes them.
        DType::I32 | DType::I16 | DType::U16 => TV::Ints(RepeatedInts {
            values: t.to_i64_vec()?.into_iter().map(|x| x as i32).collect(),
        }),
        DType::I64 | DType::U64 => TV::LongInts(RepeatedLongInts {
            values: t.to_i64_vec()?,
        }),
        DType::Bool => TV::Bools(RepeatedBools {
            values: b.iter().map(|&x| x != 0).collect(),
        }),
        // fp16, bf16, 8-bit and packed sub-byte integers: raw bytes, as coremltools writes them.
        _ => TV::Bytes(RepeatedBytes { values: b.to_vec() }),
    };
    Ok(mil::TensorValue { value: Some(v) })
}

pub fn value_to_proto(v: &Value, blobs: &mut dyn BlobSink) -> Result<mil::Value> {
    use mil::value::immediate_value::Value as IV;
    use mil::value::{ImmediateValue, Value as PV};
    let ty = Some(value_type_to_proto(&v.value_type()));
    let value = match v {
        Value::Tensor(t) if goes_to_blob(t) => PV::BlobFileValue(mil::value::BlobFileValue {
            file_name: WEIGHTS_REF.to_string(),
            offset: blobs.put(t)?,
        }),
        Value::Tensor(t) => PV::ImmediateValue(ImmediateValue {
            value: Some(IV::Tensor(immediate_tensor(t)?)),
        }),
        Value::Strings { values, .. } => PV::ImmediateValue(ImmediateValue {
            value: Some(IV::Tensor(mil::TensorValue {
                value: Some(mil::tensor_value::Value::Strings(
                    mil::tensor_value::RepeatedStrings {
                        values: values.clone(),
                    },
                )),
            })),
        }),
        Value::List { values, .. } => PV::ImmediateValue(ImmediateValue {
            value: Some(IV::List(mil::ListValue {
                values: values
                    .iter()
                    .map(|x| value_to_proto(x, blobs))
                    .collect::<Result<_>>()?,
            })),
        }),
        Value::Tuple(values) => PV::ImmediateValue(ImmediateValue {
            value: Some(IV::Tuple(mil::TupleValue {
                values: values
                    .iter()
                    .map(|x| value_to_proto(x, blobs))
                    .collect::<Result<_>>()?,
            })),
        }),
        Value::Dict { entries, .. } => PV::ImmediateValue(ImmediateValue {
            value: Some(IV::Dictionary(mil::DictionaryValue {
                values: entries
                    .iter()
                    .map(|(k, x)| {
                        Ok(mil::dictionary_value::KeyValuePair {
                            key: Some(value_to_proto(k, blobs)?),
                            value: Some(value_to_proto(x, blobs)?),
                        })
                    })
                    .collect::<Result<_>>()?,
            })),
        }),
    };
    Ok(mil::Value {
        doc_string: String::new(),
        r#type: ty,
        value: Some(value),
    })
}

fn tensor_from_immediate(tt: &TensorType, tv: &mil::TensorValue) -> Result<Value> {
    use mil::tensor_value::Value as TV;
    let shape = tt
        .fixed_shape()
        .ok_or_else(|| anyhow!("constant {tt} has an unknown dimension"))?;
    let n: usize = shape.iter().product();
    let v = tv
        .value
        .as_ref()
        .ok_or_else(|| anyhow!("tensor value without data"))?;
    let count = |len: usize| -> Result<()> {
        ensure!(len == n, "constant {tt} holds {len} values, expected {n}");
        Ok(())
    };
    let t = |bytes: Vec<u8>| {
        Tensor::new(tt.dtype, shape.clone(), crate::ir::Bytes::from_vec(bytes)).map(Value::Tensor)
    };
    match (tt.dtype, v) {
        (DType::Str, TV::Strings(s)) => {
            count(s.values.len())?;
            Ok(Value::Strings {
                shape: shape.clone(),
                values: s.values.clone(),
            })
        }
        (DType::F32, TV::Floats(f)) => {
            count(f.values.len())?;
            t(bytemuck::cast_slice(&f.values).to_vec())
        }
        (DType::F64, TV::Doubles(f)) => {
            count(f.values.len())?;
            t(bytemuck::cast_slice(&f.values).to_vec())
        }
        (DType::Bool, TV::Bools(f)) => {
            count(f.values.len())?;
            t(f.values.iter().map(|&b| b as u8).collect())
        }
        (DType::I32, TV::Ints(f)) => {
            count(f.values.len())?;
            t(bytemuck::cast_slice(&f.values).to_vec())
        }
        (DType::U32, TV::Ints(f)) => {
            count(f.values.len())?;
            t(f.values
                .iter()
                .flat_map(|&x| (x as u32).to_le_bytes())
                .collect())
        }
        (DType::I16, TV::Ints(f)) => {
            count(f.values.len())?;
            t(f.values
                .iter()
                .flat_map(|&x| (x as i16).to_le_bytes())
                .collect())
        }
        (DType::U16, TV::Ints(f)) => {
            count(f.values.len())?;
            t(f.values
                .iter()
                .flat_map(|&x| (x as u16).to_le_bytes())
                .collect())
        }
        (DType::I8, TV::Ints(f)) => {
            count(f.values.len())?;
            t(f.values.iter().map(|&x| x as i8 as u8).collect())
        }
        (DType::U8, TV::Ints(f)) => {
            count(f.values.len())?;
            t(f.values.iter().map(|&x| x as u8).collect())
        }
        (DType::I64 | DType::U64, TV::LongInts(f)) => {
            count(f.values.len())?;
            t(bytemuck::cast_slice(&f.values).to_vec())
        }
        (DType::I64, TV::Ints(f)) => {
            count(f.values.len())?;
            t(f.values
                .iter()
                .flat_map(|&x| (x as i64).to_le_bytes())
                .collect())
        }
        (_, TV::Bytes(b)) => {
            ensure!(
                b.values.len() == tt.dtype.storage_bytes(n),
                "constant {tt} holds {} bytes, expected {}",
                b.values.len(),
                tt.dtype.storage_bytes(n)
            );
            t(b.values.clone())
        }
        (d, _) => bail!("constant of type {d} stored in an unexpected representation"),
    }
}

pub fn value_from_proto(v: &mil::Value, blobs: &dyn BlobSource) -> Result<Value> {
    use mil::value::immediate_value::Value as IV;
    use mil::value::Value as PV;
    let ty = value_type_from_proto(
        v.r#type
            .as_ref()
            .ok_or_else(|| anyhow!("value without a type"))?,
    )?;
    match v
        .value
        .as_ref()
        .ok_or_else(|| anyhow!("value without data"))?
    {
        PV::BlobFileValue(bf) => {
            let ValueType::Tensor(tt) = &ty else {
                bail!("blob value of non-tensor type {ty}")
            };
            ensure!(
                bf.file_name == WEIGHTS_REF,
                "blob reference to `{}`; only {WEIGHTS_REF} is supported",
                bf.file_name
            );
            let (bd, data) = blobs
                .get(bf.offset)
                .with_context(|| format!("blob at offset {}", bf.offset))?;
            let d =
                dtype_from_blob(bd).ok_or_else(|| anyhow!("blob dtype {bd:?} has no MIL type"))?;
            ensure!(
                d == tt.dtype,
                "blob at offset {} holds {d}, the program declares {tt}",
                bf.offset
            );
            let shape = tt
                .fixed_shape()
                .ok_or_else(|| anyhow!("blob constant {tt} has an unknown dimension"))?;
            let n: usize = shape.iter().product();
            ensure!(
                data.len() == d.storage_bytes(n),
                "blob at offset {} holds {} bytes, {tt} needs {}",
                bf.offset,
                data.len(),
                d.storage_bytes(n)
            );
            Ok(Value::Tensor(Tensor::new(d, shape, data)?))
        }
        PV::ImmediateValue(iv) => match iv
            .value
            .as_ref()
            .ok_or_else(|| anyhow!("immediate value without data"))?
        {
            IV::Tensor(tv) => {
                let ValueType::Tensor(tt) = &ty else {
                    bail!("tensor value of type {ty}")
                };
                tensor_from_immediate(tt, tv)
            }
            IV::List(l) => {
                let ValueType::List { elem, .. } = &ty else {
                    bail!("list value of type {ty}")
                };
                Ok(Value::List {
                    elem: (**elem).clone(),
                    values: l
                        .values
                        .iter()
                        .map(|x| value_from_proto(x, blobs))
                        .collect::<Result<_>>()?,
                })
            }
            IV::Tuple(l) => Ok(Value::Tuple(
                l.values
                    .iter()
                    .map(|x| value_from_proto(x, blobs))
                    .collect::<Result<_>>()?,
            )),
            IV::Dictionary(d) => {
                let ValueType::Dict { key, value } = &ty else {
                    bail!("dictionary value of type {ty}")
                };
                Ok(Value::Dict {
                    key: (**key).clone(),
                    value: (**value).clone(),
                    entries: d
                        .values
                        .iter()
                        .map(|kv| {
                            Ok((
                                value_from_proto(
                                    kv.key
                                        .as_ref()
                                        .ok_or_else(|| anyhow!("dict entry without key"))?,
                                    blobs,
                                )?,
                                value_from_proto(
                                    kv.value
                                        .as_ref()
                                        .ok_or_else(|| anyhow!("dict entry without value"))?,
                                    blobs,
                                )?,
                            ))
                        })
                        .collect::<Result<_>>()?,
                })
            }
        },
    }
}
