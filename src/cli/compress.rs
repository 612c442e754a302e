//! `milkit compress` and the compression flags shared with `milkit export`.

use super::progress;
use anyhow::{bail, Result};
use clap::Args;
pub use milkit::convert::compress::CompressFlags;
use milkit::ir::Model;
use milkit::package::{load_package, save_package};
use milkit::passes::compress::{Method, Outcome};
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
    #[command(flatten)]
    pub flags: CompressFlags,
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
    if c.target_bits.is_some() && !quiet {
        eprintln!("mixed precision: measuring each weight at 2/3/4/6/8 bits on the calibration statistics");
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
    apply(&mut m, &a.flags, a.json, a.quiet)?;
    let pb = progress::bytes_bar(0, "writing", a.quiet);
    save_package(&m, &a.out, a.force, &mut |n| pb.inc(n))?;
    pb.finish_and_clear();
    Ok(0)
}
