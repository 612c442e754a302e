//! Generated protobuf types (see mil/ and build.rs).
