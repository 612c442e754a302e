//! Compiled models (`.mlmodelc` folders, what `coremlc` and Xcode write and apps ship):
//! `model.mil` (the program as text, read by [`super::mil_text`]), `weights/weight.bin`
//! (the package blob format), `metadata.json` (I/O schemas, op histogram, metadata) and
//! `coremldata.bin` (the `ModelDescription`, read by [`super::coremldata`]). The I/O
//! description comes from `coremldata.bin` (shape ranges, enumerated and default shapes,
//! state types, the function list), then `metadata.json`, then the function attribute
//! `FlexibleShapeInformation` and the program; where a file disagrees with the program, the
//! program wins and [`Compiled::notes`] says so. A `coremldata.bin` milkit cannot read is a
//! warning ([`Compiled::warnings`]), not an error.
//!
//! A model whose `weight.bin` is missing or a Git LFS pointer still opens (its blob
//! constants read as zeros) for inspection and verification; [`load_compiled`] refuses it.

use super::blob::BlobReader;
use super::coremldata::read_coremldata;
use super::fsio::LFS_POINTER;
use super::load::{check_abi, description_from_proto, fits};
use super::mil_text::{parse_program, ParsedProgram, Weights};
use crate::ir::{
    ArrayDType, Description, Dim, Feature, FeatureKind, Function, FunctionIo, Model, Opset,
    ShapeFlex, TensorType, Value, ValueType,
};
use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value as Json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// An opened compiled model.
pub struct Compiled {
    pub model: Model,
    /// Why the weights the program references cannot be read (their constants are then
    /// zeros); `None` when they were read or the program references none.
    pub weights_absent: Option<String>,
    /// Where `coremldata.bin` or `metadata.json` and the program disagree, and what was
    /// used.
    pub notes: Vec<String>,
    /// What could not be read (a damaged `coremldata.bin`), and what was used instead.
    pub warnings: Vec<String>,
    /// The printer dialect of `model.mil`: `1.0` or `1.3`.
    pub dialect: String,
    /// `model.mil` and `weights/weight.bin` of the folder.
    pub program_file: PathBuf,
    pub weights_file: PathBuf,
}

/// Whether `path` is a compiled model folder (it holds a `model.mil`).
pub fn is_compiled(path: &Path) -> bool {
    path.is_dir() && path.join("model.mil").is_file() && !path.join("Manifest.json").exists()
}

/// Opens a compiled model for running: like [`open_compiled`], but refuses a model whose
/// weights are absent.
pub fn load_compiled(path: &Path) -> Result<Model> {
    let c = open_compiled(path)?;
    if let Some(why) = c.weights_absent {
        bail!(
            "{}: cannot run or convert this model: its weights are absent ({why})",
            path.display()
        );
    }
    Ok(c.model)
}

/// The weight file of a compiled folder, or why it cannot be read.
fn weights(path: &Path) -> Result<Weights> {
    let file = path.join("weights").join("weight.bin");
    if !file.exists() {
        return Ok(Weights::Absent(format!(
            "{} does not exist",
            file.display()
        )));
    }
    let mut head = vec![0u8; LFS_POINTER.len()];
    let n = {
        use std::io::Read;
        let mut f = std::fs::File::open(&file)
            .with_context(|| format!("cannot open {}", file.display()))?;
        f.read(&mut head)
            .with_context(|| format!("cannot read {}", file.display()))?
    };
    if n == LFS_POINTER.len() && head == LFS_POINTER {
        return Ok(Weights::Absent(format!(
            "{} is a Git LFS pointer, not the weights (fetch them with `git lfs pull`)",
            file.display()
        )));
    }
    Ok(Weights::File(BlobReader::open(&file)?))
}

/// Opens and checks a compiled model folder.
pub fn open_compiled(path: &Path) -> Result<Compiled> {
    let program_file = path.join("model.mil");
    let text = std::fs::read_to_string(&program_file)
        .with_context(|| format!("cannot read {}", program_file.display()))?;
    let meta_file = path.join("metadata.json");
    let meta = match std::fs::read_to_string(&meta_file) {
        Ok(s) => {
            let j: Json = serde_json::from_str(&s)
                .with_context(|| format!("{}: not JSON", meta_file.display()))?;
            Some(match j {
                Json::Array(mut a) if !a.is_empty() => a.swap_remove(0),
                o @ Json::Object(_) => o,
                _ => bail!("{}: expected an array of one object", meta_file.display()),
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", meta_file.display())),
    };
    // coremldata.bin is secondary: one milkit cannot read leaves a warning, not an error.
    let mut warnings = vec![];
    let data = match read_coremldata(path) {
        Ok(Some(c)) => match description_from_proto(&c.description) {
            Ok(d) => Some((c.spec_version, d)),
            Err(e) => {
                warnings.push(format!(
                    "{}: its ModelDescription is not one milkit reads ({e:#}); the description \
                     comes from metadata.json and the program",
                    path.join("coremldata.bin").display()
                ));
                None
            }
        },
        Ok(None) => None,
        Err(e) => {
            warnings.push(format!(
                "{e:#}; the description comes from metadata.json and the program"
            ));
            None
        }
    };
    let spec_version = meta
        .as_ref()
        .and_then(|m| m.get("specificationVersion"))
        .and_then(|v| v.as_i64())
        .or_else(|| data.as_ref().and_then(|(v, _)| i64::try_from(*v).ok()))
        .and_then(|v| i32::try_from(v).ok());
    let max_opset = spec_version
        .map(|v| {
            // A later specification version than milkit knows still allows every opset.
            Opset::ALL
                .into_iter()
                .rev()
                .find(|o| o.spec_version() <= v)
                .ok_or_else(|| {
                    anyhow!(
                        "{}: specification version {v} is below 6 (iOS15), not an ML program",
                        meta_file.display()
                    )
                })
        })
        .transpose()?;
    let weights_file = path.join("weights").join("weight.bin");
    let w = weights(path)?;
    let parsed = parse_program(&text, &program_file.display().to_string(), &w, max_opset)?;
    let weights_absent = match (&w, parsed.references_blobs) {
        (Weights::Absent(why), true) => Some(why.clone()),
        _ => None,
    };
    let mut notes = vec![];
    if meta.is_none() {
        notes.push(format!(
            "{} does not exist: the I/O description comes from {}the program",
            meta_file.display(),
            if data.is_some() {
                "coremldata.bin and "
            } else {
                ""
            }
        ));
    }
    let description = describe(
        &parsed,
        meta.as_ref(),
        data.as_ref().map(|(_, d)| d),
        &mut notes,
    )
    .with_context(|| format!("{}", path.display()))?;
    let top = parsed
        .program
        .functions
        .values()
        .map(|f| f.opset)
        .max()
        .unwrap_or(Opset::Ios15);
    let spec_version = spec_version.unwrap_or(top.spec_version());
    Ok(Compiled {
        model: Model {
            spec_version,
            description,
            program: parsed.program,
        },
        weights_absent,
        notes,
        warnings,
        dialect: parsed.version,
        program_file,
        weights_file,
    })
}

fn str_of<'a>(j: &'a Json, k: &str) -> &'a str {
    j.get(k).and_then(|v| v.as_str()).unwrap_or("")
}

/// A schema entry of `metadata.json` as a feature, or why it is not one milkit reads.
fn schema_feature(j: &Json) -> Result<Feature, String> {
    let name = str_of(j, "name");
    let kind = str_of(j, "type");
    if !kind.is_empty() && kind != "MultiArray" && kind != "State" {
        return Err(format!("a {kind} feature"));
    }
    let dtype = match str_of(j, "dataType") {
        "Float16" => ArrayDType::F16,
        "Float32" => ArrayDType::F32,
        "Double" | "Float64" => ArrayDType::F64,
        "Int32" => ArrayDType::I32,
        d => return Err(format!("data type `{d}`")),
    };
    let shape: Vec<usize> = serde_json::from_str(str_of(j, "shape"))
        .map_err(|_| format!("shape `{}`", str_of(j, "shape")))?;
    let mut fe = Feature::new(name, dtype, &shape);
    fe.doc = str_of(j, "shortDescription").to_string();
    if str_of(j, "hasShapeFlexibility") == "1" {
        if let Ok(r) = serde_json::from_str::<Vec<Vec<i64>>>(str_of(j, "shapeRange")) {
            fe.flex = ShapeFlex::Ranges(
                r.iter()
                    .map(|d| {
                        let lo = d.first().copied().unwrap_or(0).max(0) as usize;
                        let hi = d.get(1).copied().filter(|&h| h >= 0).map(|h| h as usize);
                        (lo, hi)
                    })
                    .collect(),
            );
        } else if let Ok(e) = serde_json::from_str::<Vec<Vec<usize>>>(str_of(j, "enumeratedShapes"))
        {
            fe.flex = ShapeFlex::Enumerated(e);
        }
        if let ShapeFlex::Ranges(r) = &fe.flex {
            if r.len() != shape.len() {
                return Err(format!(
                    "a shape range of rank {} for shape {shape:?}",
                    r.len()
                ));
            }
        }
    }
    Ok(fe)
}

/// Shapes from a `FlexibleShapeInformation` attribute: per input, its default shape, its
/// ranges or its enumerated shapes.
#[derive(Default)]
struct FlexInfo {
    defaults: BTreeMap<String, Vec<usize>>,
    flex: BTreeMap<String, ShapeFlex>,
}

fn ints(v: &Value) -> Option<Vec<i64>> {
    v.as_tensor()?.to_i64_vec().ok()
}

fn flex_info(attrs: Option<&BTreeMap<String, Value>>) -> FlexInfo {
    let mut out = FlexInfo::default();
    let Some(Value::Tuple(items)) = attrs.and_then(|a| a.get("FlexibleShapeInformation")) else {
        return out;
    };
    for item in items {
        let Value::Tuple(kv) = item else { continue };
        let (Some(k), Some(Value::Dict { entries, .. })) =
            (kv.first().and_then(|k| k.as_str()), kv.get(1))
        else {
            continue;
        };
        for (name, v) in entries {
            let Some(name) = name.as_str() else { continue };
            match (k, v) {
                ("DefaultShapes", v) => {
                    if let Some(s) = ints(v) {
                        out.defaults
                            .insert(name.into(), s.iter().map(|&d| d.max(0) as usize).collect());
                    }
                }
                ("RangeDims", Value::List { values, .. }) => {
                    let r: Option<Vec<(usize, Option<usize>)>> = values
                        .iter()
                        .map(|d| {
                            let d = ints(d)?;
                            Some((
                                (*d.first()?).max(0) as usize,
                                d.get(1).copied().filter(|&h| h >= 0).map(|h| h as usize),
                            ))
                        })
                        .collect();
                    if let Some(r) = r {
                        out.flex.insert(name.into(), ShapeFlex::Ranges(r));
                    }
                }
                ("EnumeratedShapes", Value::List { values, .. }) => {
                    let e: Option<Vec<Vec<usize>>> = values
                        .iter()
                        .map(|s| Some(ints(s)?.iter().map(|&d| d.max(0) as usize).collect()))
                        .collect();
                    if let Some(e) = e {
                        out.flex.insert(name.into(), ShapeFlex::Enumerated(e));
                    }
                }
                _ => {}
            }
        }
    }
    out
}

/// A feature for a program input of type `t` when `metadata.json` has none that fits:
/// the fixed sizes, and for each `?` the function attribute's default and range (else 1
/// and unbounded).
fn feature_from_program(name: &str, t: &TensorType, info: &FlexInfo) -> Result<Feature> {
    let dtype = ArrayDType::from_dtype(t.dtype)
        .ok_or_else(|| anyhow!("input `{name}` is {t}, not a type a Core ML input can have"))?;
    let default = info.defaults.get(name).filter(|d| d.len() == t.rank());
    let shape: Vec<usize> = t
        .shape
        .iter()
        .enumerate()
        .map(|(i, d)| match d {
            Dim::Fixed(n) => *n,
            Dim::Unknown => default.map_or(1, |d| d[i]),
        })
        .collect();
    let mut fe = Feature::new(name, dtype, &shape);
    fe.flex = match info.flex.get(name) {
        Some(f) => f.clone(),
        None if t.fixed_shape().is_none() => ShapeFlex::Ranges(
            t.shape
                .iter()
                .zip(&shape)
                .map(|(d, &n)| match d {
                    Dim::Fixed(_) => (n, Some(n)),
                    Dim::Unknown => (1, None),
                })
                .collect(),
        ),
        None => ShapeFlex::Fixed,
    };
    Ok(fe)
}

/// An entry of a description: its name, and the feature, or why milkit cannot read it.
type Entry = (String, Result<Feature, String>);

/// One file's word on a function's interface: `coremldata.bin`'s `ModelDescription` or
/// `metadata.json`'s schemas.
struct Source {
    file: &'static str,
    /// What the file calls its lists of inputs, outputs and states, as notes name them.
    lists: [&'static str; 3],
    inputs: Vec<Entry>,
    outputs: Vec<Entry>,
    states: Vec<Entry>,
}

fn find<'a>(entries: &'a [Entry], name: &str) -> Option<(usize, &'a Result<Feature, String>)> {
    entries
        .iter()
        .position(|(n, _)| n == name)
        .map(|p| (p, &entries[p].1))
}

fn schema(meta: &Json, key: &str) -> Vec<Entry> {
    meta.get(key)
        .and_then(|v| v.as_array())
        .map(|a| {
            a.iter()
                .map(|j| (str_of(j, "name").to_string(), schema_feature(j)))
                .collect()
        })
        .unwrap_or_default()
}

fn metadata_source(meta: &Json) -> Source {
    Source {
        file: "metadata.json",
        lists: [
            "metadata.json's inputSchema",
            "metadata.json's outputSchema",
            "metadata.json's stateSchema",
        ],
        inputs: schema(meta, "inputSchema"),
        outputs: schema(meta, "outputSchema"),
        states: schema(meta, "stateSchema"),
    }
}

fn coremldata_source(inputs: &[Feature], outputs: &[Feature], states: &[Feature]) -> Source {
    let entries = |fs: &[Feature]| fs.iter().map(|f| (f.name.clone(), Ok(f.clone()))).collect();
    Source {
        file: "coremldata.bin",
        lists: [
            "coremldata.bin's inputs",
            "coremldata.bin's outputs",
            "coremldata.bin's states",
        ],
        inputs: entries(inputs),
        outputs: entries(outputs),
        states: entries(states),
    }
}

/// `" (accepting …)"` for a flexible feature, empty for a fixed one.
fn accepting(f: &Feature) -> String {
    match &f.flex {
        ShapeFlex::Fixed => String::new(),
        f => format!(" (accepting {f})"),
    }
}

/// The note for an input or state (`what`) of the program that source `s` describes
/// otherwise (`found`: its entry) or leaves out.
fn disagreement(
    fname: &str,
    what: &str,
    name: &str,
    s: &Source,
    t: &TensorType,
    found: Option<(usize, &Result<Feature, String>)>,
) -> String {
    let file = s.file;
    match found {
        Some((_, Ok(m))) => format!(
            "{fname}: {what} `{name}`: {file} says {}{}, the program says {t}; the program's \
             is used",
            m.tensor_type(),
            accepting(m)
        ),
        Some((_, Err(e))) => {
            format!("{fname}: {what} `{name}`: {file} describes {e}; the program's {t} is used")
        }
        None => {
            let list = s.lists[if what == "state" { 2 } else { 0 }];
            format!("{fname}: {what} `{name}` is not in {list}")
        }
    }
}

/// One function's inputs, outputs and states: from the first of `sources` (in order of
/// preference) whose entry fits the program, the program's otherwise; every source that
/// disagrees with the program gets a note.
fn function_io(
    fname: &str,
    f: &Function,
    sources: &[Source],
    info: &FlexInfo,
    notes: &mut Vec<String>,
) -> Result<FunctionIo> {
    let mut io = FunctionIo::default();
    // Described inputs, keyed by (source, position there): the order the model's users see.
    let mut described: Vec<((usize, usize), Feature)> = vec![];
    for v in &f.inputs {
        match &v.ty {
            ValueType::State(t) => {
                let dtype = ArrayDType::from_dtype(t.dtype).ok_or_else(|| {
                    anyhow!(
                        "state `{}` is {t}, not a type a Core ML state can have",
                        v.name
                    )
                })?;
                let shape = t.fixed_shape().ok_or_else(|| {
                    anyhow!("state `{}` is {t}: a state's shape must be known", v.name)
                })?;
                let fe = Feature::new(&v.name, dtype, &shape);
                for s in sources {
                    match find(&s.states, &v.name) {
                        Some((_, Ok(m))) if m.dtype == fe.dtype && m.shape == fe.shape => {}
                        found => notes.push(disagreement(fname, "state", &v.name, s, t, found)),
                    }
                }
                io.states.push(fe);
            }
            ValueType::Tensor(t) => {
                let mut chosen: Option<((usize, usize), Feature)> = None;
                for (k, s) in sources.iter().enumerate() {
                    match find(&s.inputs, &v.name) {
                        Some((p, Ok(fe))) if fits(t, fe) => {
                            if chosen.is_none() {
                                chosen = Some(((k, p), fe.clone()));
                            }
                        }
                        found => notes.push(disagreement(fname, "input", &v.name, s, t, found)),
                    }
                }
                match chosen {
                    Some((key, mut fe)) => {
                        // A description may leave out ranges the function attribute gives.
                        if fe.flex == ShapeFlex::Fixed && t.fixed_shape().is_none() {
                            if let Some(f) = info.flex.get(&v.name) {
                                fe.flex = f.clone();
                            }
                        }
                        described.push((key, fe));
                    }
                    None => io.inputs.push(feature_from_program(&v.name, t, info)?),
                }
            }
            other => bail!(
                "function `{fname}` takes `{}` of type {other}, which Core ML inputs cannot be",
                v.name
            ),
        }
    }
    // The descriptions' order first, then the rest.
    described.sort_by_key(|(k, _)| *k);
    let rest = std::mem::take(&mut io.inputs);
    io.inputs = described.into_iter().map(|(_, f)| f).chain(rest).collect();
    for s in sources {
        for (what, entries) in [("input", &s.inputs), ("state", &s.states)] {
            for (n, _) in entries {
                if !f.inputs.iter().any(|v| v.name == *n) {
                    notes.push(format!(
                        "{fname}: {} lists {what} `{n}`, which the program does not take",
                        s.file
                    ));
                }
            }
        }
    }
    // Outputs: the block's, typed by the program.
    let types: BTreeMap<&str, &ValueType> = f
        .block
        .walk()
        .into_iter()
        .flat_map(|op| op.outputs.iter())
        .chain(f.inputs.iter())
        .map(|v| (v.name.as_str(), &v.ty))
        .collect();
    for o in &f.block.outputs {
        let ty = types
            .get(o.as_str())
            .ok_or_else(|| anyhow!("output `{o}` is never defined"))?;
        let first = sources
            .iter()
            .find_map(|s| find(&s.outputs, o).and_then(|(_, r)| r.as_ref().ok()));
        let fe = match ty {
            // A classifier's label: an int64 or string scalar.
            ValueType::Tensor(t) if t.shape.is_empty() && t.dtype == crate::ir::DType::I64 => {
                Feature::of_kind(o, FeatureKind::Int64)
            }
            ValueType::Tensor(t) if t.shape.is_empty() && t.dtype == crate::ir::DType::Str => {
                Feature::of_kind(o, FeatureKind::String)
            }
            ValueType::Tensor(t) => {
                // Other element types (bool, 8- and 16-bit integers) are converted at the
                // boundary into the type the description gives (int32 unless it says).
                let dtype = match (ArrayDType::from_dtype(t.dtype), first) {
                    (Some(d), _) => d,
                    (None, Some(m)) => m.dtype,
                    (None, None) => ArrayDType::I32,
                };
                let shape = match (t.fixed_shape(), first) {
                    (Some(s), _) => s,
                    (None, Some(m)) if m.shape.len() == t.rank() => m.shape.clone(),
                    _ => vec![],
                };
                let mut fe = Feature::new(o, dtype, &shape);
                if let Some(m) = first {
                    fe.doc = m.doc.clone();
                }
                for s in sources {
                    match find(&s.outputs, o) {
                        Some((_, Ok(m))) => {
                            // An empty shape in a description means "not known", not a
                            // scalar.
                            let same_type = m.dtype.to_dtype() == t.dtype
                                || ArrayDType::from_dtype(t.dtype).is_none();
                            let same_shape = m.shape.is_empty()
                                || (m.shape.len() == t.rank()
                                    && m.shape.iter().zip(&t.shape).all(|(a, d)| match d {
                                        Dim::Fixed(n) => n == a,
                                        Dim::Unknown => true,
                                    }));
                            if !same_type || !same_shape {
                                notes.push(format!(
                                    "{fname}: output `{o}`: {} says {}, the program says {t}; \
                                     the program's is used",
                                    s.file,
                                    m.tensor_type()
                                ));
                            }
                        }
                        Some((_, Err(e))) => notes.push(format!(
                            "{fname}: output `{o}`: {} describes {e}; the program's {t} is used",
                            s.file
                        )),
                        None => {
                            notes.push(format!("{fname}: output `{o}` is not in {}", s.lists[1]))
                        }
                    }
                }
                fe
            }
            other => {
                let kind = match other {
                    ValueType::Dict { key, .. } => match key.as_tensor().map(|k| k.dtype) {
                        Some(crate::ir::DType::I64) => FeatureKind::Dict(crate::ir::DictKey::Int64),
                        Some(crate::ir::DType::Str) => {
                            FeatureKind::Dict(crate::ir::DictKey::String)
                        }
                        _ => bail!("output `{o}` is {other}, which Core ML outputs cannot be"),
                    },
                    _ => bail!("output `{o}` is {other}, which Core ML outputs cannot be"),
                };
                Feature::of_kind(o, kind)
            }
        };
        io.outputs.push(fe);
    }
    for s in sources {
        for (n, _) in &s.outputs {
            if !f.block.outputs.iter().any(|o| o == n) {
                notes.push(format!(
                    "{fname}: {} lists output `{n}`, which the program does not return",
                    s.file
                ));
            }
        }
    }
    check_abi(&io.inputs, &io.outputs, &io.states, f)
        .with_context(|| format!("function `{fname}`"))?;
    Ok(io)
}

/// The model's description: each function's interface from `coremldata.bin`'s
/// `ModelDescription` where it fits the program (it alone has default shapes, state types
/// and a multifunction model's function list), then `metadata.json`'s (which describes the
/// default function), then the program's; the model's metadata from the first that has it.
fn describe(
    parsed: &ParsedProgram,
    meta: Option<&Json>,
    data: Option<&Description>,
    notes: &mut Vec<String>,
) -> Result<Description> {
    let p = &parsed.program;
    let mut d = Description::default();
    if let Some(c) = data {
        d.short_description = c.short_description.clone();
        d.author = c.author.clone();
        d.version = c.version.clone();
        d.user_defined = c.user_defined.clone();
    } else if let Some(m) = meta {
        d.short_description = str_of(m, "shortDescription").to_string();
        d.author = str_of(m, "author").to_string();
        d.version = str_of(m, "version").to_string();
        if let Some(u) = m.get("userDefinedMetadata").and_then(|u| u.as_object()) {
            for (k, v) in u {
                if let Some(s) = v.as_str() {
                    d.user_defined.insert(k.clone(), s.to_string());
                }
            }
        }
    }
    let single = p.functions.len() == 1;
    // The default function: coremldata.bin's, else `main`, else the only one.
    let named = data
        .map(|c| c.default_function.clone())
        .filter(|n| !n.is_empty());
    if let Some(n) = named.as_ref().filter(|n| !p.functions.contains_key(*n)) {
        notes.push(format!(
            "coremldata.bin names `{n}` the default function, which the program does not have"
        ));
    }
    let default = named
        .filter(|n| p.functions.contains_key(n))
        .or_else(|| p.functions.contains_key("main").then(|| "main".to_string()))
        .or_else(|| single.then(|| p.functions.keys().next().cloned()).flatten());
    if let Some(c) = data.filter(|c| !c.functions.is_empty()) {
        for n in c.functions.keys().filter(|n| !p.functions.contains_key(*n)) {
            notes.push(format!(
                "coremldata.bin lists function `{n}`, which the program does not have"
            ));
        }
    }
    for (name, f) in &p.functions {
        let info = flex_info(parsed.function_attributes.get(name));
        let is_default = Some(name) == default.as_ref();
        let mut sources = vec![];
        if let Some(c) = data {
            if let Some(io) = c.functions.get(name) {
                sources.push(coremldata_source(&io.inputs, &io.outputs, &io.states));
            } else if !c.functions.is_empty() {
                notes.push(format!(
                    "{name}: not in coremldata.bin's function list; its interface comes from \
                     the program"
                ));
            } else if is_default {
                sources.push(coremldata_source(&c.inputs, &c.outputs, &c.states));
            }
        }
        if let Some(m) = meta.filter(|_| is_default) {
            sources.push(metadata_source(m));
        }
        let io = function_io(name, f, &sources, &info, notes)?;
        if single {
            (d.inputs, d.outputs, d.states) = (io.inputs, io.outputs, io.states);
        } else {
            d.functions.insert(name.clone(), io);
        }
    }
    if !single {
        let def = default.unwrap_or_else(|| p.functions.keys().next().cloned().unwrap_or_default());
        let io = &d.functions[&def];
        (d.inputs, d.outputs, d.states) =
            (io.inputs.clone(), io.outputs.clone(), io.states.clone());
        d.default_function = def;
    }
    // A classifier's label and probabilities outputs, where the program returns them.
    if let Some(c) = data {
        for (what, name, to) in [
            (
                "predictedFeatureName",
                &c.predicted_feature,
                &mut d.predicted_feature,
            ),
            (
                "predictedProbabilitiesName",
                &c.predicted_probabilities,
                &mut d.predicted_probabilities,
            ),
        ] {
            if name.is_empty() {
                continue;
            }
            if d.outputs.iter().any(|o| o.name == *name) {
                *to = name.clone();
            } else {
                notes.push(format!(
                    "coremldata.bin's {what} `{name}` is not an output of the program"
                ));
            }
        }
    }
    Ok(d)
}
