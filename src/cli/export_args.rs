//! The arguments of `milkit export` and what its two modes — components from flags
//! (`export`) and every component of a recipe (`export_recipe`) — share: the `--target`
//! parser and the folder's compression report. A leaf, so that the two modes do not import
//! each other both ways.

use anyhow::Result;
use clap::{Args, ValueEnum};
use milkit::convert::bundle::BundleReport;
use milkit::whisper::decoder_spec::CrossKv;
use milkit::whisper::encoder::EncoderAbi;
use std::path::{Path, PathBuf};

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

#[derive(Args)]
pub struct ExportArgs {
    /// A conversion recipe (models/*.toml): exports every component it lists, compressed as
    /// it says, into the directory --out. Replaces --component/--abi/--target and the
    /// compression flags.
    #[arg(long, conflicts_with_all = ["palettize", "quantize"])]
    pub recipe: Option<PathBuf>,
    /// Hugging Face Whisper checkpoint: a directory (config.json + model.safetensors, sharded
    /// safetensors with an index, or pytorch_model.bin), or a Hub id ORG/NAME[@REVISION]
    /// (e.g. openai/whisper-tiny.en), downloaded into the Hugging Face cache
    /// ($HF_HOME/hub; HF_ENDPOINT, HF_TOKEN and HF_HUB_OFFLINE=1 honoured; see docs/hub.md).
    #[arg(long)]
    pub model: PathBuf,
    /// Which part of the model to export.
    #[arg(long, value_enum, default_value = "encoder")]
    pub component: ComponentArg,
    /// I/O interface of the package.
    #[arg(long, value_enum, default_value = "whisperkit")]
    pub abi: EncoderAbi,
    /// Deployment target: ios15..ios18 (or macos12..macos15). Decides the opset and the
    /// specification version (iOS18 = spec 9).
    #[arg(long, default_value = "ios18")]
    pub target: String,
    /// Decoder: keep the self-attention caches as Core ML states (needs --target ios18).
    #[arg(long)]
    pub stateful: bool,
    /// Decoder: where cross-attention keys/values come from.
    #[arg(long, value_enum, default_value = "in-graph")]
    pub cross_kv: CrossKv,
    /// Decoder: split the vocabulary projection into N row chunks (N matmuls). The Neural
    /// Engine (and whisper.cpp) want at most 16,384 rows per chunk, i.e. N ≥ ceil(vocab /
    /// 16384) (`min_head_chunks`): 4 for every Whisper vocabulary (51,864-51,866 rows).
    #[arg(long, default_value_t = 1)]
    pub head_chunks: usize,
    /// Decoder: add an `alignment_heads_weights_per_head` output [1, heads, 1500] beside
    /// WhisperKit's mean `alignment_heads_weights`. `milkit transcribe --word-timestamps`
    /// uses it when present: each head normalised before averaging, as openai-whisper and
    /// Hugging Face do, puts more words within 0.1 s of their times (docs/transcription.md).
    /// WhisperKit reads outputs by name and ignores the extra one. On by default with
    /// --component all (and in recipes); this flag turns it on for --component decoder.
    #[arg(long, conflicts_with = "no_per_head_alignment")]
    pub per_head_alignment: bool,
    /// Leave the per-head alignment output out of the decoder of --component all: the
    /// TextDecoder then has exactly WhisperKit's outputs, and word timestamps use the mean
    /// row. (In a recipe: `per_head_alignment = false` in the decoder's component.)
    #[arg(long)]
    pub no_per_head_alignment: bool,
    /// With --recipe: measure what the recipe needs on these clips (audio files or .jsonl
    /// manifests with `audio`, and `text`/`language` for WER-based targets) in this one
    /// command: the statistics of every compressed encoder and decoder (as `milkit
    /// calibrate` gathers them, with Gram matrices where the recipe uses error feedback, and
    /// end-metric sensitivity curves where a component sets `sensitivity_widths`), then,
    /// with a quality target, each plan's fidelity. With a target the clips are split in
    /// two by a hash of their file names: one half gives the statistics, the other is held
    /// back to measure the plans on. Results are cached under --cache-dir, keyed by the
    /// checkpoint's and the clips' SHA-256 and the plan, and reused.
    #[arg(long, num_args = 1.., value_name = "CLIPS", requires = "recipe")]
    pub calibrate_on: Vec<PathBuf>,
    /// With --recipe and --calibrate-on: the fewest bits whose fidelity against the fp16
    /// folder of the same recipe, on the held-back clips, meets every bound:
    /// KEY=VALUE,... with keys max_wer_delta (points, against the texts), min_qoi (0-1),
    /// max_wer_vs_fp16 (%), max_mean_kl (nats), min_top1 (0-1), min_encoder_psnr_db,
    /// max_bits (the largest plan tried). Replaces the recipe's [target] table. Plans: every
    /// compressed component at 2, 3, 4, 4-6 mixed within 5, 6, 6-8 mixed within 7, 8 bits,
    /// 8 bits or fp16 per weight within 12, or fp16 (docs/recipes.md). A target no plan meets
    /// is an error naming the best reached.
    #[arg(long, value_name = "KEY=VALUE,...", requires = "calibrate_on")]
    pub target_quality: Option<String>,
    /// Where --calibrate-on keeps statistics and measurements (default: $MILKIT_CACHE, else
    /// ~/.cache/milkit/measure).
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
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
    /// List every compressed weight (shape, bytes before and after, relative RMS error);
    /// the default prints one line per compressed package.
    #[arg(long, short)]
    pub verbose: bool,
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

pub use milkit::convert::recipe::parse_target;

/// Compression reports of a folder write: one JSON object keyed by file on stdout, or on
/// stderr one line per compressed file (every weight with `verbose`).
pub fn report_folder(r: &BundleReport, json: bool, quiet: bool, verbose: bool) -> Result<()> {
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
    } else if !quiet {
        for (file, method, out) in &r.compressed {
            if verbose {
                eprintln!("{file}:");
                super::compress::print_report(method, out, false, false)?;
            } else {
                eprintln!("{file}: {}", summary(method, out));
            }
        }
    }
    Ok(())
}

/// The one-line compression summary of a package.
pub fn summary(
    method: &milkit::passes::compress::Method,
    out: &milkit::passes::compress::Outcome,
) -> String {
    milkit::report::CompressReport::from_outcome(out, &milkit::passes::compress::mode_name(method))
        .summary()
}

/// Bytes of every file under `dir` (what a folder weighs on disk).
pub fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return std::fs::metadata(dir).map(|m| m.len()).unwrap_or(0);
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            _ => e.metadata().map(|m| m.len()).unwrap_or(0),
        })
        .sum()
}
