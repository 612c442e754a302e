//! Whole conversions into one output folder: any Whisper component built from an opened
//! checkpoint ([`Checkpoint`], each of its files read once for the whole folder) and
//! compressed as asked, and the WhisperKit model folder — MelSpectrogram,
//! AudioEncoder, TextDecoder (+ TextDecoderContextPrefill for multilingual models, + CrossKV
//! with precomputed cross-attention) next to the checkpoint's config.json,
//! generation_config.json, tokenizer.json and preprocessor_config.json. Folders are written
//! atomically: into a temporary directory beside the target, renamed when complete.

use super::decoder_export::{
    export_cross_kv, export_decoder, export_prefill, head_only_selection, head_op_names, head_ops,
    DecoderExport, HEAD_OPS_KEY,
};
use super::export::{export_encoder, export_mel};
use crate::ir::{Model, Opset};
use crate::package::fsio::write_package_atomically;
use crate::package::save::write_package_dir_new;
use crate::passes::calibrate::Calibration;
use crate::passes::compress::{compress_with, selected_weights, Method, Outcome, Selection};
use crate::passes::lut::{LutConfig, LutMode};
use crate::passes::mixed::{candidates_for, plan_bits_fixed, plan_bits_joint, MixedPlan, PlanPart};
use crate::passes::regroup::{regroup, Regrouped};
use crate::whisper::checkpoint::{missing_tokenizer_error, Checkpoint};
use crate::whisper::decoder::CrossKv;
use crate::whisper::encoder::EncoderAbi;
use crate::whisper::head_pad::{pad_head_rows_of, row_multiple};
use anyhow::{bail, ensure, Context, Result};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;

/// WhisperKit's package file names.
pub const MEL_FILE: &str = "MelSpectrogram.mlpackage";
pub const ENCODER_FILE: &str = "AudioEncoder.mlpackage";
pub const DECODER_FILE: &str = "TextDecoder.mlpackage";
pub const PREFILL_FILE: &str = "TextDecoderContextPrefill.mlpackage";
pub const CROSS_KV_FILE: &str = "CrossKV.mlpackage";

/// Checkpoint files copied into a WhisperKit folder: (name, required).
pub const MODEL_FILES: [(&str, bool); 4] = [
    ("config.json", true),
    ("generation_config.json", true),
    ("tokenizer.json", true),
    ("preprocessor_config.json", false),
];

/// One exportable model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Component {
    Mel,
    Encoder,
    Decoder,
    CrossKv,
    Prefill,
}

impl Component {
    /// From the CLI/recipe name: mel, encoder, decoder, crosskv, prefill.
    pub fn parse(s: &str) -> Result<Component> {
        Ok(match s {
            "mel" => Component::Mel,
            "encoder" => Component::Encoder,
            "decoder" => Component::Decoder,
            "crosskv" | "cross-kv" | "cross_kv" => Component::CrossKv,
            "prefill" => Component::Prefill,
            o => bail!(
                "unknown component `{o}` (expected mel, encoder, decoder, crosskv or prefill)"
            ),
        })
    }

    /// The file name WhisperKit loads this model from.
    pub fn whisperkit_file(self) -> &'static str {
        match self {
            Component::Mel => MEL_FILE,
            Component::Encoder => ENCODER_FILE,
            Component::Decoder => DECODER_FILE,
            Component::CrossKv => CROSS_KV_FILE,
            Component::Prefill => PREFILL_FILE,
        }
    }
}

/// Weight compression of one model.
#[derive(Clone, Debug)]
pub struct Compression {
    pub method: Method,
    pub selection: Selection,
    /// Only the vocabulary head of a text decoder (one op per head chunk); the selection's
    /// op types and names are replaced by the head's.
    pub head_only: bool,
    /// Statistics from `milkit calibrate`: data-aware (weighted) k-means.
    pub calibration: Option<Calibration>,
    /// Mixed precision within this average of stored bits per weight (needs calibration).
    pub target_bits: Option<f64>,
    /// Bit widths per weight constant fixed beforehand (by a joint plan over several
    /// models, see [`plan_folder_bits`]); when not empty, `target_bits` is not planned again.
    pub nbits: BTreeMap<String, u32>,
    /// Outlier-aware grouping before compressing ([`regroup`]).
    pub regroup: bool,
    /// Error feedback while rounding with this damping (share of the mean diagonal of the
    /// input Gram matrix), for the weights whose statistics hold that matrix
    /// ([`crate::passes::feedback`]).
    pub error_feedback: Option<f64>,
    /// Widths fixed by name (an op or its weight constant → nbits; `--op-nbits`): kept as
    /// they are by a mixed-precision plan, which plans the other weights within what they
    /// leave of the budget. Every name must be a weight the selection compresses.
    pub op_nbits: BTreeMap<String, u32>,
}

impl Compression {
    /// Plain compression with `method` over `selection`.
    pub fn new(method: Method, selection: Selection, head_only: bool) -> Compression {
        Compression {
            method,
            selection,
            head_only,
            calibration: None,
            target_bits: None,
            nbits: BTreeMap::new(),
            regroup: false,
            error_feedback: None,
            op_nbits: BTreeMap::new(),
        }
    }

    /// The selection this compression takes in `m` (the head's ops with `head_only`).
    pub fn selection_in(&self, m: &Model) -> Result<Selection> {
        if self.head_only {
            head_only_selection(m, &self.selection)
        } else {
            Ok(self.selection.clone())
        }
    }

    /// [`Self::op_nbits`] by weight constant name, for the weights `sel` selects in `m`; a
    /// name that is none of them is an error.
    pub fn fixed_widths(&self, m: &Model, sel: &Selection) -> Result<BTreeMap<String, u32>> {
        if self.op_nbits.is_empty() {
            return Ok(BTreeMap::new());
        }
        ensure!(
            matches!(self.method, Method::Palettize(_)),
            "op_nbits sets palettization widths; this compression quantizes"
        );
        let weights = selected_weights(m, &self.method, sel)?;
        let mut out = BTreeMap::new();
        for (name, &b) in &self.op_nbits {
            let Some(w) = weights.iter().find(|w| &w.op == name || &w.weight == name) else {
                let names: Vec<&str> = weights.iter().map(|w| w.op.as_str()).collect();
                bail!(
                    "op_nbits names `{name}`, which is not a weight this compression selects (it selects: {})",
                    names.join(", ")
                );
            };
            out.insert(w.weight.clone(), b);
        }
        Ok(out)
    }

    /// The base table layout of a mixed-precision plan (k-means palettization only).
    fn mixed_base(&self) -> Result<&LutConfig> {
        match &self.method {
            Method::Palettize(c) if c.mode == LutMode::Kmeans => Ok(c),
            _ => bail!("--target-bits needs --palettize kmeans"),
        }
    }

    /// The steps before compressing `m`: its selection and, with `regroup`, the channel
    /// reordering (done in place) and the statistics permuted to match.
    pub fn prepare(&self, m: &mut Model) -> Result<Prepared<'_>> {
        let sel = self.selection_in(m)?;
        let chunked = match &self.calibration {
            Some(c) => head_chunk_statistics(m, c)?,
            None => None,
        };
        pad_selected_head(m, &self.method, &sel)?;
        let mut p = Prepared {
            calibration: match chunked {
                Some(c) => Some(Cow::Owned(c)),
                None => self.calibration.as_ref().map(Cow::Borrowed),
            },
            regrouped: Vec::new(),
            sel,
        };
        if self.regroup {
            let (done, cal) = regroup(m, &self.method, &p.sel, p.calibration.as_deref())?;
            if let Some(c) = cal {
                p.calibration = Some(Cow::Owned(c));
            }
            p.regrouped = done;
        }
        Ok(p)
    }

    /// Compresses `m` in place.
    pub fn apply(&self, m: &mut Model) -> Result<Outcome> {
        let p = self.prepare(m)?;
        let cal = p.calibration.as_deref();
        let mut nbits = self.nbits.clone();
        if nbits.is_empty() {
            let fixed = self.fixed_widths(m, &p.sel)?;
            nbits = match self.target_bits {
                Some(target) => {
                    let cfg = self.mixed_base()?;
                    plan_bits_fixed(m, cfg, &p.sel, cal, target, &candidates_for(target), &fixed)?
                        .nbits()
                }
                None => fixed,
            };
        }
        let mut out = compress_with(m, &self.method, &p.sel, cal, &nbits, self.error_feedback)?;
        out.regrouped = p.regrouped;
        Ok(out)
    }
}

/// Pads the vocabulary-head chunks of a milkit text decoder that `sel` compresses to a
/// multiple of the group size where it does not divide their rows ([`pad_head_rows_of`]);
/// leaves the other chunks, and every other model, alone.
fn pad_selected_head(m: &mut Model, method: &Method, sel: &Selection) -> Result<()> {
    let multiple = row_multiple(method);
    if multiple <= 1 || !m.description.user_defined.contains_key(HEAD_OPS_KEY) {
        return Ok(());
    }
    let head = head_ops(m)?;
    let picks = |op: &String| {
        sel.op_names.is_empty()
            || sel.op_names.contains(op)
            || sel.op_names.contains(&format!("{op}_weight"))
    };
    if sel.op_types.iter().any(|t| t == "conv") {
        // Only the chunks this selection compresses: another pass may have compressed the
        // rest already.
        let picked: Vec<String> = head.into_iter().filter(picks).collect();
        if !picked.is_empty() {
            pad_head_rows_of(m, multiple, &picked)?;
        }
    }
    Ok(())
}

/// Every chunk of a chunked vocabulary head (`--head-chunks N`) reads the decoder's final
/// hidden state, the input the unchunked head reads, so statistics measured on an unchunked
/// decoder serve every chunk: returns `cal` with the chunks' missing input statistics (moments,
/// Gram matrix) copied from the unchunked head's, or `None` when nothing is missing. End-metric
/// curves are per weight and are not copied.
fn head_chunk_statistics(m: &Model, cal: &Calibration) -> Result<Option<Calibration>> {
    if !m.description.user_defined.contains_key(HEAD_OPS_KEY) {
        return Ok(None);
    }
    let single = format!("{}_weight", head_op_names(1)[0]);
    let Some(moments) = cal.moments.get(&single) else {
        return Ok(None);
    };
    let heads = head_ops(m)?;
    let mut out: Option<Calibration> = None;
    for f in m.program.functions.values() {
        for op in f
            .block
            .operations
            .iter()
            .filter(|o| heads.contains(&o.name))
        {
            let Some(crate::ir::Arg::Var(w)) = op.arg("weight") else {
                continue;
            };
            if cal.moments.contains_key(w) {
                continue;
            }
            let c = out.get_or_insert_with(|| cal.clone());
            c.moments.insert(w.clone(), moments.clone());
            if let Some(g) = cal.grams.get(&single) {
                c.grams.insert(w.clone(), std::sync::Arc::clone(g));
            }
        }
    }
    Ok(out)
}

/// What [`Compression::prepare`] hands to the compression of one model.
pub struct Prepared<'a> {
    pub sel: Selection,
    pub calibration: Option<Cow<'a, Calibration>>,
    pub regrouped: Vec<Regrouped>,
}

/// How to build one model.
#[derive(Clone, Debug)]
pub struct ComponentSpec {
    pub component: Component,
    /// Encoder only.
    pub abi: EncoderAbi,
    pub opset: Opset,
    /// Decoder only.
    pub decoder: DecoderExport,
    pub compression: Option<Compression>,
}

/// A built (and possibly compressed) model.
pub struct Built {
    pub model: Model,
    /// The compression method and its outcome, if compressed.
    pub compressed: Option<(Method, Outcome)>,
}

/// Builds one model of a checkpoint and compresses it as `spec` says.
pub fn build_component(
    ckpt: &Checkpoint,
    spec: &ComponentSpec,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Built> {
    let mut model = match spec.component {
        Component::Mel => export_mel(ckpt, spec.opset)?,
        Component::Encoder => export_encoder(ckpt, spec.abi, spec.opset, progress)?,
        Component::Decoder => export_decoder(ckpt, &spec.decoder, spec.opset)?,
        Component::CrossKv => export_cross_kv(ckpt, spec.opset)?,
        Component::Prefill => export_prefill(ckpt, spec.opset)?,
    };
    let compressed = match &spec.compression {
        None => None,
        Some(c) => {
            if c.head_only && spec.component != Component::Decoder {
                bail!(
                    "--head-only compresses the text decoder's vocabulary head; the {:?} model has none",
                    spec.component
                );
            }
            Some((c.method, c.apply(&mut model)?))
        }
    };
    Ok(Built { model, compressed })
}

/// Options of [`write_whisperkit_folder`].
#[derive(Clone, Debug)]
pub struct BundleOptions {
    /// Target of every package (a stateful decoder needs iOS18).
    pub opset: Opset,
    pub decoder: DecoderExport,
    /// Compression of the AudioEncoder.
    pub encoder_compression: Option<Compression>,
    /// Compression of the TextDecoder (and of CrossKV unless it is head-only).
    pub decoder_compression: Option<Compression>,
}

/// What a folder write produced.
#[derive(Debug, Default)]
pub struct BundleReport {
    /// Every file and package written, in order.
    pub files: Vec<String>,
    /// Per compressed package: its file name, method and outcome.
    pub compressed: Vec<(String, Method, Outcome)>,
}

/// The packages of a WhisperKit folder for this checkpoint and options, in writing order.
pub fn whisperkit_components(
    ckpt: &Checkpoint,
    o: &BundleOptions,
) -> Result<Vec<(String, ComponentSpec)>> {
    let spec = |component, compression: Option<Compression>| ComponentSpec {
        component,
        abi: EncoderAbi::WhisperKit,
        opset: o.opset,
        decoder: o.decoder,
        compression,
    };
    let mut components = vec![
        spec(Component::Mel, None),
        spec(Component::Encoder, o.encoder_compression.clone()),
        spec(Component::Decoder, o.decoder_compression.clone()),
    ];
    if ckpt.is_multilingual()? {
        components.push(spec(Component::Prefill, None));
    }
    if o.decoder.cross_kv == CrossKv::Precomputed {
        let c = o.decoder_compression.clone().filter(|c| !c.head_only);
        components.push(spec(Component::CrossKv, c));
    }
    Ok(components
        .into_iter()
        .map(|s| (s.component.whisperkit_file().to_string(), s))
        .collect())
}

/// Writes `components` (file name, how to build it) into the folder `out_dir`, plus copies of the
/// checkpoint files `copy` ((name, required); a missing optional file is left out). Atomic:
/// the folder appears complete or not at all; an existing `out_dir` is refused unless
/// `force`. Models are built one at a time, so only one is in memory. `progress` gets a line
/// per step.
pub fn write_folder(
    ckpt: &Checkpoint,
    out_dir: &Path,
    components: &[(String, ComponentSpec)],
    copy: &[(&str, bool)],
    force: bool,
    progress: &mut dyn FnMut(&str),
) -> Result<BundleReport> {
    let model_dir = ckpt.dir();
    for (name, required) in copy {
        let p = model_dir.join(name);
        if *required && !p.is_file() {
            if *name == "tokenizer.json" {
                return Err(missing_tokenizer_error(model_dir));
            }
            if *name == "generation_config.json" && model_dir.join("config.json").is_file() {
                continue; // derived from config.json and the tokenizer, with a warning
            }
            bail!(
                "{}: missing {name}, which the output folder must contain",
                model_dir.display()
            );
        }
    }
    let generation = if copy.iter().any(|(n, _)| *n == "generation_config.json") {
        ckpt.folder_generation_json()?
    } else {
        None
    };
    if out_dir.exists() && !force {
        bail!(
            "{} already exists; pass --force to replace it",
            out_dir.display()
        );
    }
    let mut report = BundleReport::default();
    write_package_atomically(out_dir, force, |dir| {
        for (file, spec) in components {
            progress(&format!("building {file}"));
            let built = build_component(ckpt, spec, &mut |_, _| {})
                .with_context(|| format!("building {file}"))?;
            progress(&format!("writing {file}"));
            write_package_dir_new(&built.model, &dir.join(file))?;
            report.files.push(file.clone());
            if let Some((method, outcome)) = built.compressed {
                report.compressed.push((file.clone(), method, outcome));
            }
        }
        for (name, _) in copy {
            let src = model_dir.join(name);
            if let (true, Some(g)) = (*name == "generation_config.json", &generation) {
                // The checkpoint's (or derived) config with only the heads the decoder has.
                let dst = dir.join(name);
                std::fs::write(&dst, serde_json::to_string_pretty(g)? + "\n")
                    .with_context(|| format!("cannot write {}", dst.display()))?;
                report.files.push(name.to_string());
            } else if src.is_file() {
                std::fs::copy(&src, dir.join(name))
                    .with_context(|| format!("cannot copy {}", src.display()))?;
                report.files.push(name.to_string());
            }
        }
        Ok(())
    })?;
    Ok(report)
}

/// Writes the WhisperKit model folder of a checkpoint (see the module doc) into `out_dir`.
pub fn write_whisperkit_folder(
    ckpt: &Checkpoint,
    out_dir: &Path,
    opts: &BundleOptions,
    force: bool,
    progress: &mut dyn FnMut(&str),
) -> Result<BundleReport> {
    if opts.decoder.stateful && opts.opset < Opset::Ios18 {
        bail!(
            "a stateful decoder needs target ios18 (Core ML states), got {}",
            opts.opset
        );
    }
    let mut opts = opts.clone();
    route_statistics(&mut opts);
    plan_folder_bits(ckpt, &mut opts, progress)?;
    let components = whisperkit_components(ckpt, &opts)?;
    write_folder(ckpt, out_dir, &components, &MODEL_FILES, force, progress)
}

/// One budget for the whole model: when both the encoder's and the decoder's compression
/// ask for `target_bits` (the same value), their weights are planned together
/// ([`plan_bits_joint`]), so the average over ALL compressed weights of the folder meets the
/// budget while the more sensitive weights (per measured error per stored bit) get more of
/// it, wherever they are. Fixes the widths in both compressions (their `nbits`) and returns
/// the encoder's and the decoder's plans; `None` when no joint plan is asked for, or when
/// their errors are on different scales: exactly one of the two has end-metric sensitivity
/// curves, or both have curves, measured on different components (each is then planned alone
/// within the budget, so the folder's average stays within it too).
/// A part without statistics has its errors measured unweighted (plain weight error).
pub fn plan_folder_bits(
    ckpt: &Checkpoint,
    opts: &mut BundleOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<Option<[MixedPlan; 2]>> {
    let (Some(ec), Some(dc)) = (&mut opts.encoder_compression, &mut opts.decoder_compression)
    else {
        return Ok(None);
    };
    let (Some(te), Some(td)) = (ec.target_bits, dc.target_bits) else {
        return Ok(None);
    };
    // Errors on different scales (an end-metric curve against a per-op relative error)
    // cannot share one budget: each component is then planned alone within its own.
    // (Curves measured on the encoder and on the decoder are on different scales too.)
    fn scale(c: &Compression) -> Option<&str> {
        c.calibration.as_ref().and_then(|s| s.end_metric_scale())
    }
    if scale(ec) != scale(dc) {
        progress("planning the encoder and the decoder each within its budget (their errors are on different scales)");
        return Ok(None);
    }
    ensure!(
        te == td,
        "one budget for the whole model: the encoder asks for {te} bits, the decoder for {td}"
    );
    progress("planning bit widths over the encoder and the decoder");
    let mut enc = export_encoder(ckpt, EncoderAbi::WhisperKit, opts.opset, &mut |_, _| {})?;
    let mut dec = export_decoder(ckpt, &opts.decoder, opts.opset)?;
    // The plan measures the weights as they will be compressed: reordered, if asked.
    let mut plans = {
        let (ep, dp) = (ec.prepare(&mut enc)?, dc.prepare(&mut dec)?);
        let (ef, df) = (
            ec.fixed_widths(&enc, &ep.sel)?,
            dc.fixed_widths(&dec, &dp.sel)?,
        );
        let parts = [
            PlanPart {
                model: &enc,
                base: *ec.mixed_base()?,
                sel: &ep.sel,
                calibration: ep.calibration.as_deref(),
                fixed: &ef,
            },
            PlanPart {
                model: &dec,
                base: *dc.mixed_base()?,
                sel: &dp.sel,
                calibration: dp.calibration.as_deref(),
                fixed: &df,
            },
        ];
        plan_bits_joint(&parts, te, &candidates_for(te))?
    };
    let d = plans.pop().context("a plan per part")?;
    let e = plans.pop().context("a plan per part")?;
    ec.nbits = e.nbits();
    dc.nbits = d.nbits();
    Ok(Some([e, d]))
}

/// Gives calibration statistics only to the component they were measured on
/// ([`Calibration::component`]): Whisper's encoder and decoder share weight names
/// (`layers_0_fc1_weight`, ...), so names alone cannot tell whose statistics a file holds.
pub fn route_statistics(opts: &mut BundleOptions) {
    keep_statistics_of(&mut opts.encoder_compression, "encoder");
    keep_statistics_of(&mut opts.decoder_compression, "decoder");
}

fn keep_statistics_of(c: &mut Option<Compression>, component: &str) {
    if let Some(c) = c {
        if c.calibration
            .as_ref()
            .is_some_and(|s| s.component() != component)
        {
            c.calibration = None;
        }
    }
}
