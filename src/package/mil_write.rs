//! Writing a program as `model.mil` text, the syntax [`super::mil_text`] reads and Apple's
//! compiler prints: `program(1.0)` (scalars as rank-0 tensors) or `program(1.3)` (bare
//! scalars), C99 hex floats, typed literals, `BLOBFILE` references for the constants a
//! [`BlobSink`] takes. Also writes a whole compiled folder (`model.mil`, `weights/weight.bin`,
//! `metadata.json`) from a model.

use super::blob::{unpack_i4, unpack_sub_byte, BlobWriter};
use super::convert::{blob_dtype, goes_to_blob, BlobSink, WEIGHTS_REF};
use crate::ir::{Arg, Block, DType, Feature, Model, Opset, Program, Tensor, Value, ValueType};
use anyhow::{anyhow, Result};
use half::{bf16, f16};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

/// The printer dialect: `1.0` writes every scalar as a rank-0 tensor, `1.3` bare.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    V1_0,
    V1_3,
}

impl Dialect {
    /// The dialect Apple's compiler of the program's generation writes: `1.3` for programs
    /// with an iOS17 or later function, `1.0` before.
    pub fn for_program(p: &Program) -> Dialect {
        if p.functions.values().any(|f| f.opset >= Opset::Ios17) {
            Dialect::V1_3
        } else {
            Dialect::V1_0
        }
    }
    pub fn version(self) -> &'static str {
        match self {
            Dialect::V1_0 => "1.0",
            Dialect::V1_3 => "1.3",
        }
    }
}

/// A C99 hex float with the fewest digits (`0x1.8p+1`, `-0x0p+0`), or `inf`, `-inf`, `nan`.
pub fn hex_float(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    let sign = if x.is_sign_negative() { "-" } else { "" };
    if x.is_infinite() {
        return format!("{sign}inf");
    }
    if x == 0.0 {
        return format!("{sign}0x0p+0");
    }
    let bits = x.to_bits();
    let mut e = ((bits >> 52) & 0x7ff) as i64;
    let mut m = bits & ((1u64 << 52) - 1);
    if e == 0 {
        // A subnormal: normalise.
        e = 1;
        while m & (1u64 << 52) == 0 {
            m <<= 1;
            e -= 1;
        }
        m &= (1u64 << 52) - 1;
    }
    let frac = format!("{m:013x}");
    let frac = frac.trim_end_matches('0');
    let e = e - 1023;
    if frac.is_empty() {
        format!("{sign}0x1p{e:+}")
    } else {
        format!("{sign}0x1.{frac}p{e:+}")
    }
}

fn quote(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '\t' => o.push_str("\\t"),
            '\r' => o.push_str("\\r"),
            '\0' => o.push_str("\\0"),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// The text of a type in `dialect`.
pub fn type_text(t: &ValueType, d: Dialect) -> String {
    match t {
        ValueType::Tensor(tt) if tt.shape.is_empty() && d == Dialect::V1_3 => {
            tt.dtype.name().to_string()
        }
        ValueType::Tensor(tt) => tt.to_string(),
        ValueType::State(tt) => format!("state<{tt}>"),
        ValueType::List { elem, len } => match len {
            Some(n) => format!("list<{}, {n}>", type_text(elem, d)),
            None => format!("list<{}, ?>", type_text(elem, d)),
        },
        ValueType::Tuple(ts) => {
            let s: Vec<String> = ts.iter().map(|t| type_text(t, d)).collect();
            format!("tuple<{}>", s.join(", "))
        }
        ValueType::Dict { key, value } => {
            format!("dict<{}, {}>", type_text(key, d), type_text(value, d))
        }
    }
}

/// The elements of a tensor as literal text.
fn elements(t: &Tensor) -> Result<Vec<String>> {
    let n = t.num_elements();
    let b = t.data.as_slice();
    Ok(match t.dtype {
        DType::Bool => b.iter().map(|&x| (x != 0).to_string()).collect(),
        DType::F16 => b
            .chunks_exact(2)
            .map(|c| hex_float(f16::from_le_bytes([c[0], c[1]]).to_f64()))
            .collect(),
        DType::BF16 => b
            .chunks_exact(2)
            .map(|c| hex_float(bf16::from_le_bytes([c[0], c[1]]).to_f64()))
            .collect(),
        DType::F32 => b
            .chunks_exact(4)
            .map(|c| hex_float(f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64))
            .collect(),
        DType::F64 => t.to_f64_vec()?.into_iter().map(hex_float).collect(),
        DType::I64 => b
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()).to_string())
            .collect(),
        DType::U64 => b
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()).to_string())
            .collect(),
        DType::I4 => unpack_i4(b, n)?.iter().map(|v| v.to_string()).collect(),
        d if d.is_sub_byte() => {
            let bd = blob_dtype(d).ok_or_else(|| anyhow!("no packing for {d}"))?;
            unpack_sub_byte(bd, b, n)?
                .iter()
                .map(|v| v.to_string())
                .collect()
        }
        _ => t
            .to_f64_vec()?
            .into_iter()
            .map(|v| format!("{}", v as i64))
            .collect(),
    })
}

/// Nested `[...]` of `items` in `shape` (a scalar bare).
fn nest(items: &[String], shape: &[usize]) -> String {
    match shape {
        [] => items.first().cloned().unwrap_or_default(),
        [_] => format!("[{}]", items.join(", ")),
        [n, rest @ ..] => {
            let inner: usize = rest.iter().product();
            let parts: Vec<String> = (0..*n)
                .map(|i| nest(&items[i * inner..(i + 1) * inner], rest))
                .collect();
            format!("[{}]", parts.join(", "))
        }
    }
}

struct W<'a> {
    d: Dialect,
    blobs: Option<&'a mut dyn BlobSink>,
    out: String,
}

impl W<'_> {
    /// The literal of `v` (without its type).
    fn lit(&mut self, v: &Value) -> Result<String> {
        Ok(match v {
            Value::Tensor(t) => nest(&elements(t)?, &t.shape),
            Value::Strings { shape, values } => {
                let q: Vec<String> = values.iter().map(|s| quote(s)).collect();
                nest(&q, shape)
            }
            Value::List { values, .. } => {
                let v: Vec<String> = values.iter().map(|x| self.lit(x)).collect::<Result<_>>()?;
                format!("[{}]", v.join(", "))
            }
            Value::Tuple(values) => {
                let v: Vec<String> = values.iter().map(|x| self.lit(x)).collect::<Result<_>>()?;
                format!("({})", v.join(", "))
            }
            Value::Dict { entries, .. } => {
                let v: Vec<String> = entries
                    .iter()
                    .map(|(k, x)| Ok(format!("{{{}, {}}}", self.lit(k)?, self.lit(x)?)))
                    .collect::<Result<_>>()?;
                format!("{{{}}}", v.join(", "))
            }
        })
    }

    /// `TYPE(literal)`, or `TYPE(BLOBFILE(...))` for a tensor the blob sink takes.
    fn typed(&mut self, v: &Value) -> Result<String> {
        let ty = type_text(&v.value_type(), self.d);
        if let (Value::Tensor(t), Some(sink)) = (v, self.blobs.as_deref_mut()) {
            if goes_to_blob(t) {
                let off = sink.put(t)?;
                let s = type_text(
                    &ValueType::Tensor(crate::ir::TensorType::scalar(DType::Str)),
                    self.d,
                );
                let u = type_text(
                    &ValueType::Tensor(crate::ir::TensorType::scalar(DType::U64)),
                    self.d,
                );
                return Ok(format!(
                    "{ty}(BLOBFILE(path = {s}({}), offset = {u}({off})))",
                    quote(WEIGHTS_REF)
                ));
            }
        }
        Ok(format!("{ty}({})", self.lit(v)?))
    }

    fn binding(&mut self, a: &Arg) -> Result<String> {
        match a {
            Arg::Var(n) => Ok(n.clone()),
            Arg::Value(v) => self.typed(v),
        }
    }

    fn attrs(&mut self, name: &str, attrs: &BTreeMap<&str, &Value>) -> Result<String> {
        let mut parts = vec![];
        if !name.is_empty() {
            parts.push(format!("name = {}", self.typed(&Value::str(name))?));
        }
        for (k, v) in attrs {
            parts.push(format!("{k} = {}", self.typed(v)?));
        }
        Ok(if parts.is_empty() {
            String::new()
        } else {
            format!("[{}]", parts.join(", "))
        })
    }

    fn block(&mut self, b: &Block, indent: usize) -> Result<()> {
        let pad = " ".repeat(indent);
        for op in &b.operations {
            let outs: Vec<String> = op
                .outputs
                .iter()
                .map(|v| format!("{} {}", type_text(&v.ty, self.d), v.name))
                .collect();
            let constexpr = op.op_type.starts_with("constexpr_");
            let mut args = vec![];
            let mut attrs: BTreeMap<&str, &Value> =
                op.attributes.iter().map(|(k, v)| (k.as_str(), v)).collect();
            for (p, binds) in &op.inputs {
                // constexpr ops take their constant parameters in the bracket list.
                if let ([Arg::Value(v)], true) = (binds.as_slice(), constexpr) {
                    attrs.insert(p, v);
                    continue;
                }
                let text = if binds.len() == 1 {
                    self.binding(&binds[0])?
                } else {
                    let v: Vec<String> = binds
                        .iter()
                        .map(|a| self.binding(a))
                        .collect::<Result<_>>()?;
                    format!("({})", v.join(", "))
                };
                args.push(format!("{p} = {text}"));
            }
            let attrs = self.attrs(&op.name, &attrs)?;
            write!(
                self.out,
                "{pad}{} = {}({}){attrs}",
                outs.join(", "),
                op.op_type,
                args.join(", ")
            )?;
            for nb in &op.blocks {
                let params: Vec<String> = nb
                    .inputs
                    .iter()
                    .map(|v| format!("{} {}", type_text(&v.ty, self.d), v.name))
                    .collect();
                write!(self.out, "\n{pad}    ")?;
                if !nb.inputs.is_empty() {
                    write!(self.out, "({}) ", params.join(", "))?;
                }
                self.out.push_str("{\n");
                self.block(nb, indent + 8)?;
                write!(self.out, "{pad}    }} -> ({})", nb.outputs.join(", "))?;
            }
            self.out.push_str(";\n");
        }
        Ok(())
    }
}

/// The program as `model.mil` text in `dialect`; tensors `blobs` takes (those a package
/// stores in its weight file) become `BLOBFILE` references, the rest inline literals.
pub fn write_program(
    p: &Program,
    dialect: Dialect,
    blobs: Option<&mut dyn BlobSink>,
) -> Result<String> {
    let mut w = W {
        d: dialect,
        blobs,
        out: String::new(),
    };
    writeln!(w.out, "program({})", dialect.version())?;
    if !p.attributes.is_empty() {
        let a: BTreeMap<&str, &Value> = p.attributes.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let mut parts = vec![];
        for (k, v) in a {
            parts.push(format!("{k} = {}", w.typed(v)?));
        }
        writeln!(w.out, "[{}]", parts.join(", "))?;
    }
    w.out.push_str("{\n");
    for (name, f) in &p.functions {
        let params: Vec<String> = f
            .inputs
            .iter()
            .map(|v| format!("{} {}", type_text(&v.ty, dialect), v.name))
            .collect();
        writeln!(
            w.out,
            "    func {name}<{}>({}) {{",
            f.opset.target_name(),
            params.join(", ")
        )?;
        w.block(&f.block, 12)?;
        writeln!(w.out, "        }} -> ({});", f.block.outputs.join(", "))?;
    }
    w.out.push('}');
    Ok(w.out)
}

/// Counts the offsets a weight file would give without storing anything, for printing.
pub struct OffsetCounter(u64);

impl Default for OffsetCounter {
    fn default() -> Self {
        OffsetCounter(64)
    }
}

impl BlobSink for OffsetCounter {
    fn put(&mut self, t: &Tensor) -> Result<u64> {
        let off = self.0;
        self.0 = (off + 64 + t.data.len() as u64).next_multiple_of(64);
        Ok(off)
    }
}

struct FileSink(BlobWriter);

impl BlobSink for FileSink {
    fn put(&mut self, t: &Tensor) -> Result<u64> {
        let bd =
            blob_dtype(t.dtype).ok_or_else(|| anyhow!("{} cannot be stored in a blob", t.dtype))?;
        if bd.is_sub_byte() {
            self.0.append_sub_byte(bd, t.num_elements() as u64, &t.data)
        } else {
            self.0.append(bd, &t.data)
        }
    }
}

fn schema(f: &Feature) -> serde_json::Value {
    let dt = match f.dtype {
        crate::ir::ArrayDType::F16 => "Float16",
        crate::ir::ArrayDType::F32 => "Float32",
        crate::ir::ArrayDType::F64 => "Double",
        crate::ir::ArrayDType::I32 => "Int32",
    };
    let mut j = serde_json::json!({
        "name": f.name,
        "type": "MultiArray",
        "dataType": dt,
        "shape": format!("{:?}", f.shape),
        "shortDescription": f.doc,
        "hasShapeFlexibility": if f.flex == crate::ir::ShapeFlex::Fixed { "0" } else { "1" },
        "isOptional": "0",
    });
    match &f.flex {
        crate::ir::ShapeFlex::Ranges(r) => {
            let r: Vec<[i64; 2]> = r
                .iter()
                .map(|&(lo, hi)| [lo as i64, hi.map_or(-1, |h| h as i64)])
                .collect();
            j["shapeRange"] = format!("{r:?}").into();
        }
        crate::ir::ShapeFlex::Enumerated(e) => j["enumeratedShapes"] = format!("{e:?}").into(),
        crate::ir::ShapeFlex::Fixed => {}
    }
    j
}

/// `metadata.json` of a model: its I/O schemas, op histogram (`const` left out, as
/// Apple's compiler does) and metadata.
pub fn metadata_json(m: &Model) -> String {
    let d = &m.description;
    let mut hist: BTreeMap<String, u64> = BTreeMap::new();
    for f in m.program.functions.values() {
        for op in f.block.walk() {
            if op.op_type != "const" {
                *hist.entry(op.op_type.clone()).or_default() += 1;
            }
        }
    }
    let j = serde_json::json!([{
        "metadataOutputVersion": "3.0",
        "specificationVersion": m.spec_version,
        "shortDescription": d.short_description,
        "author": d.author,
        "version": d.version,
        "userDefinedMetadata": d.user_defined,
        "inputSchema": d.inputs.iter().map(schema).collect::<Vec<_>>(),
        "outputSchema": d.outputs.iter().map(schema).collect::<Vec<_>>(),
        "stateSchema": d.states.iter().map(|s| { let mut j = schema(s); j["type"] = "State".into(); j }).collect::<Vec<_>>(),
        "mlProgramOperationTypeHistogram": hist,
        "modelType": { "name": "MLModelType_mlProgram" },
    }]);
    serde_json::to_string_pretty(&j).unwrap_or_default()
}

/// Writes `m` as a compiled folder at `dir` (which must exist and be empty): `model.mil`,
/// `weights/weight.bin` when a constant goes to the weight file, `metadata.json` and
/// `coremldata.bin` (the description, in the layout read off Apple's files; whether Core
/// ML loads such a folder is untested: Apple's compiler also optimises the program and
/// writes `analytics/`).
pub fn write_compiled_dir(m: &Model, dir: &Path) -> Result<()> {
    let wdir = dir.join("weights");
    std::fs::create_dir_all(&wdir)?;
    let wfile = wdir.join("weight.bin");
    let mut sink = FileSink(BlobWriter::create(&wfile)?);
    let text = write_program(
        &m.program,
        Dialect::for_program(&m.program),
        Some(&mut sink),
    )?;
    let used = sink.0.count() > 0;
    sink.0.finish()?;
    if !used {
        std::fs::remove_file(&wfile)?;
        std::fs::remove_dir(&wdir)?;
    }
    std::fs::write(dir.join("model.mil"), text)?;
    std::fs::write(dir.join("metadata.json"), metadata_json(m))?;
    std::fs::write(
        dir.join("coremldata.bin"),
        super::coremldata::coremldata_bytes(
            m.spec_version as u64,
            &super::save::description_to_proto(m),
        ),
    )?;
    Ok(())
}
