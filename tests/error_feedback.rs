//! Error feedback while rounding (`--error-feedback`, GPTQ-style): the factor is the upper
//! Cholesky factor of the damped inverse Gram matrix; on a random layer with correlated
//! inputs the sweep lowers the output error ‖X(W − Ŵ)ᵀ‖ (float64 maths here) against plain
//! rounding, for tables and for int4; with an identity Gram matrix it is plain rounding; the
//! calibration probe measures XᵀX; statistics with Gram matrices round-trip and are refused
//! when non-finite; packages built with it pass the coremltools validator.

mod common;

use common::milkit;
use common::programs::{f16_tensor, host, model, tin};
use common::rng::Rng;
use half::f16;
use milkit::ir::{DType, Opset};
use milkit::ops::{Builder, In};
use milkit::passes::calibrate::{instrument, Calibration, Gram};
use milkit::passes::compress::Selection;
use milkit::passes::feedback::{
    feedback_factor, palettize_with_feedback, quantize_with_feedback, DEFAULT_DAMPING,
};
use milkit::passes::lut::{palettize, LutConfig, LutGranularity, LutMode};
use milkit::passes::quant::{quantize, QuantConfig, QuantDtype, QuantGranularity};
use milkit::quality::calibrate::probe_values;
use milkit::runtime::Session;
use std::collections::BTreeMap;
use std::sync::Arc;

/// `n` input vectors of `d` channels driven by 4 shared latent factors (strongly correlated
/// channels, as a layer's inputs are) plus a little independent noise; row-major [n, d].
fn correlated_inputs(r: &mut Rng, n: usize, d: usize) -> Vec<f64> {
    let k = 4;
    let mix: Vec<f64> = (0..k * d).map(|_| r.normal()).collect();
    let mut x = vec![0.0; n * d];
    for s in 0..n {
        let z: Vec<f64> = (0..k).map(|_| r.normal()).collect();
        for j in 0..d {
            let shared: f64 = (0..k).map(|m| z[m] * mix[m * d + j]).sum();
            x[s * d + j] = shared + 0.1 * r.normal();
        }
    }
    x
}

/// XᵀX / n in float64, returned as the fp32 matrix the statistics store.
fn gram(x: &[f64], n: usize, d: usize) -> Vec<f32> {
    let mut h = vec![0.0f64; d * d];
    for s in 0..n {
        let row = &x[s * d..(s + 1) * d];
        for i in 0..d {
            for k in 0..d {
                h[i * d + k] += row[i] * row[k];
            }
        }
    }
    h.iter().map(|v| (v / n as f64) as f32).collect()
}

/// ‖X (W − Ŵ)ᵀ‖² in float64: the error of the layer's outputs on the inputs `x`.
fn output_error(x: &[f64], n: usize, d: usize, w: &[f16], dec: &[f16]) -> f64 {
    let rows = w.len() / d;
    let mut e = 0.0;
    for s in 0..n {
        let xs = &x[s * d..(s + 1) * d];
        for r in 0..rows {
            let y: f64 = (0..d)
                .map(|j| xs[j] * (w[r * d + j].to_f64() - dec[r * d + j].to_f64()))
                .sum();
            e += y * y;
        }
    }
    e
}

fn random_weight(r: &mut Rng, rows: usize, d: usize) -> Vec<f16> {
    (0..rows * d)
        .map(|_| f16::from_f64(0.1 * r.normal()))
        .collect()
}

fn lut(nbits: u32, group: usize, pcs: bool) -> LutConfig {
    LutConfig {
        mode: LutMode::Kmeans,
        nbits,
        granularity: LutGranularity::PerGroupedChannel(group),
        per_channel_scale: pcs,
        cluster_dim: 1,
    }
}

fn int4(granularity: QuantGranularity) -> QuantConfig {
    QuantConfig {
        dtype: QuantDtype::Int4,
        granularity,
        symmetric: true,
    }
}

#[test]
fn the_factor_squares_to_the_inverse_of_the_damped_gram_matrix() {
    let mut r = Rng(5);
    let (n, d) = (64, 12);
    let x = correlated_inputs(&mut r, n, d);
    let h = gram(&x, n, d);
    let damp = 0.01;
    let u = feedback_factor(&h, d, damp).unwrap();
    let mean = (0..d).map(|i| f64::from(h[i * d + i])).sum::<f64>() / d as f64;
    for i in 0..d {
        for k in 0..i {
            assert_eq!(u[i * d + k], 0.0, "U must be upper triangular");
        }
    }
    // (UᵀU) · (H + λI) = I within float64 round-off of an fp32 matrix's inverse.
    for i in 0..d {
        for k in 0..d {
            let mut s = 0.0;
            for m in 0..d {
                let utu: f64 = (0..d).map(|p| u[p * d + i] * u[p * d + m]).sum();
                let hd = f64::from(h[m * d + k]) + if m == k { damp * mean } else { 0.0 };
                s += utu * hd;
            }
            let want = if i == k { 1.0 } else { 0.0 };
            assert!((s - want).abs() < 1e-8, "({i},{k}) = {s}");
        }
    }
}

#[test]
fn bad_gram_matrices_are_refused_with_the_reason() {
    let msg = feedback_factor(&[1.0; 6], 2, 0.01).unwrap_err().to_string();
    assert!(msg.contains("not 2 × 2"), "{msg}");
    let msg = feedback_factor(&[f32::NAN, 0.0, 0.0, 1.0], 2, 0.01)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("non-finite"), "{msg}");
    // Indefinite without damping: refused rather than rounded with a wrong factor.
    let msg = feedback_factor(&[1.0, 2.0, 2.0, 1.0], 2, 0.0)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("not positive definite"), "{msg}");
}

#[test]
fn error_feedback_lowers_the_output_error_of_a_layer_with_correlated_inputs() {
    let mut r = Rng(17);
    let (n, d, rows) = (512, 64, 32);
    let x = correlated_inputs(&mut r, n, d);
    let h = gram(&x, n, d);
    let u = feedback_factor(&h, d, DEFAULT_DAMPING).unwrap();
    let w = random_weight(&mut r, rows, d);
    let shape = [rows, d];
    let diag: Vec<f32> = (0..d).map(|i| h[i * d + i]).collect();
    for cfg in [lut(4, 16, false), lut(4, 8, true), lut(3, 32, false)] {
        let plain = palettize(&w, &shape, &cfg, Some(&diag)).unwrap();
        let fed = palettize_with_feedback(&w, &shape, &cfg, Some(&diag), &u).unwrap();
        // The same tables: only the indices differ.
        assert_eq!(plain.lut, fed.lut);
        let e0 = output_error(&x, n, d, &w, &plain.decode().unwrap());
        let e1 = output_error(&x, n, d, &w, &fed.decode().unwrap());
        assert!(e1 < 0.7 * e0, "{cfg:?}: output error {e1} vs plain {e0}");
    }
    for cfg in [
        int4(QuantGranularity::PerChannel),
        int4(QuantGranularity::PerBlock(16)),
    ] {
        let plain = quantize(&w, &shape, &cfg).unwrap();
        let (fed, rel) = quantize_with_feedback(&w, &shape, &cfg, &u).unwrap();
        assert_eq!(plain.scale, fed.scale);
        let dec = fed.decode().unwrap();
        let e0 = output_error(&x, n, d, &w, &plain.decode().unwrap());
        let e1 = output_error(&x, n, d, &w, &dec);
        assert!(e1 < 0.7 * e0, "{cfg:?}: output error {e1} vs plain {e0}");
        // The reported error is the decode's relative RMS error.
        let (num, den) = w.iter().zip(&dec).fold((0.0, 0.0), |(a, b), (p, q)| {
            (
                a + (p.to_f64() - q.to_f64()).powi(2),
                b + p.to_f64().powi(2),
            )
        });
        assert!(((num / den).sqrt() - rel).abs() < 1e-6, "{rel}");
    }
}

#[test]
fn with_an_identity_gram_matrix_it_is_plain_rounding() {
    let mut r = Rng(23);
    let (rows, d) = (32, 48);
    let w = random_weight(&mut r, rows, d);
    let shape = [rows, d];
    let mut h = vec![0f32; d * d];
    for i in 0..d {
        h[i * d + i] = 1.0;
    }
    let u = feedback_factor(&h, d, DEFAULT_DAMPING).unwrap();
    // Tables: every element takes its group's nearest entry (float64 search here).
    let cfg = lut(4, 16, false);
    let fed = palettize_with_feedback(&w, &shape, &cfg, None, &u).unwrap();
    let dec = fed.decode().unwrap();
    for (i, (x, got)) in w.iter().zip(&dec).enumerate() {
        let table = &fed.lut[(i / (16 * d)) * 16..(i / (16 * d) + 1) * 16];
        let best = table
            .iter()
            .map(|e| (e.to_f64() - x.to_f64()).abs())
            .fold(f64::INFINITY, f64::min);
        assert_eq!((got.to_f64() - x.to_f64()).abs(), best, "element {i}");
    }
    // int4, per channel and per block: the same codes as the plain path.
    for cfg in [
        int4(QuantGranularity::PerChannel),
        int4(QuantGranularity::PerBlock(16)),
    ] {
        let plain = quantize(&w, &shape, &cfg).unwrap();
        let (fed, _) = quantize_with_feedback(&w, &shape, &cfg, &u).unwrap();
        assert_eq!(plain, fed, "{cfg:?}");
    }
}

#[test]
fn the_calibration_probe_measures_the_input_gram_matrix() {
    // A 1×1 conv over [1, d, 1, t] and a linear over [t, d] reading the same input.
    let (d, t, h) = (16usize, 10usize, 24usize);
    let mut r = Rng(31);
    let mut b = Builder::new(Opset::Ios18);
    let x = b.input("x", tin(DType::F16, &[1, d, 1, t]));
    let wc = b.konst("c_weight", f16_tensor(&[h, d, 1, 1], &r.vec(h * d)));
    let y = b
        .op1("conv", "c", vec![("x", In::V(x)), ("weight", In::V(wc))])
        .unwrap();
    let xl = b.input("xl", tin(DType::F16, &[t, d]));
    let wl = b.konst("l_weight", f16_tensor(&[h, d], &r.vec(h * d)));
    let wl2 = b.konst("l2_weight", f16_tensor(&[h, d], &r.vec(h * d)));
    let z = b
        .op1(
            "linear",
            "l",
            vec![("x", In::V(xl.clone())), ("weight", In::V(wl))],
        )
        .unwrap();
    let z2 = b
        .op1(
            "linear",
            "l2",
            vec![("x", In::V(xl)), ("weight", In::V(wl2))],
        )
        .unwrap();
    let m = model(b, &[(y, "y"), (z, "z"), (z2, "z2")]);
    let sel = Selection {
        weight_threshold: 0,
        ..Selection::default()
    };
    let (inst, probes) = instrument(&m, &sel, true).unwrap();
    assert_eq!(probes.len(), 3);
    // Two consumers of one input share one matrix.
    let pl: Vec<_> = probes
        .iter()
        .filter(|p| p.weight.starts_with('l'))
        .collect();
    assert!(pl[0].gram.is_some() && pl[0].gram == pl[1].gram);
    let xc: Vec<f32> = r.vec(d * t);
    let xr: Vec<f32> = r.vec(t * d);
    let mut s = Session::from_model(inst).unwrap();
    let outs = s
        .predict(&[("x", host(&xc, &[1, d, 1, t])), ("xl", host(&xr, &[t, d]))])
        .unwrap();
    let vals = probe_values(&probes, outs).unwrap();
    // Σ_t x[c, t] x[k, t] in float64 of the fp16 inputs the runtime sees.
    let fp = |v: f32| f16::from_f32(v).to_f64();
    for p in &probes {
        let got = &vals[p.gram.as_ref().unwrap()];
        assert_eq!(got.len(), d * d);
        for i in 0..d {
            for k in 0..d {
                let want: f64 = (0..t)
                    .map(|s| {
                        if p.weight == "c_weight" {
                            fp(xc[i * t + s]) * fp(xc[k * t + s])
                        } else {
                            fp(xr[s * d + i]) * fp(xr[s * d + k])
                        }
                    })
                    .sum();
                let g = f64::from(got[i * d + k]);
                assert!(
                    (g - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "{} ({i},{k}): {g} vs {want}",
                    p.weight
                );
            }
        }
    }
}

#[test]
fn statistics_with_gram_matrices_round_trip_and_non_finite_ones_are_refused() {
    let d = 3;
    let g = Arc::new(Gram {
        dim: d,
        data: vec![2.0, 0.5, 0.1, 0.5, 1.0, 0.2, 0.1, 0.2, 3.0],
    });
    let mut moments = BTreeMap::new();
    moments.insert("a_weight".to_string(), vec![2.0f32, 1.0, 3.0]);
    moments.insert("b_weight".to_string(), vec![2.0f32, 1.0, 3.0]);
    moments.insert("conv_weight".to_string(), vec![1.0f32, 1.0]);
    let mut grams = BTreeMap::new();
    grams.insert("a_weight".to_string(), Arc::clone(&g));
    grams.insert("b_weight".to_string(), Arc::clone(&g));
    let cal = Calibration {
        moments,
        grams,
        meta: BTreeMap::new(),
    };
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("s.safetensors");
    cal.save(&p, false).unwrap();
    let back = Calibration::load(&p).unwrap();
    assert_eq!(back.moments, cal.moments);
    assert_eq!(back.grams.len(), 2);
    assert_eq!(*back.grams["a_weight"], *g);
    // Stored once, shared again after loading.
    assert!(Arc::ptr_eq(
        &back.grams["a_weight"],
        &back.grams["b_weight"]
    ));
    assert!(!back.grams.contains_key("conv_weight"));
    // Checked against the weight it serves.
    assert!(back.gram("a_weight", &[8, 3, 1, 1]).unwrap().is_some());
    let msg = back.gram("a_weight", &[8, 4]).unwrap_err().to_string();
    assert!(msg.contains("a_weight") && msg.contains("3 × 3"), "{msg}");
    // Saved again (the metadata's order is the serializer's), it reads back the same.
    let p2 = dir.path().join("s2.safetensors");
    back.save(&p2, false).unwrap();
    let again = Calibration::load(&p2).unwrap();
    assert_eq!(again.moments, back.moments);
    assert_eq!(again.grams, back.grams);

    // A non-finite value in a Gram matrix: refused, naming the file and the tensor.
    let mut bad = cal.clone();
    let mut data = g.data.clone();
    data[4] = f32::INFINITY;
    bad.grams
        .insert("a_weight".into(), Arc::new(Gram { dim: d, data }));
    let pb = dir.path().join("bad.safetensors");
    bad.save(&pb, false).unwrap();
    let msg = Calibration::load(&pb).unwrap_err().to_string();
    assert!(
        msg.contains("bad.safetensors")
            && msg.contains("gram:a_weight")
            && msg.contains("non-finite"),
        "{msg}"
    );
}

#[test]
fn cli_packages_with_error_feedback_pass_the_validator() {
    let Some(fx) = common::fixtures() else { return };
    let dir = tempfile::tempdir().unwrap();
    let hf = dir.path().join("micro");
    let opts = milkit::whisper::synth::SynthOptions {
        seed: 7,
        dtype: milkit::whisper::synth::SynthDType::F16,
        progress: false,
        force: false,
    };
    milkit::whisper::synth::synthesize_with(&common::micro_config(), None, &hf, &opts).unwrap();
    let calibrate = |st: &std::path::Path, gram: bool| {
        let mut c = milkit();
        c.args(["calibrate", "--model"])
            .arg(&hf)
            .arg("--audio")
            .arg(fx.join("audio/jfk.wav"))
            .arg("--out")
            .arg(st);
        if gram {
            c.arg("--gram");
        }
        let o = c.output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        Calibration::load(st).unwrap()
    };
    // Without --gram the statistics hold no matrix, and error feedback says what is missing.
    let plain = dir.path().join("plain.st");
    assert!(calibrate(&plain, false).grams.is_empty());
    let o = milkit()
        .args(["export", "--model"])
        .arg(&hf)
        .args([
            "--component",
            "encoder",
            "--palettize",
            "kmeans",
            "--group-size",
            "16",
        ])
        .arg("--calibration")
        .arg(&plain)
        .args(["--error-feedback", "--quiet", "--out"])
        .arg(dir.path().join("refused.mlpackage"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("calibrate --gram"), "{err}");
    assert!(!dir.path().join("refused.mlpackage").exists());
    let st = dir.path().join("enc.st");
    let cal = calibrate(&st, true);
    // Every pointwise weight (2 layers × q, k, v, out, fc1, fc2) has a matrix; the stem's
    // 3-tap convs do not.
    assert_eq!(cal.grams.len(), 12, "{:?}", cal.grams.keys());
    assert!(cal
        .grams
        .values()
        .all(|g| g.data.iter().all(|v| v.is_finite())));
    let flags: [&[&str]; 2] = [
        &[
            "--palettize",
            "kmeans",
            "--group-size",
            "16",
            "--outlier-grouping",
        ],
        &[
            "--quantize",
            "int4",
            "--granularity",
            "per-block",
            "--block-size",
            "16",
        ],
    ];
    for (k, f) in flags.iter().enumerate() {
        let out = dir.path().join(format!("enc{k}.mlpackage"));
        let o = milkit()
            .args(["export", "--model"])
            .arg(&hf)
            .args(["--component", "encoder", "--target", "ios18"])
            .args(*f)
            .arg("--calibration")
            .arg(&st)
            .args(["--error-feedback", "--json", "--quiet", "--out"])
            .arg(&out)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let modes: Vec<&str> = report["ops"]
            .as_array()
            .expect("ops list")
            .iter()
            .map(|c| c["mode"].as_str().unwrap())
            .collect();
        let fed = modes
            .iter()
            .filter(|m| m.ends_with("-error-feedback"))
            .count();
        assert_eq!(fed, 12, "{modes:?}");
        if let Some(v) = common::validate(&out) {
            let kind = if k == 0 {
                "constexpr_lut_to_dense"
            } else {
                "constexpr_blockwise_shift_scale"
            };
            assert_eq!(v["histogram"]["main"][kind], 14, "{v}");
        }
    }
    // Without statistics there is nothing to feed back: refused with the reason.
    let o = milkit()
        .args(["export", "--model"])
        .arg(&hf)
        .args(["--component", "encoder", "--palettize", "kmeans"])
        .args(["--error-feedback", "--quiet", "--out"])
        .arg(dir.path().join("x.mlpackage"))
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("calibration"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}
