//! Outlier-aware grouping (`--outlier-grouping`): the channel reordering finds Whisper's conv stem and MLP
//! chains, keeps the function the model computes (checked by running both), sorts the rows
//! that share a table so that outlier rows group together (lowering the grouped table error
//! of weights with scattered outlier rows), carries calibration statistics along, refuses
//! methods without grouped tables, and yields packages the coremltools validator accepts.

mod common;

use candle_core::{Device, Tensor};
use common::milkit;
use common::programs::{f16_tensor, f32s, host, model, psnr, tin};
use common::rng::Rng;
use milkit::convert::export::export_encoder;
use milkit::ir::{DType, Model, Opset, Value};
use milkit::ops::{Builder, In};
use milkit::passes::calibrate::Calibration;
use milkit::passes::compress::{compress, compress_calibrated, Method, Outcome, Selection};
use milkit::passes::lut::{LutConfig, LutGranularity, LutMode};
use milkit::passes::quant::{QuantConfig, QuantDtype, QuantGranularity};
use milkit::passes::regroup::{regroup, row_key};
use milkit::runtime::Session;
use milkit::whisper::checkpoint::Checkpoint;
use milkit::whisper::encoder::EncoderAbi;
use milkit::whisper::synth::{synthesize_with, SynthDType, SynthOptions};
use std::path::Path;

fn lut4(pcs: bool) -> Method {
    Method::Palettize(LutConfig {
        mode: LutMode::Kmeans,
        nbits: 4,
        granularity: LutGranularity::PerGroupedChannel(16),
        per_channel_scale: pcs,
        cluster_dim: 1,
    })
}

/// The values of a const weight of `m` as f32.
fn weight(m: &Model, name: &str) -> (Vec<usize>, Vec<f32>) {
    for f in m.program.functions.values() {
        for op in &f.block.operations {
            if op.name == name {
                if let Some(Value::Tensor(t)) = op.const_val() {
                    let v = t.to_f64_vec().unwrap().iter().map(|x| *x as f32).collect();
                    return (t.shape.clone(), v);
                }
            }
        }
    }
    panic!("no const `{name}`");
}

/// The same function up to fp16 rounding (the consumer sums its inputs in another order):
/// rms(a − b) ≤ tol · rms(a) and max |a − b| ≤ 4 · tol · max |a|.
fn assert_same_function(a: &[f32], b: &[f32], tol: f64, what: &str) {
    assert_eq!(a.len(), b.len());
    let rms = |v: &mut dyn Iterator<Item = f64>| {
        let (s, n) = v.fold((0.0, 0usize), |(s, n), x| (s + x * x, n + 1));
        (s / n.max(1) as f64).sqrt()
    };
    let r_a = rms(&mut a.iter().map(|x| *x as f64));
    let r_d = rms(&mut a.iter().zip(b).map(|(x, y)| (x - y) as f64));
    let peak = a.iter().fold(0f64, |m, v| m.max(v.abs() as f64));
    let diff = a
        .iter()
        .zip(b)
        .fold(0f64, |m, (x, y)| m.max((x - y).abs() as f64));
    eprintln!(
        "{what}: rms |Δ| {:.2e} of rms {r_a:.3}, max |Δ| {diff:.2e} of peak {peak:.3}",
        r_d
    );
    assert!(
        r_a > 0.0 && r_d <= tol * r_a,
        "{what}: rms Δ {r_d} > {tol} × {r_a}"
    );
    assert!(
        diff <= 4.0 * tol * peak,
        "{what}: max Δ {diff} > 4 × {tol} × {peak}"
    );
}

/// conv(x; W₁ [64, 32], b₁) → gelu → conv(W₂ [32, 64]): every fifth hidden channel's row has
/// eight times the magnitude of the others, so each group of 16 rows mixes both kinds.
fn mlp_with_outlier_rows() -> Model {
    let mut r = Rng(11);
    let (d, h) = (32usize, 64usize);
    let w1: Vec<f32> = (0..h * d)
        .map(|i| r.next() * if (i / d) % 5 == 0 { 8.0 } else { 1.0 })
        .collect();
    let b1 = r.vec(h);
    let w2 = r.vec(d * h);
    let mut b = Builder::new(Opset::Ios18);
    let x = b.input("x", tin(DType::F16, &[1, d, 1, 8]));
    let conv = |b: &mut Builder, name: &str, x, w: Value, bias: Option<Value>| {
        let wv = b.konst(&format!("{name}_weight"), w);
        let mut ins = vec![("x", In::V(x)), ("weight", In::V(wv))];
        if let Some(bv) = bias {
            let bv = b.konst(&format!("{name}_bias"), bv);
            ins.push(("bias", In::V(bv)));
        }
        b.op1("conv", name, ins).unwrap()
    };
    let y = conv(
        &mut b,
        "fc1",
        x,
        f16_tensor(&[h, d, 1, 1], &w1),
        Some(f16_tensor(&[h], &b1)),
    );
    let g = b
        .op1(
            "gelu",
            "act",
            vec![("x", In::V(y)), ("mode", In::C(Value::str("EXACT")))],
        )
        .unwrap();
    let out = conv(&mut b, "fc2", g, f16_tensor(&[d, h, 1, 1], &w2), None);
    model(b, &[(out, "y")])
}

fn small_selection() -> Selection {
    Selection {
        weight_threshold: 0,
        ..Selection::default()
    }
}

fn run(m: &Model, input: &str, x: &Tensor) -> Vec<f32> {
    let mut s = Session::from_model(m.clone()).unwrap();
    f32s(&s.predict(&[(input, x.clone())]).unwrap()[0].1)
}

fn mean_error(o: &Outcome, weight: &str) -> f64 {
    o.compressed
        .iter()
        .find(|c| c.weight == weight)
        .unwrap_or_else(|| panic!("`{weight}` not compressed"))
        .rel_rms_error
}

#[test]
fn reordering_keeps_the_function_and_lowers_the_error_of_outlier_rows() {
    let m = mlp_with_outlier_rows();
    let mut re = m.clone();
    let (done, cal) = regroup(&mut re, &lut4(false), &small_selection(), None).unwrap();
    assert!(cal.is_none());
    assert_eq!(done.len(), 1, "{done:?}");
    let r = &done[0];
    assert_eq!(
        (
            r.producer_weight.as_str(),
            r.consumer_weight.as_str(),
            r.activation.as_str()
        ),
        ("fc1_weight", "fc2_weight", "gelu")
    );
    assert_eq!(r.channels, 64);
    assert!(r.moved > 0);
    // Rows now ascend by their largest magnitude, so the 13 outlier rows share the last group.
    let (_, w1) = weight(&re, "fc1_weight");
    let keys: Vec<f64> = w1.chunks(32).map(|row| row_key(row, false)).collect();
    assert!(keys.windows(2).all(|k| k[0] <= k[1]));
    // The same function: rows of W₁, b₁ and columns of W₂ moved together.
    let mut rng = Rng(5);
    let x = host(&rng.vec(32 * 8), &[1, 32, 1, 8]);
    assert_same_function(&run(&m, "x", &x), &run(&re, "x", &x), 2e-3, "mlp");
    // The same bytes, a lower table error for the reordered producer.
    let (mut a, mut b) = (m.clone(), re.clone());
    let oa = compress(&mut a, &lut4(false), &small_selection()).unwrap();
    let ob = compress(&mut b, &lut4(false), &small_selection()).unwrap();
    let bytes = |o: &Outcome| o.compressed.iter().map(|c| c.bytes_after).sum::<u64>();
    assert_eq!(bytes(&oa), bytes(&ob));
    let (ea, eb) = (mean_error(&oa, "fc1_weight"), mean_error(&ob, "fc1_weight"));
    eprintln!("fc1 LUT4 g16 relative RMS error: {ea:.4} in place, {eb:.4} reordered");
    assert!(eb < 0.85 * ea, "reordered {eb} not well below {ea}");
    // The consumer's columns moved, its rows did not: each of its tables sees the same
    // values, so its error is the same (up to the order of summation).
    let (ec, ed) = (mean_error(&oa, "fc2_weight"), mean_error(&ob, "fc2_weight"));
    assert!((ec - ed).abs() < 1e-9, "{ec} vs {ed}");
}

#[test]
fn calibration_statistics_follow_the_reordering() {
    let m = mlp_with_outlier_rows();
    let mut cal = Calibration::default();
    let m1: Vec<f32> = (0..32).map(|i| 1.0 + i as f32).collect();
    let m2: Vec<f32> = (0..64).map(|i| 100.0 + i as f32).collect();
    cal.moments.insert("fc1_weight".into(), m1.clone());
    cal.moments.insert("fc2_weight".into(), m2.clone());
    let mut re = m.clone();
    let (_, got) = regroup(&mut re, &lut4(false), &small_selection(), Some(&cal)).unwrap();
    let got = got.expect("the consumer's statistics were permuted");
    // The producer's inputs did not move.
    assert_eq!(got.moments["fc1_weight"], m1);
    // Hidden channel i of the reordered model is old channel p: W₁ row i = old row p, and
    // the consumer's statistic i must be old statistic p.
    let (_, old) = weight(&m, "fc1_weight");
    let (_, new) = weight(&re, "fc1_weight");
    for (i, row) in new.chunks(32).enumerate() {
        let p = old.chunks(32).position(|o| o == row).unwrap();
        assert_eq!(got.moments["fc2_weight"][i], m2[p], "channel {i}");
    }
    // And compression takes the permuted statistics.
    let mut c = re.clone();
    compress_calibrated(&mut c, &lut4(false), &small_selection(), Some(&got)).unwrap();
}

#[test]
fn refuses_methods_without_grouped_tables() {
    let mut m = mlp_with_outlier_rows();
    let int4 = Method::Quantize(QuantConfig {
        dtype: QuantDtype::Int4,
        granularity: QuantGranularity::PerBlock(32),
        symmetric: true,
    });
    let per_tensor = Method::Palettize(LutConfig {
        granularity: LutGranularity::PerTensor,
        ..match lut4(false) {
            Method::Palettize(c) => c,
            _ => unreachable!(),
        }
    });
    for method in [int4, per_tensor] {
        let e = regroup(&mut m, &method, &small_selection(), None).unwrap_err();
        assert!(format!("{e:#}").contains("grouped-channel"), "{e:#}");
    }
}

/// A very small random Whisper checkpoint (d 64, 2 layers, ffn 128).
fn micro(dir: &Path) {
    let opts = SynthOptions {
        seed: 3,
        dtype: SynthDType::F16,
        progress: false,
        force: false,
    };
    synthesize_with(&common::micro_config(), None, dir, &opts).unwrap();
}

#[test]
fn whisper_mlps_are_found_and_the_encoder_is_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let hf = dir.path().join("micro");
    micro(&hf);
    let m = export_encoder(
        &Checkpoint::open(&hf).unwrap(),
        EncoderAbi::WhisperKit,
        Opset::Ios18,
        &mut |_, _| {},
    )
    .unwrap();
    let mut re = m.clone();
    let (done, _) = regroup(&mut re, &lut4(true), &small_selection(), None).unwrap();
    // The conv stem (conv1 → gelu → conv2) and one chain per layer (fc1 → gelu → fc2),
    // nothing else (attention projections feed reshapes, not an activation).
    let names: Vec<(&str, &str, usize)> = done
        .iter()
        .map(|r| {
            (
                r.producer_weight.as_str(),
                r.consumer_weight.as_str(),
                r.channels,
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            ("conv1_weight", "conv2_weight", 64),
            ("layers_0_fc1_weight", "layers_0_fc2_weight", 128),
            ("layers_1_fc1_weight", "layers_1_fc2_weight", 128),
        ]
    );
    let mut rng = Rng(9);
    let x = host(&rng.vec(80 * 3000), &[1, 80, 1, 3000]);
    let input = "melspectrogram_features";
    assert_same_function(
        &run(&m, input, &x),
        &run(&re, input, &x),
        2e-3,
        "micro encoder",
    );
}

fn mel(fx: &Path, clip: &str) -> Tensor {
    let s = milkit::whisper::audio::load_audio(fx.join("audio").join(clip)).unwrap();
    let m = milkit::whisper::audio::log_mel(&s, 80, None).unwrap();
    Tensor::from_vec(m, (1, 80, 1, 3000), &Device::Cpu).unwrap()
}

#[test]
fn tiny_en_reordered_encoder_is_the_same_and_palettizes_better() {
    let Some(fx) = common::fixtures() else { return };
    let hf = fx.join("models/whisper-tiny.en");
    let m = export_encoder(
        &Checkpoint::open(&hf).unwrap(),
        EncoderAbi::WhisperKit,
        Opset::Ios18,
        &mut |_, _| {},
    )
    .unwrap();
    let sel = Selection::default();
    let mut re = m.clone();
    let (done, _) = regroup(&mut re, &lut4(false), &sel, None).unwrap();
    assert_eq!(done.len(), 5, "tiny.en: the conv stem and four MLPs");
    // fp16 in, fp16 out: the reordered encoder gives the same output on real speech.
    let x = mel(&fx, "jfk.wav");
    let input = "melspectrogram_features";
    let want = run(&m, input, &x);
    assert_same_function(&want, &run(&re, input, &x), 2e-3, "tiny.en encoder");
    // At the same bytes, the reordered fc1 weights have lower table error.
    let (mut a, mut b) = (m.clone(), re);
    let oa = compress(&mut a, &lut4(false), &sel).unwrap();
    let ob = compress(&mut b, &lut4(false), &sel).unwrap();
    for r in &done {
        let (ea, eb) = (
            mean_error(&oa, &r.producer_weight),
            mean_error(&ob, &r.producer_weight),
        );
        eprintln!(
            "{}: {ea:.4} in place → {eb:.4} reordered",
            r.producer_weight
        );
        assert!(eb < ea, "{}: {eb} not below {ea}", r.producer_weight);
    }
}

#[test]
fn cli_export_reports_the_reordering_and_the_validator_accepts_it() {
    let Some(fx) = common::fixtures() else { return };
    let hf = fx.join("models/whisper-tiny.en");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("enc.mlpackage");
    let o = milkit()
        .args(["export", "--model"])
        .arg(&hf)
        .args([
            "--component",
            "encoder",
            "--target",
            "ios18",
            "--palettize",
            "kmeans",
        ])
        .args(["--outlier-grouping", "--json", "--quiet", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let chains = report["regrouped"].as_array().expect("regrouped list");
    assert_eq!(chains.len(), 5, "{report}");
    assert!(chains.iter().all(|c| c["moved"].as_u64().unwrap() > 0));
    if let Some(v) = common::validate(&out) {
        assert_eq!(v["histogram"]["main"]["constexpr_lut_to_dense"], 26, "{v}");
    }
    // Linear quantization has no tables to group: refused with the reason.
    let o = milkit()
        .args(["export", "--model"])
        .arg(&hf)
        .args([
            "--component",
            "encoder",
            "--target",
            "ios18",
            "--quantize",
            "int4",
        ])
        .args(["--outlier-grouping", "--quiet", "--out"])
        .arg(dir.path().join("q.mlpackage"))
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("grouped-channel"));
    assert!(!dir.path().join("q.mlpackage").exists());
}

#[test]
fn recipe_table_takes_the_flag() {
    let Some(fx) = common::fixtures() else { return };
    let hf = fx.join("models/whisper-tiny.en");
    let dir = tempfile::tempdir().unwrap();
    let out =
        common::export_encoder_recipe(dir.path(), "whisperkit", "outlier_grouping = true", &hf);
    // fc1's bias (too small to compress) is the checkpoint's, reordered.
    let got = milkit::package::load_package(&out.join("encoder.mlpackage")).unwrap();
    let plain = export_encoder(
        &Checkpoint::open(&hf).unwrap(),
        EncoderAbi::WhisperKit,
        Opset::Ios18,
        &mut |_, _| {},
    )
    .unwrap();
    let (_, a) = weight(&plain, "layers_0_fc1_bias");
    let (_, b) = weight(&got, "layers_0_fc1_bias");
    assert_ne!(a, b, "the recipe did not reorder");
    let sorted = |mut v: Vec<f32>| {
        v.sort_by(f32::total_cmp);
        v
    };
    assert_eq!(sorted(a), sorted(b));
}

/// Encoder output PSNR against fp16 on two clips the statistics never saw, for LUT4 g16
/// with and without the reordering (plain, calibrated, per-channel scales).
#[test]
fn tiny_en_held_out_output_error_with_and_without_reordering() {
    let Some(fx) = common::fixtures() else { return };
    let hf = fx.join("models/whisper-tiny.en");
    let audio = |c: &str| fx.join("audio").join(c);
    let sel = Selection::default();
    let calib = [audio("fleurs_en_000.wav"), audio("fleurs_en_001.wav")];
    let cal =
        milkit::quality::calibrate::calibrate_encoder(&hf, &calib, &sel, true, &mut |_, _| {})
            .unwrap();
    let m = export_encoder(
        &Checkpoint::open(&hf).unwrap(),
        EncoderAbi::WhisperKit,
        Opset::Ios18,
        &mut |_, _| {},
    )
    .unwrap();
    let input = "melspectrogram_features";
    let clips = ["jfk.wav", "librivox_ss01_0870.wav"];
    let xs: Vec<Tensor> = clips.iter().map(|c| mel(&fx, c)).collect();
    let want: Vec<Vec<f32>> = xs.iter().map(|x| run(&m, input, x)).collect();
    let mut rows = Vec::new();
    for (name, pcs, with_cal) in [
        ("LUT4 g16", false, false),
        ("LUT4 g16 calibrated", false, true),
        ("LUT4 g16 channel scales", true, false),
    ] {
        let c = with_cal.then_some(&cal);
        let mut db = [0f64; 2];
        for (k, reorder) in [false, true].into_iter().enumerate() {
            let mut q = m.clone();
            let mut cal2 = None;
            if reorder {
                cal2 = regroup(&mut q, &lut4(pcs), &sel, c).unwrap().1;
            }
            compress_calibrated(&mut q, &lut4(pcs), &sel, cal2.as_ref().or(c)).unwrap();
            db[k] = xs
                .iter()
                .zip(&want)
                .map(|(x, w)| psnr(w, &run(&q, input, x)))
                .sum::<f64>()
                / xs.len() as f64;
        }
        eprintln!(
            "{name}: held-out encoder PSNR {:.2} dB in place, {:.2} dB reordered",
            db[0], db[1]
        );
        rows.push(db);
    }
    // Measured: +1.8, +1.3 and +0.7 dB. Each must gain at least 0.3 dB.
    for (r, name) in rows.iter().zip(["plain", "calibrated", "channel scales"]) {
        assert!(r[1] > r[0] + 0.3, "{name}: {:.2} → {:.2} dB", r[0], r[1]);
    }
}

/// coremltools' own fp16 encoder (`linear` + `gelu` MLPs, not BC1S convs): the same chains
/// are found and the reordered program computes the same output.
#[test]
fn coremltools_linear_mlps_are_reordered_too() {
    let Some(fx) = common::fixtures() else { return };
    let pkg = fx.join("coremltools/tiny.en-encoder-fp16.mlpackage");
    let m = milkit::package::load_package(&pkg).unwrap();
    let mut re = m.clone();
    let (done, _) = regroup(&mut re, &lut4(false), &Selection::default(), None).unwrap();
    let kinds: Vec<usize> = done.iter().map(|r| r.channels).collect();
    assert_eq!(kinds, [384, 1536, 1536, 1536, 1536], "{done:?}");
    let x = mel(&fx, "jfk.wav").reshape((1, 80, 3000)).unwrap();
    let want = run(&m, "logmel_data", &x);
    assert_same_function(
        &want,
        &run(&re, "logmel_data", &x),
        2e-3,
        "coremltools encoder",
    );
}
