//! `milkit export`: checkpoint → .mlpackage.

use super::progress;
use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use milkit::ir::Opset;
use milkit::package::save_package;
use milkit::whisper::encoder::EncoderAbi;
use milkit::whisper::export::export_encoder;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ComponentArg {
    /// The audio encoder (log-mel → encoder states).
    Encoder,
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
    /// Output .mlpackage path.
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
    if let Some(r) = &a.recipe {
        return run_recipe(a, r);
    }
    let t0 = Instant::now();
    let opset = parse_target(&a.target)?;
    if a.out.exists() && !a.force {
        bail!(
            "{} already exists; pass --force to replace it",
            a.out.display()
        );
    }
    let abi = match a.abi {
        AbiArg::Whispercpp => EncoderAbi::WhisperCpp,
        AbiArg::Whisperkit => EncoderAbi::WhisperKit,
    };
    let mut model = build(a, a.component, abi, opset)?;
    super::compress::apply(&mut model, &a.compress, a.json, a.quiet)?;
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

fn build(
    a: &ExportArgs,
    component: ComponentArg,
    abi: EncoderAbi,
    opset: Opset,
) -> Result<milkit::ir::Model> {
    match component {
        ComponentArg::Encoder => {
            let pb = progress::bar(0, "building", a.quiet);
            let m = export_encoder(&a.model, abi, opset, &mut |i, n| {
                pb.set_length(n as u64);
                pb.set_position(i as u64);
            })?;
            pb.finish_and_clear();
            Ok(m)
        }
    }
}

fn enum_arg<T: ValueEnum>(what: &str, s: &str) -> Result<T> {
    T::from_str(s, true).map_err(|_| anyhow::anyhow!("recipe: unknown {what} `{s}`"))
}

fn recipe_flags(
    c: &milkit::whisper::recipe::RecipeCompression,
) -> Result<super::compress::CompressFlags> {
    let d = super::compress::CompressFlags::default();
    Ok(super::compress::CompressFlags {
        palettize: c
            .palettize
            .as_deref()
            .map(|s| enum_arg("palettize mode", s))
            .transpose()?,
        nbits: c.nbits.unwrap_or(4),
        quantize: c
            .quantize
            .as_deref()
            .map(|s| enum_arg("quantize dtype", s))
            .transpose()?,
        granularity: c
            .granularity
            .as_deref()
            .map(|s| enum_arg("granularity", s))
            .transpose()?,
        group_size: c.group_size.unwrap_or(16),
        block_size: c.block_size.unwrap_or(32),
        asymmetric: c.asymmetric,
        op_types: c
            .op_types
            .clone()
            .unwrap_or_else(|| vec!["conv".into(), "linear".into()]),
        op_names: c.op_names.clone().unwrap_or_default(),
        weight_threshold: c.weight_threshold.unwrap_or(2048),
        skip_indivisible: c.skip_indivisible,
        ..d
    })
}

/// Exports every component of a recipe into the directory `--out`, atomically as a whole.
fn run_recipe(a: &ExportArgs, path: &std::path::Path) -> Result<u8> {
    let recipe = milkit::whisper::recipe::Recipe::from_file(path)?;
    let mut models = Vec::new();
    for c in &recipe.components {
        let component = enum_arg::<ComponentArg>("component", &c.component)?;
        let abi = EncoderAbi::parse(&c.abi)?;
        let opset = parse_target(&c.target)?;
        let mut m = build(a, component, abi, opset)?;
        if let Some(cc) = &c.compress {
            let flags = recipe_flags(cc)?;
            if flags.method()?.is_none() {
                bail!(
                    "{}: component `{}` has a [compress] table without palettize or quantize",
                    path.display(),
                    c.file
                );
            }
            super::compress::apply(&mut m, &flags, a.json, a.quiet)?;
        }
        models.push((c.file.clone(), m));
    }
    milkit::package::fsio::write_package_atomically(&a.out, a.force, |dir| {
        for (file, m) in &models {
            milkit::package::save::write_package_dir_new(m, &dir.join(file))?;
        }
        Ok(())
    })?;
    if !a.quiet {
        eprintln!(
            "wrote {} ({} packages, recipe {})",
            a.out.display(),
            models.len(),
            recipe.name
        );
    }
    Ok(0)
}
