//! IR → package: `Model` to `model.mlmodel` + `weight.bin` + `Manifest.json`, written
//! atomically. The output is byte-reproducible: maps encode in key order, item identifiers
//! derive from paths, blobs are appended in program order, and no timestamps are stored.

use super::blob::BlobWriter;
use super::convert::{blob_dtype, value_to_proto, value_type_to_proto, BlobSink};
use super::fsio::write_package_atomically;
use super::manifest::Manifest;
use crate::ir::{
    Arg, ArrayDType, Block, ColorSpace, DictKey, Feature, FeatureKind, Model, Operation, Opset,
    Program, ShapeFlex, Tensor, Value, Var,
};
use crate::proto::{mil, specification as spec};
use anyhow::{anyhow, bail, Context, Result};
use prost::Message;
use std::collections::BTreeMap;
use std::io::{Seek, Write};
use std::path::Path;

/// Relative paths inside a package.
pub const MODEL_PATH: &str = "Data/com.apple.CoreML/model.mlmodel";
pub const WEIGHTS_PATH: &str = "Data/com.apple.CoreML/weights/weight.bin";

struct Sink<'a, W: Write + Seek> {
    w: &'a mut BlobWriter<W>,
    progress: &'a mut dyn FnMut(u64),
}

impl<W: Write + Seek> BlobSink for Sink<'_, W> {
    fn put(&mut self, t: &Tensor) -> Result<u64> {
        let bd =
            blob_dtype(t.dtype).ok_or_else(|| anyhow!("{} cannot be stored in a blob", t.dtype))?;
        let off = if bd.is_sub_byte() {
            self.w
                .append_sub_byte(bd, t.num_elements() as u64, &t.data)?
        } else {
            self.w.append(bd, &t.data)?
        };
        (self.progress)(t.data.len() as u64);
        Ok(off)
    }
}

fn named(v: &Var) -> mil::NamedValueType {
    mil::NamedValueType {
        name: v.name.clone(),
        r#type: Some(value_type_to_proto(&v.ty)),
    }
}

/// Constant values of the block so far, by name (for constexpr parameters written as
/// attributes).
type Consts<'a> = BTreeMap<&'a str, &'a Value>;

/// Whether `op` is a constexpr op of an opset that takes its parameters as attributes: the
/// iOS16/iOS17 versions, as coremltools writes them (its `translate_constexpr`); iOS18's
/// take inputs.
fn params_as_attributes(op: &Operation, opset: Opset) -> bool {
    op.op_type.starts_with("constexpr_") && opset < Opset::Ios18
}

fn op_to_proto(
    op: &Operation,
    opset: Opset,
    consts: &Consts,
    blobs: &mut dyn BlobSink,
) -> Result<mil::Operation> {
    let mut attributes = BTreeMap::new();
    attributes.insert(
        "name".to_string(),
        value_to_proto(&Value::str(&op.name), blobs)?,
    );
    let mut inputs = BTreeMap::new();
    if params_as_attributes(op, opset) {
        for (k, binds) in &op.inputs {
            let v = match binds.as_slice() {
                [Arg::Value(v)] => v,
                [Arg::Var(n)] => consts.get(n.as_str()).copied().ok_or_else(|| {
                    anyhow!(
                        "op {}: {} in {} takes constant parameters; `{k}` reads `{n}`, \
                         which is not a constant",
                        op.name,
                        op.op_type,
                        opset.opset_name()
                    )
                })?,
                _ => bail!(
                    "op {}: parameter `{k}` has {} bindings",
                    op.name,
                    binds.len()
                ),
            };
            attributes.insert(
                k.clone(),
                value_to_proto(v, blobs).with_context(|| format!("op {} `{k}`", op.name))?,
            );
        }
    }
    for (k, binds) in op
        .inputs
        .iter()
        .filter(|_| !params_as_attributes(op, opset))
    {
        let arguments = binds
            .iter()
            .map(|a| {
                Ok(mil::argument::Binding {
                    binding: Some(match a {
                        Arg::Var(n) => mil::argument::binding::Binding::Name(n.clone()),
                        Arg::Value(v) => {
                            mil::argument::binding::Binding::Value(value_to_proto(v, blobs)?)
                        }
                    }),
                })
            })
            .collect::<Result<_>>()?;
        inputs.insert(k.clone(), mil::Argument { arguments });
    }
    for (k, v) in &op.attributes {
        attributes.insert(
            k.clone(),
            value_to_proto(v, blobs).with_context(|| format!("op {} attribute {k}", op.name))?,
        );
    }
    Ok(mil::Operation {
        r#type: op.op_type.clone(),
        inputs,
        outputs: op.outputs.iter().map(named).collect(),
        blocks: op
            .blocks
            .iter()
            .map(|b| block_to_proto(b, opset, blobs))
            .collect::<Result<_>>()?,
        attributes,
    })
}

fn block_to_proto(b: &Block, opset: Opset, blobs: &mut dyn BlobSink) -> Result<mil::Block> {
    let mut consts = Consts::new();
    let mut operations = Vec::with_capacity(b.operations.len());
    for o in &b.operations {
        operations.push(op_to_proto(o, opset, &consts, blobs)?);
        if o.op_type == "const" {
            if let (Some(out), Some(v)) = (o.outputs.first(), o.attributes.get("val")) {
                consts.insert(out.name.as_str(), v);
            }
        }
    }
    Ok(mil::Block {
        inputs: b.inputs.iter().map(named).collect(),
        outputs: b.outputs.clone(),
        operations,
        attributes: Default::default(),
    })
}

pub fn program_to_proto(p: &Program, blobs: &mut dyn BlobSink) -> Result<mil::Program> {
    let mut functions = BTreeMap::new();
    for (name, f) in &p.functions {
        let mut specs = BTreeMap::new();
        specs.insert(
            f.opset.opset_name().to_string(),
            block_to_proto(&f.block, f.opset, blobs)?,
        );
        functions.insert(
            name.clone(),
            mil::Function {
                inputs: f.inputs.iter().map(named).collect(),
                opset: f.opset.opset_name().to_string(),
                block_specializations: specs,
                attributes: Default::default(),
            },
        );
    }
    let mut attributes = BTreeMap::new();
    for (k, v) in &p.attributes {
        attributes.insert(k.clone(), value_to_proto(v, blobs)?);
    }
    Ok(mil::Program {
        version: 1,
        functions,
        doc_string: p.doc.clone(),
        attributes,
    })
}

pub fn array_dtype_code(d: ArrayDType) -> i32 {
    use spec::array_feature_type::ArrayDataType as A;
    (match d {
        ArrayDType::F16 => A::Float16,
        ArrayDType::F32 => A::Float32,
        ArrayDType::F64 => A::Double,
        ArrayDType::I32 => A::Int32,
    }) as i32
}

fn array_type(f: &Feature) -> spec::ArrayFeatureType {
    use spec::array_feature_type as a;
    let shape = |s: &[usize]| s.iter().map(|&d| d as i64).collect::<Vec<_>>();
    let shape_flexibility = match &f.flex {
        ShapeFlex::Fixed => None,
        ShapeFlex::Ranges(r) => Some(a::ShapeFlexibility::ShapeRange(a::ShapeRange {
            size_ranges: r
                .iter()
                .map(|&(lo, hi)| spec::SizeRange {
                    lower_bound: lo as u64,
                    upper_bound: hi.map_or(-1, |h| h as i64),
                })
                .collect(),
        })),
        ShapeFlex::Enumerated(s) => {
            Some(a::ShapeFlexibility::EnumeratedShapes(a::EnumeratedShapes {
                shapes: s.iter().map(|s| a::Shape { shape: shape(s) }).collect(),
            }))
        }
    };
    spec::ArrayFeatureType {
        shape: shape(&f.shape),
        data_type: array_dtype_code(f.dtype),
        shape_flexibility,
        ..Default::default()
    }
}

fn image_type(f: &Feature, c: ColorSpace) -> spec::ImageFeatureType {
    use spec::image_feature_type as i;
    let range = |(lo, hi): (usize, Option<usize>)| spec::SizeRange {
        lower_bound: lo as u64,
        upper_bound: hi.map_or(-1, |h| h as i64),
    };
    let size_flexibility = match &f.flex {
        ShapeFlex::Fixed => None,
        ShapeFlex::Ranges(r) => Some(i::SizeFlexibility::ImageSizeRange(i::ImageSizeRange {
            height_range: r.first().map(|&r| range(r)),
            width_range: r.get(1).map(|&r| range(r)),
        })),
        ShapeFlex::Enumerated(s) => Some(i::SizeFlexibility::EnumeratedSizes(
            i::EnumeratedImageSizes {
                sizes: s
                    .iter()
                    .map(|s| i::ImageSize {
                        height: s[0] as u64,
                        width: s[1] as u64,
                    })
                    .collect(),
            },
        )),
    };
    spec::ImageFeatureType {
        height: f.shape[0] as i64,
        width: f.shape[1] as i64,
        size_flexibility,
        color_space: match c {
            ColorSpace::Grayscale => i::ColorSpace::Grayscale,
            ColorSpace::Rgb => i::ColorSpace::Rgb,
            ColorSpace::Bgr => i::ColorSpace::Bgr,
            ColorSpace::GrayscaleF16 => i::ColorSpace::GrayscaleFloat16,
        } as i32,
    }
}

fn feature(f: &Feature, state: bool) -> spec::FeatureDescription {
    use spec::dictionary_feature_type::KeyType;
    use spec::feature_type::Type;
    let ty = match f.kind {
        _ if state => Type::StateType(spec::StateFeatureType {
            r#type: Some(spec::state_feature_type::Type::ArrayType(array_type(f))),
        }),
        FeatureKind::Array => Type::MultiArrayType(array_type(f)),
        FeatureKind::Image(c) => Type::ImageType(image_type(f, c)),
        FeatureKind::Int64 => Type::Int64Type(spec::Int64FeatureType {}),
        FeatureKind::Double => Type::DoubleType(spec::DoubleFeatureType {}),
        FeatureKind::String => Type::StringType(spec::StringFeatureType {}),
        FeatureKind::Dict(k) => Type::DictionaryType(spec::DictionaryFeatureType {
            key_type: Some(match k {
                DictKey::Int64 => KeyType::Int64KeyType(spec::Int64FeatureType {}),
                DictKey::String => KeyType::StringKeyType(spec::StringFeatureType {}),
            }),
        }),
    };
    spec::FeatureDescription {
        name: f.name.clone(),
        short_description: f.doc.clone(),
        r#type: Some(spec::FeatureType {
            r#type: Some(ty),
            is_optional: false,
        }),
    }
}

/// The `ModelDescription` of `m`: what a package's `model.mlmodel` and a compiled model's
/// `coremldata.bin` hold.
pub fn description_to_proto(m: &Model) -> spec::ModelDescription {
    let d = &m.description;
    // A multifunction model describes each function and leaves the top level empty.
    let multi = !d.functions.is_empty();
    let features = |fs: &[Feature], state: bool| -> Vec<spec::FeatureDescription> {
        if multi {
            vec![]
        } else {
            fs.iter().map(|f| feature(f, state)).collect()
        }
    };
    spec::ModelDescription {
        input: features(&d.inputs, false),
        output: features(&d.outputs, false),
        state: features(&d.states, true),
        functions: d
            .functions
            .iter()
            .map(|(name, io)| spec::FunctionDescription {
                name: name.clone(),
                input: io.inputs.iter().map(|f| feature(f, false)).collect(),
                output: io.outputs.iter().map(|f| feature(f, false)).collect(),
                state: io.states.iter().map(|f| feature(f, true)).collect(),
                ..Default::default()
            })
            .collect(),
        default_function_name: d.default_function.clone(),
        metadata: Some(spec::Metadata {
            short_description: d.short_description.clone(),
            version_string: d.version.clone(),
            author: d.author.clone(),
            license: String::new(),
            user_defined: d.user_defined.clone(),
        }),
        predicted_feature_name: d.predicted_feature.clone(),
        predicted_probabilities_name: d.predicted_probabilities.clone(),
        ..Default::default()
    }
}

/// Builds the top-level message; blob-bound tensors go through `blobs`.
pub fn model_to_proto(m: &Model, blobs: &mut dyn BlobSink) -> Result<spec::Model> {
    Ok(spec::Model {
        specification_version: m.spec_version,
        description: Some(description_to_proto(m)),
        is_updatable: false,
        r#type: Some(spec::model::Type::MlProgram(program_to_proto(
            &m.program, blobs,
        )?)),
    })
}

/// What was written.
#[derive(Clone, Debug)]
pub struct SaveSummary {
    pub model_bytes: u64,
    pub weight_bytes: u64,
    pub blobs: u32,
}

/// Writes the package contents into an existing empty directory.
pub fn write_package_dir(
    m: &Model,
    dir: &Path,
    progress: &mut dyn FnMut(u64),
) -> Result<SaveSummary> {
    let wdir = dir.join("Data/com.apple.CoreML/weights");
    std::fs::create_dir_all(&wdir).with_context(|| format!("cannot create {}", wdir.display()))?;
    let mut bw = BlobWriter::create(&dir.join(WEIGHTS_PATH))?;
    let proto = model_to_proto(
        m,
        &mut Sink {
            w: &mut bw,
            progress,
        },
    )?;
    let blobs = bw.count();
    let (_, weight_bytes) = bw.finish()?;
    let bytes = proto.encode_to_vec();
    let mp = dir.join(MODEL_PATH);
    std::fs::write(&mp, &bytes).with_context(|| format!("cannot write {}", mp.display()))?;
    Manifest::mlprogram(true).write(dir)?;
    Ok(SaveSummary {
        model_bytes: bytes.len() as u64,
        weight_bytes,
        blobs,
    })
}

/// Creates the directory `dir` (which must not exist) and writes the package into it; for
/// packages inside a directory that is itself written atomically.
pub fn write_package_dir_new(m: &Model, dir: &Path) -> Result<SaveSummary> {
    std::fs::create_dir(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    write_package_dir(m, dir, &mut |_| {})
}

/// Writes `m` as an `.mlpackage` at `target`, atomically; refuses to replace an existing
/// target unless `force`.
pub fn save_package(
    m: &Model,
    target: &Path,
    force: bool,
    progress: &mut dyn FnMut(u64),
) -> Result<SaveSummary> {
    let mut summary = None;
    write_package_atomically(target, force, |dir| {
        summary = Some(write_package_dir(m, dir, progress)?);
        Ok(())
    })?;
    summary.ok_or_else(|| anyhow!("package writer produced nothing"))
}
