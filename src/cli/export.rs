//! `milkit export`: checkpoint → .mlpackage.

use super::progress;
use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use milkit::ir::Opset;
use milkit::package::save_package;
use milkit::whisper::bundle::{
    build_part, write_whisperkit_folder, BundleOptions, BundleReport, Part, PartSpec,
};
use milkit::whisper::decoder::CrossKv;
use milkit::whisper::decoder_export::DecoderExport;
use milkit::whisper::encoder::EncoderAbi;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ComponentArg {
    /// The audio encoder (log-mel → encoder states).
    Encoder,
    /// WhisperKit's TextDecoder: one token per call, KV caches as I/O (or states with
    /// --stateful), logits, cache updates and alignment-head weights.
    Decoder,
    /// WhisperKit's MelSpectrogram: `audio` fp16 [480000] → `melspectrogram_features`
    /// fp16 [1, n_mels, 1, 3000].
    Mel,
    /// Cross-attention keys/values of every decoder layer from the encoder output (the
    /// companion of a `--cross-kv precomputed` decoder).
    Crosskv,
    /// WhisperKit's TextDecoderContextPrefill (multilingual models only): (task, language)
    /// → KV caches of the forced prefix.
    Prefill,
    /// The whole WhisperKit folder at --out (a directory): MelSpectrogram, AudioEncoder,
    /// TextDecoder (+ TextDecoderContextPrefill, + CrossKV) packages and the checkpoint's
    /// config.json, generation_config.json, tokenizer.json, preprocessor_config.json.
    /// Compression flags apply to the encoder and the decoder (only the decoder's head with
    /// --head-only).
    All,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CrossKvArg {
    /// The decoder projects `encoder_output_embeds` itself, every step (WhisperKit's form).
    InGraph,
    /// The decoder takes `encoder_attn_key_cache`/`encoder_attn_value_cache` inputs, made
    /// once per window by the CrossKV model.
    Precomputed,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum AbiArg {
    /// whisper.cpp's Core ML encoder: `logmel_data` fp32 [1, n_mels, 3000] → `output` fp32 [1, 1500, d].
    Whispercpp,
    /// WhisperKit's AudioEncoder: `melspectrogram_features` fp16 [1, n_mels, 1, 3000] →
    /// `encoder_output_embeds` fp16 [1, d, 1, 1500].
    Whisperkit,
}

#[derive(Args)]
pub struct ExportArgs {
    /// A conversion recipe (models/*.toml): exports every component it lists, compressed as
    /// it says, into the directory --out. Replaces --component/--abi/--target and the
    /// compression flags.
    #[arg(long, conflicts_with_all = ["palettize", "quantize"])]
    pub recipe: Option<PathBuf>,
    /// Hugging Face Whisper checkpoint directory (config.json + model.safetensors, sharded
    /// safetensors with an index, or pytorch_model.bin).
    #[arg(long)]
    pub model: PathBuf,
    /// Which part of the model to export.
    #[arg(long, value_enum, default_value = "encoder")]
    pub component: ComponentArg,
    /// I/O interface of the package.
    #[arg(long, value_enum, default_value = "whisperkit")]
    pub abi: AbiArg,
    /// Deployment target: ios15..ios18 (or macos12..macos15). Decides the opset and the
    /// specification version (iOS18 = spec 9).
    #[arg(long, default_value = "ios18")]
    pub target: String,
    /// Decoder: keep the self-attention caches as Core ML states (needs --target ios18).
    #[arg(long)]
    pub stateful: bool,
    /// Decoder: where cross-attention keys/values come from.
    #[arg(long, value_enum, default_value = "in-graph")]
    pub cross_kv: CrossKvArg,
    /// Decoder: split the vocabulary projection into N row chunks (N matmuls). The Neural
    /// Engine (and whisper.cpp) want at most 16,384 rows per chunk, i.e. N ≥ ceil(vocab /
    /// 16384) (`min_head_chunks`): 4 for every Whisper vocabulary (51,864-51,866 rows).
    #[arg(long, default_value_t = 1)]
    pub head_chunks: usize,
    /// Output .mlpackage path (a directory for --component all or --recipe).
    #[arg(long)]
    pub out: PathBuf,
    /// Replace an existing output.
    #[arg(long)]
    pub force: bool,
    /// No progress bars.
    #[arg(long, short)]
    pub quiet: bool,
    /// Print the compression report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Export even when checkpoint tensors hold NaN or ±Inf (refused by default, naming the
    /// tensor and the count), with a warning per tensor.
    #[arg(long)]
    pub allow_nonfinite: bool,
    #[command(flatten)]
    pub compress: super::compress::CompressFlags,
    /// Print wall time and peak memory as JSON on stderr when done (used by `milkit bench`).
    #[arg(long, hide = true)]
    pub stats: bool,
}

pub fn parse_target(s: &str) -> Result<Opset> {
    match Opset::from_target_name(s) {
        Some(o) => Ok(o),
        None => {
            bail!("unknown target `{s}`: use ios15, ios16, ios17 or ios18 (or macos12..macos15)")
        }
    }
}

pub fn run(a: &ExportArgs) -> Result<u8> {
    milkit::whisper::weights::set_allow_nonfinite(a.allow_nonfinite);
    if let Some(r) = &a.recipe {
        return super::export_recipe::run(a, r);
    }
    let t0 = Instant::now();
    let opset = parse_target(&a.target)?;
    if a.out.exists() && !a.force {
        bail!(
            "{} already exists; pass --force to replace it",
            a.out.display()
        );
    }
    check_decoder_flags(a, opset)?;
    if a.component == ComponentArg::All {
        return run_all(a, opset);
    }
    let spec = PartSpec {
        part: part_of(a.component),
        abi: match a.abi {
            AbiArg::Whispercpp => EncoderAbi::WhisperCpp,
            AbiArg::Whisperkit => EncoderAbi::WhisperKit,
        },
        opset,
        decoder: decoder_export(a),
        compression: a.compress.compression()?,
    };
    let pb = progress::bar(0, "building", a.quiet);
    let built = build_part(&a.model, &spec, &mut |i, n| {
        pb.set_length(n as u64);
        pb.set_position(i as u64);
    })?;
    pb.finish_and_clear();
    if let Some((method, out)) = &built.compressed {
        super::compress::print_report(method, out, a.json, a.quiet)?;
    }
    let model = built.model;
    let total: u64 = weight_bytes(&model);
    let pb = progress::bytes_bar(total, "writing", a.quiet);
    let s = save_package(&model, &a.out, a.force, &mut |n| pb.inc(n))?;
    pb.finish_and_clear();
    if !a.quiet {
        eprintln!(
            "wrote {} ({} blobs, weight.bin {:.1} MB, model.mlmodel {} KB) in {:.1} s",
            a.out.display(),
            s.blobs,
            s.weight_bytes as f64 / 1e6,
            s.model_bytes / 1024,
            t0.elapsed().as_secs_f64()
        );
    }
    if a.stats {
        eprintln!(
            "{}",
            serde_json::json!({"wall_ms": t0.elapsed().as_secs_f64() * 1e3, "peak_rss_bytes": peak_rss_bytes()})
        );
    }
    Ok(0)
}

fn part_of(c: ComponentArg) -> Part {
    match c {
        ComponentArg::Encoder => Part::Encoder,
        ComponentArg::Decoder | ComponentArg::All => Part::Decoder,
        ComponentArg::Mel => Part::Mel,
        ComponentArg::Crosskv => Part::CrossKv,
        ComponentArg::Prefill => Part::Prefill,
    }
}

fn decoder_export(a: &ExportArgs) -> DecoderExport {
    DecoderExport {
        stateful: a.stateful,
        cross_kv: match a.cross_kv {
            CrossKvArg::InGraph => CrossKv::InGraph,
            CrossKvArg::Precomputed => CrossKv::Precomputed,
        },
        head_chunks: a.head_chunks,
    }
}

/// Decoder flags on a component without a decoder, and --stateful below iOS18, are errors.
fn check_decoder_flags(a: &ExportArgs, opset: Opset) -> Result<()> {
    let decoder = matches!(a.component, ComponentArg::Decoder | ComponentArg::All);
    if !decoder && (a.stateful || a.head_chunks != 1 || a.cross_kv != CrossKvArg::InGraph) {
        bail!("--stateful, --cross-kv and --head-chunks shape the text decoder; use them with --component decoder or all");
    }
    if a.head_chunks == 0 {
        bail!("--head-chunks must be at least 1");
    }
    if a.stateful && opset < Opset::Ios18 {
        bail!(
            "--stateful keeps the KV caches as Core ML states, which exist from iOS 18 (spec 9) on: use --target ios18 (got {})",
            a.target
        );
    }
    Ok(())
}

/// `--component all`: the WhisperKit folder, written by the library.
fn run_all(a: &ExportArgs, opset: Opset) -> Result<u8> {
    let t0 = Instant::now();
    let opts = BundleOptions {
        opset,
        decoder: decoder_export(a),
        encoder_compression: a
            .compress
            .compression_for(Some("encoder"))?
            .filter(|c| !c.head_only),
        decoder_compression: a.compress.compression_for(Some("decoder"))?,
    };
    let sp = progress::spinner("exporting", a.quiet);
    let report = write_whisperkit_folder(&a.model, &a.out, &opts, a.force, &mut |msg| {
        sp.set_message(msg.to_string())
    })?;
    sp.finish_and_clear();
    report_folder(&report, a.json, a.quiet)?;
    if !a.quiet {
        eprintln!(
            "wrote {} ({}) in {:.1} s",
            a.out.display(),
            report.files.join(", "),
            t0.elapsed().as_secs_f64()
        );
    }
    Ok(0)
}

/// Compression reports of a folder write: one JSON object keyed by file, or text per file.
pub fn report_folder(r: &BundleReport, json: bool, quiet: bool) -> Result<()> {
    if json {
        let mut all = serde_json::Map::new();
        for (file, method, out) in &r.compressed {
            let rep = milkit::report::CompressReport::from_outcome(
                out,
                &milkit::passes::compress::mode_name(method),
            );
            all.insert(file.clone(), serde_json::to_value(&rep)?);
        }
        println!("{}", serde_json::to_string_pretty(&all)?);
    } else {
        for (file, method, out) in &r.compressed {
            if !quiet {
                eprintln!("{file}:");
            }
            super::compress::print_report(method, out, false, quiet)?;
        }
    }
    Ok(())
}

/// Bytes of all blob-bound constants (for the progress bar).
fn weight_bytes(m: &milkit::ir::Model) -> u64 {
    let mut n = 0;
    for f in m.program.functions.values() {
        for op in f.block.walk() {
            for v in op
                .attributes
                .values()
                .chain(op.inputs.values().flatten().filter_map(|a| match a {
                    milkit::ir::Arg::Value(v) => Some(v),
                    _ => None,
                }))
            {
                if let milkit::ir::Value::Tensor(t) = v {
                    if milkit::package::convert::goes_to_blob(t) {
                        n += t.data.len() as u64;
                    }
                }
            }
        }
    }
    n
}

/// Peak resident set size of this process (Linux: VmHWM), if known.
pub fn peak_rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
