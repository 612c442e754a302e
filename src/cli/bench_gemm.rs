//! `milkit bench gemm`: encoder-sized products — milkit's runtime running one BC1S 1x1 `conv`
//! (fp16 data, fp32 accumulation, fp16 output, as every encoder projection runs) against a
//! plain f32 GEMM of the same shape (candle's gemm on f32 tensors already in memory) timed
//! in the same run, alternating, so that the ratio is what milkit's path costs over the
//! GEMM it is built on. Rates are 2·m·n·k FLOPs over the time of one product. With
//! `--compute bf16` the same conv computed on bf16 inputs (`kernels::gemm::gemm_bf16`) is
//! timed in the same alternation, and its output compared with the fp16 conv's (PSNR).
//!
//! With `--attention`: an encoder's fused self-attention (`kernels::attention_with`, fp16
//! heads of 64 over 1500 frames, fp16 scores and probabilities) on the panels against the
//! blocks they replace, alternating pair by pair, with the range of the pairs' ratios; with
//! `--compute bf16` also the panels on bf16 products (`Kernel::PanelsBf16`) in the same
//! alternation, with their ratio to the f32 panels and their output's PSNR against them.
//!
//! Without `--only` (or with `--only ops` alone), a further table times the encoder's small
//! ops (layer norm over channels, GELU, fc1 → GELU) the way they ran before and the way they
//! run now, alternating.

use anyhow::{Context, Result};
use candle_core::{DType as CDType, Device, Tensor};
use half::f16;
use milkit::ir::{DType, Description, Model, Opset, Tensor as ITensor, Value, ValueType};
use milkit::ops::{Builder, In};
use milkit::runtime::precision::Compute;
use milkit::runtime::{Options, Session};
use std::time::Instant;

/// One product shape: `[m, k] · [k, n]`, m the encoder's frames.
pub struct Shape {
    pub name: &'static str,
    pub m: usize,
    pub k: usize,
    pub n: usize,
}

/// The encoder projections of tiny, base and large-v3-turbo (1500 frames).
pub const SHAPES: &[Shape] = &[
    Shape {
        name: "tiny attention (384 → 384)",
        m: 1500,
        k: 384,
        n: 384,
    },
    Shape {
        name: "tiny fc1 (384 → 1536)",
        m: 1500,
        k: 384,
        n: 1536,
    },
    Shape {
        name: "base fc1 (512 → 2048)",
        m: 1500,
        k: 512,
        n: 2048,
    },
    Shape {
        name: "turbo fc1 (1280 → 5120)",
        m: 1500,
        k: 1280,
        n: 5120,
    },
];

/// One shape's measurements: the best and the median of the timed runs, each side.
#[derive(serde::Serialize)]
pub struct GemmRow {
    pub shape: String,
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub gflop: f64,
    pub milkit_ms_best: f64,
    pub milkit_ms_median: f64,
    pub reference_ms_best: f64,
    pub reference_ms_median: f64,
    pub milkit_gflops: f64,
    pub reference_gflops: f64,
    /// milkit's median time over the reference's median time.
    pub ratio: f64,
    /// With `--compute bf16`: the bf16 conv's times, rate, ratio to the reference's median
    /// and the PSNR of its output against the fp16 conv's (dB, peak the largest |y|).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bf16: Option<Bf16Row>,
}

/// The bf16 conv of one shape (see [`GemmRow::bf16`]).
#[derive(serde::Serialize)]
pub struct Bf16Row {
    pub ms_best: f64,
    pub ms_median: f64,
    pub gflops: f64,
    pub ratio: f64,
    pub psnr_db: f64,
}

/// PSNR of `got` against `want`, the peak being `want`'s largest magnitude.
fn psnr(want: &[f32], got: &[f32]) -> f64 {
    let peak = want.iter().fold(0f64, |m, &v| m.max(f64::from(v).abs()));
    let mse = want
        .iter()
        .zip(got)
        .map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2))
        .sum::<f64>()
        / want.len().max(1) as f64;
    10.0 * (peak * peak / mse).log10()
}

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 0.2 - 0.1
        })
        .collect()
}

/// Input `x` fp16 [1, k, 1, m] and the op `name`: its `conv` with a constant fp16 weight
/// [n, k, 1, 1] and bias [n] (the same values for every model of shape `s`).
fn encoder_conv(b: &mut Builder, s: &Shape, name: &str) -> Result<milkit::ops::V> {
    let x = b.input("x", ValueType::tensor(DType::F16, &[1, s.k, 1, s.m]));
    let w: Vec<f16> = values(s.n * s.k, 7)
        .into_iter()
        .map(f16::from_f32)
        .collect();
    let bias: Vec<f16> = values(s.n, 9).into_iter().map(f16::from_f32).collect();
    b.op1(
        "conv",
        name,
        vec![
            ("x", In::V(x)),
            (
                "weight",
                In::C(Value::Tensor(ITensor::f16(&[s.n, s.k, 1, 1], &w))),
            ),
            ("bias", In::C(Value::Tensor(ITensor::f16(&[s.n], &bias)))),
        ],
    )
}

/// The encoder's form of the product: `conv` of x fp16 [1, k, 1, m] with a constant fp16
/// weight [n, k, 1, 1] and bias [n].
fn conv_model(s: &Shape) -> Result<Model> {
    let mut b = Builder::new(Opset::Ios18);
    let y = encoder_conv(&mut b, s, "proj")?;
    let (inputs, block) = b.finish(&[(y, "y")])?;
    Ok(Model::single(
        Opset::Ios18,
        inputs,
        block,
        Description::default(),
    ))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Times every shape: one warm-up of each side, then `runs` alternating pairs (triples
/// with `bf16`: the conv on bf16 inputs too).
pub fn measure(shapes: &[&Shape], runs: usize, bf16: bool) -> Result<Vec<GemmRow>> {
    let dev = Device::Cpu;
    let mut rows = vec![];
    for s in shapes {
        let mut session = Session::from_model(conv_model(s)?).context("building the conv")?;
        // Every call computes: no reuse of a result whose inputs did not change.
        session.set_memoize(false);
        let mut half_session = if bf16 {
            let opts = Options {
                compute: Compute::Bf16,
                ..Default::default()
            };
            let mut h = Session::from_model_with(conv_model(s)?, &opts)
                .context("building the conv with --compute bf16")?;
            h.set_memoize(false);
            Some(h)
        } else {
            None
        };
        let x = Tensor::from_vec(values(s.k * s.m, 3), (1, s.k, 1, s.m), &dev)?
            .to_dtype(CDType::F16)?;
        let a = Tensor::from_vec(values(s.m * s.k, 3), (s.m, s.k), &dev)?;
        let w = Tensor::from_vec(values(s.k * s.n, 7), (s.k, s.n), &dev)?;
        let mut mine = vec![];
        let mut reference = vec![];
        let mut halves = vec![];
        let mut psnr_db = f64::NAN;
        for i in 0..=runs.max(1) {
            let t = Instant::now();
            let y16 = session.predict(&[("x", x.clone())])?;
            let tm = t.elapsed().as_secs_f64() * 1e3;
            let t = Instant::now();
            let y = a.matmul(&w)?;
            let tr = t.elapsed().as_secs_f64() * 1e3;
            drop(y);
            if let Some(h) = half_session.as_mut() {
                let t = Instant::now();
                let yb = h.predict(&[("x", x.clone())])?;
                let tb = t.elapsed().as_secs_f64() * 1e3;
                if i == 0 {
                    let flat = |t: &Tensor| -> Result<Vec<f32>> {
                        Ok(t.flatten_all()?.to_dtype(CDType::F32)?.to_vec1()?)
                    };
                    psnr_db = psnr(&flat(&y16[0].1)?, &flat(&yb[0].1)?);
                } else {
                    halves.push(tb);
                }
            }
            drop(y16);
            if i > 0 {
                mine.push(tm);
                reference.push(tr);
            }
        }
        let gflop = 2.0 * (s.m * s.n * s.k) as f64 / 1e9;
        let best = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
        let (mb, rb) = (best(&mine), best(&reference));
        let (mm, rm) = (median(&mut mine), median(&mut reference));
        let bf16 = (!halves.is_empty()).then(|| {
            let b = best(&halves);
            let md = median(&mut halves);
            Bf16Row {
                ms_best: b,
                ms_median: md,
                gflops: gflop / (md / 1e3),
                ratio: md / rm,
                psnr_db,
            }
        });
        rows.push(GemmRow {
            shape: s.name.to_string(),
            m: s.m,
            k: s.k,
            n: s.n,
            gflop,
            milkit_ms_best: mb,
            milkit_ms_median: mm,
            reference_ms_best: rb,
            reference_ms_median: rm,
            milkit_gflops: gflop / (mm / 1e3),
            reference_gflops: gflop / (rm / 1e3),
            ratio: mm / rm,
            bf16,
        });
    }
    Ok(rows)
}

/// One encoder self-attention: `heads` heads of `d` over `s` frames.
pub struct AttnShape {
    pub name: &'static str,
    pub heads: usize,
    pub s: usize,
    pub d: usize,
}

/// The encoders' self-attention of tiny, base and large-v3-turbo.
pub const ATTENTION: &[AttnShape] = &[
    AttnShape {
        name: "tiny self-attention (6 heads)",
        heads: 6,
        s: 1500,
        d: 64,
    },
    AttnShape {
        name: "base self-attention (8 heads)",
        heads: 8,
        s: 1500,
        d: 64,
    },
    AttnShape {
        name: "turbo self-attention (20 heads)",
        heads: 20,
        s: 1500,
        d: 64,
    },
];

/// One attention shape's measurements: each kernel's median and range, and the median and
/// range of the panels' time over the blocks' in the same pair.
#[derive(serde::Serialize)]
pub struct AttnRow {
    pub shape: String,
    pub heads: usize,
    pub s: usize,
    pub d: usize,
    /// 4·heads·s²·d: the two products (the softmax not counted).
    pub gflop: f64,
    pub blocks_ms: [f64; 3],
    pub panels_ms: [f64; 3],
    pub blocks_gflops: f64,
    pub panels_gflops: f64,
    /// Panels over blocks, per pair: [min, median, max].
    pub ratio: [f64; 3],
    /// With `--compute bf16`: the panels on bf16 products.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bf16: Option<AttnBf16Row>,
}

/// The bf16 panels of one attention shape (see [`AttnRow::bf16`]).
#[derive(serde::Serialize)]
pub struct AttnBf16Row {
    /// [min, median, max] ms.
    pub ms: [f64; 3],
    pub gflops: f64,
    /// bf16 panels over the f32 panels, per round: [min, median, max].
    pub ratio: [f64; 3],
    /// The output's PSNR against the f32 panels' (dB, peak the largest |y|).
    pub psnr_db: f64,
}

/// [min, median, max].
fn spread(v: &mut [f64]) -> [f64; 3] {
    let m = median(v);
    [v[0], m, v[v.len() - 1]]
}

/// Times every attention shape: one warm-up of each kernel, then `runs` pairs (triples with
/// `bf16`: the bf16 panels last), the order of the first two swapped every other round.
pub fn measure_attention(shapes: &[&AttnShape], runs: usize, bf16: bool) -> Result<Vec<AttnRow>> {
    use milkit::kernels::{attention_with, Attention, Kernel};
    let dev = Device::Cpu;
    let panels = Kernel::Panels(milkit::kernels::gemv::Isa::best());
    let mut rows = vec![];
    for s in shapes {
        let n = s.heads * s.d * s.s;
        let t = |seed: u64, scale: f32| -> Result<Tensor> {
            let v: Vec<f32> = values(n, seed).into_iter().map(|x| x * scale).collect();
            Ok(Tensor::from_vec(v, (1, s.heads, s.d, s.s), &dev)?.to_dtype(CDType::F16)?)
        };
        // Values in ±1 for the queries and ±0.5 for the keys: scores of a few units.
        let (q, k, v) = (t(3, 10.0)?, t(5, 5.0)?, t(7, 10.0)?);
        let a = Attention {
            x: &q,
            tx: true,
            y: &k,
            ty: false,
            mask: None,
            round: [CDType::F16; 3],
            v: &v,
            tv: false,
            probs_left: false,
        };
        let run = |kernel: Kernel| -> Result<(f64, Tensor)> {
            let t = Instant::now();
            let o = attention_with(&a, false, kernel)?;
            Ok((t.elapsed().as_secs_f64() * 1e3, o.0))
        };
        let time = |kernel: Kernel| -> Result<f64> { Ok(run(kernel)?.0) };
        let flat = |t: &Tensor| -> Result<Vec<f32>> {
            Ok(t.flatten_all()?.to_dtype(CDType::F32)?.to_vec1()?)
        };
        let (mut old, mut new, mut ratio) = (vec![], vec![], vec![]);
        let (mut halves, mut half_ratio, mut psnr_db) = (vec![], vec![], f64::NAN);
        for i in 0..=runs.max(1) {
            let (to, tn) = if i % 2 == 0 {
                let to = time(Kernel::Blocks)?;
                (to, time(panels)?)
            } else {
                let tn = time(panels)?;
                (time(Kernel::Blocks)?, tn)
            };
            if bf16 {
                let (tb, ob) = run(Kernel::PanelsBf16)?;
                if i == 0 {
                    psnr_db = psnr(&flat(&run(panels)?.1)?, &flat(&ob)?);
                } else {
                    halves.push(tb);
                    half_ratio.push(tb / tn);
                }
            }
            if i > 0 {
                old.push(to);
                new.push(tn);
                ratio.push(tn / to);
            }
        }
        let gflop = 4.0 * (s.heads * s.s * s.s * s.d) as f64 / 1e9;
        let (bo, bn) = (spread(&mut old), spread(&mut new));
        let bf16 = (!halves.is_empty()).then(|| {
            let ms = spread(&mut halves);
            AttnBf16Row {
                ms,
                gflops: gflop / (ms[1] / 1e3),
                ratio: spread(&mut half_ratio),
                psnr_db,
            }
        });
        rows.push(AttnRow {
            shape: s.name.to_string(),
            heads: s.heads,
            s: s.s,
            d: s.d,
            gflop,
            blocks_ms: bo,
            panels_ms: bn,
            blocks_gflops: gflop / (bo[1] / 1e3),
            panels_gflops: gflop / (bn[1] / 1e3),
            ratio: spread(&mut ratio),
            bf16,
        });
    }
    Ok(rows)
}

/// An encoder MLP `conv → gelu(EXACT)` of `s` (the fusion under test decides whether the
/// GELU runs in the conv's store).
fn conv_gelu_model(s: &Shape) -> Result<Model> {
    let mut b = Builder::new(Opset::Ios18);
    let y = encoder_conv(&mut b, s, "fc1")?;
    let g = b.gelu("act", &y, "EXACT")?;
    let (inputs, block) = b.finish(&[(g, "y")])?;
    Ok(Model::single(
        Opset::Ios18,
        inputs,
        block,
        Description::default(),
    ))
}

/// One encoder small op timed the way it ran before and the way it runs now.
pub struct OpRow {
    pub what: String,
    pub before_ms: f64,
    pub after_ms: f64,
    pub before_best_ms: f64,
    pub after_best_ms: f64,
}

/// Times `before` and `after` alternately: one warm-up each, then `runs` pairs; medians.
fn pair(
    what: String,
    runs: usize,
    mut before: impl FnMut() -> Result<()>,
    mut after: impl FnMut() -> Result<()>,
) -> Result<OpRow> {
    let (mut b, mut a) = (vec![], vec![]);
    for i in 0..=runs.max(1) {
        let t = Instant::now();
        before()?;
        let tb = t.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        after()?;
        let ta = t.elapsed().as_secs_f64() * 1e3;
        if i > 0 {
            b.push(tb);
            a.push(ta);
        }
    }
    let best = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    Ok(OpRow {
        what,
        before_best_ms: best(&b),
        after_best_ms: best(&a),
        before_ms: median(&mut b),
        after_ms: median(&mut a),
    })
}

/// The encoder's small ops at tiny's and base's widths (1500 frames, fp16): layer norm
/// over the channels of a BC1S tensor (rows permuted into a copy, against down the
/// columns), GELU (the scalar-width map, against vector lanes), and fc1 → GELU as two
/// steps against fused into the GEMM's store.
pub fn measure_ops(runs: usize) -> Result<Vec<OpRow>> {
    use milkit::kernels::{self, fastmath};
    let dev = Device::Cpu;
    let mut rows = vec![];
    for c in [384usize, 512] {
        let x =
            Tensor::from_vec(values(c * 1500, 3), (1, c, 1, 1500), &dev)?.to_dtype(CDType::F16)?;
        let g: Vec<f32> = values(c, 4).iter().map(|v| 1.0 + v).collect();
        let b = values(c, 5);
        rows.push(pair(
            format!("layer_norm [1, {c}, 1, 1500] over axis 1"),
            runs,
            || kernels::layer_norm_rows(&x, &[1], Some(&g), Some(&b), 1e-5).map(drop),
            || kernels::layer_norm(&x, &[1], Some(&g), Some(&b), 1e-5).map(drop),
        )?);
    }
    for c in [1536usize, 2048] {
        let x =
            Tensor::from_vec(values(c * 1500, 3), (1, c, 1, 1500), &dev)?.to_dtype(CDType::F16)?;
        rows.push(pair(
            format!("gelu EXACT [1, {c}, 1, 1500]"),
            runs,
            || kernels::map_f32(&x, fastmath::gelu).map(drop),
            || kernels::map_gelu(&x, fastmath::Gelu::Exact).map(drop),
        )?);
    }
    for s in SHAPES
        .iter()
        .filter(|s| s.name.contains("fc1") && s.k <= 512)
    {
        let session = |fuse: bool| -> Result<Session> {
            let opts = milkit::runtime::Options {
                fuse_conv_gelu: fuse,
                ..Default::default()
            };
            let mut sess = Session::from_model_with(conv_gelu_model(s)?, &opts)?;
            sess.set_memoize(false);
            Ok(sess)
        };
        let (mut two, mut one) = (session(false)?, session(true)?);
        let x = Tensor::from_vec(values(s.k * s.m, 3), (1, s.k, 1, s.m), &dev)?
            .to_dtype(CDType::F16)?;
        rows.push(pair(
            format!("{} → gelu: two steps / fused", s.name),
            runs,
            || two.predict(&[("x", x.clone())]).map(drop),
            || one.predict(&[("x", x.clone())]).map(drop),
        )?);
    }
    Ok(rows)
}

/// `bench gemm --attention` (with `compute` bf16: the bf16 panels too).
pub fn run_attention(runs: usize, only: Option<&str>, json: bool, compute: Compute) -> Result<u8> {
    anyhow::ensure!(
        compute != Compute::Fp32,
        "bench gemm --attention --compute fp32: the kernels compute in float32 already; use \
         `package` or `bf16`"
    );
    let bf16 = compute == Compute::Bf16;
    if bf16 {
        compute.require(milkit::kernels::gemm::bf16_cpu())?;
    }
    let shapes: Vec<&AttnShape> = ATTENTION
        .iter()
        .filter(|s| only.is_none_or(|o| s.name.contains(o)))
        .collect();
    anyhow::ensure!(
        !shapes.is_empty(),
        "--only {} matches no shape",
        only.unwrap_or_default()
    );
    let rows = measure_attention(&shapes, runs, bf16)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(0);
    }
    println!(
        "threads: {} (rayon); panels on {} kernels; {} timed pairs, alternating; \
         median (min–max) ms",
        rayon::current_num_threads(),
        milkit::kernels::gemv::Isa::best().name(),
        runs.max(1)
    );
    let extra = match bf16 {
        true => " bf16 panels ms | bf16 GFLOP/s | bf16 / panels | bf16 PSNR vs panels |",
        false => "",
    };
    println!(
        "| attention [heads × {{S×S×d}}] | GFLOP | blocks ms | panels ms | blocks GFLOP/s \
         | panels GFLOP/s | panels / blocks |{extra}"
    );
    println!(
        "|---|---|---|---|---|---|---|{}",
        if bf16 { "---|---|---|---|" } else { "" }
    );
    let r3 = |v: [f64; 3], p: usize| format!("{:.p$} ({:.p$}–{:.p$})", v[1], v[0], v[2]);
    for r in &rows {
        let tail = match &r.bf16 {
            Some(b) => format!(
                " {} | {:.0} | {} | {:.1} dB |",
                r3(b.ms, 1),
                b.gflops,
                r3(b.ratio, 2),
                b.psnr_db
            ),
            None => String::new(),
        };
        println!(
            "| {} [{}×{{{}×{}×{}}}] | {:.2} | {} | {} | {:.0} | {:.0} | {} |{tail}",
            r.shape,
            r.heads,
            r.s,
            r.s,
            r.d,
            r.gflop,
            r3(r.blocks_ms, 1),
            r3(r.panels_ms, 1),
            r.blocks_gflops,
            r.panels_gflops,
            r3(r.ratio, 2)
        );
    }
    Ok(0)
}

pub fn run(runs: usize, only: Option<&str>, json: bool, compute: Compute) -> Result<u8> {
    anyhow::ensure!(
        compute != Compute::Fp32,
        "bench gemm --compute fp32: the plain GEMM column is already float32; use `package` \
         or `bf16`"
    );
    let bf16 = compute == Compute::Bf16;
    if bf16 {
        compute.require(milkit::kernels::gemm::bf16_cpu())?;
    }
    if only == Some("ops") && !json {
        print_ops(runs)?;
        return Ok(0);
    }
    let shapes: Vec<&Shape> = SHAPES
        .iter()
        .filter(|s| only.is_none_or(|o| s.name.contains(o)))
        .collect();
    anyhow::ensure!(
        !shapes.is_empty(),
        "--only {} matches no shape",
        only.unwrap_or_default()
    );
    let rows = measure(&shapes, runs, bf16)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(0);
    }
    println!(
        "threads: {} (rayon); kernels {}; {} timed runs per side, alternating; median (best) ms",
        rayon::current_num_threads(),
        milkit::kernels::gemv::Isa::best().name(),
        runs.max(1)
    );
    if bf16 {
        println!(
            "| product | GFLOP | milkit conv ms | bf16 conv ms | f32 GEMM ms | milkit GFLOP/s | \
             bf16 GFLOP/s | GEMM GFLOP/s | ratio | bf16 ratio | bf16 PSNR vs fp16 conv |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|---|");
    } else {
        println!(
            "| product | GFLOP | milkit conv ms | f32 GEMM ms | milkit GFLOP/s | GEMM GFLOP/s | ratio |"
        );
        println!("|---|---|---|---|---|---|---|");
    }
    for r in &rows {
        let head = format!(
            "| {} [{}×{}]·[{}×{}] | {:.2} | {:.1} ({:.1}) |",
            r.shape, r.m, r.k, r.k, r.n, r.gflop, r.milkit_ms_median, r.milkit_ms_best,
        );
        let gemm = format!(
            " {:.1} ({:.1}) |",
            r.reference_ms_median, r.reference_ms_best
        );
        match &r.bf16 {
            Some(b) => println!(
                "{head} {:.1} ({:.1}) |{gemm} {:.0} | {:.0} | {:.0} | {:.2} | {:.2} | {:.1} dB |",
                b.ms_median,
                b.ms_best,
                r.milkit_gflops,
                b.gflops,
                r.reference_gflops,
                r.ratio,
                b.ratio,
                b.psnr_db
            ),
            None => println!(
                "{head}{gemm} {:.0} | {:.0} | {:.2} |",
                r.milkit_gflops, r.reference_gflops, r.ratio
            ),
        }
    }
    if only.is_none() {
        println!();
        print_ops(runs)?;
    }
    Ok(0)
}

/// The small ops' table ([`measure_ops`]).
fn print_ops(runs: usize) -> Result<()> {
    {
        println!("encoder small ops, before and after, alternating; median (best) ms");
        println!("| op | before ms | after ms | after / before: medians (bests) |");
        println!("|---|---|---|---|");
        for r in measure_ops(runs)? {
            println!(
                "| {} | {:.2} ({:.2}) | {:.2} ({:.2}) | {:.2} ({:.2}) |",
                r.what,
                r.before_ms,
                r.before_best_ms,
                r.after_ms,
                r.after_best_ms,
                r.after_ms / r.before_ms,
                r.after_best_ms / r.before_best_ms
            );
        }
    }
    Ok(())
}
