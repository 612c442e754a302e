//! JSON reports milkit prints (`--json`), as serde + schemars types. Each top-level report has
//! a checked-in JSON Schema generated from these types (`schemas/<name>.schema.json`); a test
//! regenerates the schemas and fails when they drift. Uses nothing else in milkit.
//!
//! Reports hold data only: verification findings are values here (a failed [`Check`]), never
//! errors.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A named, typed model feature (input, output or state) or tensor.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TensorInfo {
    pub name: String,
    /// MIL dtype name: `fp16`, `fp32`, `int32`, ...
    pub dtype: String,
    /// The shape (a flexible input's default shape).
    pub shape: Vec<u64>,
    /// A flexible input's accepted sizes per dimension, `[lower, upper]`, inclusive (upper
    /// −1: unbounded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape_range: Option<Vec<(u64, i64)>>,
    /// A flexible input's accepted shapes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enumerated_shapes: Option<Vec<Vec<u64>>>,
}

/// Op counts of one function, nested blocks included.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FunctionOps {
    pub name: String,
    /// Opset of the function, as the program names it (`CoreML8`).
    pub opset: String,
    pub total_ops: u64,
    /// op type → count.
    pub ops: BTreeMap<String, u64>,
}

/// Tensors and bytes of one storage kind.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StorageBytes {
    pub tensors: u64,
    pub bytes: u64,
}

/// Constant data by how it is stored. Keys of `by_storage`: `fp16`, `fp32` (plain `const`
/// tensors), `lut1`..`lut8` (palettized: indices + look-up table; `lut8x2`, `lut4x4`, ...:
/// vector palettization, indices of 8 bits into entries of 2 values), `int4_blockwise`,
/// `int8_blockwise` (`constexpr_blockwise_shift_scale`: data + scale + offset), `other`
/// (everything else, e.g. int32 shape constants or affine-quantized weights).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct WeightSummary {
    pub by_storage: BTreeMap<String, StorageBytes>,
    /// Sum over all storage kinds.
    pub total_bytes: u64,
    /// Bytes stored for the inputs of `constexpr_*` ops.
    pub compressed_stored_bytes: u64,
    /// Bytes the `constexpr_*` outputs would take as dense fp16.
    pub compressed_dense_fp16_bytes: u64,
    /// `compressed_dense_fp16_bytes / compressed_stored_bytes`; absent without constexpr ops.
    pub compression_ratio: Option<f64>,
}

/// One file of a package.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FileSize {
    /// Relative to the package root, `/`-separated.
    pub path: String,
    pub bytes: u64,
}

/// `milkit inspect --json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct InspectReport {
    /// The package path as given.
    pub package: String,
    pub spec_version: i32,
    /// Highest opset of any function (`CoreML8`) and its deployment target (`ios18`).
    pub opset: String,
    pub target: String,
    pub inputs: Vec<TensorInfo>,
    pub outputs: Vec<TensorInfo>,
    pub states: Vec<TensorInfo>,
    pub short_description: String,
    pub user_defined: BTreeMap<String, String>,
    pub functions: Vec<FunctionOps>,
    pub weights: WeightSummary,
    /// Every regular file of the package, sorted by path.
    pub files: Vec<FileSize>,
    pub total_file_bytes: u64,
}

/// One verification check. Failed checks are listed in [`VerifyReport::mismatches`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Check {
    /// Stable identifier, e.g. `types_reinferred`, `opset`, `positional_embedding`, `abi`,
    /// `lut_ops`, `ops.conv`.
    pub name: String,
    pub ok: bool,
    pub expected: String,
    pub actual: String,
}

/// An op, by type and name.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct OpRef {
    pub op_type: String,
    pub name: String,
}

/// An op the function's opset does not have.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct OpsetViolation {
    pub function: String,
    pub op_type: String,
    pub name: String,
    pub opset: String,
    /// The first opset that has the op, when milkit knows the op at all.
    pub available_since: Option<String>,
}

/// One `constexpr_*` op (a compressed weight decoded at load time).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ConstexprOp {
    pub function: String,
    pub op_type: String,
    pub name: String,
    /// Storage kind, as in [`WeightSummary::by_storage`].
    pub storage: String,
    pub output_shape: Vec<u64>,
    pub stored_bytes: u64,
    pub dense_fp16_bytes: u64,
    /// The ops its output feeds.
    pub feeds: Vec<OpRef>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ConstexprSummary {
    /// op type → count, all functions.
    pub counts: BTreeMap<String, u64>,
    pub ops: Vec<ConstexprOp>,
}

/// Whether the positional embedding was left a plain fp16 constant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PositionalStatus {
    /// Every match is a plain fp16 `const`.
    Untouched,
    /// A match is produced by a `constexpr_*` op.
    Compressed,
    /// A match is a `const` of another dtype.
    NotFp16,
    /// No constant named like a positional embedding.
    Absent,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PositionalEntry {
    pub function: String,
    pub op_type: String,
    pub name: String,
    pub dtype: String,
    pub shape: Vec<u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PositionalReport {
    pub status: PositionalStatus,
    pub entries: Vec<PositionalEntry>,
}

/// Result of an I/O ABI check.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AbiReport {
    /// `whispercpp` or `whisperkit`.
    pub expected: String,
    /// `encoder` or `decoder` when the inputs identify one.
    pub component: Option<String>,
    pub ok: bool,
    pub problems: Vec<String>,
    /// Sizes read off the features: `n_mels`, `d_model`, `kv_width`, `layers`, `vocab`.
    pub dims: BTreeMap<String, u64>,
}

/// A compute unit, or none for ops evaluated when the model loads.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
pub enum ComputeUnit {
    #[serde(rename = "ANE")]
    Ane,
    #[serde(rename = "GPU")]
    Gpu,
    #[serde(rename = "CPU")]
    Cpu,
    #[serde(rename = "load-time")]
    LoadTime,
}

impl ComputeUnit {
    pub fn label(self) -> &'static str {
        match self {
            ComputeUnit::Ane => "ANE",
            ComputeUnit::Gpu => "GPU",
            ComputeUnit::Cpu => "CPU",
            ComputeUnit::LoadTime => "load-time",
        }
    }
}

/// One row of the placement rule table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RuleInfo {
    pub id: String,
    /// Unit the rule sends an op to, or `none` for informational rules.
    pub effect: String,
    pub statement: String,
    pub source: String,
}

/// What Core ML's MLComputePlan said about one op.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct MeasuredPlacement {
    /// `ANE`, `GPU`, `CPU`, or `none` when the plan gives no device for the op.
    pub preferred: String,
    pub supported: Vec<String>,
    /// MLComputePlan's relative cost estimate, when it gives one.
    pub cost: Option<f64>,
}

/// Predicted placement of one op.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PlacementRow {
    pub function: String,
    pub op_type: String,
    pub name: String,
    /// The op's first output variable (how MLComputePlan results are matched to it).
    pub output: String,
    pub unit: ComputeUnit,
    /// Always `predicted`: milkit does not run Core ML.
    pub basis: String,
    /// Ids of the rules that fired.
    pub rules: Vec<String>,
    /// Estimated floating-point operations per prediction.
    pub flops: u64,
    /// Estimated bytes read and written per prediction.
    pub bytes: u64,
    /// Filled by `--measured` on macOS.
    pub measured: Option<MeasuredPlacement>,
}

/// Totals of one unit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct UnitTotal {
    pub unit: ComputeUnit,
    pub ops: u64,
    pub flops: u64,
    pub bytes: u64,
    /// Fractions of the run-time totals (load-time ops excluded).
    pub flops_share: f64,
    pub bytes_share: f64,
}

/// Agreement between prediction and MLComputePlan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct MeasuredSummary {
    pub source: String,
    pub matched_ops: u64,
    pub agree: u64,
    pub disagree: u64,
    pub unmatched: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PlacementReport {
    pub basis: String,
    pub rules: Vec<RuleInfo>,
    pub ops: Vec<PlacementRow>,
    pub totals: Vec<UnitTotal>,
    pub measured: Option<MeasuredSummary>,
}

/// sha256 of one file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FileDigest {
    pub path: String,
    pub bytes: u64,
    pub sha256: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Digests {
    /// sha256 of `model.mlmodel`.
    pub model_mlmodel: String,
    /// sha256 of `weight.bin`, when the package has one.
    pub weight_bin: Option<String>,
    /// sha256 over the sorted lines `<relative path>\0<sha256 hex>\n` of every file.
    pub package: String,
}

/// What was verified, by which milkit, with which command.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Receipt {
    pub tool: String,
    pub version: String,
    pub command_line: Vec<String>,
    pub package: String,
    pub digests: Digests,
    pub files: Vec<FileDigest>,
}

/// `milkit verify --json`: the checks, everything `inspect` reports, the compressed-weight
/// and positional-embedding analysis, optional placement, and a receipt.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct VerifyReport {
    /// True when every check holds.
    pub ok: bool,
    /// One line per failed check.
    pub mismatches: Vec<String>,
    pub checks: Vec<Check>,
    pub model: InspectReport,
    pub opset_violations: Vec<OpsetViolation>,
    pub constexpr: ConstexprSummary,
    pub positional_embedding: PositionalReport,
    pub abi: Option<AbiReport>,
    pub placement: Option<PlacementReport>,
    pub receipt: Receipt,
}

/// One clip's result.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ClipResult {
    /// The clip's path as the manifest names it.
    pub audio: String,
    /// The manifest's transcript.
    pub reference: String,
    /// milkit's transcript.
    pub hypothesis: String,
    /// Word edits (substitutions + deletions + insertions) after normalisation.
    pub errors: usize,
    /// Words in the normalised reference.
    pub words: usize,
    /// errors / words.
    pub wer: f64,
}

/// `milkit eval --json`.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct EvalReport {
    /// The models folder evaluated.
    pub models: String,
    /// The manifest read.
    pub manifest: String,
    /// How texts are normalised before scoring.
    pub normalization: String,
    pub clips: Vec<ClipResult>,
    /// Corpus totals: Σ errors / Σ words.
    pub errors: usize,
    pub words: usize,
    pub wer: f64,
    /// Bits per compressed weight of the folder's packages (what the WER was bought with).
    pub bits: FolderBits,
}

/// The compressed weights of one package.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PackageBits {
    /// The package's file name inside the folder.
    pub package: String,
    /// Elements the package's final `constexpr_*` outputs hold (its compressed weights).
    pub compressed_elements: u64,
    /// Bytes stored for those ops' inputs.
    pub compressed_stored_bytes: u64,
    /// 8 × stored bytes ÷ elements; absent when nothing is compressed.
    pub avg_bits: Option<f64>,
}

/// The compressed weights of a whole folder.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FolderBits {
    /// Every `.mlpackage` of the folder, by name.
    pub packages: Vec<PackageBits>,
    /// Sums over the packages.
    pub compressed_elements: u64,
    pub compressed_stored_bytes: u64,
    /// 8 × Σ stored bytes ÷ Σ elements over all packages; absent when nothing is compressed.
    pub avg_bits: Option<f64>,
}

/// One clip's fidelity numbers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FidelityClip {
    pub audio: String,
    /// Decoder positions compared (the baseline's tokens and its end-of-text).
    pub positions: usize,
    /// Mean over positions of KL(baseline ‖ candidate), in nats, of the next-token
    /// distributions after the decoding rules' masks.
    pub mean_kl: f64,
    pub max_kl: f64,
    /// Share of positions where the candidate's greedy choice is the baseline's token.
    pub top1_agreement: f64,
    /// 10·log10(peak² / MSE) of the encoder output, peak = max |baseline|; None when the two
    /// outputs are identical (infinite PSNR).
    pub encoder_psnr_db: Option<f64>,
    pub encoder_cosine: f64,
    pub baseline_text: String,
    pub candidate_text: String,
    /// Word edits of the candidate's transcript against the baseline's, and its words.
    pub errors_vs_baseline: usize,
    pub baseline_words: usize,
    /// WER of each against the reference text, when the clip has one.
    pub baseline_wer: Option<f64>,
    pub candidate_wer: Option<f64>,
    /// Word edits of each against the reference text and the reference's words, when the
    /// clip has one (what the corpus WER difference and its interval are summed from).
    #[serde(default)]
    pub baseline_errors: Option<usize>,
    #[serde(default)]
    pub candidate_errors: Option<usize>,
    #[serde(default)]
    pub reference_words: Option<usize>,
}

/// The candidate's corpus WER minus the baseline's on the same clips, with a paired
/// bootstrap interval: clips resampled with replacement (both folders' errors of a clip
/// kept together), the difference of Σ errors ÷ Σ words per resample.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct WerDelta {
    /// Corpus WER of the baseline and of the candidate against the references, in percent.
    pub baseline_wer_pct: f64,
    pub candidate_wer_pct: f64,
    /// candidate − baseline, in percentage points.
    pub delta_points: f64,
    /// The 2.5 % and 97.5 % quantiles of the resampled differences (points).
    pub ci95_low: f64,
    pub ci95_high: f64,
    /// Clips with a reference text, and the resamples drawn (fixed seed: reproducible).
    pub clips: usize,
    pub resamples: usize,
}

/// `milkit eval --against --json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FidelityReport {
    pub candidate: String,
    pub baseline: String,
    pub clips: Vec<FidelityClip>,
    /// Position-weighted mean KL over all clips (nats).
    pub mean_kl: f64,
    /// Position-weighted top-1 agreement over all clips.
    pub top1_agreement: f64,
    /// Mean over clips of the encoder PSNR (dB; clips with identical outputs left out, None
    /// when all are identical) and cosine.
    pub encoder_psnr_db: Option<f64>,
    pub encoder_cosine: f64,
    /// Σ edits ÷ Σ words of the candidate's transcripts against the baseline's.
    pub wer_vs_baseline: f64,
    /// Share of clips whose WER against the reference is not worse than the baseline's
    /// (None when no clip has a reference text).
    pub qoi: Option<f64>,
    /// Corpus WER difference against the references with its interval (None when no clip
    /// has a reference text).
    #[serde(default)]
    pub wer_delta: Option<WerDelta>,
}

/// The JSON Schema of a report type, as checked in under `schemas/`.
pub fn schema_json<T: JsonSchema>() -> String {
    let schema = schemars::schema_for!(T);
    let mut s = serde_json::to_string_pretty(&schema).expect("a JSON schema serializes");
    s.push('\n');
    s
}

/// (file name under `schemas/`, schema text) for every report with a checked-in schema.
pub fn all_schemas() -> Vec<(&'static str, String)> {
    vec![
        ("verify.schema.json", schema_json::<VerifyReport>()),
        ("inspect.schema.json", schema_json::<InspectReport>()),
        ("compress.schema.json", schema_json::<CompressReport>()),
        ("bench-audio.schema.json", schema_json::<AudioBenchReport>()),
        ("eval.schema.json", schema_json::<EvalReport>()),
        ("fidelity.schema.json", schema_json::<FidelityReport>()),
        ("folder-bits.schema.json", schema_json::<FolderBits>()),
        (
            "bench-decode.schema.json",
            schema_json::<DecodeBenchReport>(),
        ),
        (
            "transcription.schema.json",
            schema_json::<TranscriptionResult>(),
        ),
        ("gate.schema.json", schema_json::<GateReport>()),
        ("bench-whole.schema.json", schema_json::<WholeBenchReport>()),
    ]
}

/// `milkit gate`: go or kill.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum GateVerdict {
    Go,
    Kill,
}

/// How one rung of the gate ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RungStatus {
    Pass,
    Fail,
    /// Not reached: an earlier rung failed and `--all` was not given.
    NotRun,
}

/// One rung: its number (1 = cheapest), name, outcome and the reasons it failed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GateRung {
    pub rung: u32,
    pub name: String,
    pub status: RungStatus,
    pub reasons: Vec<String>,
}

/// The limits the gate applied (from its flags).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GateThresholds {
    /// Largest allowed WER regression over the held-out clips, in percentage points.
    pub max_wer_regression_points: f64,
    /// Smallest allowed ratio of the compressed weights' fp16 bytes to their stored bytes,
    /// per package with compressed weights.
    pub min_compression: f64,
    /// Parity: smallest allowed SNR (dB) and cosine of every probe's output.
    pub min_parity_snr_db: f64,
    pub min_parity_cosine: f64,
    /// Timestamps: a baseline segment boundary agrees when the candidate has one within this
    /// many seconds; at least `min_timestamp_agreement` of them must.
    pub timestamp_tolerance_s: f64,
    pub min_timestamp_agreement: f64,
    /// Expected `constexpr_lut_to_dense` count per package (file name → count).
    pub expected_lut_ops: BTreeMap<String, u64>,
}

/// Rung 1 for one package present in both folders.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GatePackage {
    /// File name inside the folders (`AudioEncoder.mlpackage`).
    pub package: String,
    /// Inputs, outputs and states (name, dtype, shape) equal.
    pub abi_equal: bool,
    pub abi_differences: Vec<String>,
    /// Op histograms over all functions, side by side.
    pub baseline_ops: BTreeMap<String, u64>,
    pub candidate_ops: BTreeMap<String, u64>,
    /// The candidate's `constexpr_*` ops by kind.
    pub candidate_constexpr: BTreeMap<String, u64>,
    pub lut_ops: u64,
    pub expected_lut_ops: Option<u64>,
    pub positional_embedding: PositionalStatus,
    /// The candidate's compressed weights: their dense fp16 bytes, the bytes stored, and the
    /// ratio (None when the package has no compressed weight).
    pub compressed_fp16_bytes: u64,
    pub compressed_stored_bytes: u64,
    pub compression_ratio: Option<f64>,
    /// sha256 over every file of each package (the verify receipt's tree digest).
    pub baseline_sha256: String,
    pub candidate_sha256: String,
}

/// Rung 2 for one package: material ops (conv, linear, matmul, attention) placed on the
/// Neural Engine in the baseline and where the candidate's same-named ops are placed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GatePlacement {
    pub package: String,
    /// `predicted` (milkit's rules) — `measured` needs MLComputePlan on macOS.
    pub basis: String,
    pub baseline_ane_material_ops: u64,
    pub candidate_ane_material_ops: u64,
    /// Ops on the ANE in the baseline predicted elsewhere (or missing) in the candidate.
    pub moved_off_ane: Vec<String>,
}

/// Rung 3: one probe's output, candidate against baseline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GateProbe {
    /// `encoder` or `decoder`.
    pub component: String,
    /// `speech`, `silence` or `stress`.
    pub probe: String,
    /// Values compared.
    pub values: u64,
    pub max_abs_error: f64,
    pub mean_abs_error: f64,
    pub cosine: f64,
    /// 10·log10(Σ baseline² / Σ error²); None when the outputs are identical.
    pub snr_db: Option<f64>,
}

/// Rung 4 for one clip (both folders decode it the same way: timestamps, temperature
/// fallback, no-speech skipping, as `milkit transcribe`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GateClip {
    pub audio: String,
    /// A smoke clip: its text must not regress at all.
    pub smoke: bool,
    pub reference: Option<String>,
    pub baseline_text: String,
    pub candidate_text: String,
    /// Word edits against the reference (when there is one) and its words.
    pub baseline_errors: Option<usize>,
    pub candidate_errors: Option<usize>,
    pub reference_words: Option<usize>,
    /// Word edits of the candidate's transcript against the baseline's, and its words.
    pub errors_vs_baseline: usize,
    pub baseline_words: usize,
    /// Baseline segment boundaries (starts and ends) and how many the candidate matches.
    pub timestamp_boundaries: usize,
    pub timestamps_matched: usize,
    /// Per decoded window: skipped as silence (no-speech decision).
    pub baseline_silent: Vec<bool>,
    pub candidate_silent: Vec<bool>,
}

/// Rung 4 over all clips.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GateEndToEnd {
    pub clips: Vec<GateClip>,
    /// `reference` when every held-out clip has a reference text (WER against the truth),
    /// else `baseline transcript` (the candidate's WER against the baseline's output).
    pub measured_against: String,
    /// Held-out WERs (Σ edits ÷ Σ words; the baseline's is 0 against its own transcript).
    pub baseline_wer: f64,
    pub candidate_wer: f64,
    /// candidate − baseline, in percentage points.
    pub wer_regression_points: f64,
    /// Matched ÷ baseline boundaries over all clips (1 when there are none).
    pub timestamp_agreement: f64,
    /// Every window's no-speech decision equal.
    pub no_speech_agreement: bool,
}

/// `milkit gate --json`: the cheapest-falsifier ladder of a candidate models folder against
/// its baseline, every measured number, and the command line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GateReport {
    pub tool: String,
    pub version: String,
    pub command_line: Vec<String>,
    pub candidate: String,
    pub baseline: String,
    pub verdict: GateVerdict,
    /// The first failed rung and its first reason.
    pub failed_rung: Option<u32>,
    pub reason: Option<String>,
    pub thresholds: GateThresholds,
    pub rungs: Vec<GateRung>,
    pub packages: Vec<GatePackage>,
    pub placement: Vec<GatePlacement>,
    pub parity: Vec<GateProbe>,
    pub end_to_end: Option<GateEndToEnd>,
}

/// `milkit bench decode --model HF_DIR --json`: decoder ms per token against the
/// weight-stream floor, per weight form and kernel level.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DecodeBenchReport {
    /// Always `decode`.
    pub suite: String,
    /// One row per (variant, kernel level), in the order timed.
    pub rows: Vec<DecodeBenchRow>,
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DecodeBenchRow {
    /// Weight form: `fp16`, `head-LUT4`, `all-LUT4`, `int4 block32`.
    pub variant: String,
    /// Kernel level the products ran on: `avx512`, `avx2` or `portable`.
    pub isa: String,
    /// The timed pass with the median ratio to its own floor.
    pub ms_per_token: f64,
    /// weight_bytes + cross_kv_bytes.
    pub bytes_per_token: u64,
    /// Stored bytes of the weights one token reads (compressed weights at their stored size).
    pub weight_bytes: u64,
    /// Cross-attention K/V one token reads (fp16).
    pub cross_kv_bytes: u64,
    /// Read bandwidth measured just before that pass on a buffer of bytes_per_token.
    pub bandwidth_gbps: f64,
    /// bytes_per_token ÷ bandwidth.
    pub floor_ms_per_token: f64,
    /// ms_per_token ÷ floor_ms_per_token.
    pub ratio: f64,
    /// Building the session from the in-memory program.
    pub load_ms: f64,
    /// The first call (cold caches, first allocations).
    pub first_call_ms: f64,
}

/// `milkit compress --json` / `milkit export --json` with compression flags.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct CompressReport {
    /// Method, e.g. `lut4-kmeans-g16` or `int4-block32`.
    pub mode: String,
    /// One row per compressed weight.
    pub ops: Vec<CompressedOp>,
    /// Weights left uncompressed with `--skip-indivisible`, and why.
    pub skipped: Vec<SkippedOp>,
    /// `--outlier-grouping`: hidden channels reordered (function-preserving) before
    /// compressing, so rows sharing a table are alike.
    #[serde(default)]
    pub regrouped: Vec<RegroupedChain>,
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

/// One chain `producer → activation → consumer` whose hidden channels were reordered.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct RegroupedChain {
    /// The op whose output rows were reordered, and its weight constant.
    pub producer: String,
    pub producer_weight: String,
    /// The op whose input columns follow the same order, and its weight constant.
    pub consumer: String,
    pub consumer_weight: String,
    /// The elementwise op type between them.
    pub activation: String,
    /// Hidden channels in the chain.
    pub channels: usize,
    /// Channels not in their original place.
    pub moved: usize,
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct SkippedOp {
    pub op: String,
    pub weight: String,
    pub shape: Vec<usize>,
    pub reason: String,
}

/// `milkit bench audio AUDIO --models DIR --json`: one transcription, timed by stage, next to the
/// decoder's weight-stream floor measured in the same run.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AudioBenchReport {
    /// Log-mel spectrogram of every 30-s window (Rust, or the MelSpectrogram package).
    pub mel_ms: f64,
    /// Audio encoder of every window, plus the CrossKV model when the folder has one.
    pub encoder_ms: f64,
    /// FLOPs of one window's encoder (plus CrossKV) contractions — `conv`, `linear`,
    /// `matmul`: 2·k per output element — in 10^9.
    pub encoder_gflop: f64,
    /// encoder_gflop × windows / encoder_ms: the encoder's rate, in 10^9 FLOP/s.
    pub encoder_gflops: f64,
    /// Decoder time divided by decoder calls (prompt tokens included).
    pub decoder_ms_per_token: f64,
    /// The decoder model's own calls (without the decoding rules' work between them),
    /// without the first call of each decoding pass: the steady per-token time of the
    /// model, which the floor below bounds (the floor counts what a window's tokens share
    /// once).
    pub decoder_warm_ms_per_token: f64,
    /// The first call of a decoding pass, on average: one token plus what the decoder
    /// computes once per window (a WhisperKit decoder's cross-attention K/V projection).
    pub decoder_first_call_ms: f64,
    /// Bytes one token's decoder call must read, with the values a window's tokens share
    /// (the encoder output and whatever is computed from it alone) computed once per
    /// window: the stored weights of the ops that run every token (compressed weights as
    /// stored; embedding tables only gathered from count one row; the cross-attention K/V
    /// projections count 0), plus the cross-attention keys/values those ops read
    /// (layers × 2 × frames × d elements), plus every per-token input: the self-attention
    /// caches (inputs or states), the masks and the token.
    pub decoder_bytes_per_token: u64,
    /// Best read bandwidth over several passes of streaming a buffer of exactly
    /// `decoder_bytes_per_token` bytes with all threads, in 10^9 bytes per second.
    pub bandwidth_gbps: f64,
    /// decoder_bytes_per_token / bandwidth: the time per token a decoder bound by reading its
    /// weights cannot beat.
    pub floor_ms_per_token: f64,
    /// The median of the decoder model's warm calls (as `decoder_warm_ms_per_token`, over
    /// every timed run), in ms.
    pub decoder_warm_median_ms: f64,
    /// The median time of the bandwidth passes (taken after each timed run), scaled to
    /// `decoder_bytes_per_token`, in ms: set against `decoder_warm_median_ms`, a median
    /// against a median, where `floor_ms_per_token` (the best pass) is a best case that a
    /// shared machine's swings move.
    pub floor_median_ms: f64,
    /// The whole transcription (models already loaded).
    pub total_ms: f64,
    /// faster-whisper on the same audio in the same run (`--compare-faster-whisper`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub faster_whisper: Option<FasterWhisperRun>,
}

/// What tools/faster_whisper_bench.py reported.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FasterWhisperRun {
    pub total_ms: f64,
    pub text: String,
    /// milkit total_ms / faster-whisper total_ms.
    pub ratio: f64,
}

/// One tool's side of `milkit bench whole`: its command line, wall time and peak resident
/// memory over the timed runs (the warm-up run not counted).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WholeSide {
    /// `milkit` or `faster-whisper`.
    pub tool: String,
    /// The command as run (program and arguments).
    pub command: Vec<String>,
    /// Wall time of each timed run, from spawn to exit, in ms (run order).
    pub wall_ms: Vec<f64>,
    /// Peak resident set of each timed run (the kernel's `ru_maxrss` of the child), in MB.
    pub peak_rss_mb: Vec<f64>,
    pub wall_ms_median: f64,
    pub peak_rss_mb_median: f64,
    /// The transcript of the last run.
    pub text: String,
}

/// `milkit bench whole --json`: whole process against whole process, alternating.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WholeBenchReport {
    pub audio: String,
    /// Threads each tool was given.
    pub threads: usize,
    pub runs: usize,
    pub sides: Vec<WholeSide>,
    /// Per run, milkit's wall time over the other tool's in the same pair (absent without
    /// a second tool); then their median, min and max.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub wall_ratios: Vec<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rss_ratios: Vec<f64>,
}

/// What an audio file held before it became 16 kHz mono: its container and codec, its own
/// rate and channel count, and its duration (`milkit transcribe --output-format json`, under
/// `audio`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AudioInfo {
    /// `wav`, `flac`, `mp3`, `ogg`, `m4a`, ... (from the file name where it names one).
    pub container: String,
    /// `pcm_s16`, `flac`, `mp3`, `vorbis`, `opus`, `aac`, `alac`, ...
    pub codec: String,
    /// The stream's own rate, before resampling.
    pub sample_rate: u32,
    /// The stream's channels, averaged into one.
    pub channels: u32,
    /// Seconds of decoded audio (encoder delay and padding removed where the file states them).
    pub duration_s: f64,
    /// Packets the codec rejected and that were skipped (as ffmpeg does); at most a tenth of
    /// the stream, else the file is refused.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub skipped_packets: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// `milkit transcribe --output-format json`: openai-whisper's `transcribe()` result, field
/// for field (`text`, `segments`, `language`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TranscriptionResult {
    /// The whole transcript, as the tokenizer renders it (usually starting with a space).
    pub text: String,
    pub segments: Vec<TranscriptionSegment>,
    /// Language code (`en`, `de`, ...): given, detected, or the English-only model's.
    pub language: String,
    /// The file that was transcribed (milkit's addition; absent for samples given directly).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audio: Option<AudioInfo>,
}

/// One segment of a [`TranscriptionResult`] (openai-whisper's segment dict).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TranscriptionSegment {
    /// Index over the whole result, from 0.
    pub id: u64,
    /// Start of the segment's 30-s window, in 10-ms mel frames from the file start.
    pub seek: u64,
    /// Seconds from the file start.
    pub start: f64,
    pub end: f64,
    pub text: String,
    /// Generated token ids, timestamp tokens included.
    pub tokens: Vec<u32>,
    /// Sampling temperature of the decode that was kept (0 for greedy).
    pub temperature: f64,
    /// Mean log-probability of the window's generated tokens.
    pub avg_logprob: f64,
    /// UTF-8 bytes of the window's text ÷ its zlib-compressed bytes.
    pub compression_ratio: f64,
    /// Probability of `<|nospeech|>` at the `<|startoftranscript|>` position.
    pub no_speech_prob: f64,
    /// Word timings (`--word-timestamps`); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub words: Option<Vec<WordTiming>>,
}

/// One word of a segment, seconds from the file start.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WordTiming {
    /// The word as decoded, leading space and attached punctuation included.
    pub word: String,
    pub start: f64,
    pub end: f64,
    /// Mean probability of the word's tokens.
    pub probability: f64,
}
