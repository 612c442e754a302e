//! `milkit bench gemm`: encoder-sized products — milkit's runtime running one BC1S 1x1 `conv`
//! (fp16 data, fp32 accumulation, fp16 output, as every encoder projection runs) against a
//! plain f32 GEMM of the same shape (candle's gemm on f32 tensors already in memory) timed
//! in the same run, alternating, so that the ratio is what milkit's path costs over the
//! GEMM it is built on. Rates are 2·m·n·k FLOPs over the time of one product. Without
//! `--only` (or with `--only ops` alone), a second table times the encoder's small ops (layer norm over channels, GELU,
//! fc1 → GELU) the way they ran before and the way they run now, alternating.

use anyhow::{Context, Result};
use candle_core::{DType as CDType, Device, Tensor};
use half::f16;
use milkit::ir::{DType, Description, Model, Opset, Tensor as ITensor, Value, ValueType};
use milkit::ops::{Builder, In};
use milkit::runtime::Session;
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

/// The encoder's form of the product: `conv` of x fp16 [1, k, 1, m] with a constant fp16
/// weight [n, k, 1, 1] and bias [n].
fn conv_model(s: &Shape) -> Result<Model> {
    let mut b = Builder::new(Opset::Ios18);
    let x = b.input("x", ValueType::tensor(DType::F16, &[1, s.k, 1, s.m]));
    let w: Vec<f16> = values(s.n * s.k, 7)
        .into_iter()
        .map(f16::from_f32)
        .collect();
    let bias: Vec<f16> = values(s.n, 9).into_iter().map(f16::from_f32).collect();
    let y = b.op1(
        "conv",
        "proj",
        vec![
            ("x", In::V(x)),
            (
                "weight",
                In::C(Value::Tensor(ITensor::f16(&[s.n, s.k, 1, 1], &w))),
            ),
            ("bias", In::C(Value::Tensor(ITensor::f16(&[s.n], &bias)))),
        ],
    )?;
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

/// Times every shape: one warm-up of each side, then `runs` alternating pairs.
pub fn measure(shapes: &[&Shape], runs: usize) -> Result<Vec<GemmRow>> {
    let dev = Device::Cpu;
    let mut rows = vec![];
    for s in shapes {
        let mut session = Session::from_model(conv_model(s)?).context("building the conv")?;
        // Every call computes: no reuse of a result whose inputs did not change.
        session.set_memoize(false);
        let x = Tensor::from_vec(values(s.k * s.m, 3), (1, s.k, 1, s.m), &dev)?
            .to_dtype(CDType::F16)?;
        let a = Tensor::from_vec(values(s.m * s.k, 3), (s.m, s.k), &dev)?;
        let w = Tensor::from_vec(values(s.k * s.n, 7), (s.k, s.n), &dev)?;
        let mut mine = vec![];
        let mut reference = vec![];
        for i in 0..=runs.max(1) {
            let t = Instant::now();
            session.predict(&[("x", x.clone())])?;
            let tm = t.elapsed().as_secs_f64() * 1e3;
            let t = Instant::now();
            let y = a.matmul(&w)?;
            let tr = t.elapsed().as_secs_f64() * 1e3;
            drop(y);
            if i > 0 {
                mine.push(tm);
                reference.push(tr);
            }
        }
        let gflop = 2.0 * (s.m * s.n * s.k) as f64 / 1e9;
        let best = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
        let (mb, rb) = (best(&mine), best(&reference));
        let (mm, rm) = (median(&mut mine), median(&mut reference));
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
        });
    }
    Ok(rows)
}

/// An encoder MLP `conv → gelu(EXACT)` of `s` (the fusion under test decides whether the
/// GELU runs in the conv's store).
fn conv_gelu_model(s: &Shape) -> Result<Model> {
    let mut b = Builder::new(Opset::Ios18);
    let x = b.input("x", ValueType::tensor(DType::F16, &[1, s.k, 1, s.m]));
    let w: Vec<f16> = values(s.n * s.k, 7)
        .into_iter()
        .map(f16::from_f32)
        .collect();
    let bias: Vec<f16> = values(s.n, 9).into_iter().map(f16::from_f32).collect();
    let y = b.op1(
        "conv",
        "fc1",
        vec![
            ("x", In::V(x)),
            (
                "weight",
                In::C(Value::Tensor(ITensor::f16(&[s.n, s.k, 1, 1], &w))),
            ),
            ("bias", In::C(Value::Tensor(ITensor::f16(&[s.n], &bias)))),
        ],
    )?;
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

pub fn run(runs: usize, only: Option<&str>, json: bool) -> Result<u8> {
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
    let rows = measure(&shapes, runs)?;
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
    println!(
        "| product | GFLOP | milkit conv ms | f32 GEMM ms | milkit GFLOP/s | GEMM GFLOP/s | ratio |"
    );
    println!("|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} [{}×{}]·[{}×{}] | {:.2} | {:.1} ({:.1}) | {:.1} ({:.1}) | {:.0} | {:.0} | {:.2} |",
            r.shape,
            r.m,
            r.k,
            r.k,
            r.n,
            r.gflop,
            r.milkit_ms_median,
            r.milkit_ms_best,
            r.reference_ms_median,
            r.reference_ms_best,
            r.milkit_gflops,
            r.reference_gflops,
            r.ratio
        );
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
