//! Compiles the Core ML protobuf schema in `mil/` into Rust with prost, using protox (a pure
//! Rust protobuf compiler) so no system `protoc` is needed.
//!
//! Output in OUT_DIR (included by `src/proto.rs`):
//! - `core_ml.specification.rs`, `core_ml.specification.mil_spec.rs`: the generated types;
//! - `coreml_descriptor_set.bin`: the encoded `FileDescriptorSet`, so tests can compare our
//!   schema field by field with Apple's.

use std::path::PathBuf;

const PROTOS: [&str; 8] = [
    "mil/Model.proto",
    "mil/FeatureTypes.proto",
    "mil/MIL.proto",
    "mil/NeuralNetwork.proto",
    "mil/DataStructures.proto",
    "mil/Parameters.proto",
    "mil/ModelTypes.proto",
    "mil/CoreMLModels.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=mil");
    for p in PROTOS {
        println!("cargo:rerun-if-changed={p}");
    }
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);

    let mut compiler = protox::Compiler::new(["mil"])?;
    compiler
        .include_source_info(true)
        .include_imports(true)
        .open_files(PROTOS)?;
    std::fs::write(
        out_dir.join("coreml_descriptor_set.bin"),
        compiler.encode_file_descriptor_set(),
    )?;
    let fds = compiler.file_descriptor_set();

    prost_build::Config::new()
        // BTreeMap for every map field: prost then encodes map entries in sorted key order,
        // which makes model.mlmodel byte-reproducible (HashMap order is random per process).
        .btree_map(["."])
        .out_dir(&out_dir)
        .compile_fds(fds)?;
    Ok(())
}
