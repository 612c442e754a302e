//! End-metric sensitivity of an audio encoder's weights (`milkit calibrate --component
//! encoder --sensitivity-recipe R`): for every weight the recipe's encoder compression selects
//! and every asked bit width, the encoder output's relative squared error against the
//! uncompressed (fp16) encoder when only that weight is compressed as the recipe says (same
//! tables, channel scales, outlier grouping, error feedback and statistics; the sweep itself
//! is [`super::sensitivity::weight_sensitivity`]), averaged over one input window per
//! calibration clip. The curves go into the statistics file ([`Calibration::set_end_metric`]);
//! the mixed-precision plan (`passes::mixed`) then spends the encoder's bit budget where it
//! lowers the encoder output's error most per stored bit, instead of where each op's own
//! output error falls most.
//!
//! The measure, per clip, is ‖y − y₀‖² / ‖y₀‖² (y the encoder output with the one weight
//! compressed, y₀ the fp16 output), and the curve value is its mean over clips. Why this
//! one: the planner adds single-weight errors and buys the largest drop per stored bit. To
//! first order the output change of several compressed weights is the sum of their single
//! changes, y − y₀ ≈ Σₖ Jₖ·ΔWₖ; the rounding errors of different weights are independent, so
//! the cross terms of ‖Σₖ Jₖ·ΔWₖ‖² average out and the squared errors add, where norms
//! (‖·‖ without the square) or a PSNR in dB would not. Dividing by ‖y₀‖² per clip makes every
//! clip count alike whatever its loudness, and the mean over clips keeps the additivity.
//! The input format (an ABI's mel layout) is the caller's business: references are built
//! from ready input tensors.

use super::sensitivity::weight_sensitivity;
use crate::convert::bundle::Compression;
use crate::ir::Model;
use crate::passes::calibrate::{Calibration, EndMetric};
use crate::runtime::{Session, Tensor};
use anyhow::{ensure, Context, Result};
use std::collections::BTreeMap;

/// Describes the measure in the statistics file's metadata (`END_METRIC_MEASURE_KEY`).
pub fn describe(clips: usize) -> String {
    format!(
        "mean over {clips} clips (first 30-s window each) of ||y - y0||^2 / ||y0||^2, y the encoder output with one weight compressed, y0 the fp16 encoder's"
    )
}

/// One input of the encoder and the uncompressed encoder's output for it.
pub struct EncoderReference {
    input: Tensor,
    output: Vec<f32>,
    energy: f64,
}

/// The encoder's first output (by its description) of one run as f32 values.
fn run_output(session: &mut Session, io: &Io, x: &Tensor) -> Result<Vec<f32>> {
    let outs = session.predict(&[(io.input.as_str(), x.clone())])?;
    let (_, y) = outs
        .into_iter()
        .find(|(n, _)| *n == io.output)
        .with_context(|| format!("the encoder returned no output `{}`", io.output))?;
    Ok(y.flatten_all()?
        .to_dtype(candle_core::DType::F32)?
        .to_vec1::<f32>()?)
}

/// The names of `model`'s first input (the one each reference input feeds) and first output
/// (the one compared).
pub struct Io {
    input: String,
    output: String,
}

impl Io {
    pub fn of(model: &Model) -> Result<Io> {
        let d = &model.description;
        Ok(Io {
            input: d
                .inputs
                .first()
                .context("the encoder has no input")?
                .name
                .clone(),
            output: d
                .outputs
                .first()
                .context("the encoder has no output")?
                .name
                .clone(),
        })
    }
}

/// Runs the uncompressed `model` on each of `inputs` (one per clip) and keeps its outputs.
pub fn encoder_references(model: &Model, inputs: Vec<Tensor>) -> Result<Vec<EncoderReference>> {
    ensure!(!inputs.is_empty(), "no audio to measure the encoder on");
    let io = Io::of(model)?;
    let mut session =
        Session::from_model(model.clone()).context("preparing the fp16 encoder to measure")?;
    let mut out = Vec::new();
    for (i, input) in inputs.into_iter().enumerate() {
        let output = run_output(&mut session, &io, &input)
            .with_context(|| format!("running the fp16 encoder on clip {}", i + 1))?;
        let energy: f64 = output.iter().map(|&v| f64::from(v).powi(2)).sum();
        ensure!(
            energy.is_finite() && energy > 0.0,
            "clip {}: the fp16 encoder's output is {}",
            i + 1,
            if energy.is_finite() {
                "all zero"
            } else {
                "not finite"
            }
        );
        out.push(EncoderReference {
            input,
            output,
            energy,
        });
    }
    Ok(out)
}

/// Mean over `refs` of ‖y − y₀‖² / ‖y₀‖², y the output of `session` (with the inputs and
/// outputs `io`), y₀ the reference's.
pub fn mean_relative_error(
    session: &mut Session,
    io: &Io,
    refs: &[EncoderReference],
) -> Result<f64> {
    ensure!(!refs.is_empty(), "no encoder outputs to compare with");
    let mut sum = 0f64;
    for (i, r) in refs.iter().enumerate() {
        let y = run_output(session, io, &r.input)
            .with_context(|| format!("running the encoder on clip {}", i + 1))?;
        ensure!(
            y.len() == r.output.len(),
            "clip {}: the encoder gave {} values, the reference {}",
            i + 1,
            y.len(),
            r.output.len()
        );
        let err: f64 = y
            .iter()
            .zip(&r.output)
            .map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2))
            .sum();
        sum += err / r.energy;
    }
    Ok(sum / refs.len() as f64)
}

/// [`weight_sensitivity`] of the fp16 encoder `model` with the end metric
/// [`mean_relative_error`] against `refs` (made from the same `model` with
/// [`encoder_references`]). `progress(done, total)` after each measurement.
pub fn encoder_sensitivity(
    model: &Model,
    compression: &Compression,
    calibration: Option<&Calibration>,
    refs: &[EncoderReference],
    widths: &[u32],
    progress: &mut dyn FnMut(usize, usize),
) -> Result<BTreeMap<String, EndMetric>> {
    let io = Io::of(model)?;
    let mut metric = |m: Model| -> Result<f64> {
        let mut session = Session::from_model(m).context("preparing a measured encoder")?;
        mean_relative_error(&mut session, &io, refs)
    };
    weight_sensitivity(
        model,
        compression,
        calibration,
        widths,
        &mut metric,
        progress,
    )
}
