//! `.mlpackage` reading and writing: the manifest, the weight blob file, conversion between
//! the IR and the protobuf specification, atomic output. Uses `ir`, `ops` (type inference on
//! load) and `proto`. Compiled models (`.mlmodelc`: `model.mil` text) open wherever a package
//! does.
pub mod blob;
pub mod compiled;
pub mod convert;
pub mod coremldata;
pub mod fsio;
pub mod load;
pub mod manifest;
pub mod mil_text;
pub mod mil_write;
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
            "{}: a compiled model without model.mil: not an ML Program (a NeuralNetwork or \
             other model type, which milkit does not run)",
            path.display()
        )
    } else {
        load::load_package(path)
    }
}

pub use save::save_package;
