//! `milkit calibrate`: statistics for data-aware compression.

use super::progress;
use anyhow::Result;
use clap::{Args, ValueEnum};
use milkit::passes::compress::Selection;
use milkit::quality::calibrate::{calibrate_decoder, calibrate_encoder, expand_audio_list};
use std::path::PathBuf;

/// Runs the fp16 encoder (or text decoder) of a checkpoint on real audio and records, for
/// every compressible op, the mean square of its input per input channel (the diagonal of
/// XᵀX / n): the weight each weight column carries in the output error. Feed the file to
/// `--calibration` of `milkit compress` / `milkit export` (k-means palettization). The file
/// names the component it was measured on; `export --component all` gives it to that one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CalibComponent {
    Encoder,
    Decoder,
}

#[derive(Args)]
pub struct CalibrateArgs {
    /// Hugging Face Whisper checkpoint: a directory, or a Hub id ORG/NAME[@REVISION]
    /// (downloaded into the Hugging Face cache; see docs/hub.md).
    #[arg(long)]
    pub model: PathBuf,
    /// WAV files, or .jsonl manifests with an `audio` path per line (relative to the manifest).
    #[arg(long, num_args = 1.., required = true)]
    pub audio: Vec<PathBuf>,
    /// `encoder`: every 30-s window through the encoder. `decoder`: greedy transcription
    /// with the fp16 model, one run per token through the text decoder.
    #[arg(long, value_enum, default_value = "encoder")]
    pub component: CalibComponent,
    /// Output statistics (.safetensors: one fp32 vector per weight constant name).
    #[arg(long)]
    pub out: PathBuf,
    /// Replace an existing output.
    #[arg(long)]
    pub force: bool,
    /// Consumer op types to measure (as for compression).
    #[arg(long, value_delimiter = ',', default_value = "conv,linear")]
    pub op_types: Vec<String>,
    /// Also record each measured input's Gram matrix XᵀX / n (fp32, one per input, shared by
    /// the ops reading it), which `--error-feedback` needs. Off by default: it costs dim² values
    /// per input (45 MB for tiny.en's encoder, gigabytes for large-v3's) and a product per
    /// window as large as the layer's own.
    #[arg(long)]
    pub gram: bool,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
}

pub fn run(a: &CalibrateArgs) -> Result<u8> {
    if a.out.exists() && !a.force {
        anyhow::bail!(
            "{} already exists; pass --force to replace it",
            a.out.display()
        );
    }
    let files = expand_audio_list(&a.audio)?;
    let model = milkit::hub::resolve_model(&a.model, !a.quiet)?;
    let sel = Selection {
        op_types: a.op_types.clone(),
        ..Selection::default()
    };
    let pb = progress::bar(files.len() as u64, "calibrating", a.quiet);
    let mut tick = |d: usize, _| pb.set_position(d as u64);
    let cal = match a.component {
        CalibComponent::Encoder => calibrate_encoder(&model, &files, &sel, a.gram, &mut tick)?,
        CalibComponent::Decoder => calibrate_decoder(&model, &files, &sel, a.gram, &mut tick)?,
    };
    pb.finish_and_clear();
    cal.save(&a.out, a.force)?;
    if !a.quiet {
        eprintln!(
            "{}: {} weights, {} {} runs from {} files",
            a.out.display(),
            cal.moments.len(),
            cal.component(),
            cal.meta
                .get("milkit.calibration.runs")
                .map(String::as_str)
                .unwrap_or("?"),
            files.len()
        );
    }
    Ok(0)
}
