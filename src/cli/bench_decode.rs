//! `milkit bench decode --model HF_DIR`: per-token decode speed of tiny-sized
//! Whisper text decoders built in memory (stateful KV cache, precomputed cross K/V) in four
//! weight forms — fp16, head-only LUT4, all-LUT4, int4 per block of 32 — against the
//! weight-stream floor: bytes read per token ÷ memory bandwidth measured in the same run on
//! a buffer of exactly that many bytes.

use anyhow::{ensure, Context, Result};
use candle_core::{DType, Device, Tensor};
use milkit::ir::{Model, Opset};
use milkit::kernels::gemv::Isa;
use milkit::passes::compress::{compress, Method, Selection};
use milkit::passes::lut::{LutConfig, LutGranularity, LutMode};
use milkit::passes::quant::{QuantConfig, QuantDtype, QuantGranularity};
use milkit::runtime::Session;
use milkit::whisper::checkpoint::Checkpoint;
use milkit::whisper::decoder::{
    build_decoder, CrossKv, DecoderDims, DecoderOptions, KvCache, MASK_HIDDEN,
};
use milkit::whisper::weights::Component;
use std::path::Path;
use std::time::Instant;

/// Warm-up steps (not timed) and timed steps, starting at this cache position.
const WARMUP: usize = 8;
const STEPS: usize = 32;
const START: usize = 200;

/// One measured decoder on one kernel level.
pub struct DecodeRow {
    pub variant: String,
    pub isa: Isa,
    pub load_ms: f64,
    pub first_call_ms: f64,
    pub ms_per_token: f64,
    pub weight_bytes: usize,
    pub cross_kv_bytes: usize,
    pub bandwidth_gbps: f64,
}

impl DecodeRow {
    pub fn bytes(&self) -> usize {
        self.weight_bytes + self.cross_kv_bytes
    }
    pub fn floor_ms(&self) -> f64 {
        self.bytes() as f64 / (self.bandwidth_gbps * 1e9) * 1e3
    }
}

/// The kernel levels to time: the named ones this CPU runs, or by default its best and,
/// where that is AVX-512, AVX2 too.
pub fn levels(names: &[String]) -> Result<Vec<Isa>> {
    let cpu = Isa::supported();
    if names.is_empty() {
        return Ok(match Isa::cpu() {
            Isa::Avx512 => vec![Isa::Avx512, Isa::Avx2],
            b => vec![b],
        });
    }
    let mut out = vec![];
    for n in names {
        let isa = match n.trim() {
            "avx512" => Isa::Avx512,
            "avx2" => Isa::Avx2,
            "portable" => Isa::Portable,
            other => {
                anyhow::bail!("unknown kernel level `{other}` (have: avx512, avx2, portable)")
            }
        };
        if !cpu.contains(&isa) {
            eprintln!(
                "note: this CPU does not run the {} kernels; left out",
                isa.name()
            );
        } else if !out.contains(&isa) {
            out.push(isa);
        }
    }
    ensure!(
        !out.is_empty(),
        "none of the kernel levels {names:?} runs on this CPU"
    );
    Ok(out)
}

/// Builds, loads and times the four decoders of the checkpoint at `model_dir` (those whose
/// name contains `only`): `runs` timed passes each per kernel level, alternating between
/// the levels, every one paired with a bandwidth measurement; per level the pass with the
/// median ratio to its floor is reported.
pub fn measure(
    model_dir: &Path,
    only: Option<&str>,
    runs: usize,
    isas: &[Isa],
) -> Result<Vec<DecodeRow>> {
    let ckpt = Checkpoint::open(model_dir)?;
    let w = ckpt.checked_weights(Component::Decoder)?;
    let dims = DecoderDims::from_config(ckpt.config());
    ensure!(
        START + WARMUP + STEPS <= dims.n_text_ctx,
        "the text context ({}) is too short for the timed positions",
        dims.n_text_ctx
    );
    let opts = DecoderOptions {
        alignment_heads: vec![],
        per_head_alignment: false,
        head_chunks: 1,
        kv_cache: KvCache::State,
        cross_kv: CrossKv::Precomputed,
    };
    let base = build_decoder(&dims, w, &opts, Opset::Ios18)
        .with_context(|| format!("building the decoder of {}", model_dir.display()))?;
    let lut4 = Method::Palettize(LutConfig {
        mode: LutMode::Kmeans,
        nbits: 4,
        granularity: LutGranularity::PerGroupedChannel(8),
        per_channel_scale: false,
        cluster_dim: 1,
    });
    let int4 = Method::Quantize(QuantConfig {
        dtype: QuantDtype::Int4,
        granularity: QuantGranularity::PerBlock(32),
        symmetric: true,
    });
    let head = Selection {
        op_names: vec!["lm_head".into()],
        ..Selection::default()
    };
    let all = Selection::default();
    let variants: Vec<(&str, Option<(&Method, &Selection)>)> = vec![
        ("fp16", None),
        ("head-LUT4", Some((&lut4, &head))),
        ("all-LUT4", Some((&lut4, &all))),
        ("int4 block32", Some((&int4, &all))),
    ];
    let mut rows = vec![];
    let wanted = |name: &str| only.is_none_or(|o| name.contains(o));
    ensure!(
        variants.iter().any(|(n, _)| wanted(n)),
        "no decode variant matches `{}` (have: {})",
        only.unwrap_or_default(),
        variants
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(", ")
    );
    for (name, how) in variants.into_iter().filter(|(n, _)| wanted(n)) {
        let mut m = base.clone();
        if let Some((method, sel)) = how {
            eprintln!("compressing the {name} decoder ...");
            compress(&mut m, method, sel).with_context(|| format!("compressing {name}"))?;
        }
        let timed = time_variant(name, m, &dims, runs.max(1), isas);
        Isa::set_cap(None);
        rows.extend(timed.with_context(|| format!("timing {name}"))?);
    }
    Ok(rows)
}

fn time_variant(
    name: &str,
    m: Model,
    d: &DecoderDims,
    runs: usize,
    isas: &[Isa],
) -> Result<Vec<DecodeRow>> {
    let t0 = Instant::now();
    let mut s = Session::from_model(m)?;
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    let cpu = Device::Cpu;
    let (dl, na, n) = (d.d_model * d.layers, d.n_audio_ctx, d.n_text_ctx);
    // Cross K/V with small non-zero values (their content does not change the work).
    let kv: Vec<f32> = (0..dl * na)
        .map(|i| ((i % 97) as f32 - 48.0) * 1e-3)
        .collect();
    let kv = Tensor::from_vec(kv, (1, dl, 1, na), &cpu)?.to_dtype(DType::F16)?;
    let step = |s: &mut Session, pos: usize| -> Result<()> {
        let mask: Vec<f32> = (0..n)
            .map(|j| if j <= pos { 0.0 } else { MASK_HIDDEN })
            .collect();
        let token = 50257 + (pos % 100) as i32;
        let inputs = [
            ("input_ids", Tensor::new(&[token], &cpu)?),
            ("cache_length", Tensor::new(&[pos as i32], &cpu)?),
            (
                "decoder_key_padding_mask",
                Tensor::from_vec(mask, (1, n), &cpu)?.to_dtype(DType::F16)?,
            ),
            ("encoder_attn_key_cache", kv.clone()),
            ("encoder_attn_value_cache", kv.clone()),
        ];
        let out = s.predict(&inputs)?;
        ensure!(
            out.iter()
                .any(|(k, v)| k == "logits" && v.elem_count() == d.vocab),
            "the decoder returned no logits"
        );
        Ok(())
    };
    let t1 = Instant::now();
    step(&mut s, 0)?;
    let first_call_ms = t1.elapsed().as_secs_f64() * 1e3;
    for p in START..START + WARMUP {
        step(&mut s, p)?;
    }
    // The timed steps continue at fresh cache positions, each a complete one-token run;
    // every pass covers the same positions (the states are not reset: what a position
    // holds does not change the work). Each pass is paired with a bandwidth measurement
    // taken just before it (the same measurement as `milkit bench audio AUDIO`, best of 4 passes
    // over a buffer of the bytes a token reads): the machine's bandwidth drifts between
    // minutes, so a ratio is only meaningful within a pair. The pass with the median ratio
    // is reported.
    let weight_bytes = s.streamed_bytes(None)?;
    let cross_kv_bytes = 2 * dl * na * 2;
    let bytes = (weight_bytes + cross_kv_bytes) as u64;
    // Per level: (ms per token, GB/s) of each pass; the levels alternate pass by pass, so
    // that a drift of the machine's speed reaches them alike.
    let mut pairs: Vec<Vec<(f64, f64)>> = vec![vec![]; isas.len()];
    for _ in 0..runs {
        for (li, &isa) in isas.iter().enumerate() {
            Isa::set_cap(Some(isa));
            // One untimed step on this level first (its kernels' code and tables warm).
            step(&mut s, START)?;
            let bw = milkit::transcribe::cost::stream_bandwidth_gbps(bytes, 4);
            let t2 = Instant::now();
            for p in START + WARMUP..START + WARMUP + STEPS {
                step(&mut s, p)?;
            }
            pairs[li].push((t2.elapsed().as_secs_f64() * 1e3 / STEPS as f64, bw));
        }
    }
    let mut out = vec![];
    for (li, &isa) in isas.iter().enumerate() {
        let p = &mut pairs[li];
        // ms × GB/s orders the pairs as their ratios to the floor do.
        p.sort_by(|a, b| (a.0 * a.1).total_cmp(&(b.0 * b.1)));
        let (ms_per_token, bandwidth_gbps) = p[p.len() / 2];
        // Where a step's time goes (a few more profiled steps, to stderr).
        Isa::set_cap(Some(isa));
        s.enable_profiling(true);
        for p in START + WARMUP + STEPS..START + WARMUP + STEPS + 4 {
            step(&mut s, p)?;
        }
        let prof: Vec<String> = s
            .profile()
            .iter()
            .take(6)
            .map(|(op, n, t)| format!("{op} {:.2} ms ({} calls)", t.as_secs_f64() * 250.0, n / 4))
            .collect();
        s.enable_profiling(false);
        eprintln!("{name} [{}] per step: {}", isa.name(), prof.join(", "));
        out.push(DecodeRow {
            variant: name.to_string(),
            isa,
            load_ms,
            first_call_ms,
            ms_per_token,
            weight_bytes,
            cross_kv_bytes,
            bandwidth_gbps,
        });
    }
    Ok(out)
}

/// Runs the suite and prints the table (or JSON).
pub fn run(
    model: Option<&Path>,
    json: bool,
    only: Option<&str>,
    runs: usize,
    isa: &[String],
) -> Result<u8> {
    let model = model.context("the decode suite needs --model HF_DIR (e.g. whisper-tiny.en)")?;
    let isas = levels(isa)?;
    let rows = measure(model, only, runs, &isas)?;
    if json {
        let report = milkit::report::DecodeBenchReport {
            suite: "decode".into(),
            rows: rows
                .iter()
                .map(|r| milkit::report::DecodeBenchRow {
                    variant: r.variant.clone(),
                    isa: r.isa.name().into(),
                    ms_per_token: r.ms_per_token,
                    bytes_per_token: r.bytes() as u64,
                    weight_bytes: r.weight_bytes as u64,
                    cross_kv_bytes: r.cross_kv_bytes as u64,
                    bandwidth_gbps: r.bandwidth_gbps,
                    floor_ms_per_token: r.floor_ms(),
                    ratio: r.ms_per_token / r.floor_ms(),
                    load_ms: r.load_ms,
                    first_call_ms: r.first_call_ms,
                })
                .collect(),
        };
        println!("{}", serde_json::to_string(&report)?);
        return Ok(0);
    }
    println!(
        "decode: {WARMUP} warm-up + {STEPS} timed steps from cache position {START}; median ratio of {} passes, each against the bandwidth measured just before it; {} threads",
        runs.max(1),
        rayon::current_num_threads()
    );
    println!(
        "| variant | kernels | ms/token | bytes/token | GB/s | floor ms | ratio | first call ms |"
    );
    println!(
        "|---------|---------|----------|-------------|------|----------|-------|---------------|"
    );
    for r in &rows {
        println!(
            "| {} | {} | {:.2} | {:.1} MB | {:.1} | {:.2} | {:.2}× | {:.1} |",
            r.variant,
            r.isa.name(),
            r.ms_per_token,
            r.bytes() as f64 / 1e6,
            r.bandwidth_gbps,
            r.floor_ms(),
            r.ms_per_token / r.floor_ms(),
            r.first_call_ms
        );
    }
    Ok(0)
}
