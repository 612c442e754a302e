//! `milkit bench`: timing tables (never timed tests). `milkit bench AUDIO --models DIR` times a
//! transcription (see `bench_audio`); `--suite export` an encoder export.

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use std::path::PathBuf;
use std::process::Command;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Suite {
    /// Export of the encoder of a synthetic checkpoint (default large-v3-turbo): wall time and
    /// peak RSS of the `milkit export` process.
    Export,
    /// LUT4 k-means g16 and int4 per-block-32 compression (src/cli/bench_compress.rs).
    Compress,
    /// Decoder ms per token against the weight-stream floor (needs --model HF_DIR).
    Decode,
}

#[derive(Args)]
pub struct BenchArgs {
    /// A WAV file to transcribe and time (needs --models); without it, --suite runs.
    pub audio: Option<PathBuf>,
    /// Models folder for the audio benchmark (as for `milkit transcribe`).
    #[arg(long)]
    pub models: Option<PathBuf>,
    /// Also run tools/faster_whisper_bench.py with this python on the same audio and show
    /// its total time next to milkit's (skipped with a note when the script is missing).
    #[arg(long, value_name = "PYTHON")]
    pub compare_faster_whisper: Option<PathBuf>,
    /// What to measure when no audio is given.
    #[arg(long, value_enum, default_value = "export")]
    pub suite: Suite,
    /// Preset of the synthetic checkpoint (export suite).
    #[arg(long, default_value = "large-v3-turbo")]
    pub preset: String,
    /// Use this checkpoint instead of synthesizing one (compress suite: the real checkpoint
    /// compared with coremltools; default ../shared/models/whisper-tiny.en): a directory or
    /// a Hub id ORG/NAME[@REVISION] (downloaded into the Hugging Face cache; docs/hub.md).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Repetitions (export: the median; audio: the best, after one warm-up run; decode:
    /// timed passes per variant, each paired with its own bandwidth measurement; the pass
    /// with the median ratio to its floor is shown).
    #[arg(long, default_value_t = 1)]
    pub runs: usize,
    /// Python with coremltools 9 to compare against (compress suite).
    #[arg(long)]
    pub python: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Audio benchmark: also time every op type of every package during one more
    /// transcription and print where the time goes (stderr).
    #[arg(long)]
    pub profile: bool,
    /// Compress suite: only the methods whose bench name contains this (`int4`, `lut4`);
    /// decode suite: only the variants whose name contains it (`fp16`, `LUT4`, `int4`).
    #[arg(long)]
    pub only: Option<String>,
    /// Compress suite: skip the tiny.en encoder (and coremltools), run only the turbo synth.
    #[arg(long)]
    pub only_turbo: bool,
    /// Decode suite: the kernel levels to time, comma-separated (`avx512`, `avx2`,
    /// `portable`; levels this CPU lacks are left out with a note); each variant's passes
    /// alternate between them, each paired with its own bandwidth measurement. Default: the
    /// CPU's best and, where that is AVX-512, also AVX2 (the kernels it replaces).
    #[arg(long, value_delimiter = ',')]
    pub isa: Vec<String>,
}

pub fn run(a: &BenchArgs) -> Result<u8> {
    if let Some(audio) = &a.audio {
        let models = a
            .models
            .as_deref()
            .context("milkit bench AUDIO needs --models DIR")?;
        return super::bench_audio::run(
            audio,
            models,
            a.runs,
            a.json,
            a.compare_faster_whisper.as_deref(),
            a.profile,
        );
    }
    let model = a
        .model
        .as_deref()
        .map(|m| milkit::hub::resolve_model(m, true))
        .transpose()?;
    match a.suite {
        Suite::Export => bench_export(a, model),
        Suite::Compress => super::bench_compress::run(
            model.as_deref(),
            a.python.as_deref(),
            a.json,
            &super::bench_compress::Filter {
                method: a.only.clone(),
                turbo_only: a.only_turbo,
            },
        ),
        Suite::Decode => {
            super::bench_decode::run(model.as_deref(), a.json, a.only.as_deref(), a.runs, &a.isa)
        }
    }
}

fn bench_export(a: &BenchArgs, model: Option<PathBuf>) -> Result<u8> {
    let exe = std::env::current_exe()?;
    let tmp = tempdir()?;
    let model = match model {
        Some(m) => m,
        None => {
            let dir = tmp.join("ckpt");
            eprintln!(
                "synthesizing a {} checkpoint in {} ...",
                a.preset,
                dir.display()
            );
            let st = Command::new(&exe)
                .args(["synth", "--preset", &a.preset, "--quiet", "--out"])
                .arg(&dir)
                .status()?;
            if !st.success() {
                bail!("milkit synth failed");
            }
            dir
        }
    };
    let mut rows = vec![];
    for i in 0..a.runs.max(1) {
        let out = tmp.join(format!("enc{i}.mlpackage"));
        let o = Command::new(&exe)
            .args([
                "export",
                "--component",
                "encoder",
                "--abi",
                "whisperkit",
                "--quiet",
                "--stats",
                "--model",
            ])
            .arg(&model)
            .arg("--out")
            .arg(&out)
            .output()?;
        if !o.status.success() {
            bail!(
                "milkit export failed: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        let text = String::from_utf8_lossy(&o.stderr);
        let line = text
            .lines()
            .rev()
            .find(|l| l.starts_with('{'))
            .context("export printed no stats")?;
        let v: serde_json::Value = serde_json::from_str(line)?;
        let bytes = std::fs::metadata(out.join("Data/com.apple.CoreML/weights/weight.bin"))?.len();
        rows.push((
            v["wall_ms"].as_f64().unwrap_or(f64::NAN),
            v["peak_rss_bytes"].as_u64().unwrap_or(0),
            bytes,
        ));
        let _ = std::fs::remove_dir_all(&out);
    }
    let _ = std::fs::remove_dir_all(&tmp);
    let mut walls: Vec<f64> = rows.iter().map(|r| r.0).collect();
    walls.sort_by(|x, y| x.total_cmp(y));
    let median = walls[walls.len() / 2];
    let rss = rows.iter().map(|r| r.1).max().unwrap_or(0);
    if a.json {
        println!(
            "{}",
            serde_json::json!({"suite": "export", "preset": a.preset, "runs": rows.len(), "wall_ms_median": median,
                "peak_rss_bytes": rss, "weight_bytes": rows[0].2})
        );
    } else {
        println!("| suite  | model | runs | wall (median) | peak RSS | weight.bin |");
        println!("|--------|-------|------|---------------|----------|------------|");
        println!(
            "| export encoder | {} | {} | {:.2} s | {:.2} GB | {:.2} GB |",
            a.model
                .as_ref()
                .map(|m| m.display().to_string())
                .unwrap_or(format!("synth {}", a.preset)),
            rows.len(),
            median / 1e3,
            rss as f64 / 1e9,
            rows[0].2 as f64 / 1e9
        );
    }
    Ok(0)
}

fn tempdir() -> Result<PathBuf> {
    let d = std::env::temp_dir().join(format!("milkit-bench-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}
