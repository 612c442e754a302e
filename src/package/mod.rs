//! `.mlpackage` reading and writing: the manifest, the weight blob file, conversion between
//! the IR and the protobuf specification, atomic output. Uses `ir`, `ops` (type inference on
//! load) and `proto`. Compiled models (`.mlmodelc`: `model.mil` text) open wherever a package
//! does. NeuralNetwork models are translated into ML Programs as they load
//! ([`neural_network`]); other model types are refused by name.
pub mod blob;
pub mod compiled;
pub mod convert;
pub mod coremldata;
pub mod fsio;
pub mod load;
pub mod manifest;
pub mod mil_text;
pub mod mil_write;
pub mod neural_network;
pub mod save;

/// Reads and checks an `.mlpackage`, a single-file `.mlmodel`, or a compiled `.mlmodelc`
/// folder (refused when its weights are absent).
pub fn load_package(path: &std::path::Path) -> anyhow::Result<crate::ir::Model> {
    if compiled::is_compiled(path) {
        compiled::load_compiled(path)
    } else if path.is_dir()
        && path.extension().is_some_and(|e| e == "mlmodelc")
        && !path.join("Manifest.json").exists()
    {
        anyhow::bail!(
            "{}: a compiled model without model.mil: not an ML Program but a NeuralNetwork or \
             other model type, compiled into a format Apple does not document; milkit runs \
             these from their .mlmodel file",
            path.display()
        )
    } else {
        load::load_package(path)
    }
}

pub use save::save_package;
