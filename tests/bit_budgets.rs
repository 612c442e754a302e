//! Whole-model budgets: the folder's bits per compressed weight count exactly what the
//! packages store (checked against an independent count from the weight shapes), a joint
//! plan over encoder and decoder keeps ONE budget over both (and the written folder stores
//! exactly the planned bits), and calibration statistics only go to the component they were
//! measured on (Whisper's encoder and decoder share weight names). A budget above 8 bits
//! keeps some weights fp16, bit for bit, and the package counts them at 16 bits.

mod common;
use milkit::convert::bundle::{plan_folder_bits, route_statistics, BundleOptions, Compression};
use milkit::convert::decoder_export::{export_decoder, DecoderExport};
use milkit::convert::export::export_encoder;
use milkit::ir::{Model, Opset};
use milkit::package::save_package;
use milkit::passes::calibrate::{Calibration, COMPONENT_KEY};
use milkit::passes::compress::{compress_mixed, selected_weights, Method, Selection};
use milkit::passes::lut::{LutConfig, LutGranularity, LutMode};
use milkit::passes::mixed::{plan_bits_joint, PlanPart};
use milkit::quality::bits::folder_bits;
use milkit::whisper::checkpoint::Checkpoint;
use milkit::whisper::encoder::EncoderAbi;
use std::collections::BTreeMap;
use std::path::Path;

fn lut(nbits: u32, group: usize) -> LutConfig {
    LutConfig {
        mode: LutMode::Kmeans,
        nbits,
        granularity: LutGranularity::PerGroupedChannel(group),
        per_channel_scale: false,
        cluster_dim: 1,
    }
}

fn models(fx: &Path) -> (Model, Model) {
    let hf = fx.join("models/whisper-tiny.en");
    let enc = export_encoder(
        &Checkpoint::open(&hf).unwrap(),
        EncoderAbi::WhisperKit,
        Opset::Ios18,
        &mut |_, _| {},
    )
    .unwrap();
    let dec = export_decoder(
        &Checkpoint::open(&hf).unwrap(),
        &DecoderExport::default(),
        Opset::Ios18,
    )
    .unwrap();
    (enc, dec)
}

/// Stored bits of a weight palettized at `nbits` with one fp16 table per `group` rows,
/// counted from its shape alone.
fn expected_bits(shape: &[usize], nbits: u32, group: usize) -> u64 {
    let numel: u64 = shape.iter().map(|d| *d as u64).product();
    let tables = (shape[0] / group) as u64;
    numel * nbits as u64 + tables * (1u64 << nbits) * 16
}

/// A selection the encoder and the decoder both have (they share these names), so the
/// tests stay fast: the decoder's 20 M-element head is left out.
fn shared_sel() -> Selection {
    Selection {
        op_names: vec![
            "layers_0_fc1_weight".into(),
            "layers_0_fc2_weight".into(),
            "layers_3_self_attn_v_proj_weight".into(),
        ],
        ..Selection::default()
    }
}

#[test]
fn folder_bits_count_what_the_packages_store() {
    let Some(fx) = common::fixtures() else { return };
    let (mut enc, mut dec) = models(&fx);
    let sel = Selection::default();
    // Independent count from the fp16 shapes: encoder LUT4 g16, decoder layer-0 fc at LUT6 g8.
    let mut want_bits = 0u64;
    let mut want_elems = 0u64;
    let enc_m = Method::Palettize(lut(4, 16));
    for w in selected_weights(&enc, &enc_m, &sel).unwrap() {
        want_bits += expected_bits(&w.tensor.shape, 4, 16);
        want_elems += w.tensor.num_elements() as u64;
    }
    let dec_sel = Selection {
        op_names: vec!["layers_0_fc1_weight".into(), "layers_0_fc2_weight".into()],
        ..Selection::default()
    };
    let dec_m = Method::Palettize(lut(6, 8));
    let dec_ws = selected_weights(&dec, &dec_m, &dec_sel).unwrap();
    assert_eq!(dec_ws.len(), 2);
    let mut dec_bits = 0u64;
    for w in &dec_ws {
        dec_bits += expected_bits(&w.tensor.shape, 6, 8);
        want_elems += w.tensor.num_elements() as u64;
    }
    want_bits += dec_bits;
    compress_mixed(&mut enc, &enc_m, &sel, None, &BTreeMap::new()).unwrap();
    compress_mixed(&mut dec, &dec_m, &dec_sel, None, &BTreeMap::new()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    save_package(
        &enc,
        &dir.path().join("AudioEncoder.mlpackage"),
        false,
        &mut |_| {},
    )
    .unwrap();
    save_package(
        &dec,
        &dir.path().join("TextDecoder.mlpackage"),
        false,
        &mut |_| {},
    )
    .unwrap();
    std::fs::write(dir.path().join("config.json"), "{}").unwrap();
    let b = folder_bits(dir.path()).unwrap();
    assert_eq!(b.packages.len(), 2, "{b:?}");
    assert_eq!(b.compressed_elements, want_elems);
    assert_eq!(b.compressed_stored_bytes * 8, want_bits);
    let d = &b.packages[1];
    assert_eq!(d.package, "TextDecoder.mlpackage");
    assert_eq!(d.compressed_stored_bytes * 8, dec_bits);
    let avg = b.avg_bits.unwrap();
    assert!((avg - want_bits as f64 / want_elems as f64).abs() < 1e-12);
    // Roughly 4 + 0.06 (tables of the encoder) and 6 bits, weighted by elements.
    assert!(avg > 4.0 && avg < 6.0, "{avg}");
    // A folder without compressed weights has no average.
    let plain = tempfile::tempdir().unwrap();
    let (e2, _) = models(&fx);
    save_package(
        &e2,
        &plain.path().join("AudioEncoder.mlpackage"),
        false,
        &mut |_| {},
    )
    .unwrap();
    let pb = folder_bits(plain.path()).unwrap();
    assert_eq!(pb.compressed_elements, 0);
    assert!(pb.avg_bits.is_none());
}

#[test]
fn joint_plan_keeps_one_budget_over_both_models() {
    let Some(fx) = common::fixtures() else { return };
    let (enc, dec) = models(&fx);
    let sel = shared_sel();
    let no_fixed = std::collections::BTreeMap::new();
    let parts = [
        PlanPart {
            model: &enc,
            base: lut(4, 16),
            sel: &sel,
            calibration: None,
            fixed: &no_fixed,
        },
        PlanPart {
            model: &dec,
            base: lut(4, 8),
            sel: &sel,
            calibration: None,
            fixed: &no_fixed,
        },
    ];
    let target = 4.6;
    let plans = plan_bits_joint(&parts, target, &[2, 3, 4, 6, 8]).unwrap();
    assert_eq!(plans.len(), 2);
    assert_eq!(plans[0].weights.len(), 3);
    assert_eq!(plans[1].weights.len(), 3);
    let bits: u64 = plans
        .iter()
        .flat_map(|p| &p.weights)
        .map(|w| w.chosen_stored_bits())
        .sum();
    let elems: u64 = plans
        .iter()
        .flat_map(|p| &p.weights)
        .map(|w| w.elements as u64)
        .sum();
    let joint = bits as f64 / elems as f64;
    assert!(joint <= target, "{joint}");
    // The budget is used: one more upgrade of the cheapest kind would not fit.
    assert!(
        joint > target - 2.1 * 1536.0 * 384.0 / elems as f64,
        "{joint}"
    );
    assert!(plans.iter().flat_map(|p| &p.weights).all(|w| w.chosen >= 4));
    // Each part's stored bits at its own table layout: the decoder's tables per 8 rows.
    for (p, g) in plans.iter().zip([16, 8]) {
        let (mut b, mut n) = (0u64, 0u64);
        for w in &p.weights {
            let shape = if w.elements == 1536 * 384 {
                if w.weight.contains("fc1") {
                    vec![1536, 384]
                } else {
                    vec![384, 1536]
                }
            } else {
                vec![384, 384]
            };
            b += expected_bits(&shape, w.chosen, g);
            n += w.elements as u64;
        }
        assert!(
            (p.avg_bits - b as f64 / n as f64).abs() < 1e-12,
            "{}",
            p.avg_bits
        );
    }
    // Jointly one part may end above the target only if the other pays for it.
    assert!(plans[0].avg_bits <= target || plans[1].avg_bits <= target);
}

#[test]
fn folder_plan_routes_statistics_and_fixes_widths() {
    let Some(fx) = common::fixtures() else { return };
    let hf = fx.join("models/whisper-tiny.en");
    let (enc, _) = models(&fx);
    // Encoder statistics (flat ones: equal importance everywhere, marked as the encoder's).
    let sel = shared_sel();
    let mut moments = BTreeMap::new();
    for w in selected_weights(&enc, &Method::Palettize(lut(4, 16)), &sel).unwrap() {
        moments.insert(w.weight.clone(), vec![1.0f32; w.tensor.shape[1]]);
    }
    let mut meta = BTreeMap::new();
    meta.insert(COMPONENT_KEY.to_string(), "encoder".to_string());
    let cal = Calibration {
        moments,
        meta,
        ..Default::default()
    };
    // Round trip keeps the component.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("s.safetensors");
    cal.save(&p, false).unwrap();
    assert_eq!(Calibration::load(&p).unwrap().component(), "encoder");
    assert_eq!(Calibration::default().component(), "encoder");
    let comp = |g: usize| {
        let mut c = Compression::new(Method::Palettize(lut(4, g)), sel.clone(), false);
        c.calibration = Some(cal.clone());
        c.target_bits = Some(4.6);
        c
    };
    let mut opts = BundleOptions {
        opset: Opset::Ios18,
        decoder: DecoderExport::default(),
        encoder_compression: Some(comp(16)),
        decoder_compression: Some(comp(8)),
    };
    // The encoder's statistics stay with the encoder only (the names would match the
    // decoder's too); statistics marked as the decoder's go the other way.
    let mut swapped = opts.clone();
    route_statistics(&mut opts);
    assert!(opts
        .encoder_compression
        .as_ref()
        .unwrap()
        .calibration
        .is_some());
    assert!(opts
        .decoder_compression
        .as_ref()
        .unwrap()
        .calibration
        .is_none());
    for c in [
        &mut swapped.encoder_compression,
        &mut swapped.decoder_compression,
    ] {
        let cal = c.as_mut().unwrap().calibration.as_mut().unwrap();
        cal.meta.insert(COMPONENT_KEY.into(), "decoder".into());
    }
    route_statistics(&mut swapped);
    assert!(swapped
        .encoder_compression
        .as_ref()
        .unwrap()
        .calibration
        .is_none());
    assert!(swapped
        .decoder_compression
        .as_ref()
        .unwrap()
        .calibration
        .is_some());
    let plans = plan_folder_bits(&Checkpoint::open(&hf).unwrap(), &mut opts, &mut |_| {})
        .unwrap()
        .expect("both parts ask for a budget");
    let (e, d) = (
        opts.encoder_compression.as_ref().unwrap(),
        opts.decoder_compression.as_ref().unwrap(),
    );
    assert_eq!(e.nbits, plans[0].nbits());
    assert_eq!(d.nbits, plans[1].nbits());
    assert_eq!(e.nbits.len(), 3);
    assert_eq!(d.nbits.len(), 3);
    // Different budgets for the two parts are refused: it is one budget.
    let mut bad = opts.clone();
    bad.decoder_compression.as_mut().unwrap().target_bits = Some(5.0);
    bad.encoder_compression.as_mut().unwrap().nbits.clear();
    let err = plan_folder_bits(&Checkpoint::open(&hf).unwrap(), &mut bad, &mut |_| {})
        .err()
        .unwrap();
    assert!(format!("{err:#}").contains("one budget"), "{err:#}");
}

#[test]
fn decoder_statistics_are_reproducible_and_cover_the_decoder() {
    let Some(fx) = common::fixtures() else { return };
    let hf = fx.join("models/whisper-tiny.en");
    let clip = vec![fx.join("audio/jfk.wav")];
    let sel = Selection::default();
    let run = || {
        milkit::quality::calibrate::calibrate_decoder(&hf, &clip, &sel, false, &mut |_, _| {})
            .unwrap()
    };
    let a = run();
    let b = run();
    assert_eq!(a.moments, b.moments, "two runs on the same clip differ");
    assert_eq!(a.component(), "decoder");
    let runs: u64 = a.meta["milkit.calibration.runs"].parse().unwrap();
    // jfk.wav is ~22 words: at least that many tokens, far fewer than the 448 positions.
    assert!((22..448).contains(&runs), "{runs} decoder runs");
    // Every weight the compression pass takes in the decoder has statistics of its width.
    let dec = export_decoder(
        &Checkpoint::open(&hf).unwrap(),
        &DecoderExport::default(),
        Opset::Ios18,
    )
    .unwrap();
    let ws = selected_weights(&dec, &Method::Palettize(lut(4, 8)), &sel).unwrap();
    assert!(ws.iter().any(|w| w.weight == "lm_head_weight"));
    for w in &ws {
        let m = a
            .moments
            .get(&w.weight)
            .unwrap_or_else(|| panic!("{}", w.weight));
        assert_eq!(m.len(), w.tensor.shape[1], "{}", w.weight);
        assert!(m.iter().all(|v| v.is_finite() && *v >= 0.0));
        assert!(m.iter().any(|v| *v > 0.0), "{}: all zero", w.weight);
    }
    // They drive weighted k-means of the decoder without any missing weight.
    let mut d = dec.clone();
    compress_mixed(
        &mut d,
        &Method::Palettize(lut(4, 8)),
        &shared_sel(),
        Some(&a),
        &BTreeMap::new(),
    )
    .unwrap();
}

#[test]
fn a_budget_above_eight_bits_keeps_weights_fp16_and_the_package_counts_them_at_16() {
    let dir = tempfile::tempdir().unwrap();
    let hf = dir.path().join("micro");
    let opts = milkit::whisper::synth::SynthOptions {
        seed: 5,
        dtype: milkit::whisper::synth::SynthDType::F16,
        progress: false,
        force: false,
    };
    milkit::whisper::synth::synthesize_with(&common::micro_config(), None, &hf, &opts).unwrap();
    let ckpt = Checkpoint::open(&hf).unwrap();
    let enc = export_encoder(&ckpt, EncoderAbi::WhisperKit, Opset::Ios18, &mut |_, _| {}).unwrap();
    let flags = |nbits: u32, target: f64| milkit::convert::compress::CompressFlags {
        palettize: Some(LutMode::Kmeans),
        nbits,
        group_size: 16,
        target_bits: Some(target),
        ..Default::default()
    };
    let mut m = enc.clone();
    let out = flags(8, 12.0)
        .compression()
        .unwrap()
        .unwrap()
        .apply(&mut m)
        .unwrap();
    let kept: Vec<&str> = out
        .skipped
        .iter()
        .filter(|s| s.reason == milkit::passes::compress::KEPT_FP16_REASON)
        .map(|s| s.weight.as_str())
        .collect();
    assert!(
        !kept.is_empty() && !out.compressed.is_empty(),
        "both kinds: {kept:?}"
    );
    assert!(out.compressed.iter().all(|c| c.mode.starts_with("lut8")));
    let mut named: Vec<&str> = m.description.user_defined[milkit::passes::compress::KEPT_FP16_KEY]
        .split(',')
        .collect();
    named.sort();
    let mut sorted = kept.clone();
    sorted.sort();
    assert_eq!(named, sorted);
    // A kept weight is the model's own constant, bit for bit.
    let consts = |m: &Model| -> BTreeMap<String, Vec<u16>> {
        m.program
            .functions
            .values()
            .flat_map(|f| &f.block.operations)
            .filter_map(|op| match op.const_val() {
                Some(milkit::ir::Value::Tensor(t)) => Some((
                    op.name.clone(),
                    t.data.to_f16_vec().iter().map(|h| h.to_bits()).collect(),
                )),
                _ => None,
            })
            .collect()
    };
    let (before, after) = (consts(&enc), consts(&m));
    for k in &kept {
        assert_eq!(before[*k], after[*k], "{k}");
    }
    // The package's bits per weight, against a count from the shapes: 8-bit tables per 16
    // rows for the compressed weights, 16 bits for the kept ones.
    let pkg = dir.path().join("k.mlpackage");
    save_package(&m, &pkg, false, &mut |_| {}).unwrap();
    let (mut bits, mut elems) = (0u64, 0u64);
    for c in &out.compressed {
        bits += expected_bits(&c.shape, 8, 16);
        elems += c.shape.iter().product::<usize>() as u64;
    }
    for s in out
        .skipped
        .iter()
        .filter(|s| kept.contains(&s.weight.as_str()))
    {
        let n = s.shape.iter().product::<usize>() as u64;
        bits += 16 * n;
        elems += n;
    }
    let counted = milkit::quality::bits::package_bits(&pkg).unwrap();
    assert_eq!(counted.compressed_elements, elems);
    let want = bits as f64 / elems as f64;
    let got = counted.avg_bits.unwrap();
    assert!((got - want).abs() < 1e-9, "{got} vs {want}");
    assert!(got > 8.0 && got <= 12.0, "{got}");
    // Within 8 bits no weight stays fp16.
    let mut m = enc.clone();
    let out = flags(4, 7.0)
        .compression()
        .unwrap()
        .unwrap()
        .apply(&mut m)
        .unwrap();
    assert!(out
        .skipped
        .iter()
        .all(|s| s.reason != milkit::passes::compress::KEPT_FP16_REASON));
    assert!(!m
        .description
        .user_defined
        .contains_key(milkit::passes::compress::KEPT_FP16_KEY));
}
