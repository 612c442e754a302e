//! Value types of the MIL type system: element dtypes (incl. sub-byte integers), dimensions,
//! tensor / state / list / tuple / dict types, and the opset targets.

use std::fmt;

/// Element type of a tensor. Names follow MIL (`fp16`, `int32`, `uint4`, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    Bool,
    Str,
    F16,
    F32,
    F64,
    BF16,
    I4,
    I8,
    I16,
    I32,
    I64,
    U1,
    U2,
    U3,
    U4,
    U6,
    U8,
    U16,
    U32,
    U64,
}

/// (dtype, MIL name, Core ML `DataType` enum value, bits per element)
const TABLE: &[(DType, &str, i32, usize)] = &[
    (DType::Bool, "bool", 1, 8),
    (DType::Str, "string", 2, 0),
    (DType::F16, "fp16", 10, 16),
    (DType::F32, "fp32", 11, 32),
    (DType::F64, "fp64", 12, 64),
    (DType::BF16, "bf16", 13, 16),
    (DType::I8, "int8", 21, 8),
    (DType::I16, "int16", 22, 16),
    (DType::I32, "int32", 23, 32),
    (DType::I64, "int64", 24, 64),
    (DType::I4, "int4", 25, 4),
    (DType::U8, "uint8", 31, 8),
    (DType::U16, "uint16", 32, 16),
    (DType::U32, "uint32", 33, 32),
    (DType::U64, "uint64", 34, 64),
    (DType::U4, "uint4", 35, 4),
    (DType::U2, "uint2", 36, 2),
    (DType::U1, "uint1", 37, 1),
    (DType::U6, "uint6", 38, 6),
    (DType::U3, "uint3", 39, 3),
];

impl DType {
    fn row(self) -> &'static (DType, &'static str, i32, usize) {
        TABLE
            .iter()
            .find(|r| r.0 == self)
            .expect("every dtype is in TABLE")
    }
    /// MIL spelling, e.g. `fp16`.
    pub fn name(self) -> &'static str {
        self.row().1
    }
    pub fn from_name(s: &str) -> Option<DType> {
        TABLE.iter().find(|r| r.1 == s).map(|r| r.0)
    }
    /// Value of `CoreML.Specification.MILSpec.DataType`.
    pub fn proto_code(self) -> i32 {
        self.row().2
    }
    pub fn from_proto_code(c: i32) -> Option<DType> {
        TABLE.iter().find(|r| r.2 == c).map(|r| r.0)
    }
    /// Storage bits per element (bool is stored one byte per element; string has none).
    pub fn bits(self) -> usize {
        self.row().3
    }
    pub fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::F32 | DType::F64 | DType::BF16)
    }
    pub fn is_int(self) -> bool {
        !self.is_float() && !matches!(self, DType::Bool | DType::Str)
    }
    pub fn is_signed_int(self) -> bool {
        matches!(
            self,
            DType::I4 | DType::I8 | DType::I16 | DType::I32 | DType::I64
        )
    }
    /// Fewer than 8 bits per element: stored packed.
    pub fn is_sub_byte(self) -> bool {
        self.bits() > 0 && self.bits() < 8
    }
    /// Bytes needed to store `n` elements (sub-byte types packed, rounded up to whole bytes).
    pub fn storage_bytes(self, n: usize) -> usize {
        (n * self.bits()).div_ceil(8)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One dimension: a known size or unknown (symbolic) at compile time.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Dim {
    Fixed(usize),
    Unknown,
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Fixed(n) => write!(f, "{n}"),
            Dim::Unknown => f.write_str("?"),
        }
    }
}

/// Tensor type; rank 0 is a scalar.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Vec<Dim>,
}

impl TensorType {
    pub fn new(dtype: DType, shape: &[usize]) -> TensorType {
        TensorType {
            dtype,
            shape: shape.iter().map(|&d| Dim::Fixed(d)).collect(),
        }
    }
    pub fn scalar(dtype: DType) -> TensorType {
        TensorType {
            dtype,
            shape: vec![],
        }
    }
    pub fn rank(&self) -> usize {
        self.shape.len()
    }
    /// The shape when every dimension is known.
    pub fn fixed_shape(&self) -> Option<Vec<usize>> {
        self.shape
            .iter()
            .map(|d| match d {
                Dim::Fixed(n) => Some(*n),
                Dim::Unknown => None,
            })
            .collect()
    }
    pub fn num_elements(&self) -> Option<usize> {
        self.fixed_shape().map(|s| s.iter().product())
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dims: Vec<String> = self.shape.iter().map(|d| d.to_string()).collect();
        write!(f, "tensor<{}, [{}]>", self.dtype, dims.join(", "))
    }
}

/// Any MIL value type.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ValueType {
    Tensor(TensorType),
    /// A Core ML state (iOS18) wrapping a tensor type.
    State(TensorType),
    List {
        elem: Box<ValueType>,
        len: Option<usize>,
    },
    Tuple(Vec<ValueType>),
    Dict {
        key: Box<ValueType>,
        value: Box<ValueType>,
    },
}

impl ValueType {
    pub fn tensor(dtype: DType, shape: &[usize]) -> ValueType {
        ValueType::Tensor(TensorType::new(dtype, shape))
    }
    pub fn as_tensor(&self) -> Option<&TensorType> {
        match self {
            ValueType::Tensor(t) => Some(t),
            _ => None,
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ValueType::Tensor(t) => t.fmt(f),
            ValueType::State(t) => write!(f, "state<{t}>"),
            ValueType::List { elem, len } => match len {
                Some(n) => write!(f, "list<{elem}, {n}>"),
                None => write!(f, "list<{elem}, ?>"),
            },
            ValueType::Tuple(ts) => {
                let s: Vec<String> = ts.iter().map(|t| t.to_string()).collect();
                write!(f, "tuple<{}>", s.join(", "))
            }
            ValueType::Dict { key, value } => write!(f, "dict<{key}, {value}>"),
        }
    }
}

/// MIL opset / deployment target. Ordered: a later target includes the earlier ops.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Opset {
    /// iOS15 / macOS12, opset `CoreML5`, specification version 6.
    Ios15,
    /// iOS16 / macOS13, `CoreML6`, spec 7.
    Ios16,
    /// iOS17 / macOS14, `CoreML7`, spec 8.
    Ios17,
    /// iOS18 / macOS15, `CoreML8`, spec 9.
    Ios18,
}

impl Opset {
    pub const ALL: [Opset; 4] = [Opset::Ios15, Opset::Ios16, Opset::Ios17, Opset::Ios18];
    /// Name of the block specialization / function opset in the program.
    pub fn opset_name(self) -> &'static str {
        match self {
            Opset::Ios15 => "CoreML5",
            Opset::Ios16 => "CoreML6",
            Opset::Ios17 => "CoreML7",
            Opset::Ios18 => "CoreML8",
        }
    }
    pub fn from_opset_name(s: &str) -> Option<Opset> {
        Opset::ALL.into_iter().find(|o| o.opset_name() == s)
    }
    /// Core ML model specification version that introduced this opset.
    pub fn spec_version(self) -> i32 {
        match self {
            Opset::Ios15 => 6,
            Opset::Ios16 => 7,
            Opset::Ios17 => 8,
            Opset::Ios18 => 9,
        }
    }
    pub fn from_spec_version(v: i32) -> Option<Opset> {
        Opset::ALL.into_iter().find(|o| o.spec_version() == v)
    }
    /// `ios15`..`ios18`, as the CLI's `--target` spells it.
    pub fn target_name(self) -> &'static str {
        match self {
            Opset::Ios15 => "ios15",
            Opset::Ios16 => "ios16",
            Opset::Ios17 => "ios17",
            Opset::Ios18 => "ios18",
        }
    }
    /// Accepts `ios15`..`ios18` and `macos12`..`macos15`.
    pub fn from_target_name(s: &str) -> Option<Opset> {
        match s.to_ascii_lowercase().as_str() {
            "ios15" | "macos12" => Some(Opset::Ios15),
            "ios16" | "macos13" => Some(Opset::Ios16),
            "ios17" | "macos14" => Some(Opset::Ios17),
            "ios18" | "macos15" => Some(Opset::Ios18),
            _ => None,
        }
    }
}

impl fmt::Display for Opset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.target_name())
    }
}
