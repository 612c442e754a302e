//! `.mlpackage` reading and writing.
pub mod blob;
