//! `milkit calibrate`: statistics for data-aware compression.

use super::progress;
use anyhow::Result;
use clap::{Args, ValueEnum};
use milkit::convert::bundle::Component;
use milkit::convert::decoder_export::DecoderExport;
use milkit::convert::recipe::{recipe_components, Recipe};
use milkit::passes::compress::Selection;
use milkit::quality::calibrate::{
    calibrate_decoder_with, calibrate_encoder_with, expand_audio_list, EncoderSensitivityRequest,
    SensitivityRequest,
};
use milkit::whisper::encoder::EncoderAbi;
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
    /// Audio files (WAV, FLAC, MP3, Ogg, Opus, M4A, ...), or .jsonl manifests with an `audio`
    /// path per line (relative to the manifest).
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
    /// Also measure each weight's end-metric sensitivity for this recipe's compression of
    /// the --component, with only that weight compressed exactly as the recipe says (tables,
    /// channel scales, outlier grouping, error feedback; with the statistics just gathered)
    /// at each of --widths, and store the curves in the statistics. `decoder`: the decoder's
    /// teacher-forced next-token KL divergence from fp16 along the fp16 model's transcripts
    /// of the same clips. `encoder`: the encoder output's relative squared error against
    /// fp16 (mean over clips of ‖y − y0‖² / ‖y0‖², first 30-s window of each clip). A mixed
    /// plan (`target_bits`) then allocates that component's bits by drop of this measure per
    /// stored bit instead of by each op's own output error; components whose errors are on
    /// different scales are each planned within the budget. Costs one pass over the clips
    /// per weight and width.
    #[arg(long, value_name = "RECIPE")]
    pub sensitivity_recipe: Option<PathBuf>,
    /// Bit widths the end-metric sensitivity is measured at (with --sensitivity-recipe).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "3,4,6,8",
        requires = "sensitivity_recipe"
    )]
    pub widths: Vec<u32>,
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
    let compression = match &a.sensitivity_recipe {
        None => None,
        Some(r) => Some(compression_of(r, a.component)?),
    };
    if let Some((c, _)) = &compression {
        if c.error_feedback.is_some() && !a.gram {
            anyhow::bail!(
                "the recipe's {} compression uses error feedback, which needs the Gram matrices: add --gram",
                component_name(a.component)
            );
        }
    }
    let widths = milkit::passes::lut::lut_widths(&a.widths)
        .map_err(|b| anyhow::anyhow!("--widths: {b} is not one of 1, 2, 3, 4, 6, 8"))?;
    let sweep_bar = progress::bar(
        0,
        "end-metric sensitivity",
        a.quiet || compression.is_none(),
    );
    let mut sweep = |d: usize, n: usize| {
        sweep_bar.set_length(n as u64);
        sweep_bar.set_position(d as u64);
    };
    let cal = match a.component {
        CalibComponent::Encoder => calibrate_encoder_with(
            &model,
            &files,
            &sel,
            a.gram,
            compression
                .as_ref()
                .map(|(c, _)| EncoderSensitivityRequest {
                    compression: c,
                    widths: &widths,
                }),
            &mut tick,
            &mut sweep,
        )?,
        CalibComponent::Decoder => calibrate_decoder_with(
            &model,
            &files,
            &sel,
            a.gram,
            compression.as_ref().map(|(c, d)| SensitivityRequest {
                compression: c,
                decoder: *d,
                widths: &widths,
            }),
            &mut tick,
            &mut sweep,
        )?,
    };
    sweep_bar.finish_and_clear();
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

fn component_name(c: CalibComponent) -> &'static str {
    match c {
        CalibComponent::Encoder => "encoder",
        CalibComponent::Decoder => "decoder",
    }
}

/// The compression a recipe describes for `component` (its `[compress]` table) and the
/// shape of the recipe's decoder export (used with the decoder only).
fn compression_of(
    path: &std::path::Path,
    component: CalibComponent,
) -> Result<(milkit::convert::bundle::Compression, DecoderExport)> {
    let r = Recipe::from_file(path)?;
    let specs = recipe_components(&r, path, &[])?;
    let (want, name) = match component {
        CalibComponent::Encoder => (Component::Encoder, "encoder"),
        CalibComponent::Decoder => (Component::Decoder, "decoder"),
    };
    let Some((_, spec)) = specs.iter().find(|(_, s)| s.component == want) else {
        anyhow::bail!(
            "{}: the recipe has no `{name}` component to measure",
            path.display()
        );
    };
    let Some(c) = spec.compression.clone() else {
        anyhow::bail!(
            "{}: the recipe's {name} is not compressed; nothing to measure",
            path.display()
        );
    };
    if component == CalibComponent::Encoder && spec.abi != EncoderAbi::WhisperKit {
        // The statistics and the sweep run the WhisperKit-ABI encoder; other layouts may name
        // or shape their weights differently.
        anyhow::bail!(
            "{}: the recipe's encoder uses the `{}` ABI; the encoder sweep measures the `whisperkit` one",
            path.display(),
            spec.abi.name()
        );
    }
    Ok((c, spec.decoder))
}
