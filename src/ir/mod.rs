//! The MIL program model: Program / Function / Block / Operation / Var, value types (incl.
//! sub-byte integer types), tensor data and the Builder. Knows no op by name.
pub mod bytes;
pub use bytes::Bytes;
