//! `milkit bench audio|export|compress|decode|gemm|whole`: timing tables (never timed tests): a
//! transcription by stage (`bench_audio`), an encoder export, compression
//! (`bench_compress`), decoding per token (`bench_decode`), encoder-sized products against
//! a plain GEMM (`bench_gemm`), whole processes against faster-whisper (`bench_whole`).

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::process::Command;

#[derive(Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub what: Bench,
}

/// What to time.
#[derive(Subcommand)]
pub enum Bench {
    /// One transcription timed by stage against the decoder's weight-stream floor.
    Audio(AudioBench),
    /// An encoder export of a synthetic checkpoint: wall time and peak RSS.
    Export(ExportBench),
    /// LUT4 k-means g16 and int4 per-block-32 compression, next to coremltools'.
    Compress(CompressBench),
    /// Decoder ms per token against the bytes ÷ bandwidth floor.
    Decode(DecodeBench),
    /// Encoder-sized products: milkit's 1x1 conv against a plain f32 GEMM, same run.
    Gemm(GemmBench),
    /// Whole process against whole process: `milkit transcribe` and faster-whisper on the
    /// same audio, alternating; wall time and peak RSS of each.
    Whole(WholeBench),
}

#[derive(Args)]
pub struct WholeBench {
    /// The WAV file both transcribe.
    pub audio: PathBuf,
    /// Models folder milkit transcribes with (as for `milkit transcribe`).
    #[arg(long)]
    pub models: PathBuf,
    /// Timed runs per tool, after one untimed warm-up pair; medians and ranges are shown.
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Threads for each tool (milkit's RAYON_NUM_THREADS, faster-whisper's cpu_threads).
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Language both are forced to (temperature 0, no timestamps).
    #[arg(long, default_value = "en")]
    pub language: String,
    /// Beams both decode with: 1 is greedy; 5 is openai-whisper's CLI and faster-whisper's
    /// default (both then keep the best of 5 by summed log-probability and length penalty).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=32))]
    pub beam_size: u32,
    /// Python with faster-whisper (tools/faster_whisper_bench.py) to run alongside.
    #[arg(long, value_name = "PYTHON")]
    pub faster_whisper: Option<PathBuf>,
    /// The Hugging Face checkpoint faster-whisper converts (default: the tiny.en fixture).
    #[arg(long, value_name = "HF_DIR")]
    pub checkpoint: Option<PathBuf>,
    /// CTranslate2 compute type for faster-whisper (`int8`, `float32`).
    #[arg(long, default_value = "int8")]
    pub compute_type: String,
    /// Print JSON (schemas/bench-whole.schema.json) instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct GemmBench {
    /// Timed runs per side (alternating, after one warm-up); the median is shown.
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Only the shapes whose name contains this (`tiny`, `fc1`, `turbo`); `ops`: only the
    /// encoder small ops before and after (layer norm, GELU, fc1 → GELU).
    #[arg(long)]
    pub only: Option<String>,
    /// milkit's kernel level (`avx512`, `avx2`, `portable`); default the CPU's best.
    #[arg(long)]
    pub isa: Option<String>,
    /// `bf16`: also time the conv computed on bf16 inputs (f32 sums; `--compute bf16`, a
    /// faster evaluation mode, not what a device computes) in the same alternation (with
    /// `--attention`: the panels on bf16 products); needs a CPU with AVX512-BF16.
    /// `package` (default): fp16 conv and f32 GEMM only.
    #[arg(long, value_enum, default_value = "package")]
    pub compute: milkit::runtime::precision::Compute,
    /// Time the encoders' fused self-attention instead: its panels (on LEVEL's kernels)
    /// against the blocks on candle's gemm they replace.
    #[arg(long)]
    pub attention: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct AudioBench {
    /// The WAV file to transcribe.
    pub audio: PathBuf,
    /// Models folder (as for `milkit transcribe`).
    #[arg(long)]
    pub models: PathBuf,
    /// Timed runs after one warm-up; the best is shown.
    #[arg(long, default_value_t = 1)]
    pub runs: usize,
    /// Also time faster-whisper (tools/faster_whisper_bench.py) with this python.
    #[arg(long, value_name = "PYTHON")]
    pub compare_faster_whisper: Option<PathBuf>,
    /// Also print the time per op type of every package (stderr).
    #[arg(long)]
    pub profile: bool,
    /// Like --profile, but every op on its own line, named as in the program (`conv
    /// lm_head`, `matmul+softmax+matmul layers_0_encoder_attn_context`): where a decode
    /// step's time goes op by op.
    #[arg(long)]
    pub profile_ops: bool,
    /// Precision the packages are computed in, as for `milkit transcribe` (`bf16`: the
    /// encoder's 1x1 convs and self-attention on bf16 inputs, a faster evaluation mode, not
    /// what a device
    /// computes).
    #[arg(long, value_enum, default_value = "package")]
    pub compute: milkit::runtime::precision::Compute,
    /// Print JSON (schemas/bench-audio.schema.json) instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct ExportBench {
    /// Preset of the synthetic checkpoint.
    #[arg(long, default_value = "large-v3-turbo")]
    pub preset: String,
    /// Export this checkpoint (a directory or a Hub id) instead of synthesizing one.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Runs; the median is shown.
    #[arg(long, default_value_t = 1)]
    pub runs: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct CompressBench {
    /// The real checkpoint compared with coremltools (default ../shared/models/whisper-tiny.en).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Python with coremltools 9 to compare against.
    #[arg(long)]
    pub python: Option<PathBuf>,
    /// Only the methods whose name contains this (`int4`, `lut4`).
    #[arg(long)]
    pub only: Option<String>,
    /// Only the large-v3-turbo synth encoder (no tiny.en, no coremltools).
    #[arg(long)]
    pub only_turbo: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct DecodeBench {
    /// The checkpoint whose decoder is timed (a directory or a Hub id).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Only the variants whose name contains this (`fp16`, `LUT4`, `int4`).
    #[arg(long)]
    pub only: Option<String>,
    /// Timed passes per variant and kernel level, each paired with its own bandwidth
    /// measurement; the pass with the median ratio to its floor is shown.
    #[arg(long, default_value_t = 1)]
    pub runs: usize,
    /// Kernel levels, comma-separated (`avx512`, `avx2`, `portable`); default the CPU's best
    /// and AVX2 beside AVX-512 (docs/speed.md).
    #[arg(long, value_delimiter = ',')]
    pub isa: Vec<String>,
    /// Print JSON (schemas/bench-decode.schema.json) instead of a table.
    #[arg(long)]
    pub json: bool,
}

fn resolve(model: &Option<PathBuf>) -> Result<Option<PathBuf>> {
    model
        .as_deref()
        .map(|m| milkit::hub::resolve_model(m, true))
        .transpose()
}

pub fn run(a: &BenchArgs) -> Result<u8> {
    match &a.what {
        Bench::Audio(b) => super::bench_audio::run(
            &b.audio,
            &b.models,
            b.runs,
            b.json,
            b.compare_faster_whisper.as_deref(),
            match (b.profile_ops, b.profile) {
                (true, _) => super::bench_audio::Profile::Ops,
                (false, true) => super::bench_audio::Profile::OpTypes,
                (false, false) => super::bench_audio::Profile::Off,
            },
            b.compute,
        ),
        Bench::Export(b) => bench_export(b, resolve(&b.model)?),
        Bench::Compress(b) => super::bench_compress::run(
            resolve(&b.model)?.as_deref(),
            b.python.as_deref(),
            b.json,
            &super::bench_compress::Filter {
                method: b.only.clone(),
                turbo_only: b.only_turbo,
            },
        ),
        Bench::Gemm(b) => {
            if let Some(name) = &b.isa {
                let level = super::bench_decode::levels(std::slice::from_ref(name))?;
                milkit::kernels::gemv::Isa::set_cap(level.first().copied());
            }
            match b.attention {
                true => {
                    super::bench_gemm::run_attention(b.runs, b.only.as_deref(), b.json, b.compute)
                }
                false => super::bench_gemm::run(b.runs, b.only.as_deref(), b.json, b.compute),
            }
        }
        Bench::Whole(b) => super::bench_whole::run(&super::bench_whole::WholeOpts {
            audio: &b.audio,
            models: &b.models,
            runs: b.runs,
            threads: b.threads,
            language: &b.language,
            beam_size: b.beam_size as usize,
            python: b.faster_whisper.as_deref(),
            checkpoint: b.checkpoint.as_deref(),
            compute_type: &b.compute_type,
            json: b.json,
        }),
        Bench::Decode(b) => super::bench_decode::run(
            resolve(&b.model)?.as_deref(),
            b.json,
            b.only.as_deref(),
            b.runs,
            &b.isa,
        ),
    }
}

fn bench_export(a: &ExportBench, model: Option<PathBuf>) -> Result<u8> {
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
