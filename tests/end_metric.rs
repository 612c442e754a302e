//! End-metric sensitivity for mixed-bit plans (`milkit calibrate --sensitivity-recipe`): on a
//! random two-branch model whose branches differ only in scale, the measured divergence of
//! the model's output (KL of its softmax, computed here in float64) ranks the branch that
//! moves the output more above the other, falls with more bits, and the plan then spends the
//! budget on that branch and stays within it; the curves travel in the statistics file and
//! malformed ones are refused; one budget over parts whose errors are on different scales is
//! refused; and on tiny.en the decoder's measured next-token KL falls with more bits.

mod common;

use common::programs::{f16_tensor, f32s, host, model, tin};
use common::rng::Rng;
use milkit::convert::bundle::Compression;
use milkit::ir::{DType, Model, Opset};
use milkit::ops::{Builder, In};
use milkit::passes::calibrate::{Calibration, EndMetric};
use milkit::passes::compress::{Method, Selection};
use milkit::passes::lut::{LutConfig, LutGranularity, LutMode};
use milkit::passes::mixed::{plan_bits, plan_bits_joint, PlanPart};
use milkit::quality::sensitivity::weight_sensitivity;
use milkit::runtime::Session;
use std::collections::BTreeMap;

const D: usize = 32;
const H: usize = 64;
const T: usize = 12;

fn lut(nbits: u32) -> LutConfig {
    LutConfig {
        mode: LutMode::Kmeans,
        nbits,
        granularity: LutGranularity::PerGroupedChannel(4),
        per_channel_scale: false,
        cluster_dim: 1,
    }
}

fn all_weights() -> Selection {
    Selection {
        weight_threshold: 0,
        ..Selection::default()
    }
}

/// y = A·x + B·x over [T, D] inputs, with A's entries `big` times B's (the same random
/// pattern otherwise), so each branch's own relative error is alike but A moves y more.
fn two_branches(big: f32) -> Model {
    let mut r = Rng(7);
    let pattern = r.vec(H * D);
    let a: Vec<f32> = pattern.iter().map(|v| v * big).collect();
    let b_w: Vec<f32> = pattern.iter().rev().copied().collect();
    let mut b = Builder::new(Opset::Ios18);
    let x = b.input("x", tin(DType::F16, &[T, D]));
    let wa = b.konst("a_weight", f16_tensor(&[H, D], &a));
    let wb = b.konst("b_weight", f16_tensor(&[H, D], &b_w));
    let ya = b
        .op1(
            "linear",
            "a",
            vec![("x", In::V(x.clone())), ("weight", In::V(wa))],
        )
        .unwrap();
    let yb = b
        .op1("linear", "b", vec![("x", In::V(x)), ("weight", In::V(wb))])
        .unwrap();
    let y = b
        .op1("add", "y", vec![("x", In::V(ya)), ("y", In::V(yb))])
        .unwrap();
    model(b, &[(y, "y")])
}

fn inputs() -> Vec<f32> {
    Rng(11).vec(T * D)
}

fn outputs(m: Model, x: &[f32]) -> Vec<f32> {
    let mut s = Session::from_model(m).unwrap();
    let out = s.predict(&[("x", host(x, &[T, D]))]).unwrap();
    f32s(&out[0].1)
}

/// Mean over the T rows of KL(softmax(p) ‖ softmax(q)), float64.
fn mean_row_kl(p: &[f32], q: &[f32]) -> f64 {
    let lsm = |row: &[f32]| {
        let m = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
        let lse = m + row.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
        row.iter().map(|&v| v as f64 - lse).collect::<Vec<f64>>()
    };
    let mut sum = 0.0;
    for (rp, rq) in p.chunks(H).zip(q.chunks(H)) {
        let (lp, lq) = (lsm(rp), lsm(rq));
        sum += lp
            .iter()
            .zip(&lq)
            .map(|(a, b)| a.exp() * (a - b))
            .sum::<f64>();
    }
    sum / T as f64
}

fn sweep(m: &Model, widths: &[u32]) -> BTreeMap<String, EndMetric> {
    let x = inputs();
    let reference = outputs(m.clone(), &x);
    let c = Compression::new(Method::Palettize(lut(4)), all_weights(), false);
    let mut metric = |cand: Model| Ok(mean_row_kl(&reference, &outputs(cand, &x)));
    let mut calls = 0;
    let curves = weight_sensitivity(m, &c, None, widths, &mut metric, &mut |d, n| {
        calls += 1;
        assert!(d <= n);
    })
    .unwrap();
    assert_eq!(
        calls,
        2 * widths.len(),
        "one measurement per weight and width"
    );
    curves
}

fn ones(m: &mut BTreeMap<String, Vec<f32>>) {
    for w in ["a_weight", "b_weight"] {
        m.insert(w.into(), vec![1.0; D]);
    }
}

#[test]
fn the_end_metric_ranks_the_branch_that_moves_the_output_more_above_the_other() {
    let m = two_branches(8.0);
    let curves = sweep(&m, &[2, 3, 4]);
    let (a, b) = (&curves["a_weight"], &curves["b_weight"]);
    println!("a: {a:?}\nb: {b:?}");
    for c in [a, b] {
        assert_eq!(c.iter().map(|p| p.0).collect::<Vec<_>>(), vec![2, 3, 4]);
        assert!(
            c[0].1 > c[1].1 && c[1].1 > c[2].1,
            "not falling with bits: {c:?}"
        );
        assert!(
            c[2].1 > 0.0,
            "16 entries for 128 values still change the output: {c:?}"
        );
    }
    // Both branches have the same pattern of values, so A moves the logits ~64× more at
    // every width (KL grows with the square of the change).
    for k in 0..3 {
        assert!(
            a[k].1 > 10.0 * b[k].1,
            "width {}: {} vs {}",
            a[k].0,
            a[k].1,
            b[k].1
        );
    }
}

#[test]
fn a_plan_on_end_metric_curves_upgrades_the_weight_that_buys_the_most_and_keeps_the_budget() {
    let m = two_branches(8.0);
    let curves = sweep(&m, &[4, 6, 8]);
    let mut cal = Calibration {
        moments: BTreeMap::new(),
        grams: BTreeMap::new(),
        meta: BTreeMap::new(),
    };
    ones(&mut cal.moments);
    for (w, c) in &curves {
        cal.set_end_metric(w, c);
    }
    // Budget for one of the two weights at 6 bits (tables included), not both.
    let elems = (2 * H * D) as f64;
    let at = |b: u32| (H * D) as f64 * b as f64 + (H / 4) as f64 * (1u64 << b) as f64 * 16.0;
    let target = (at(6) + at(4)) / elems + 0.01;
    let plan = plan_bits(&m, &lut(4), &all_weights(), Some(&cal), target, &[4, 6, 8]).unwrap();
    let chosen: BTreeMap<_, _> = plan.nbits().into_iter().collect();
    assert_eq!(chosen["a_weight"], 6, "{chosen:?}");
    assert_eq!(chosen["b_weight"], 4, "{chosen:?}");
    assert!(plan.avg_bits <= target, "{} > {target}", plan.avg_bits);
    // The plan's curves are the measured divergences, not the per-op errors.
    let a = plan
        .weights
        .iter()
        .find(|w| w.weight == "a_weight")
        .unwrap();
    assert_eq!(
        a.curve.iter().map(|c| (c.0, c.2)).collect::<Vec<_>>(),
        curves["a_weight"]
    );
    // Swap the curves: now B buys more per bit and gets the upgrade.
    let mut swapped = cal.clone();
    swapped.set_end_metric("a_weight", &curves["b_weight"]);
    swapped.set_end_metric("b_weight", &curves["a_weight"]);
    let plan = plan_bits(
        &m,
        &lut(4),
        &all_weights(),
        Some(&swapped),
        target,
        &[4, 6, 8],
    )
    .unwrap();
    let chosen = plan.nbits();
    assert_eq!((chosen["a_weight"], chosen["b_weight"]), (4, 6));
    // A weight without a curve, in statistics that carry curves, is refused by name.
    let mut partial = cal.clone();
    partial
        .meta
        .retain(|k, _| !k.ends_with("b_weight") || !k.contains("end_metric"));
    let e = plan_bits(
        &m,
        &lut(4),
        &all_weights(),
        Some(&partial),
        target,
        &[4, 6, 8],
    )
    .unwrap_err();
    assert!(format!("{e:#}").contains("b_weight"), "{e:#}");
}

#[test]
fn end_metric_curves_travel_in_the_statistics_file_and_malformed_ones_are_refused() {
    let mut cal = Calibration {
        moments: BTreeMap::new(),
        grams: BTreeMap::new(),
        meta: BTreeMap::new(),
    };
    ones(&mut cal.moments);
    assert!(!cal.has_end_metric());
    cal.set_end_metric("a_weight", &[(4, 0.125), (6, 0.0078125), (3, 1.5)]);
    assert!(cal.has_end_metric());
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("s.safetensors");
    cal.save(&p, false).unwrap();
    let back = Calibration::load(&p).unwrap();
    assert_eq!(
        back.end_metric("a_weight").unwrap().unwrap(),
        vec![(3, 1.5), (4, 0.125), (6, 0.0078125)],
        "read back sorted by width, values exact"
    );
    assert_eq!(back.end_metric("b_weight").unwrap(), None);
    for bad in ["4:abc", "4:-1", "4:0.1,4:0.2", "x:0.1", "4:NaN"] {
        let mut c = back.clone();
        c.meta
            .insert("milkit.calibration.end_metric:a_weight".into(), bad.into());
        let e = c.end_metric("a_weight").unwrap_err();
        assert!(format!("{e:#}").contains("a_weight"), "{bad}: {e:#}");
    }
}

#[test]
fn one_budget_over_parts_on_different_scales_is_refused() {
    let m = two_branches(1.0);
    let mut with = Calibration {
        moments: BTreeMap::new(),
        grams: BTreeMap::new(),
        meta: BTreeMap::new(),
    };
    ones(&mut with.moments);
    let without = with.clone();
    with.set_end_metric("a_weight", &[(4, 0.1), (6, 0.01)]);
    with.set_end_metric("b_weight", &[(4, 0.1), (6, 0.01)]);
    let sel = all_weights();
    let no_fixed = std::collections::BTreeMap::new();
    let part = |cal| PlanPart {
        model: &m,
        base: lut(4),
        sel: &sel,
        calibration: Some(cal),
        fixed: &no_fixed,
    };
    let e = plan_bits_joint(&[part(&with), part(&without)], 9.0, &[4, 6])
        .err()
        .unwrap();
    assert!(format!("{e:#}").contains("different scales"), "{e:#}");
    // Both on the same scale: planned.
    plan_bits_joint(&[part(&with), part(&with)], 9.0, &[4, 6]).unwrap();
}

#[test]
fn the_decoder_next_token_kl_falls_with_more_bits_on_tiny_en() {
    let Some(fx) = common::fixtures() else { return };
    let hf = fx.join("models/whisper-tiny.en");
    let sel = Selection {
        op_names: vec![
            "layers_0_fc1_weight".into(),
            "layers_3_encoder_attn_v_proj_weight".into(),
        ],
        ..Selection::default()
    };
    let c = Compression::new(Method::Palettize(lut(4)), sel.clone(), false);
    let clip = vec![fx.join("audio/jfk.wav")];
    let req = milkit::quality::calibrate::SensitivityRequest {
        compression: &c,
        decoder: Default::default(),
        widths: &[2, 8],
    };
    let cal = milkit::quality::calibrate::calibrate_decoder_with(
        &hf,
        &clip,
        &Selection::default(),
        false,
        Some(req),
        &mut |_, _| {},
        &mut |_, _| {},
    )
    .unwrap();
    for w in &sel.op_names {
        let curve = cal.end_metric(w).unwrap().unwrap();
        println!("{w}: {curve:?}");
        assert_eq!(curve.len(), 2);
        assert!(
            curve[0].1 > curve[1].1 && curve[1].1 >= 0.0,
            "{w}: {curve:?}"
        );
        // 2-bit tables move the next-token distribution measurably.
        assert!(curve[0].1 > 1e-5, "{w}: {curve:?}");
    }
    // The statistics are still the decoder's, with a moment vector per weight.
    assert_eq!(cal.component(), "decoder");
    assert!(cal.moments.contains_key("layers_0_fc1_weight"));
}

#[test]
fn statistics_of_an_unchunked_head_serve_every_chunk_of_a_chunked_one() {
    let Some(fx) = common::fixtures() else { return };
    let hf = fx.join("models/whisper-tiny.en");
    let ckpt = milkit::whisper::checkpoint::Checkpoint::open(&hf).unwrap();
    let shape = milkit::convert::decoder_export::DecoderExport {
        head_chunks: 2,
        ..Default::default()
    };
    let mut m =
        milkit::convert::decoder_export::export_decoder(&ckpt, &shape, Opset::Ios18).unwrap();
    let head = vec![0.5f32; 384];
    let mut cal = Calibration {
        moments: BTreeMap::new(),
        grams: BTreeMap::new(),
        meta: BTreeMap::new(),
    };
    cal.moments.insert("lm_head_weight".into(), head.clone());
    let mut c = Compression::new(Method::Palettize(lut(4)), Selection::default(), false);
    c.calibration = Some(cal);
    // Also through outlier-aware grouping, which permutes the statistics it is given.
    c.regroup = true;
    let p = c.prepare(&mut m).unwrap();
    let got = p.calibration.as_deref().unwrap();
    for w in ["lm_head_0_weight", "lm_head_1_weight"] {
        assert_eq!(got.moments.get(w), Some(&head), "{w}");
    }
    // Nothing else is invented (no MLP had statistics to permute).
    assert_eq!(got.moments.len(), 3);
}
