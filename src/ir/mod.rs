//! The MIL program model: Program / Function / Block / Operation / Var, value types (incl.
//! sub-byte integer types) and tensor data. Knows no op by name: op definitions, the
//! builder and type inference live in `ops`. Uses nothing else in milkit.
pub mod bytes;
pub mod program;
pub mod types;
pub mod value;

pub use bytes::Bytes;
pub use program::{
    Arg, ArrayDType, Block, ColorSpace, Description, DictKey, Feature, FeatureKind, Function,
    FunctionIo, Model, Operation, Program, ShapeFlex, Var, HEAD_PADDING_KEY,
};
pub use types::{DType, Dim, Opset, TensorType, ValueType};
pub use value::{Tensor, Value};
