//! End-metric sensitivity for an encoder's weights (`milkit calibrate --component encoder
//! --sensitivity-recipe R`), on a very small random Whisper checkpoint and real speech: every
//! weight the recipe's encoder compression selects gets a curve, the encoder output's error
//! falls with more bits, the curves travel in the statistics file and a mixed plan over the
//! encoder reads them (the weight with a large curve gets the upgrade), encoder and decoder
//! curves are never put under one budget, and bad input is refused with a clear message.

mod common;

use common::milkit;
use milkit::convert::bundle::Compression;
use milkit::convert::export::export_encoder;
use milkit::ir::{Model, Opset};
use milkit::passes::calibrate::{Calibration, COMPONENT_KEY};
use milkit::passes::compress::{selected_weights, Method, Selection};
use milkit::passes::lut::{LutConfig, LutGranularity, LutMode};
use milkit::passes::mixed::{plan_bits, plan_bits_joint, PlanPart};
use milkit::quality::calibrate::{calibrate_encoder_with, EncoderSensitivityRequest};
use milkit::whisper::checkpoint::Checkpoint;
use milkit::whisper::encoder::EncoderAbi;
use milkit::whisper::synth::{synthesize_with, SynthDType, SynthOptions};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn lut(nbits: u32) -> LutConfig {
    LutConfig {
        mode: LutMode::Kmeans,
        nbits,
        granularity: LutGranularity::PerGroupedChannel(16),
        per_channel_scale: true,
        cluster_dim: 1,
    }
}

/// A very small random Whisper checkpoint (d 64, 2 encoder layers, ffn 128).
fn micro(dir: &Path) -> PathBuf {
    let hf = dir.join("micro");
    let opts = SynthOptions {
        seed: 5,
        dtype: SynthDType::F16,
        progress: false,
        force: false,
    };
    synthesize_with(&common::micro_config(), None, &hf, &opts).unwrap();
    hf
}

fn encoder(hf: &Path) -> Model {
    export_encoder(
        &Checkpoint::open(hf).unwrap(),
        EncoderAbi::WhisperKit,
        Opset::Ios18,
        &mut |_, _| {},
    )
    .unwrap()
}

/// The encoder recipe's compression: LUT k-means per 16 channels, channel scales, outlier
/// grouping.
fn recipe_like() -> Compression {
    let mut c = Compression::new(Method::Palettize(lut(4)), Selection::default(), false);
    c.regroup = true;
    c
}

/// Writes an encoder-only recipe with `compress` as its `[component.compress]` body (none
/// when empty).
fn recipe(dir: &Path, compress: &str) -> PathBuf {
    let p = dir.join("r.toml");
    let table = if compress.is_empty() {
        String::new()
    } else {
        format!("\n[component.compress]\n{compress}\n")
    };
    std::fs::write(
        &p,
        format!(
            "name = \"t\"\n\n[[component]]\ncomponent = \"encoder\"\nabi = \"whisperkit\"\n\
             file = \"AudioEncoder.mlpackage\"\n{table}"
        ),
    )
    .unwrap();
    p
}

const RECIPE: &str = "palettize = \"kmeans\"\nnbits = 4\ngranularity = \"per-grouped-channel\"\n\
                      group_size = 16\ntarget_bits = 4.6\nper_channel_scale = true\n\
                      outlier_grouping = true";

#[test]
fn every_selected_encoder_weight_gets_a_curve_that_falls_with_more_bits() {
    let Some(fx) = common::fixtures() else { return };
    let dir = tempfile::tempdir().unwrap();
    let hf = micro(dir.path());
    let c = recipe_like();
    let mut sweeps = 0;
    let cal = calibrate_encoder_with(
        &hf,
        &[fx.join("audio/jfk.wav")],
        &Selection::default(),
        false,
        Some(EncoderSensitivityRequest {
            compression: &c,
            widths: &[4, 8],
        }),
        &mut |_, _| {},
        &mut |d, n| {
            sweeps += 1;
            assert!(d <= n);
        },
    )
    .unwrap();
    let m = encoder(&hf);
    let weights = selected_weights(&m, &c.method, &Selection::default()).unwrap();
    // 2 stem convs + 2 layers × (q, k, v, out, fc1, fc2).
    assert_eq!(weights.len(), 14);
    assert_eq!(
        sweeps,
        2 * weights.len(),
        "one measurement per weight and width"
    );
    for w in &weights {
        let curve = cal.end_metric(&w.weight).unwrap().unwrap();
        println!("{}: {curve:?}", w.weight);
        assert_eq!(curve.iter().map(|p| p.0).collect::<Vec<_>>(), vec![4, 8]);
        assert!(
            curve[0].1 > curve[1].1,
            "{}: 8 bits not below 4 bits: {curve:?}",
            w.weight
        );
        // 16 entries per group still move the output measurably, and not wildly.
        assert!(
            curve[0].1 > 1e-7 && curve[0].1 < 1.0,
            "{}: {curve:?}",
            w.weight
        );
    }
    // The statistics are still the encoder's, and say what the curves measure.
    assert_eq!(cal.component(), "encoder");
    assert_eq!(cal.end_metric_scale(), Some("encoder"));
    assert!(cal.moments.contains_key("layers_0_fc1_weight"));
    assert!(cal.meta["milkit.calibration.end_metric"].contains("||y - y0||^2"));
}

#[test]
fn a_plan_over_the_encoder_gives_the_bits_to_the_weight_with_the_large_curve() {
    let dir = tempfile::tempdir().unwrap();
    let hf = micro(dir.path());
    let m = encoder(&hf);
    let sel = Selection::default();
    let weights = selected_weights(&m, &Method::Palettize(lut(4)), &sel).unwrap();
    let mut cal = Calibration {
        moments: BTreeMap::new(),
        grams: BTreeMap::new(),
        meta: BTreeMap::new(),
    };
    cal.meta.insert(COMPONENT_KEY.into(), "encoder".into());
    for w in &weights {
        cal.moments
            .insert(w.weight.clone(), vec![1.0; w.tensor.shape[1]]);
        cal.set_end_metric(&w.weight, &[(4, 1e-4), (6, 0.5e-4), (8, 0.4e-4)]);
    }
    // Budget for every weight at 4 bits plus about one 4 → 6 upgrade of a q projection.
    let plan4 = plan_bits(&m, &lut(4), &sel, Some(&cal), 16.0, &[4]).unwrap();
    let elems: usize = weights.iter().map(|w| w.tensor.num_elements()).sum();
    let target = plan4.avg_bits + (2.0 * 4096.0 + 4.0 * 48.0 * 16.0) / elems as f64 + 1e-6;
    for big in [
        "layers_1_self_attn_q_proj_weight",
        "layers_0_self_attn_v_proj_weight",
    ] {
        let mut c = cal.clone();
        c.set_end_metric(big, &[(4, 0.3), (6, 0.01), (8, 0.005)]);
        let plan = plan_bits(&m, &lut(4), &sel, Some(&c), target, &[2, 3, 4, 6, 8]).unwrap();
        let chosen = plan.nbits();
        println!("{big}: {chosen:?}");
        assert_eq!(chosen[big], 6, "{chosen:?}");
        assert!(
            chosen
                .iter()
                .filter(|(w, _)| *w != big)
                .all(|(_, &b)| b == 4),
            "the tiny curves stay at the base width: {chosen:?}"
        );
        assert!(plan.avg_bits <= target);
        // The plan's errors are the curve, not the op's own output error.
        let wp = plan.weights.iter().find(|w| w.weight == big).unwrap();
        assert_eq!(
            wp.curve.iter().map(|p| (p.0, p.2)).collect::<Vec<_>>(),
            vec![(4, 0.3), (6, 0.01), (8, 0.005)]
        );
    }
    // Encoder curves and decoder curves are on different scales: one budget is refused.
    let mut dec = cal.clone();
    dec.meta.insert(COMPONENT_KEY.into(), "decoder".into());
    let no_fixed = BTreeMap::new();
    let part = |c| PlanPart {
        model: &m,
        base: lut(4),
        sel: &sel,
        calibration: Some(c),
        fixed: &no_fixed,
    };
    let e = plan_bits_joint(&[part(&cal), part(&dec)], 9.0, &[4, 6])
        .err()
        .unwrap();
    assert!(format!("{e:#}").contains("different scales"), "{e:#}");
    plan_bits_joint(&[part(&cal), part(&cal)], 9.0, &[4, 6]).unwrap();
}

#[test]
fn the_cli_stores_encoder_curves_that_export_plans_with() {
    let Some(fx) = common::fixtures() else { return };
    let dir = tempfile::tempdir().unwrap();
    let hf = micro(dir.path());
    let r = recipe(dir.path(), RECIPE);
    let st = dir.path().join("enc.st");
    let o = milkit()
        .args(["calibrate", "--quiet", "--model"])
        .arg(&hf)
        .arg("--audio")
        .arg(fx.join("audio/jfk.wav"))
        .arg("--sensitivity-recipe")
        .arg(&r)
        .args(["--widths", "4,6,8", "--out"])
        .arg(&st)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let cal = Calibration::load(&st).unwrap();
    let m = encoder(&hf);
    let weights = selected_weights(&m, &Method::Palettize(lut(4)), &Selection::default()).unwrap();
    for w in &weights {
        let c = cal.end_metric(&w.weight).unwrap().unwrap();
        assert_eq!(c.len(), 3, "{}: {c:?}", w.weight);
        assert!(c[0].1 > c[2].1, "{}: {c:?}", w.weight);
    }
    // The export plans the encoder with these curves: the recipe needs no change.
    let out = dir.path().join("folder");
    let o = milkit()
        .args(["export", "--recipe"])
        .arg(&r)
        .arg("--model")
        .arg(&hf)
        .arg("--calibration")
        .arg(&st)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Its widths are the plan over the curves (which some weights' curves move above 4).
    // The 4.6-bit plan (LUT4 at least) that the statistics `cal` give over `widths`.
    let plan = |cal: &Calibration, widths: &[u32]| {
        plan_bits(&m, &lut(4), &Selection::default(), Some(cal), 4.6, widths)
    };
    let want = plan(&cal, &[2, 3, 4, 6, 8]).unwrap().nbits();
    assert!(want.values().any(|&b| b > 4), "{want:?}");
    let o = milkit()
        .args(["inspect", "--mil"])
        .arg(out.join("AudioEncoder.mlpackage"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mil = String::from_utf8_lossy(&o.stdout);
    let mut got = BTreeMap::new();
    for line in mil.lines() {
        let Some(rest) = line.split("constexpr_lut_to_dense[name=\"").nth(1) else {
            continue;
        };
        let name = rest.split("_palettized\"").next().unwrap();
        let bits: u32 = rest.split("indices=<uint").nth(1).unwrap()[..1]
            .parse()
            .unwrap();
        got.insert(name.to_string(), bits);
    }
    assert_eq!(got, want);
    // ... and not what the per-op errors alone would plan.
    let mut plain = cal.clone();
    plain.meta.retain(|k, _| !k.contains("end_metric"));
    let per_op = plan(&plain, &[2, 3, 4, 6, 8]).unwrap().nbits();
    assert_ne!(got, per_op);
    // A curve missing for one weight: the plan names it instead of mixing scales.
    let mut partial = cal.clone();
    partial
        .meta
        .remove("milkit.calibration.end_metric:layers_0_fc2_weight");
    let e = plan(&partial, &[4, 6, 8]).unwrap_err();
    assert!(format!("{e:#}").contains("layers_0_fc2_weight"), "{e:#}");
}

#[test]
fn an_encoder_sweep_refuses_recipes_it_cannot_measure_with_a_clear_message() {
    let Some(fx) = common::fixtures() else { return };
    let dir = tempfile::tempdir().unwrap();
    let hf = micro(dir.path());
    let run = |r: &Path, gram: bool| {
        let mut c = milkit();
        c.args(["calibrate", "--quiet", "--model"])
            .arg(&hf)
            .arg("--audio")
            .arg(fx.join("audio/jfk.wav"))
            .arg("--sensitivity-recipe")
            .arg(r)
            .args(["--widths", "4,8", "--out"])
            .arg(dir.path().join("x.st"));
        if gram {
            c.arg("--gram");
        }
        let o = c.output().unwrap();
        assert!(!o.status.success());
        assert!(!dir.path().join("x.st").exists());
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let err = run(&recipe(dir.path(), ""), false);
    assert!(err.contains("encoder is not compressed"), "{err}");
    let err = run(
        &recipe(dir.path(), &format!("{RECIPE}\nerror_feedback = true")),
        false,
    );
    assert!(err.contains("add --gram"), "{err}");
    let err = run(&recipe(dir.path(), "quantize = \"int8\""), false);
    assert!(err.contains("palettize"), "{err}");
    // A decoder-only recipe has no encoder to measure.
    let p = dir.path().join("dec.toml");
    std::fs::write(
        &p,
        "name = \"t\"\n\n[[component]]\ncomponent = \"decoder\"\nfile = \"TextDecoder.mlpackage\"\n\
         \n[component.compress]\npalettize = \"kmeans\"\nnbits = 4\n",
    )
    .unwrap();
    let err = run(&p, true);
    assert!(err.contains("no `encoder` component"), "{err}");
}
