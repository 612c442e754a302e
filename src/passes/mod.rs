//! Compression passes over the IR. Never runs the model. Uses `ir` and `ops`.
pub mod compress;
mod compress_report;
pub mod kmeans;
pub mod lut;
pub mod quant;
pub mod subbyte;
