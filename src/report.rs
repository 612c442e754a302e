//! JSON report types.
