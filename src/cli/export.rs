//! `milkit export`: checkpoint → .mlpackage.

pub use super::export_args::ExportArgs;
use super::export_args::{dir_bytes, parse_target, report_folder, summary, ComponentArg};
use super::progress;
use anyhow::{bail, Result};
use milkit::convert::bundle::{
    build_component, write_whisperkit_folder, BundleOptions, Component, ComponentSpec,
};
use milkit::convert::decoder_export::DecoderExport;
use milkit::ir::Opset;
use milkit::package::save_package;
use milkit::whisper::checkpoint::Checkpoint;
use milkit::whisper::decoder::CrossKv;
use std::path::Path;
use std::time::Instant;

pub fn run(a: &ExportArgs) -> Result<u8> {
    milkit::whisper::weights::set_allow_nonfinite(a.allow_nonfinite);
    if a.out.exists() && !a.force {
        bail!(
            "{} already exists; pass --force to replace it",
            a.out.display()
        );
    }
    if let Some(r) = &a.recipe {
        if a.per_head_alignment || a.no_per_head_alignment {
            bail!("with --recipe the recipe chooses the decoder's outputs: write `per_head_alignment = false` (or true) in its decoder component instead of --per-head-alignment/--no-per-head-alignment");
        }
        let model = milkit::hub::resolve_model(&a.model, !a.quiet)?;
        return super::export_recipe::run(a, &model, r);
    }
    let t0 = Instant::now();
    let opset = parse_target(&a.target)?;
    check_decoder_flags(a, opset)?;
    let model = milkit::hub::resolve_model(&a.model, !a.quiet)?;
    if a.component == ComponentArg::All {
        return run_all(a, &model, opset);
    }
    let spec = ComponentSpec {
        component: component_of(a.component),
        abi: a.abi,
        opset,
        decoder: decoder_export(a),
        compression: a.compress.compression()?,
    };
    let pb = progress::bar(0, "building", a.quiet);
    let built = build_component(&Checkpoint::open(&model)?, &spec, &mut |i, n| {
        pb.set_length(n as u64);
        pb.set_position(i as u64);
    })?;
    pb.finish_and_clear();
    if let Some((method, out)) = &built.compressed {
        if a.json || a.verbose {
            super::compress::print_report(method, out, a.json, a.quiet)?;
        } else if !a.quiet {
            eprintln!("compressed {}", summary(method, out));
        }
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

fn component_of(c: ComponentArg) -> Component {
    match c {
        ComponentArg::Encoder => Component::Encoder,
        ComponentArg::Decoder | ComponentArg::All => Component::Decoder,
        ComponentArg::Mel => Component::Mel,
        ComponentArg::Crosskv => Component::CrossKv,
        ComponentArg::Prefill => Component::Prefill,
    }
}

fn decoder_export(a: &ExportArgs) -> DecoderExport {
    DecoderExport {
        stateful: a.stateful,
        cross_kv: a.cross_kv,
        head_chunks: a.head_chunks,
        per_head_alignment: per_head_alignment(a),
    }
}

/// The per-head alignment output: on for --component all unless --no-per-head-alignment,
/// for --component decoder only with --per-head-alignment.
fn per_head_alignment(a: &ExportArgs) -> bool {
    match a.component {
        ComponentArg::All => !a.no_per_head_alignment,
        _ => a.per_head_alignment,
    }
}

/// Decoder flags on a component without a decoder, and --stateful below iOS18, are errors.
fn check_decoder_flags(a: &ExportArgs, opset: Opset) -> Result<()> {
    let decoder = matches!(a.component, ComponentArg::Decoder | ComponentArg::All);
    if !decoder && (a.stateful || a.head_chunks != 1 || a.cross_kv != CrossKv::InGraph) {
        bail!("--stateful, --cross-kv and --head-chunks shape the text decoder; use them with --component decoder or all");
    }
    if !decoder && (a.per_head_alignment || a.no_per_head_alignment) {
        bail!("--per-head-alignment and --no-per-head-alignment choose the text decoder's outputs; use them with --component decoder or all");
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
fn run_all(a: &ExportArgs, model: &Path, opset: Opset) -> Result<u8> {
    let t0 = Instant::now();
    if !a.compress.op_nbits.is_empty() {
        // Whisper's encoder and decoder share weight names (layers_0_fc1, ...).
        bail!("--op-nbits with --component all would name weights of both the encoder and the decoder; give the widths in a recipe (`op_nbits` in the [component.compress] table of the component they belong to), or export one component");
    }
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
    let ckpt = Checkpoint::open(model)?;
    let report = write_whisperkit_folder(&ckpt, &a.out, &opts, a.force, &mut |msg| {
        sp.set_message(msg.to_string())
    })?;
    sp.finish_and_clear();
    report_folder(&report, a.json, a.quiet, a.verbose)?;
    if !a.quiet {
        let (packages, others): (Vec<&String>, Vec<&String>) =
            report.files.iter().partition(|f| f.ends_with(".mlpackage"));
        let stems: Vec<&str> = packages
            .iter()
            .map(|f| f.trim_end_matches(".mlpackage"))
            .collect();
        eprintln!(
            "wrote {} ({} .mlpackage, {} checkpoint files; {:.1} MB) in {:.1} s",
            a.out.display(),
            stems.join(", "),
            others.len(),
            dir_bytes(&a.out) as f64 / 1e6,
            t0.elapsed().as_secs_f64()
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
