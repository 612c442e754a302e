//! The one description of a weight compression: [`CompressFlags`], the flags of `milkit
//! compress` and `milkit export` (clap) and the `[compress]` table of a recipe (serde), with
//! the same names and defaults; and what it means in the library's terms ([`Compression`]).

use super::bundle::Compression;
use crate::passes::calibrate::Calibration;
use crate::passes::compress::{Method, Selection};
use crate::passes::lut::{LutConfig, LutGranularity, LutMode, CLUSTER_DIMS, LUT_NBITS};
use crate::passes::quant::{QuantConfig, QuantDtype, QuantGranularity};
use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use serde::{Deserialize, Deserializer};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// A recipe's name for a CLI choice (`kmeans`, `int8`, `per-grouped-channel`, ...), read as
/// clap reads the flag (case-insensitive).
fn value_enum<'de, D: Deserializer<'de>, T: ValueEnum>(d: D) -> Result<Option<T>, D::Error> {
    let s = String::deserialize(d)?;
    T::from_str(&s, true).map(Some).map_err(|_| {
        let names: Vec<String> = T::value_variants()
            .iter()
            .filter_map(|v| v.to_possible_value().map(|p| p.get_name().to_string()))
            .collect();
        serde::de::Error::custom(format!(
            "unknown value `{s}` (expected {})",
            names.join(", ")
        ))
    })
}

/// The flags' defaults (a recipe's `[compress]` table starts from them too).
impl Default for CompressFlags {
    fn default() -> Self {
        CompressFlags {
            palettize: None,
            nbits: 4,
            quantize: None,
            granularity: None,
            group_size: 16,
            block_size: 32,
            asymmetric: false,
            op_types: vec!["conv".into(), "linear".into()],
            op_names: vec![],
            head_only: false,
            weight_threshold: 2048,
            skip_indivisible: false,
            calibration: vec![],
            target_bits: None,
            per_channel_scale: false,
            cluster_dim: 1,
            outlier_grouping: false,
            error_feedback: false,
            damping: 0.01,
            op_nbits: vec![],
        }
    }
}

#[allow(clippy::enum_variant_names)] // the names are the CLI vocabulary (per-tensor, per-block, ...)
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum Granularity {
    /// One table / scale for the whole weight.
    PerTensor,
    /// Palettization: one table per --group-size output channels.
    PerGroupedChannel,
    /// Quantization: one scale per output channel.
    PerChannel,
    /// Quantization: one scale per --block-size input channels of each output channel.
    PerBlock,
}

/// Weight compression (vocabulary of coremltools.optimize.coreml). Emits iOS18 ops.
#[derive(Args, Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CompressFlags {
    /// LUT palettization: k-means or uniform tables of 2^nbits fp16 entries.
    #[arg(long, value_enum, conflicts_with = "quantize")]
    #[serde(deserialize_with = "value_enum")]
    pub palettize: Option<LutMode>,
    /// Bits per palettized index: 1, 2, 3, 4, 6 or 8 (with --cluster-dim N one index stands
    /// for N weights, so the weights cost nbits / N bits each, plus the tables).
    #[arg(long, default_value_t = 4)]
    pub nbits: u32,
    /// Linear quantization to int4/uint4/int8/uint8 with fp16 scales.
    #[arg(long, value_enum)]
    #[serde(deserialize_with = "value_enum")]
    pub quantize: Option<QuantDtype>,
    /// Granularity; default per-grouped-channel for palettization, per-channel for quantization.
    #[arg(long, value_enum)]
    #[serde(deserialize_with = "value_enum")]
    pub granularity: Option<Granularity>,
    /// Output channels (axis 0) sharing one table with per-grouped-channel.
    #[arg(long, default_value_t = 16)]
    pub group_size: usize,
    /// Input channels (axis 1) sharing one scale with per-block.
    #[arg(long, default_value_t = 32)]
    pub block_size: usize,
    /// Quantization with an offset (zero point) instead of symmetric.
    #[arg(long)]
    pub asymmetric: bool,
    /// Consumer op types whose weights are compressed.
    #[arg(long, value_delimiter = ',', default_value = "conv,linear")]
    pub op_types: Vec<String>,
    /// Only these ops (exact names as `milkit inspect --mil` shows them; a consumer or its
    /// weight constant).
    #[arg(long, value_delimiter = ',')]
    pub op_names: Vec<String>,
    /// Text decoder only: compress exactly its vocabulary head — one conv per head chunk
    /// (`lm_head`, or `lm_head_0`..`lm_head_{N-1}` with --head-chunks N; `milkit inspect`
    /// lists them as `milkit.head_ops`) — and nothing else; the `embed_tokens` gather table
    /// stays fp16. The group size must divide the rows of every chunk.
    #[arg(long, conflicts_with = "op_names")]
    pub head_only: bool,
    /// Constants with at most this many elements are left as they are.
    #[arg(long, default_value_t = 2048)]
    pub weight_threshold: usize,
    /// Leave weights whose shape the group/block size does not divide uncompressed (each is
    /// listed) instead of refusing.
    #[arg(long)]
    pub skip_indivisible: bool,
    /// Data-aware k-means: statistics from `milkit calibrate` (safetensors). Each weight's
    /// squared error is weighted by its input channel's mean square on real audio, so
    /// channels that carry signal keep more precision. Without it, plain k-means. With
    /// `export --component all` give one file per component (repeat the flag: the encoder's
    /// and the decoder's statistics); each goes to the component it was measured on.
    #[arg(long, value_name = "STATS")]
    #[serde(skip)]
    pub calibration: Vec<PathBuf>,
    /// Mixed precision (with --palettize kmeans): measure each weight's output error at
    /// 2/3/4/6/8 bits (weighted by --calibration statistics when given, else plain weight
    /// error) and give more bits where they buy the most accuracy, never fewer than --nbits,
    /// keeping the average stored bits per compressed weight (tables included) within this
    /// budget, e.g. 4.25. A budget above 8 bits can also keep weights fp16 (16 bits, exact):
    /// the package names them (`milkit.kept_fp16`) and counts them in its bits per weight.
    /// The report lists the bits chosen per op. With `export --component all` (not
    /// --head-only) the budget is over the encoder and the decoder together: their weights
    /// are planned jointly, so either may end above or below it.
    #[arg(long, value_name = "BITS")]
    pub target_bits: Option<f64>,
    /// Palettization (iOS18 only): divide each output channel by its largest magnitude
    /// before fitting the tables and store that fp16 scale per channel (a
    /// constexpr_blockwise_shift_scale after the table op, the chain coremltools'
    /// enable_per_channel_scale emits, though coremltools 9 takes its maximum over the output
    /// channels instead), so channels of very different magnitudes share a table well.
    /// With --calibration the k-means still minimizes the error of the original weight.
    #[arg(long)]
    pub per_channel_scale: bool,
    /// Vector palettization (iOS18; with --palettize kmeans): 2 or 4 consecutive output
    /// channels at one input position share one --nbits index into a table of 2- or
    /// 4-value entries (coremltools' cluster_dim; the constexpr_lut_to_dense has
    /// vector_axis 0), clustered by k-means on the vectors. 1 = scalar tables. The group
    /// size (or the output channels, per tensor) must be a multiple of it. In a recipe:
    /// `cluster_dim = 2`.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub cluster_dim: usize,
    /// Outlier-aware grouping (grouped-channel palettization): before fitting the tables,
    /// reorder the hidden channels of every weight → activation → weight chain (Whisper's
    /// MLPs: fc1 → gelu → fc2) so that the output rows sharing a table have alike ranges —
    /// rows with outliers share tables among themselves instead of stretching the table of
    /// 15 ordinary rows. fc1's rows and bias and fc2's input columns move together, so the
    /// model computes the same function; calibration statistics follow the reordering.
    #[arg(long)]
    pub outlier_grouping: bool,
    /// Error feedback while rounding (GPTQ-style; needs --calibration statistics from this
    /// milkit's `calibrate`, which record each input's Gram matrix XᵀX): the tables (or
    /// int4/int8 scales) are set as usual, then each weight's input columns are rounded in
    /// order and every column's rounding error is pushed onto the columns not yet rounded,
    /// so the layer's output on the calibration audio moves least. Applies to linear ops and
    /// 1×1 convs; convs with wider kernels are compressed without it (the report's mode
    /// says `-error-feedback` where it was used). The output is the same standard constexpr
    /// ops.
    #[arg(long)]
    pub error_feedback: bool,
    /// With --error-feedback: the damping added to the Gram matrix's diagonal, as a share of
    /// its mean diagonal.
    #[arg(long, default_value_t = 0.01, requires = "error_feedback")]
    pub damping: f64,
    /// Palettization: fixed bit widths for named weights, NAME=BITS (an op or its weight
    /// constant, as --op-names takes them; BITS one of 1, 2, 3, 4, 6, 8), e.g. `lm_head_0=6`
    /// for the first row chunk of a head exported with --head-chunks. Every other selected
    /// weight gets --nbits; with --target-bits these widths are kept as they are and the
    /// rest is planned within what they leave of the budget (the average still counts them).
    /// In a recipe: `op_nbits = { lm_head_0 = 6 }`. Each name must be a weight the
    /// component compresses.
    #[arg(long, value_delimiter = ',', value_name = "NAME=BITS")]
    #[serde(deserialize_with = "op_widths")]
    pub op_nbits: Vec<String>,
}

/// A recipe's `op_nbits`: a table `{ lm_head_0 = 6 }` or, as the flag writes it, a list
/// `["lm_head_0=6"]`; kept in the flag's form.
fn op_widths<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Widths {
        Table(BTreeMap<String, u32>),
        List(Vec<String>),
    }
    match Widths::deserialize(d)? {
        Widths::Table(t) => Ok(t.into_iter().map(|(k, v)| format!("{k}={v}")).collect()),
        Widths::List(l) => Ok(l),
    }
}

/// `NAME=BITS` entries as a map, each width checked.
pub fn parse_op_widths(entries: &[String]) -> Result<BTreeMap<String, u32>> {
    let mut out = BTreeMap::new();
    for e in entries {
        let Some((name, bits)) = e.split_once('=') else {
            bail!("op_nbits entry `{e}` is not NAME=BITS (e.g. lm_head_0=6)");
        };
        let (name, bits) = (name.trim(), bits.trim());
        let Ok(b) = bits.parse::<u32>() else {
            bail!("op_nbits entry `{e}`: `{bits}` is not a whole number of bits");
        };
        if name.is_empty() || !LUT_NBITS.contains(&b) {
            bail!("op_nbits entry `{e}`: needs an op name and a width of 1, 2, 3, 4, 6 or 8 bits");
        }
        if out.insert(name.to_string(), b).is_some() {
            bail!("op_nbits names `{name}` twice");
        }
    }
    Ok(out)
}

impl CompressFlags {
    /// The requested method, if any compression was asked for.
    pub fn method(&self) -> Result<Option<Method>> {
        if let Some(mode) = self.palettize {
            let granularity = match self.granularity.unwrap_or(Granularity::PerGroupedChannel) {
                Granularity::PerTensor => LutGranularity::PerTensor,
                Granularity::PerGroupedChannel => LutGranularity::PerGroupedChannel(self.group_size),
                g => bail!("--granularity {g:?} is for --quantize; palettization takes per-tensor or per-grouped-channel"),
            };
            if !LUT_NBITS.contains(&self.nbits) {
                bail!("--nbits {} is not one of 1, 2, 3, 4, 6, 8", self.nbits);
            }
            if self.cluster_dim != 1 {
                if !CLUSTER_DIMS.contains(&self.cluster_dim) {
                    bail!("--cluster-dim {} is not 1, 2 or 4", self.cluster_dim);
                }
                if mode != LutMode::Kmeans {
                    bail!("--cluster-dim {} (vector palettization) takes --palettize kmeans: uniform tables are scalar", self.cluster_dim);
                }
                if self.target_bits.is_some() || !self.op_nbits.is_empty() {
                    bail!("--target-bits and --op-nbits plan scalar tables; they do not apply with --cluster-dim {}", self.cluster_dim);
                }
                if self.error_feedback {
                    bail!("--error-feedback rounds one element at a time; it does not apply with --cluster-dim {}", self.cluster_dim);
                }
            }
            return Ok(Some(Method::Palettize(LutConfig {
                mode,
                nbits: self.nbits,
                granularity,
                per_channel_scale: self.per_channel_scale,
                cluster_dim: self.cluster_dim,
            })));
        }
        if self.cluster_dim != 1 {
            bail!("--cluster-dim (vector palettization) applies to --palettize kmeans only");
        }
        if self.per_channel_scale {
            bail!("--per-channel-scale applies to --palettize only");
        }
        if self.outlier_grouping {
            bail!("--outlier-grouping orders the channels that share a table, so it applies to --palettize with per-grouped-channel tables only");
        }
        if let Some(dtype) = self.quantize {
            let granularity = match self.granularity.unwrap_or(Granularity::PerChannel) {
                Granularity::PerTensor => QuantGranularity::PerTensor,
                Granularity::PerChannel => QuantGranularity::PerChannel,
                Granularity::PerBlock => QuantGranularity::PerBlock(self.block_size),
                g => bail!("--granularity {g:?} is for --palettize; quantization takes per-tensor, per-channel or per-block"),
            };
            return Ok(Some(Method::Quantize(QuantConfig {
                dtype,
                granularity,
                symmetric: !self.asymmetric,
            })));
        }
        Ok(None)
    }

    /// The compression the flags ask for, if any (library form), for one package: at most
    /// one statistics file.
    pub fn compression(&self) -> Result<Option<Compression>> {
        if self.calibration.len() > 1 {
            bail!("--calibration given {} times; one package takes one statistics file (several only with export --component all)", self.calibration.len());
        }
        self.compression_for(None)
    }

    /// The compression of one component of a folder: the statistics file measured on
    /// `component` (`encoder`/`decoder`), if any; `None` = the only file, whatever it is.
    pub fn compression_for(&self, component: Option<&str>) -> Result<Option<Compression>> {
        let mut calibration = None;
        for p in &self.calibration {
            let c = Calibration::load(p)?;
            if component.is_none_or(|want| c.component() == want) {
                if calibration.is_some() {
                    bail!(
                        "two --calibration files were measured on the {}",
                        c.component()
                    );
                }
                calibration = Some(c);
            }
        }
        let op_nbits = parse_op_widths(&self.op_nbits)?;
        if !op_nbits.is_empty() && self.palettize.is_none() {
            bail!("--op-nbits (op_nbits) sets palettization widths; it needs --palettize");
        }
        Ok(self.method()?.map(|method| Compression {
            method,
            selection: self.selection(),
            head_only: self.head_only,
            calibration,
            target_bits: self.target_bits,
            nbits: Default::default(),
            regroup: self.outlier_grouping,
            error_feedback: self.error_feedback.then_some(self.damping),
            op_nbits,
        }))
    }

    pub fn selection(&self) -> Selection {
        Selection {
            op_types: self.op_types.clone(),
            op_names: self.op_names.clone(),
            weight_threshold: self.weight_threshold,
            skip_indivisible: self.skip_indivisible,
        }
    }
}
