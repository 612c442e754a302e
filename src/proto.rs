//! Generated protobuf types for Core ML model files (schema in `mil/`, compiled by build.rs).
//!
//! Paths:
//! - [`specification`]: package `CoreML.Specification` — `Model`, `ModelDescription`,
//!   `FeatureDescription`, `FeatureType`, `ArrayFeatureType`, `Metadata`, ...
//! - [`specification::mil_spec`] (alias [`mil`]): package `CoreML.Specification.MILSpec` —
//!   `Program`, `Function`, `Block`, `Operation`, `Value`, `TensorValue`, `DataType`, ...
//! - `NeuralNetwork`, `NeuralNetworkLayer` and every layer's parameters (generated in full by
//!   `tools/proto_subset.py`); the other model types as empty messages.
//!
//! Every map field is a `BTreeMap`, so encoding is deterministic (keys in byte order).
//! Field numbers equal Apple's; `tests/proto.rs` checks that against coremltools.

/// Package `CoreML.Specification`.
#[allow(clippy::all, missing_docs, rustdoc::all)]
pub mod specification {
    include!(concat!(env!("OUT_DIR"), "/core_ml.specification.rs"));

    /// Package `CoreML.Specification.MILSpec` (a child module because prost refers to it
    /// from the parent package as `mil_spec::...`).
    #[allow(clippy::all, missing_docs, rustdoc::all)]
    pub mod mil_spec {
        include!(concat!(
            env!("OUT_DIR"),
            "/core_ml.specification.mil_spec.rs"
        ));
    }

    /// Package `CoreML.Specification.CoreMLModels`: Apple's private-framework model types,
    /// as empty messages (milkit only names them).
    #[allow(clippy::all, missing_docs, rustdoc::all)]
    pub mod core_ml_models {
        include!(concat!(
            env!("OUT_DIR"),
            "/core_ml.specification.core_ml_models.rs"
        ));
    }
}

pub use specification::mil_spec as mil;

/// The encoded `google.protobuf.FileDescriptorSet` of `mil/*.proto`, as compiled by build.rs.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/coreml_descriptor_set.bin"));
