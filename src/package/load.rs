//! Package → IR, trusting nothing: the manifest must keep paths inside the package, blob
//! references must be in range with valid records, every op must exist in the function's
//! opset, every input must be defined before use, and every op's output types are inferred
//! again from its definition and must equal the types the file declares. Nested blocks
//! (`cond`, `while_loop`) see the enclosing scope; what they define ends with them.

use super::blob::{BlobDType, BlobReader};
use super::convert::{value_from_proto, value_type_from_proto, BlobSource};
use super::manifest::read_package;
use crate::ir::{
    Arg, ArrayDType, Block, ColorSpace, Description, DictKey, Dim, Feature, FeatureKind, Function,
    FunctionIo, Model, Operation, Opset, Program, ShapeFlex, TensorType, Value, ValueType, Var,
};
use crate::ops::builder::infer_op;
use crate::proto::{mil, specification as spec};
use anyhow::{anyhow, bail, ensure, Context, Result};
use prost::Message;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

struct Blobs(Option<BlobReader>, PathBuf);

impl BlobSource for Blobs {
    fn get(&self, offset: u64) -> Result<(BlobDType, crate::ir::Bytes)> {
        match &self.0 {
            Some(r) => r.read(offset),
            None => bail!(
                "the program references a weight blob but {} does not exist",
                self.1.display()
            ),
        }
    }
}

type Scope = HashMap<String, (ValueType, Option<Value>)>;

fn var(n: &mil::NamedValueType) -> Result<Var> {
    Ok(Var {
        name: n.name.clone(),
        ty: value_type_from_proto(
            n.r#type
                .as_ref()
                .ok_or_else(|| anyhow!("`{}` has no type", n.name))?,
        )?,
    })
}

fn load_op(
    p: &mil::Operation,
    opset: Opset,
    scope: &mut Scope,
    blobs: &dyn BlobSource,
) -> Result<Operation> {
    let mut name = String::new();
    let mut attributes = BTreeMap::new();
    for (k, v) in &p.attributes {
        let val = value_from_proto(v, blobs)
            .with_context(|| format!("`{}` op attribute `{k}`", p.r#type))?;
        if k == "name" {
            name = val
                .as_str()
                .ok_or_else(|| anyhow!("op name is not a string"))?
                .to_string();
        } else {
            attributes.insert(k.clone(), val);
        }
    }
    let label = if name.is_empty() {
        p.outputs
            .first()
            .map(|o| o.name.clone())
            .unwrap_or_default()
    } else {
        name.clone()
    };
    let ctx = || format!("op `{label}` ({})", p.r#type);
    let mut inputs = BTreeMap::new();
    // The iOS16/iOS17 constexpr ops carry their parameters as attributes (coremltools'
    // `translate_constexpr`); the IR holds them as constant inputs, as iOS18's are.
    if p.r#type.starts_with("constexpr_") {
        for (k, v) in std::mem::take(&mut attributes) {
            inputs.insert(k, vec![Arg::Value(v)]);
        }
    }
    for (k, a) in &p.inputs {
        let binds = a
            .arguments
            .iter()
            .map(|b| {
                Ok(
                    match b
                        .binding
                        .as_ref()
                        .ok_or_else(|| anyhow!("input `{k}` has an empty binding"))?
                    {
                        mil::argument::binding::Binding::Name(n) => Arg::Var(n.clone()),
                        mil::argument::binding::Binding::Value(v) => {
                            Arg::Value(value_from_proto(v, blobs)?)
                        }
                    },
                )
            })
            .collect::<Result<Vec<_>>>()
            .with_context(ctx)?;
        inputs.insert(k.clone(), binds);
    }
    let outputs = p
        .outputs
        .iter()
        .map(var)
        .collect::<Result<Vec<_>>>()
        .with_context(ctx)?;
    // Nested blocks (cond, while_loop): each sees the outer scope plus its own inputs and
    // values, which end with it.
    let blocks = p
        .blocks
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let mut inner = scope.clone();
            load_block(b, opset, &mut inner, blobs).with_context(|| format!("block {i}"))
        })
        .collect::<Result<Vec<_>>>()
        .with_context(ctx)?;
    let op = Operation {
        op_type: p.r#type.clone(),
        name,
        inputs,
        outputs,
        blocks,
        attributes,
    };
    let inferred = infer_op(&op, opset, scope).with_context(ctx)?;
    ensure!(
        inferred.len() == op.outputs.len(),
        "{}: declares {} outputs, its definition has {}",
        ctx(),
        op.outputs.len(),
        inferred.len()
    );
    for (o, t) in op.outputs.iter().zip(&inferred) {
        ensure!(
            agrees(&o.ty, t),
            "{}: output `{}` is declared {} but infers to {t}",
            ctx(),
            o.name,
            o.ty
        );
        ensure!(
            !scope.contains_key(&o.name),
            "{}: redefines `{}`",
            ctx(),
            o.name
        );
    }
    let cval = op.const_val().cloned();
    for o in &op.outputs {
        scope.insert(o.name.clone(), (o.ty.clone(), cval.clone()));
    }
    Ok(op)
}

/// Whether a declared output type and the type milkit infers for it say the same thing:
/// equal, or tensors of one dtype and rank whose sizes differ only where one side does not
/// know the size (`?`). Core ML's converters often know more than a re-inference from the
/// op's inputs alone (`[1, ?, ?]` where milkit infers `[?, ?, ?]`), or less; the declared
/// type stands, and only a real contradiction refuses the package.
pub(crate) fn agrees(declared: &ValueType, inferred: &ValueType) -> bool {
    match (declared, inferred) {
        (ValueType::Tensor(d), ValueType::Tensor(i)) => {
            d.dtype == i.dtype
                && d.shape.len() == i.shape.len()
                && d.shape
                    .iter()
                    .zip(&i.shape)
                    .all(|(a, b)| a == b || matches!(a, Dim::Unknown) || matches!(b, Dim::Unknown))
        }
        _ => declared == inferred,
    }
}

fn load_block(
    p: &mil::Block,
    opset: Opset,
    scope: &mut Scope,
    blobs: &dyn BlobSource,
) -> Result<Block> {
    let inputs = p.inputs.iter().map(var).collect::<Result<Vec<_>>>()?;
    for v in &inputs {
        ensure!(
            !scope.contains_key(&v.name),
            "block input `{}` redefines a visible name",
            v.name
        );
        scope.insert(v.name.clone(), (v.ty.clone(), None));
    }
    let operations = p
        .operations
        .iter()
        .map(|o| load_op(o, opset, scope, blobs))
        .collect::<Result<Vec<_>>>()?;
    for o in &p.outputs {
        ensure!(scope.contains_key(o), "block output `{o}` is never defined");
    }
    Ok(Block {
        inputs,
        operations,
        outputs: p.outputs.clone(),
    })
}

/// Converts a program message; the opset of each function must be a known one and at most
/// `max_opset` (the package's specification version).
pub fn program_from_proto(
    p: &mil::Program,
    max_opset: Opset,
    blobs: &dyn BlobSource,
) -> Result<Program> {
    let mut functions = BTreeMap::new();
    for (fname, f) in &p.functions {
        let ctx = || format!("function `{fname}`");
        let opset = Opset::from_opset_name(&f.opset)
            .ok_or_else(|| anyhow!("{}: unknown opset `{}`", ctx(), f.opset))?;
        ensure!(
            opset <= max_opset,
            "{}: opset {} needs specification version {}, the package declares {}",
            ctx(),
            f.opset,
            opset.spec_version(),
            max_opset.spec_version()
        );
        let block = f
            .block_specializations
            .get(&f.opset)
            .ok_or_else(|| anyhow!("{}: no block for its opset {}", ctx(), f.opset))?;
        let inputs = f
            .inputs
            .iter()
            .map(var)
            .collect::<Result<Vec<_>>>()
            .with_context(ctx)?;
        let mut scope: Scope = inputs
            .iter()
            .map(|v| (v.name.clone(), (v.ty.clone(), None)))
            .collect();
        let block = load_block(block, opset, &mut scope, blobs).with_context(ctx)?;
        functions.insert(
            fname.clone(),
            Function {
                inputs,
                opset,
                block,
            },
        );
    }
    let mut attributes = BTreeMap::new();
    for (k, v) in &p.attributes {
        attributes.insert(k.clone(), value_from_proto(v, blobs)?);
    }
    Ok(Program {
        functions,
        attributes,
        doc: p.doc_string.clone(),
    })
}

fn array_dtype(code: i32) -> Result<ArrayDType> {
    use spec::array_feature_type::ArrayDataType as A;
    Ok(match A::try_from(code) {
        Ok(A::Float16) => ArrayDType::F16,
        Ok(A::Float32) => ArrayDType::F32,
        Ok(A::Double) => ArrayDType::F64,
        Ok(A::Int32) => ArrayDType::I32,
        _ => bail!("unsupported multi-array data type code {code}"),
    })
}

fn feature(f: &spec::FeatureDescription) -> Result<(Feature, bool)> {
    use spec::feature_type::Type;
    let ty = f
        .r#type
        .as_ref()
        .and_then(|t| t.r#type.as_ref())
        .ok_or_else(|| anyhow!("feature `{}` has no type", f.name))?;
    let other = |kind| {
        let mut fe = Feature::of_kind(&f.name, kind);
        fe.doc = f.short_description.clone();
        Ok((fe, false))
    };
    let (a, state) = match ty {
        Type::MultiArrayType(a) => (a.clone(), false),
        Type::StateType(s) => match &s.r#type {
            Some(spec::state_feature_type::Type::ArrayType(a)) => (a.clone(), true),
            None => bail!("state `{}` has no array type", f.name),
        },
        Type::ImageType(im) => return image_feature(f, im),
        Type::Int64Type(_) => return other(FeatureKind::Int64),
        Type::DoubleType(_) => return other(FeatureKind::Double),
        Type::StringType(_) => return other(FeatureKind::String),
        Type::DictionaryType(d) => {
            use spec::dictionary_feature_type::KeyType;
            return other(FeatureKind::Dict(match d.key_type {
                Some(KeyType::Int64KeyType(_)) => DictKey::Int64,
                Some(KeyType::StringKeyType(_)) => DictKey::String,
                None => bail!("dictionary feature `{}` has no key type", f.name),
            }));
        }
    };
    let shape = a
        .shape
        .iter()
        .map(|&d| {
            usize::try_from(d).map_err(|_| anyhow!("feature `{}` has a negative dimension", f.name))
        })
        .collect::<Result<Vec<_>>>()?;
    let flex = shape_flex(&a, &shape).with_context(|| format!("feature `{}`", f.name))?;
    Ok((
        Feature {
            name: f.name.clone(),
            dtype: array_dtype(a.data_type).with_context(|| format!("feature `{}`", f.name))?,
            shape,
            flex,
            doc: f.short_description.clone(),
            kind: FeatureKind::Array,
        },
        state,
    ))
}

/// An image feature: `[height, width]`, its size flexibility over those two, its colours.
fn image_feature(
    f: &spec::FeatureDescription,
    im: &spec::ImageFeatureType,
) -> Result<(Feature, bool)> {
    use spec::image_feature_type::{ColorSpace as C, SizeFlexibility as S};
    let size = |d: i64, what: &str| {
        usize::try_from(d).map_err(|_| anyhow!("image feature `{}` has {what} {d}", f.name))
    };
    let color = match C::try_from(im.color_space) {
        Ok(C::Grayscale) => ColorSpace::Grayscale,
        Ok(C::Rgb) => ColorSpace::Rgb,
        Ok(C::Bgr) => ColorSpace::Bgr,
        Ok(C::GrayscaleFloat16) => ColorSpace::GrayscaleF16,
        _ => bail!(
            "image feature `{}` has an unknown colour space {}",
            f.name,
            im.color_space
        ),
    };
    let range = |r: Option<spec::SizeRange>| -> Result<(usize, Option<usize>)> {
        let r = r.unwrap_or_default();
        let lo = usize::try_from(r.lower_bound)
            .map_err(|_| anyhow!("image feature `{}`: lower bound too large", f.name))?;
        let hi = match r.upper_bound {
            -1 => None,
            u => Some(size(u, "an upper bound")?),
        };
        Ok((lo, hi))
    };
    let flex = match &im.size_flexibility {
        None => ShapeFlex::Fixed,
        Some(S::ImageSizeRange(r)) => {
            ShapeFlex::Ranges(vec![range(r.height_range)?, range(r.width_range)?])
        }
        Some(S::EnumeratedSizes(e)) => ShapeFlex::Enumerated(
            e.sizes
                .iter()
                .map(|s| vec![s.height as usize, s.width as usize])
                .collect(),
        ),
    };
    let fe = Feature {
        flex,
        doc: f.short_description.clone(),
        kind: FeatureKind::Image(color),
        ..Feature::new(
            &f.name,
            ArrayDType::F32,
            &[size(im.height, "height")?, size(im.width, "width")?],
        )
    };
    Ok((fe, false))
}

/// A multi-array's shape flexibility: per-dimension ranges (upper bound −1: unbounded) or
/// a list of shapes, each of the default shape's rank.
fn shape_flex(a: &spec::ArrayFeatureType, default: &[usize]) -> Result<ShapeFlex> {
    use spec::array_feature_type::ShapeFlexibility as F;
    let size = |d: i64| usize::try_from(d).map_err(|_| anyhow!("negative size {d}"));
    Ok(match &a.shape_flexibility {
        None => ShapeFlex::Fixed,
        Some(F::ShapeRange(r)) => {
            ensure!(
                r.size_ranges.len() == default.len(),
                "a shape range of {} dimensions for a default shape of {}",
                r.size_ranges.len(),
                default.len()
            );
            let ranges = r
                .size_ranges
                .iter()
                .map(|s| {
                    let lo = usize::try_from(s.lower_bound)
                        .map_err(|_| anyhow!("lower bound {} is too large", s.lower_bound))?;
                    let hi = match s.upper_bound {
                        -1 => None,
                        u => Some(size(u)?),
                    };
                    ensure!(
                        hi.is_none_or(|hi| hi >= lo),
                        "size range {lo}..={} is empty",
                        s.upper_bound
                    );
                    Ok((lo, hi))
                })
                .collect::<Result<Vec<_>>>()?;
            ShapeFlex::Ranges(ranges)
        }
        Some(F::EnumeratedShapes(e)) => {
            let shapes = e
                .shapes
                .iter()
                .map(|s| {
                    ensure!(
                        s.shape.len() == default.len(),
                        "an enumerated shape of rank {} for a default shape of rank {}",
                        s.shape.len(),
                        default.len()
                    );
                    s.shape.iter().map(|&d| size(d)).collect()
                })
                .collect::<Result<Vec<_>>>()?;
            ShapeFlex::Enumerated(shapes)
        }
    })
}

/// Whether a program input's declared type is one the described feature fits: the same
/// dtype and rank, and every dimension the program fixes fixed to the size the feature
/// always has (a `?` dimension accepts anything; Core ML's converters write `?` wherever the
/// description lets a size vary, and sometimes where it does not).
/// An image feature's program input is the `[1, C, H, W]` tensor its pixels become (or
/// `[C, H, W]`), in any float type.
pub(crate) fn fits(program: &TensorType, fe: &Feature) -> bool {
    let dims_fit = |want: &[Dim]| {
        program.shape.len() == want.len()
            && program
                .shape
                .iter()
                .zip(want)
                .all(|(p, w)| matches!(p, Dim::Unknown) || p == w)
    };
    match fe.kind {
        FeatureKind::Image(_) => {
            let ValueType::Tensor(want) = fe.value_type() else {
                return false;
            };
            program.dtype.is_float() && (dims_fit(&want.shape) || dims_fit(&want.shape[1..]))
        }
        _ => {
            let want = fe.flexible_type();
            program.dtype == want.dtype && dims_fit(&want.shape)
        }
    }
}

/// Reads and checks a whole `.mlpackage`, or a single-file `.mlmodel` (an ML Program whose
/// weights are all inline).
pub fn load_package(path: &Path) -> Result<Model> {
    ensure!(path.exists(), "{}: no such file or folder", path.display());
    if path.is_file() {
        let bytes =
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        let m = spec::Model::decode(bytes.as_slice())
            .with_context(|| format!("{}: not a Core ML model specification", path.display()))?;
        let blobs = Blobs(None, path.with_file_name("weights").join("weight.bin"));
        return model_from_proto(&m, &blobs).with_context(|| format!("{}", path.display()));
    }
    let layout = read_package(path)?;
    let bytes = std::fs::read(&layout.model)
        .with_context(|| format!("cannot read {}", layout.model.display()))?;
    let m = spec::Model::decode(bytes.as_slice()).with_context(|| {
        format!(
            "{}: not a Core ML model specification",
            layout.model.display()
        )
    })?;
    let weights = layout.weights_dir.as_ref().map(|d| d.join("weight.bin"));
    let reader = match &weights {
        Some(w) if w.exists() => Some(BlobReader::open(w)?),
        _ => None,
    };
    let blobs = Blobs(
        reader,
        weights.unwrap_or_else(|| path.join("Data/com.apple.CoreML/weights/weight.bin")),
    );
    model_from_proto(&m, &blobs).with_context(|| format!("{}", layout.model.display()))
}

pub fn model_from_proto(m: &spec::Model, blobs: &dyn BlobSource) -> Result<Model> {
    let kind = m
        .r#type
        .as_ref()
        .ok_or_else(|| anyhow!("the model specification names no model type"))?;
    if let Some(net) = super::neural_network::Network::of(kind) {
        let net = net?;
        let d = m
            .description
            .as_ref()
            .ok_or_else(|| anyhow!("model has no description"))?;
        let mut description = description_from_proto(d)?;
        let program =
            super::neural_network::translate(&net, &mut description).with_context(|| {
                format!("{} (translated into an ML Program)", model_type_name(kind))
            })?;
        let f = program
            .main()
            .ok_or_else(|| anyhow!("the program has no functions"))?;
        check_abi(
            &description.inputs,
            &description.outputs,
            &description.states,
            f,
        )?;
        return Ok(Model {
            spec_version: super::neural_network::OPSET.spec_version(),
            description,
            program,
        });
    }
    let spec::model::Type::MlProgram(p) = kind else {
        bail!(
            "the model is a {}, which milkit does not run: {}",
            model_type_name(kind),
            refusal(kind)
        )
    };
    let opset = Opset::from_spec_version(m.specification_version).ok_or_else(|| {
        anyhow!(
            "specification version {} is not an ML program version milkit reads (6..9)",
            m.specification_version
        )
    })?;
    let program = program_from_proto(p, opset, blobs)?;
    let d = m
        .description
        .as_ref()
        .ok_or_else(|| anyhow!("model has no description"))?;
    let description = description_from_proto(d)?;
    if description.functions.is_empty() {
        let f = program
            .main()
            .ok_or_else(|| anyhow!("the program has no functions"))?;
        check_abi(
            &description.inputs,
            &description.outputs,
            &description.states,
            f,
        )?;
    }
    for (name, io) in &description.functions {
        let f = program
            .functions
            .get(name)
            .ok_or_else(|| anyhow!("the description's function `{name}` is not in the program"))?;
        check_abi(&io.inputs, &io.outputs, &io.states, f)
            .with_context(|| format!("function `{name}`"))?;
    }
    Ok(Model {
        spec_version: m.specification_version,
        description,
        program,
    })
}

/// A `ModelDescription` (a package's, or the copy in a compiled model's `coremldata.bin`)
/// as the IR's, checked on its own, not against a program: inputs are arrays or images, a
/// multifunction description (iOS18) lists each function once, none at the top level, and
/// names its default among them; the predicted feature names are outputs.
pub(crate) fn description_from_proto(d: &spec::ModelDescription) -> Result<Description> {
    let mut description = Description::default();
    let (inputs, outputs, states) = function_io(&d.input, &d.output, &d.state)?;
    (description.inputs, description.outputs, description.states) = (inputs, outputs, states);
    description.predicted_feature = d.predicted_feature_name.clone();
    description.predicted_probabilities = d.predicted_probabilities_name.clone();
    if let Some(md) = &d.metadata {
        description.short_description = md.short_description.clone();
        description.version = md.version_string.clone();
        description.author = md.author.clone();
        description.user_defined = md.user_defined.clone();
    }
    if !d.functions.is_empty() {
        ensure!(
            description.inputs.is_empty() && description.outputs.is_empty(),
            "the description lists both functions and top-level inputs/outputs"
        );
        for fd in &d.functions {
            let (inputs, outputs, states) = function_io(&fd.input, &fd.output, &fd.state)
                .with_context(|| format!("function `{}`", fd.name))?;
            let io = FunctionIo {
                inputs,
                outputs,
                states,
            };
            ensure!(
                description.functions.insert(fd.name.clone(), io).is_none(),
                "the description lists function `{}` twice",
                fd.name
            );
        }
        let default = &d.default_function_name;
        let io = description.functions.get(default).ok_or_else(|| {
            anyhow!("the default function `{default}` is not one the description lists")
        })?;
        (description.inputs, description.outputs, description.states) =
            (io.inputs.clone(), io.outputs.clone(), io.states.clone());
        description.default_function = default.clone();
    }
    for (what, name) in [
        ("predictedFeatureName", &description.predicted_feature),
        (
            "predictedProbabilitiesName",
            &description.predicted_probabilities,
        ),
    ] {
        ensure!(
            name.is_empty() || description.outputs.iter().any(|o| o.name == *name),
            "{what} `{name}` is not an output of the description"
        );
    }
    Ok(description)
}

/// A description's (or one function's) inputs, outputs and states; inputs must be arrays.
type Io = (Vec<Feature>, Vec<Feature>, Vec<Feature>);

fn function_io(
    input: &[spec::FeatureDescription],
    output: &[spec::FeatureDescription],
    state: &[spec::FeatureDescription],
) -> Result<Io> {
    let mut inputs = vec![];
    for f in input {
        let fe = feature(f)?.0;
        ensure!(
            matches!(fe.kind, FeatureKind::Array | FeatureKind::Image(_)),
            "input `{}` is a {}; milkit feeds only multi-array and image inputs",
            fe.name,
            fe.type_name()
        );
        inputs.push(fe);
    }
    let outputs = output
        .iter()
        .map(|f| feature(f).map(|x| x.0))
        .collect::<Result<_>>()?;
    let states = state
        .iter()
        .map(|f| feature(f).map(|x| x.0))
        .collect::<Result<_>>()?;
    Ok((inputs, outputs, states))
}

/// A function's described inputs/outputs must be the function's, with equal types.
pub(crate) fn check_abi(
    inputs: &[Feature],
    outputs: &[Feature],
    states: &[Feature],
    f: &Function,
) -> Result<()> {
    for fe in inputs {
        let v =
            f.inputs.iter().find(|v| v.name == fe.name).ok_or_else(|| {
                anyhow!("description input `{}` is not a function input", fe.name)
            })?;
        ensure!(
            matches!(&v.ty, ValueType::Tensor(t) if fits(t, fe)),
            "input `{}`: description says {}{}, program says {}",
            fe.name,
            match fe.kind {
                FeatureKind::Image(_) => fe.value_type().to_string(),
                _ => fe.tensor_type().to_string(),
            },
            match fe.flex {
                ShapeFlex::Fixed => String::new(),
                ref f => format!(" (accepting {f})"),
            },
            v.ty
        );
    }
    for fe in states {
        let v =
            f.inputs.iter().find(|v| v.name == fe.name).ok_or_else(|| {
                anyhow!("description state `{}` is not a function input", fe.name)
            })?;
        ensure!(
            v.ty == ValueType::State(fe.tensor_type()),
            "state `{}`: description says {}, program says {}",
            fe.name,
            fe.tensor_type(),
            v.ty
        );
    }
    ensure!(
        inputs.len() + states.len() == f.inputs.len(),
        "description lists {} inputs and states, the function takes {}",
        inputs.len() + states.len(),
        f.inputs.len()
    );
    ensure!(
        outputs.len() == f.block.outputs.len(),
        "description lists {} outputs, the function's block has {}",
        outputs.len(),
        f.block.outputs.len()
    );
    for (fe, o) in outputs.iter().zip(&f.block.outputs) {
        ensure!(
            fe.name == *o,
            "output `{}` of the description is `{o}` in the program",
            fe.name
        );
        // A classifier's label and dictionary must be what the program returns (arrays
        // are converted at the boundary, so only their names are checked).
        if fe.kind != FeatureKind::Array {
            let ty = f
                .block
                .walk()
                .iter()
                .flat_map(|op| &op.outputs)
                .chain(&f.inputs)
                .find(|v| v.name == *o)
                .map(|v| &v.ty);
            ensure!(
                ty == Some(&fe.value_type()),
                "output `{}`: description says {}, program says {}",
                fe.name,
                fe.value_type(),
                ty.map(|t| t.to_string())
                    .unwrap_or_else(|| "nothing".into())
            );
        }
    }
    Ok(())
}

/// A model type as Core ML's documentation names it.
pub fn model_type_name(t: &spec::model::Type) -> &'static str {
    use spec::model::Type as T;
    match t {
        T::PipelineClassifier(_) => "pipeline classifier",
        T::PipelineRegressor(_) => "pipeline regressor",
        T::Pipeline(_) => "pipeline",
        T::GlmRegressor(_) => "GLM regressor",
        T::SupportVectorRegressor(_) => "support vector regressor",
        T::TreeEnsembleRegressor(_) => "tree ensemble regressor",
        T::NeuralNetworkRegressor(_) => "NeuralNetwork regressor",
        T::BayesianProbitRegressor(_) => "Bayesian probit regressor",
        T::GlmClassifier(_) => "GLM classifier",
        T::SupportVectorClassifier(_) => "support vector classifier",
        T::TreeEnsembleClassifier(_) => "tree ensemble classifier",
        T::NeuralNetworkClassifier(_) => "NeuralNetwork classifier",
        T::KNearestNeighborsClassifier(_) => "k-nearest-neighbours classifier",
        T::NeuralNetwork(_) => "NeuralNetwork",
        T::ItemSimilarityRecommender(_) => "item similarity recommender",
        T::MlProgram(_) => "ML Program",
        T::CustomModel(_) => "custom model",
        T::LinkedModel(_) => "linked model",
        T::ClassConfidenceThresholding(_) => "class confidence thresholding model",
        T::OneHotEncoder(_) => "one-hot encoder",
        T::Imputer(_) => "imputer",
        T::FeatureVectorizer(_) => "feature vectorizer",
        T::DictVectorizer(_) => "dictionary vectorizer",
        T::Scaler(_) => "scaler",
        T::CategoricalMapping(_) => "categorical mapping",
        T::Normalizer(_) => "normalizer",
        T::ArrayFeatureExtractor(_) => "array feature extractor",
        T::NonMaximumSuppression(_) => "non-maximum suppression model",
        T::Identity(_) => "identity model",
        T::TextClassifier(_) => "text classifier (Create ML)",
        T::WordTagger(_) => "word tagger (Create ML)",
        T::VisionFeaturePrint(_) => "Vision feature print",
        T::SoundAnalysisPreprocessing(_) => "sound analysis preprocessing",
        T::Gazetteer(_) => "gazetteer (Create ML)",
        T::WordEmbedding(_) => "word embedding (Create ML)",
        T::AudioFeaturePrint(_) => "audio feature print",
        T::SerializedModel(_) => "serialized model",
    }
}

/// Why a model type other than an ML Program or a NeuralNetwork does not run.
fn refusal(t: &spec::model::Type) -> &'static str {
    use spec::model::Type as T;
    match t {
        T::TextClassifier(_)
        | T::WordTagger(_)
        | T::VisionFeaturePrint(_)
        | T::SoundAnalysisPreprocessing(_)
        | T::Gazetteer(_)
        | T::WordEmbedding(_)
        | T::AudioFeaturePrint(_) => {
            "it is computed by Apple's private frameworks (Natural Language, Vision, Sound \
             Analysis), whose models and code are not public"
        }
        T::CustomModel(_) => "its computation is the app's own code, which the file does not hold",
        T::SerializedModel(_) => "it holds a model in a format Core ML itself does not document",
        T::LinkedModel(_) => "it refers to another model file by name; open that file instead",
        _ => "pipelines and classical (scikit-learn, XGBoost, LibSVM) models are not run yet",
    }
}
