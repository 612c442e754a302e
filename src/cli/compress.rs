//! `milkit compress` and the compression flags shared with `milkit export`.

use super::progress;
use anyhow::{bail, Context, Result};
use clap::Args;
pub use milkit::convert::compress::CompressFlags;
use milkit::ir::Model;
use milkit::package::{load_package, save_package};
use milkit::passes::compress::{Method, Outcome};
use milkit::quality::output_target::{random_probes, search, OutputTarget, Probe};
use milkit::runtime::io::read_tensor;
use milkit::runtime::Tensor;
use std::path::PathBuf;

#[derive(Args)]
pub struct CompressArgs {
    /// Input .mlpackage, or compiled .mlmodelc folder (iOS18 target).
    pub input: PathBuf,
    /// Output .mlpackage (a package whatever the input; `milkit convert` compiles it to
    /// model.mil text).
    #[arg(long)]
    pub out: PathBuf,
    /// Replace an existing output.
    #[arg(long)]
    pub force: bool,
    /// Print the report as JSON (schema: schemas/compress.schema.json).
    #[arg(long)]
    pub json: bool,
    /// No progress bars.
    #[arg(long, short)]
    pub quiet: bool,
    /// Compress even when weights hold NaN or ±Inf (refused by default), with a warning.
    #[arg(long)]
    pub allow_nonfinite: bool,
    /// Choose the palettization widths by a quality target on the package's own outputs
    /// instead of --nbits: KEY=VALUE,... with min_psnr_db (the lowest PSNR of any output
    /// against the uncompressed package, dB), max_rel_error (the highest relative L2 error)
    /// and max_bits (the largest plan tried). Plans: 2, 3, 4, 6 and 8 bits and, with
    /// --palettize kmeans, the mixed plans between them; the one with the fewest bits that
    /// meets every bound is written, and a target no plan meets is an error naming the best
    /// reached. Measured on --target-input probes, else on seeded random ones.
    #[arg(long, value_name = "KEY=VALUE,...")]
    pub target_quality: Option<String>,
    /// A probe input for --target-quality: NAME=FILE (x.npy or x.safetensors:TENSOR). Give
    /// every input of the model; repeat an input's flag for more probes (the k-th file of
    /// each input makes probe k).
    #[arg(
        long = "target-input",
        value_name = "NAME=FILE",
        requires = "target_quality"
    )]
    pub target_inputs: Vec<String>,
    /// Without --target-input: this many random probes, standard-normal values (seed 0) at
    /// each float input's default shape.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub target_probes: u32,
    #[command(flatten)]
    pub flags: CompressFlags,
}

/// The probes of --target-input (grouped by input, in order), or random ones.
fn probes(a: &CompressArgs, m: &Model) -> Result<Vec<Probe>> {
    if a.target_inputs.is_empty() {
        return random_probes(m, a.target_probes as usize, 0);
    }
    let mut by_input: Vec<(String, Vec<Tensor>)> = Vec::new();
    for spec in &a.target_inputs {
        let Some((name, file)) = spec
            .split_once('=')
            .filter(|(n, f)| !n.is_empty() && !f.is_empty())
        else {
            bail!("--target-input `{spec}`: expected NAME=FILE (FILE is x.npy or x.safetensors:TENSOR)");
        };
        if !m.description.inputs.iter().any(|f| f.name == name) {
            bail!(
                "--target-input {name}: {} has no input `{name}` (inputs: {})",
                a.input.display(),
                m.description
                    .inputs
                    .iter()
                    .map(|f| f.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        let t = read_tensor(file).with_context(|| format!("--target-input {name} from {file}"))?;
        match by_input.iter_mut().find(|(n, _)| n == name) {
            Some((_, v)) => v.push(t),
            None => by_input.push((name.to_string(), vec![t])),
        }
    }
    for f in &m.description.inputs {
        if !by_input.iter().any(|(n, _)| *n == f.name) {
            bail!(
                "missing --target-input {}=FILE: every input needs its probe values",
                f.name
            );
        }
    }
    let k = by_input[0].1.len();
    if let Some((n, v)) = by_input.iter().find(|(_, v)| v.len() != k) {
        bail!(
            "--target-input gives `{}` {k} file(s) and `{n}` {}: give every input the same number of probes",
            by_input[0].0,
            v.len()
        );
    }
    Ok((0..k)
        .map(|i| {
            by_input
                .iter()
                .map(|(n, v)| (n.clone(), v[i].clone()))
                .collect()
        })
        .collect())
}

/// `--target-quality`: the search, its table, the chosen plan's report.
fn apply_target(a: &CompressArgs, m: &mut Model, text: &str) -> Result<()> {
    let target = OutputTarget::parse(text)?;
    let probes = probes(a, m)?;
    let sp = progress::spinner("choosing widths", a.quiet);
    let chosen = search(m, &a.flags, &target, &probes, &mut |s| {
        sp.set_message(s.to_string())
    })?;
    sp.finish_and_clear();
    if !a.quiet {
        eprint!("{}", chosen.report.to_text());
    }
    *m = chosen.model;
    let method = chosen.flags.method()?.context("palettization asked for")?;
    print_report(&method, &chosen.outcome, a.json, a.quiet)
}

/// Prints the report of one compression (JSON on stdout, or text on stderr unless quiet).
pub fn print_report(method: &Method, out: &Outcome, json: bool, quiet: bool) -> Result<()> {
    let report = milkit::report::CompressReport::from_outcome(
        out,
        &milkit::passes::compress::mode_name(method),
    );
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else if !quiet {
        eprint!("{}", report.to_text());
    }
    Ok(())
}

/// Applies the flags to a model; prints the report. Errors leave nothing written.
pub fn apply(
    model: &mut Model,
    flags: &CompressFlags,
    json: bool,
    quiet: bool,
) -> Result<Option<Outcome>> {
    let Some(c) = flags.compression()? else {
        return Ok(None);
    };
    if let (Some(t), false) = (c.target_bits, quiet) {
        eprintln!(
            "mixed precision: measuring each weight at 2/3/4/6/8 bits{} on the calibration statistics",
            if t > 8.0 { " and fp16" } else { "" }
        );
    }
    let sp = progress::spinner("compressing", quiet);
    let out = c.apply(model)?;
    sp.finish_and_clear();
    print_report(&c.method, &out, json, quiet)?;
    Ok(Some(out))
}

pub fn run(a: &CompressArgs) -> Result<u8> {
    if a.out.exists() && !a.force {
        bail!(
            "{} already exists; pass --force to replace it",
            a.out.display()
        );
    }
    if a.out.extension().is_some_and(|e| e == "mlmodelc") {
        bail!(
            "{}: compress writes a package; name the output .mlpackage (and `milkit convert` \
             it to an .mlmodelc)",
            a.out.display()
        );
    }
    if a.flags.method()?.is_none() {
        bail!("nothing to do: pass --palettize kmeans|uniform or --quantize int4|uint4|int8|uint8");
    }
    let mut m = load_package(&a.input)?;
    milkit::passes::finite::check_model(&m, &a.input.display().to_string(), a.allow_nonfinite)?;
    match &a.target_quality {
        Some(t) => apply_target(a, &mut m, t)?,
        None => {
            apply(&mut m, &a.flags, a.json, a.quiet)?;
        }
    }
    let pb = progress::bytes_bar(0, "writing", a.quiet);
    save_package(&m, &a.out, a.force, &mut |n| pb.inc(n))?;
    pb.finish_and_clear();
    Ok(0)
}
