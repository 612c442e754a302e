//! The generated Core ML protobuf types: they decode coremltools' model files losslessly,
//! encode deterministically, and their schema matches Apple's field for field.

use milkit::proto::mil::{self, DataType};
use milkit::proto::specification::{
    array_feature_type::ArrayDataType, feature_type, model, Metadata, Model,
};
use prost::Message;
use std::collections::BTreeMap;

fn dims(t: &mil::ValueType) -> Vec<u64> {
    let Some(mil::value_type::Type::TensorType(t)) = &t.r#type else {
        panic!("not a tensor")
    };
    t.dimensions
        .iter()
        .map(|d| match &d.dimension {
            Some(mil::dimension::Dimension::Constant(c)) => c.size,
            other => panic!("not a constant dimension: {other:?}"),
        })
        .collect()
}

#[test]
fn decodes_and_reencodes_coremltools_models() {
    let Some(fx) = crate::fixtures() else { return };
    for pkg in crate::fixture_packages(&fx) {
        let path = pkg.join("Data/com.apple.CoreML/model.mlmodel");
        let bytes = std::fs::read(&path).unwrap();
        let m = Model::decode(bytes.as_slice()).unwrap();
        let again = m.encode_to_vec();
        // coremltools writes maps in hash order, so bytes differ only by map-entry order: same
        // length (nothing dropped or added) and same decoded value.
        assert_eq!(again.len(), bytes.len(), "{}", path.display());
        assert_eq!(Model::decode(again.as_slice()).unwrap(), m);
        // Encoding is a function of the value.
        assert_eq!(
            Model::decode(again.as_slice()).unwrap().encode_to_vec(),
            again
        );

        assert_eq!(m.specification_version, 9);
        let desc = m.description.as_ref().unwrap();
        assert_eq!(desc.input.len(), 1);
        assert_eq!(desc.input[0].name, "logmel_data");
        let Some(feature_type::Type::MultiArrayType(a)) =
            &desc.input[0].r#type.as_ref().unwrap().r#type
        else {
            panic!("input is not a multi-array")
        };
        assert_eq!(a.shape, vec![1, 80, 3000]);
        assert_eq!(a.data_type(), ArrayDataType::Float32);
        assert_eq!(desc.output[0].name, "output");
        let md = desc.metadata.as_ref().unwrap();
        assert_eq!(
            md.user_defined
                .get("com.github.apple.coremltools.version")
                .map(String::as_str),
            Some("9.0")
        );

        let Some(model::Type::MlProgram(p)) = &m.r#type else {
            panic!("not an mlProgram")
        };
        let main = &p.functions["main"];
        assert_eq!(main.opset, "CoreML8");
        assert_eq!(main.inputs[0].name, "logmel_data");
        assert_eq!(
            dims(main.inputs[0].r#type.as_ref().unwrap()),
            vec![1, 80, 3000]
        );
        let block = &main.block_specializations["CoreML8"];
        assert_eq!(block.outputs, vec!["output".to_string()]);
        // Weights are blob references; offsets are 64-aligned metadata records.
        let mut blobs = 0;
        for op in &block.operations {
            for v in op
                .attributes
                .values()
                .chain(op.inputs.values().flat_map(|a| {
                    a.arguments.iter().filter_map(|b| match &b.binding {
                        Some(mil::argument::binding::Binding::Value(v)) => Some(v),
                        _ => None,
                    })
                }))
            {
                if let Some(mil::value::Value::BlobFileValue(b)) = &v.value {
                    assert_eq!(b.file_name, "@model_path/weights/weight.bin");
                    assert_eq!(b.offset % 64, 0);
                    blobs += 1;
                }
            }
        }
        assert!(blobs > 60, "{}: {blobs} blob values", path.display());
    }
}

#[test]
fn maps_encode_in_sorted_key_order() {
    // BTreeMap is the generated type (a compile-time check of build.rs' btree_map config).
    let mut user: BTreeMap<String, String> = BTreeMap::new();
    for k in ["zeta", "alpha", "Mid", "beta"] {
        user.insert(k.into(), k.to_uppercase());
    }
    let md = Metadata {
        user_defined: user,
        ..Default::default()
    };
    let bytes = md.encode_to_vec();
    let pos = |s: &str| {
        bytes
            .windows(s.len())
            .position(|w| w == s.as_bytes())
            .unwrap()
    };
    assert!(pos("Mid") < pos("alpha") && pos("alpha") < pos("beta") && pos("beta") < pos("zeta"));
    let _: &BTreeMap<String, mil::Function> = &mil::Program::default().functions;
}

#[test]
fn data_type_values_are_apples() {
    let expected = [
        (DataType::UnusedType, 0),
        (DataType::Bool, 1),
        (DataType::String, 2),
        (DataType::Float8e4m3fn, 40),
        (DataType::Float8e5m2, 41),
        (DataType::Float16, 10),
        (DataType::Float32, 11),
        (DataType::Float64, 12),
        (DataType::Bfloat16, 13),
        (DataType::Int8, 21),
        (DataType::Int16, 22),
        (DataType::Int32, 23),
        (DataType::Int64, 24),
        (DataType::Int4, 25),
        (DataType::Uint8, 31),
        (DataType::Uint16, 32),
        (DataType::Uint32, 33),
        (DataType::Uint64, 34),
        (DataType::Uint4, 35),
        (DataType::Uint2, 36),
        (DataType::Uint1, 37),
        (DataType::Uint6, 38),
        (DataType::Uint3, 39),
    ];
    for (d, v) in expected {
        assert_eq!(d as i32, v, "{d:?}");
    }
    assert_eq!(DataType::Uint4.as_str_name(), "UINT4");
}

/// Compares every message, field and enum of our descriptor set with coremltools'.
const PY_COMPARE: &str = r#"
import sys
from google.protobuf import descriptor_pb2, descriptor_pool
import coremltools.proto.Model_pb2  # registers all Core ML descriptors
pool = descriptor_pool.Default()
ours = descriptor_pb2.FileDescriptorSet()
ours.ParseFromString(open(sys.argv[1], "rb").read())
problems, n_fields = [], 0
def theirs_proto(full):
    d = pool.FindMessageTypeByName(full)
    p = descriptor_pb2.DescriptorProto()
    d.CopyToProto(p)
    return p
def enum_check(full, e):
    t = pool.FindEnumTypeByName(full)
    mine = [(v.name, v.number) for v in e.value]
    theirs = [(v.name, v.number) for v in t.values]
    if mine != theirs:
        problems.append(f"enum {full}: {mine} != {theirs}")
def msg_check(full, m):
    global n_fields
    try:
        t = theirs_proto(full)
    except KeyError:
        problems.append(f"message {full} unknown to coremltools"); return
    if m.options.map_entry != t.options.map_entry:
        problems.append(f"{full}: map_entry differs")
    tf = {f.name: f for f in t.field}
    for f in m.field:
        n_fields += 1
        g = tf.get(f.name)
        if g is None:
            problems.append(f"{full}.{f.name}: no such field in coremltools"); continue
        mine = (f.number, f.label, f.type, f.type_name, f.options.packed,
                m.oneof_decl[f.oneof_index].name if f.HasField("oneof_index") else None)
        theirs = (g.number, g.label, g.type, g.type_name, g.options.packed,
                  t.oneof_decl[g.oneof_index].name if g.HasField("oneof_index") else None)
        if mine != theirs:
            problems.append(f"{full}.{f.name}: {mine} != {theirs}")
    for n in m.nested_type:
        msg_check(full + "." + n.name, n)
    for e in m.enum_type:
        enum_check(full + "." + e.name, e)
for fd in ours.file:
    if fd.syntax != "proto3":
        problems.append(f"{fd.name}: syntax {fd.syntax}")
    for m in fd.message_type:
        msg_check(fd.package + "." + m.name, m)
    for e in fd.enum_type:
        enum_check(fd.package + "." + e.name, e)
print("\n".join(problems) if problems else f"ok {n_fields}")
"#;

#[test]
fn schema_matches_coremltools_descriptors() {
    let Some(py) = crate::python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ours.desc");
    std::fs::write(&p, milkit::proto::FILE_DESCRIPTOR_SET).unwrap();
    let out = crate::run_python(&py, PY_COMPARE, &[p.as_os_str()]);
    let out = out.trim();
    assert!(
        out.starts_with("ok "),
        "schema differs from coremltools:\n{out}"
    );
    let n: usize = out[3..].parse().unwrap();
    assert!(n > 100, "only {n} fields compared");
}

/// Parses our encoding with coremltools' own (complete) schema and compares it with the
/// original file: any field our schema dropped or mistyped would make them differ.
/// (Byte comparison with `SerializeToString(deterministic=True)` is not possible: Python's
/// upb backend orders a map key after the keys it is a prefix of, e.g. "pad_type" before
/// "pad", while we, like C++ protobuf, sort bytewise.)
const PY_SAME_MESSAGE: &str = r#"
import sys
from coremltools.proto import Model_pb2
a, b = Model_pb2.Model(), Model_pb2.Model()
a.ParseFromString(open(sys.argv[1], "rb").read())
b.ParseFromString(open(sys.argv[2], "rb").read())
print("same" if a == b and a.ByteSize() == b.ByteSize() else "different")
"#;

#[test]
fn coremltools_reads_our_encoding_as_the_original_model() {
    let Some(fx) = crate::fixtures() else { return };
    let Some(py) = crate::python() else { return };
    let dir = tempfile::tempdir().unwrap();
    for pkg in crate::fixture_packages(&fx) {
        let path = pkg.join("Data/com.apple.CoreML/model.mlmodel");
        let ours = dir.path().join("ours.mlmodel");
        let m = Model::decode(std::fs::read(&path).unwrap().as_slice()).unwrap();
        std::fs::write(&ours, m.encode_to_vec()).unwrap();
        let out = crate::run_python(&py, PY_SAME_MESSAGE, &[path.as_os_str(), ours.as_os_str()]);
        assert_eq!(out.trim(), "same", "{}", path.display());
    }
}
