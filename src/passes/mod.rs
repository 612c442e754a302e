//! Compression passes over the IR (and the instrumentation that calibration runs). Never runs the model. Uses `ir` and `ops`.
pub mod calibrate;
pub mod compress;
mod compress_report;
pub mod finite;
pub mod kmeans;
pub mod lut;
pub mod mixed;
pub mod quant;
mod quant_kernel;
pub mod regroup;
pub mod subbyte;
