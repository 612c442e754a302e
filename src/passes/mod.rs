//! Compression passes over the IR. Never runs the model.
pub mod kmeans;
pub mod lut;
pub mod quant;
pub mod subbyte;
