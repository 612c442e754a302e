//! `.mlpackage` reading and writing.
pub mod blob;
pub mod fsio;
pub mod manifest;
