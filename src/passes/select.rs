//! Which weights a compression pass (and calibration, which measures the same weights) takes:
//! the [`Selection`] by consumer op type, op name and size, and the positional embedding that
//! is never taken. A leaf of `passes`, shared by `compress`, `calibrate`, `mixed` and
//! `regroup`.

/// Which weights to compress.
#[derive(Clone, Debug)]
pub struct Selection {
    /// Consumer op types whose weight input is compressed (default conv, linear).
    pub op_types: Vec<String>,
    /// If non-empty, only consumers (or weight constants) with these exact names.
    pub op_names: Vec<String>,
    /// Constants with at most this many elements are left as they are.
    pub weight_threshold: usize,
    /// Skip (and list) weights whose shape the granularity does not divide, instead of
    /// refusing the whole run.
    pub skip_indivisible: bool,
}

impl Default for Selection {
    fn default() -> Self {
        Selection {
            op_types: vec!["conv".into(), "linear".into()],
            op_names: vec![],
            weight_threshold: 2048,
            skip_indivisible: false,
        }
    }
}

/// Names that identify a positional embedding, which is never compressed (its error shifts
/// every frame).
pub fn is_positional(name: &str) -> bool {
    name.contains("embed_positions") || name.contains("positional")
}
