//! `milkit bench audio AUDIO --models DIR`: one transcription timed by stage (after a warm-up run),
//! the decoder's bytes per token, the read bandwidth of this machine for exactly that working
//! set, and the floor they imply; optionally faster-whisper on the same audio in the same run.

use anyhow::{bail, Context, Result};
use milkit::report::{AudioBenchReport, FasterWhisperRun};
use milkit::transcribe::{
    cost, Transcriber, Transcript, CROSS_KV_FILE, DECODER_FILE, ENCODER_FILE,
};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// Passes over the bandwidth buffer; the best counts.
const BANDWIDTH_PASSES: usize = 30;
/// Bandwidth passes after each timed run at the least.
const MIN_PASSES_PER_RUN: usize = 10;
/// Where the faster-whisper companion script lives, relative to the crate.
const FW_SCRIPT: &str = "tools/faster_whisper_bench.py";

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Decoder bytes per token: what one token's call must read when the encoder output
/// and the cross-attention K/V precomputed from it (the inputs a window's tokens share)
/// are fixed; see [`cost::token_bytes_per_call`].
fn decoder_bytes_per_token(tr: &Transcriber) -> Result<u64> {
    let path = tr.dir().join(DECODER_FILE);
    let m = milkit::package::load_package(&path)?;
    let fixed = |n: &str| n == "encoder_output_embeds" || n.starts_with("encoder_attn_");
    cost::token_bytes_per_call(&m, &fixed)
        .with_context(|| format!("counting the bytes per token of {}", path.display()))
}

/// FLOPs of one window: the encoder's contractions, plus the CrossKV model's when the
/// folder has one (see [`cost::flops_per_call`]).
fn encoder_flops(tr: &Transcriber) -> Result<u64> {
    let mut files = vec![ENCODER_FILE];
    if tr.uses_cross_kv() {
        files.push(CROSS_KV_FILE);
    }
    let mut total = 0;
    for f in files {
        let path = tr.dir().join(f);
        let m = milkit::package::load_package(&path)?;
        total += cost::flops_per_call(&m)
            .with_context(|| format!("counting the FLOPs of {}", path.display()))?;
    }
    Ok(total)
}

pub(crate) fn find_script() -> Option<PathBuf> {
    [
        PathBuf::from(FW_SCRIPT),
        Path::new(env!("CARGO_MANIFEST_DIR")).join(FW_SCRIPT),
    ]
    .into_iter()
    .find(|p| p.exists())
}

/// Runs `PYTHON tools/faster_whisper_bench.py AUDIO`; it prints one JSON line with
/// `total_ms` and `text`. None (with a note on stderr) when the script is absent.
fn faster_whisper(python: &Path, audio: &Path) -> Result<Option<(f64, String)>> {
    let Some(script) = find_script() else {
        eprintln!("skipping the faster-whisper comparison: {FW_SCRIPT} not found");
        return Ok(None);
    };
    let o = Command::new(python)
        .arg(&script)
        .arg(audio)
        .output()
        .with_context(|| format!("cannot run {} {}", python.display(), script.display()))?;
    if !o.status.success() {
        bail!(
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    let stdout = String::from_utf8_lossy(&o.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .with_context(|| format!("{} printed no JSON line", script.display()))?;
    let v: serde_json::Value = serde_json::from_str(line)
        .with_context(|| format!("{}: bad JSON line `{line}`", script.display()))?;
    let total = v["total_ms"]
        .as_f64()
        .with_context(|| format!("{}: no numeric total_ms", script.display()))?;
    Ok(Some((total, v["text"].as_str().unwrap_or("").to_string())))
}

pub fn run(
    audio: &Path,
    models: &Path,
    runs: usize,
    json: bool,
    compare: Option<&Path>,
    profile: Profile,
    compute: milkit::transcribe::Compute,
) -> Result<u8> {
    let t_start = Instant::now();
    let open = milkit::transcribe::OpenOptions {
        compute,
        ..Default::default()
    };
    let mut tr = Transcriber::open_with(models, &open)
        .with_context(|| format!("opening models folder {}", models.display()))?;
    let samples = milkit::whisper::audio::load_audio(audio)?;
    // The first run pages weights in and starts the thread pool: it is the cold, whole-job
    // number; the timed runs come after it.
    let cold = tr.transcribe(&samples)?;
    let cold_ms = ms(t_start.elapsed());
    // The floor's passes are taken after each timed run, so that they sample the same
    // minutes of a shared machine as the decoder calls they are set against.
    let bytes = decoder_bytes_per_token(&tr)?;
    let per_run = BANDWIDTH_PASSES
        .div_ceil(runs.max(1))
        .max(MIN_PASSES_PER_RUN);
    let (mut passes, mut warm) = (Vec::<f64>::new(), Vec::new());
    let mut best: Option<Transcript> = None;
    for _ in 0..runs.max(1) {
        let r = tr.transcribe(&samples)?;
        warm.extend(r.timings.warm_calls.iter().map(|d| d.as_secs_f64()));
        passes.extend(cost::stream_pass_seconds(bytes, per_run));
        if best
            .as_ref()
            .is_none_or(|b| r.timings.total < b.timings.total)
        {
            best = Some(r);
        }
    }
    let r = best.unwrap_or(cold);
    if profile != Profile::Off {
        print_profile(&mut tr, &samples, profile == Profile::Ops)?;
    }
    let bw = cost::best_pass_gbps(bytes, &passes);
    // The stream's passes read `streamed_bytes`; the floor is for `bytes`.
    let streamed = cost::streamed_bytes(bytes) as f64;
    let median_pass_ms = super::stats::median(&passes) * 1e3 * bytes as f64 / streamed;
    // 0 when every decoding pass ended at its first call (no warm call to time).
    let warm_median_ms = match warm.is_empty() {
        true => 0.0,
        false => super::stats::median(&warm) * 1e3,
    };
    let t = &r.timings;
    let encoder_gflop = encoder_flops(&tr)? as f64 / 1e9;
    let windows = r.windows.len().max(1) as f64;
    let mut report = AudioBenchReport {
        mel_ms: ms(t.mel),
        encoder_ms: ms(t.encoder + t.cross_kv),
        encoder_gflop,
        encoder_gflops: encoder_gflop * windows / (ms(t.encoder + t.cross_kv) / 1e3).max(1e-9),
        decoder_ms_per_token: ms(t.decoder) / t.decoder_steps.max(1) as f64,
        decoder_warm_ms_per_token: ms(t.decoder_calls.saturating_sub(t.decoder_first))
            / t.decoder_steps.saturating_sub(t.decoder_passes).max(1) as f64,
        decoder_first_call_ms: ms(t.decoder_first) / t.decoder_passes.max(1) as f64,
        decoder_bytes_per_token: bytes,
        bandwidth_gbps: bw,
        floor_ms_per_token: bytes as f64 / (bw * 1e9) * 1e3,
        decoder_warm_median_ms: warm_median_ms,
        floor_median_ms: median_pass_ms,
        total_ms: ms(t.total),
        faster_whisper: None,
    };
    if let Some(py) = compare {
        if let Some((total, text)) = faster_whisper(py, audio)? {
            report.faster_whisper = Some(FasterWhisperRun {
                total_ms: total,
                text,
                ratio: report.total_ms / total,
            });
        }
    }
    if json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(0);
    }
    println!("{}", r.text.trim());
    println!("| stage | milkit |");
    println!("|---|---|");
    println!("| mel | {:.1} ms |", report.mel_ms);
    println!(
        "| encoder | {:.1} ms ({:.1} GFLOP a window, {:.0} GFLOP/s) |",
        report.encoder_ms, report.encoder_gflop, report.encoder_gflops
    );
    println!(
        "| decoder | {:.2} ms/token × {} calls (decoding rules included); the model's warm calls {:.2} ms/token, the first call of each of {} passes {:.1} ms |",
        report.decoder_ms_per_token,
        t.decoder_steps,
        report.decoder_warm_ms_per_token,
        t.decoder_passes,
        report.decoder_first_call_ms
    );
    println!(
        "| decoder bytes/token | {:.1} MB |",
        report.decoder_bytes_per_token as f64 / 1e6
    );
    println!(
        "| bandwidth (same working set) | {:.1} GB/s |",
        report.bandwidth_gbps
    );
    println!(
        "| floor | {:.3} ms/token (warm decoder at {:.2}× floor) |",
        report.floor_ms_per_token,
        report.decoder_warm_ms_per_token / report.floor_ms_per_token
    );
    println!(
        "| medians | warm calls {:.3} ms/token against the stream's passes {:.3} ms: {:.2}× |",
        report.decoder_warm_median_ms,
        report.floor_median_ms,
        report.decoder_warm_median_ms / report.floor_median_ms
    );
    println!(
        "| total (models loaded, best of {}) | {:.1} ms |",
        runs.max(1),
        report.total_ms
    );
    println!("| load + first transcription | {cold_ms:.1} ms |");
    if let Some(fw) = &report.faster_whisper {
        println!(
            "| faster-whisper total | {:.1} ms (milkit/fw: {:.2}× loaded, {:.2}× load + first) |",
            fw.total_ms,
            fw.ratio,
            cold_ms / fw.total_ms
        );
        println!("faster-whisper text: {}", fw.text.trim());
    }
    Ok(0)
}

/// What `--profile` / `--profile-ops` print.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Profile {
    Off,
    /// Per op type, those over 1 % of their package's time.
    OpTypes,
    /// Every op, by name.
    Ops,
}

/// One more transcription with per-op timing on; per package, the op types that took at
/// least 1 % of that package's time, or with `each` every op by name (to stderr, so
/// `--json` stays parseable).
fn print_profile(tr: &mut Transcriber, samples: &[f32], each: bool) -> Result<()> {
    tr.profile_each_op(each);
    tr.enable_profiling(true);
    let r = tr.transcribe(samples)?;
    let steps = r.timings.decoder_steps.max(1);
    // Read before switching off: switching off drops the accumulated times.
    let prof = tr.profile();
    tr.enable_profiling(false);
    tr.profile_each_op(false);
    let mut totals: std::collections::BTreeMap<&str, f64> = Default::default();
    for (pkg, _, _, t) in &prof {
        *totals.entry(pkg).or_default() += ms(*t);
    }
    eprintln!("profile (one transcription, {steps} decoder calls):");
    eprintln!("| package | op | calls | ms | share |");
    eprintln!("|---|---|---|---|---|");
    for (pkg, op, n, t) in &prof {
        let total = totals.get(pkg).copied().unwrap_or(0.0).max(1e-9);
        if !each && ms(*t) / total < 0.01 {
            continue;
        }
        eprintln!(
            "| {pkg} | {op} | {n} | {:.2} | {:.0} % |",
            ms(*t),
            100.0 * ms(*t) / total
        );
    }
    Ok(())
}
