//! Compression passes over the IR (and the instrumentation that calibration runs). Never runs
//! the model. Uses `ir`, `ops`, `report` (the compression report) and `package::fsio` (the
//! calibration statistics are written atomically).
pub mod calibrate;
pub mod compress;
mod compress_report;
pub mod feedback;
pub mod finite;
pub mod kmeans;
pub mod kmeans_vec;
pub mod lut;
pub mod mixed;
pub mod quant;
mod quant_config;
mod quant_kernel;
pub mod regroup;
mod select;
pub mod subbyte;
