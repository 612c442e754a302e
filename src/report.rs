//! JSON report types.

/// `milkit compress --json` / `milkit export --json` with compression flags.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct CompressReport {
    /// Method, e.g. `lut4-kmeans-g16` or `int4-block32`.
    pub mode: String,
    /// One row per compressed weight.
    pub ops: Vec<CompressedOp>,
    /// Weights left uncompressed with `--skip-indivisible`, and why.
    pub skipped: Vec<SkippedOp>,
    /// Sum over the compressed weights of their fp16 bytes.
    pub bytes_before: u64,
    /// Sum over the compressed weights of their stored bytes (indices + tables, or data +
    /// scales + offsets).
    pub bytes_after: u64,
    /// bytes_before / bytes_after over the selected weights.
    pub ratio: f64,
    /// Mean over compressed weights of rms(w − decoded) / rms(w).
    pub mean_rel_rms_error: f64,
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct CompressedOp {
    /// The op that consumes the weight.
    pub op: String,
    pub op_type: String,
    /// The weight constant (now the constexpr op's output).
    pub weight: String,
    pub shape: Vec<usize>,
    pub mode: String,
    pub bytes_before: u64,
    pub bytes_after: u64,
    pub rel_rms_error: f64,
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct SkippedOp {
    pub op: String,
    pub weight: String,
    pub shape: Vec<usize>,
    pub reason: String,
}
