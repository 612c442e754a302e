//! `.mlpackage` reading and writing: the manifest, the weight blob file, conversion between
//! the IR and the protobuf specification, atomic output. Uses `ir`, `ops` (type inference on
//! load) and `proto`.
pub mod blob;
pub mod convert;
pub mod fsio;
pub mod load;
pub mod manifest;
pub mod save;

pub use load::load_package;
pub use save::save_package;
