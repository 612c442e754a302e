//! Program structure: Program → Function → Block → Operation, plus the model description
//! (the package-level I/O ABI and metadata) that wraps a program in an `.mlpackage`.

use super::types::{DType, Dim, Opset, TensorType, ValueType};
use super::value::Value;
use std::collections::BTreeMap;
use std::fmt;

/// A named, typed SSA value.
#[derive(Clone, Debug, PartialEq)]
pub struct Var {
    pub name: String,
    pub ty: ValueType,
}

/// One binding of an op input: a variable by name, or an inline value.
#[derive(Clone, Debug, PartialEq)]
pub enum Arg {
    Var(String),
    Value(Value),
}

/// One MIL operation. `inputs` maps parameter name → bindings (more than one for variadic
/// parameters such as `concat`'s `values`). The op's name lives in `name` (serialized as the
/// `name` attribute); other attributes (`val` of a `const`) stay in `attributes`.
#[derive(Clone, Debug, PartialEq)]
pub struct Operation {
    pub op_type: String,
    pub name: String,
    pub inputs: BTreeMap<String, Vec<Arg>>,
    pub outputs: Vec<Var>,
    pub blocks: Vec<Block>,
    pub attributes: BTreeMap<String, Value>,
}

impl Operation {
    /// The single binding of `param`, if present and not variadic.
    pub fn arg(&self, param: &str) -> Option<&Arg> {
        match self.inputs.get(param) {
            Some(v) if v.len() == 1 => Some(&v[0]),
            _ => None,
        }
    }
    /// The value of a `const` op.
    pub fn const_val(&self) -> Option<&Value> {
        if self.op_type == "const" {
            self.attributes.get("val")
        } else {
            None
        }
    }
}

#[derive(Clone, Debug, PartialEq, Default)]
pub struct Block {
    pub inputs: Vec<Var>,
    pub operations: Vec<Operation>,
    pub outputs: Vec<String>,
}

impl Block {
    /// Every operation, nested blocks included, in program order.
    pub fn walk(&self) -> Vec<&Operation> {
        let mut out = Vec::new();
        fn rec<'a>(b: &'a Block, out: &mut Vec<&'a Operation>) {
            for op in &b.operations {
                out.push(op);
                for nb in &op.blocks {
                    rec(nb, out);
                }
            }
        }
        rec(self, &mut out);
        out
    }
}

/// A function with one block specialization for its opset.
#[derive(Clone, Debug, PartialEq)]
pub struct Function {
    pub inputs: Vec<Var>,
    pub opset: Opset,
    pub block: Block,
}

#[derive(Clone, Debug, PartialEq, Default)]
pub struct Program {
    pub functions: BTreeMap<String, Function>,
    pub attributes: BTreeMap<String, Value>,
    pub doc: String,
}

impl Program {
    pub fn main(&self) -> Option<&Function> {
        self.functions
            .get("main")
            .or_else(|| self.functions.values().next())
    }
}

/// Element types a Core ML multi-array feature may have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArrayDType {
    F16,
    F32,
    F64,
    I32,
}

impl ArrayDType {
    pub fn to_dtype(self) -> DType {
        match self {
            ArrayDType::F16 => DType::F16,
            ArrayDType::F32 => DType::F32,
            ArrayDType::F64 => DType::F64,
            ArrayDType::I32 => DType::I32,
        }
    }
    pub fn from_dtype(d: DType) -> Option<ArrayDType> {
        match d {
            DType::F16 => Some(ArrayDType::F16),
            DType::F32 => Some(ArrayDType::F32),
            DType::F64 => Some(ArrayDType::F64),
            DType::I32 => Some(ArrayDType::I32),
            _ => None,
        }
    }
}

/// The key type of a dictionary feature.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DictKey {
    Int64,
    String,
}

impl DictKey {
    /// The MIL dtype of the keys (`int64` or `string`).
    pub fn dtype(self) -> DType {
        match self {
            DictKey::Int64 => DType::I64,
            DictKey::String => DType::Str,
        }
    }
}

/// The pixel layout of an image feature (Core ML's `ImageFeatureType.ColorSpace`): what
/// channels the program's `[1, C, H, W]` input receives, in which order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColorSpace {
    /// One channel, 8-bit.
    Grayscale,
    /// Three channels: red, green, blue.
    Rgb,
    /// Three channels: blue, green, red.
    Bgr,
    /// One channel, fp16 pixels.
    GrayscaleF16,
}

impl ColorSpace {
    pub fn channels(self) -> usize {
        match self {
            ColorSpace::Grayscale | ColorSpace::GrayscaleF16 => 1,
            ColorSpace::Rgb | ColorSpace::Bgr => 3,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            ColorSpace::Grayscale => "GRAYSCALE",
            ColorSpace::Rgb => "RGB",
            ColorSpace::Bgr => "BGR",
            ColorSpace::GrayscaleF16 => "GRAYSCALE_FLOAT16",
        }
    }
}

/// What a feature holds. Every input and state, and most outputs, are multi-arrays
/// (described by the feature's `dtype` and `shape`); a classifier's outputs are a scalar
/// label (`Int64` or `String`) and a dictionary of class → probability (fp64 values), for
/// which `dtype` and `shape` mean nothing (`shape` is empty).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FeatureKind {
    #[default]
    Array,
    Int64,
    Double,
    String,
    Dict(DictKey),
    /// An image input: `shape` is `[height, width]` (its flexibility ranges over those two)
    /// and `dtype` means nothing; the program's input is the `[1, C, H, W]` (or
    /// `[C, H, W]`) tensor the pixels become.
    Image(ColorSpace),
}

/// The shapes a multi-array input takes besides its default one (Core ML's shape
/// flexibility: what coremltools writes for `RangeDim` and `EnumeratedShapes` inputs, whose
/// program input then has `?` dimensions).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum ShapeFlex {
    /// Only the default shape.
    #[default]
    Fixed,
    /// Per dimension the sizes allowed, inclusive: lower bound and upper bound (`None`:
    /// unbounded).
    Ranges(Vec<(usize, Option<usize>)>),
    /// Exactly these shapes.
    Enumerated(Vec<Vec<usize>>),
}

impl ShapeFlex {
    /// Whether a dimension may take a size other than the default's.
    pub fn varies(&self, axis: usize, default: usize) -> bool {
        match self {
            ShapeFlex::Fixed => false,
            ShapeFlex::Ranges(r) => r
                .get(axis)
                .is_some_and(|&(lo, hi)| hi != Some(lo) || lo != default),
            ShapeFlex::Enumerated(s) => s.iter().any(|s| s.get(axis) != Some(&default)),
        }
    }
}

impl fmt::Display for ShapeFlex {
    /// `[1, 1..=64, 3]`, `[1, 2..]`, `[1, 3] | [2, 3]`; empty for a fixed shape.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |v: &[usize]| {
            v.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self {
            ShapeFlex::Fixed => Ok(()),
            ShapeFlex::Ranges(r) => {
                let dims: Vec<String> = r
                    .iter()
                    .map(|&(lo, hi)| match hi {
                        Some(hi) if hi == lo => lo.to_string(),
                        Some(hi) => format!("{lo}..={hi}"),
                        None => format!("{lo}.."),
                    })
                    .collect();
                write!(f, "[{}]", dims.join(", "))
            }
            ShapeFlex::Enumerated(s) => {
                let shapes: Vec<String> = s.iter().map(|s| format!("[{}]", list(s))).collect();
                f.write_str(&shapes.join(" | "))
            }
        }
    }
}

/// One feature of the model description (an input, output or state).
#[derive(Clone, Debug, PartialEq)]
pub struct Feature {
    pub name: String,
    pub dtype: ArrayDType,
    /// The default shape (the one shape of a fixed-shape feature).
    pub shape: Vec<usize>,
    /// The other shapes an input accepts.
    pub flex: ShapeFlex,
    pub doc: String,
    pub kind: FeatureKind,
}

impl Feature {
    pub fn new(name: &str, dtype: ArrayDType, shape: &[usize]) -> Feature {
        Feature {
            name: name.to_string(),
            dtype,
            shape: shape.to_vec(),
            flex: ShapeFlex::Fixed,
            doc: String::new(),
            kind: FeatureKind::Array,
        }
    }
    /// A feature that is not a multi-array (a classifier's label or dictionary).
    pub fn of_kind(name: &str, kind: FeatureKind) -> Feature {
        Feature {
            kind,
            ..Feature::new(name, ArrayDType::F64, &[])
        }
    }
    /// The tensor type of the default shape.
    pub fn tensor_type(&self) -> TensorType {
        TensorType::new(self.dtype.to_dtype(), &self.shape)
    }
    /// The tensor type every accepted shape has: `?` where the flexibility lets a
    /// dimension vary (what a program input of a flexible feature declares).
    pub fn flexible_type(&self) -> TensorType {
        let mut t = self.tensor_type();
        for (axis, d) in t.shape.iter_mut().enumerate() {
            if self.flex.varies(axis, self.shape[axis]) {
                *d = Dim::Unknown;
            }
        }
        t
    }
    /// Whether an input of shape `dims` is one the feature accepts: the default shape, a
    /// shape inside the ranges, or one of the enumerated shapes; the error names the
    /// feature, the shape given and what is allowed.
    pub fn check_shape(&self, dims: &[usize]) -> Result<(), String> {
        let ok = match &self.flex {
            ShapeFlex::Fixed => dims == self.shape.as_slice(),
            ShapeFlex::Ranges(r) => {
                dims.len() == r.len()
                    && dims
                        .iter()
                        .zip(r)
                        .all(|(&d, &(lo, hi))| d >= lo && hi.is_none_or(|hi| d <= hi))
            }
            ShapeFlex::Enumerated(s) => {
                dims == self.shape.as_slice() || s.iter().any(|s| s.as_slice() == dims)
            }
        };
        if ok {
            return Ok(());
        }
        let allowed = match &self.flex {
            ShapeFlex::Fixed => format!("{:?}", self.shape),
            ShapeFlex::Ranges(_) => format!("a shape in {}", self.flex),
            ShapeFlex::Enumerated(_) => format!("one of {}", self.flex),
        };
        Err(format!(
            "input `{}`: shape {dims:?} is not one the model accepts ({allowed})",
            self.name
        ))
    }
    /// The MIL type of the program value this feature describes: the array's tensor type,
    /// a scalar for a label or double, `dict<key, fp64>` for a dictionary.
    pub fn value_type(&self) -> ValueType {
        let scalar = |d| ValueType::Tensor(TensorType::scalar(d));
        match self.kind {
            FeatureKind::Array => ValueType::Tensor(self.tensor_type()),
            FeatureKind::Int64 => scalar(DType::I64),
            FeatureKind::Double => scalar(DType::F64),
            FeatureKind::String => scalar(DType::Str),
            FeatureKind::Dict(k) => ValueType::Dict {
                key: Box::new(scalar(k.dtype())),
                value: Box::new(scalar(DType::F64)),
            },
            FeatureKind::Image(c) => {
                let dtype = match c {
                    ColorSpace::GrayscaleF16 => DType::F16,
                    _ => DType::F32,
                };
                let mut shape = vec![Dim::Fixed(1), Dim::Fixed(c.channels())];
                shape.extend(self.flexible_type().shape);
                ValueType::Tensor(TensorType { dtype, shape })
            }
        }
    }
    /// How `inspect` names the feature's type: the array's dtype, or `int64`, `fp64`,
    /// `string`, `dict<string, fp64>`.
    pub fn type_name(&self) -> String {
        match self.kind {
            FeatureKind::Array => self.dtype.to_dtype().name().to_string(),
            FeatureKind::Int64 => "int64".into(),
            FeatureKind::Double => "fp64".into(),
            FeatureKind::String => "string".into(),
            FeatureKind::Dict(k) => format!("dict<{}, fp64>", k.dtype().name()),
            FeatureKind::Image(c) => format!("image<{}>", c.name()),
        }
    }
}

/// `user_defined` key under which a converter records rows it padded onto a weight (e.g. a
/// vocabulary head no group size divides), for `verify` and `inspect` to show.
pub const HEAD_PADDING_KEY: &str = "milkit.head_padding";

/// The model description: I/O ABI, states and metadata.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Description {
    pub inputs: Vec<Feature>,
    pub outputs: Vec<Feature>,
    pub states: Vec<Feature>,
    pub short_description: String,
    pub author: String,
    pub version: String,
    pub user_defined: BTreeMap<String, String>,
    /// A classifier's label output (`predictedFeatureName`; empty for other models).
    pub predicted_feature: String,
    /// A classifier's class → probability output (`predictedProbabilitiesName`; empty
    /// for other models).
    pub predicted_probabilities: String,
    /// A multifunction model's (iOS18) interface of each function, by name; empty for a
    /// single-function model. `inputs`, `outputs` and `states` are then the default
    /// function's.
    pub functions: BTreeMap<String, FunctionIo>,
    /// The function a multifunction model runs by default (empty: single function).
    pub default_function: String,
}

/// One function's interface in a multifunction model description.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct FunctionIo {
    pub inputs: Vec<Feature>,
    pub outputs: Vec<Feature>,
    pub states: Vec<Feature>,
}

/// What an `.mlpackage` holds: specification version, description and the MIL program.
#[derive(Clone, Debug, PartialEq)]
pub struct Model {
    pub spec_version: i32,
    pub description: Description,
    pub program: Program,
}

impl Model {
    /// A model of one function, `main`, at `opset`, with the specification version that
    /// opset needs.
    pub fn single(opset: Opset, inputs: Vec<Var>, block: Block, description: Description) -> Model {
        let mut program = Program::default();
        program.functions.insert(
            "main".into(),
            Function {
                inputs,
                opset,
                block,
            },
        );
        Model {
            spec_version: opset.spec_version(),
            description,
            program,
        }
    }
}
