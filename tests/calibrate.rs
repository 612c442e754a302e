//! Calibration and data-aware compression: the instrumentation measures what it claims
//! (checked against the mel input itself), statistics are reproducible, equal statistics
//! change nothing, and calibrated k-means beats plain k-means on audio it never saw.

mod common;
use candle_core::{Device, Tensor};
use milkit::convert::export::export_encoder;
use milkit::ir::Opset;
use milkit::passes::calibrate::{instrument, Calibration};
use milkit::passes::compress::{compress, compress_calibrated, Method, Selection};
use milkit::passes::lut::{LutConfig, LutGranularity, LutMode};
use milkit::quality::calibrate::{calibrate_encoder, probe_values};
use milkit::runtime::Session;
use milkit::whisper::audio::{load_audio, log_mel};
use milkit::whisper::checkpoint::Checkpoint;
use milkit::whisper::encoder::EncoderAbi;
use std::path::Path;

fn lut4() -> Method {
    Method::Palettize(LutConfig {
        mode: LutMode::Kmeans,
        nbits: 4,
        granularity: LutGranularity::PerGroupedChannel(16),
        per_channel_scale: false,
        cluster_dim: 1,
    })
}

fn mel(fx: &Path, clip: &str) -> Tensor {
    let s = load_audio(fx.join("audio").join(clip)).unwrap();
    let m = log_mel(&s, 80, None).unwrap();
    Tensor::from_vec(m, (1, 80, 1, 3000), &Device::Cpu).unwrap()
}

fn f32s(t: &Tensor) -> Vec<f32> {
    t.flatten_all()
        .unwrap()
        .to_dtype(candle_core::DType::F32)
        .unwrap()
        .to_vec1()
        .unwrap()
}

fn psnr(reference: &[f32], out: &[f32]) -> f64 {
    let peak = reference.iter().fold(0f64, |m, v| m.max(v.abs() as f64));
    let mse = reference
        .iter()
        .zip(out)
        .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
        .sum::<f64>()
        / reference.len() as f64;
    20.0 * (peak / mse.sqrt()).log10()
}

#[test]
fn probes_measure_the_consumer_input() {
    let Some(fx) = common::fixtures() else { return };
    let hf = fx.join("models/whisper-tiny.en");
    let m = export_encoder(
        &Checkpoint::open(&hf).unwrap(),
        EncoderAbi::WhisperKit,
        Opset::Ios18,
        &mut |_, _| {},
    )
    .unwrap();
    let (inst, probes) = instrument(&m, &Selection::default(), true).unwrap();
    // Every weight the compression pass would take has a probe: tiny.en's 26.
    assert_eq!(probes.len(), 26);
    let mut s = Session::from_model(inst).unwrap();
    let x = mel(&fx, "jfk.wav");
    let outs = s
        .predict(&[("melspectrogram_features", x.clone())])
        .unwrap();
    // The encoder output itself is unchanged by the instrumentation.
    let plain = Session::from_model(m)
        .unwrap()
        .predict(&[("melspectrogram_features", x.clone())])
        .unwrap();
    assert_eq!(f32s(&plain[0].1), f32s(&outs[0].1));
    // The first conv reads the mel itself: its probe must equal Σ_t mel[c, t]² in f64
    // (the runtime sees fp16 input, so compare with the fp16-rounded mel).
    let vals = probe_values(&probes, outs).unwrap();
    let first = probes
        .iter()
        .find(|p| p.channels == 80)
        .expect("a probe on the 80-channel mel input");
    let got = &vals[&first.output];
    let melv: Vec<f32> = f32s(&x)
        .iter()
        .map(|v| half::f16::from_f32(*v).to_f32())
        .collect();
    for c in 0..80 {
        let want: f64 = melv[c * 3000..(c + 1) * 3000]
            .iter()
            .map(|v| (*v as f64).powi(2))
            .sum();
        let rel = (got[c] as f64 - want).abs() / want.max(1e-12);
        assert!(
            rel < 1e-4,
            "channel {c}: probe {} vs {want} (rel {rel:.2e})",
            got[c]
        );
    }
}

#[test]
fn equal_statistics_change_nothing() {
    let Some(fx) = common::fixtures() else { return };
    let hf = fx.join("models/whisper-tiny.en");
    let m = export_encoder(
        &Checkpoint::open(&hf).unwrap(),
        EncoderAbi::WhisperKit,
        Opset::Ios18,
        &mut |_, _| {},
    )
    .unwrap();
    let (_, probes) = instrument(&m, &Selection::default(), true).unwrap();
    let mut cal = Calibration::default();
    for p in &probes {
        cal.moments.insert(p.weight.clone(), vec![0.37; p.channels]);
    }
    let mut a = m.clone();
    let mut b = m;
    let oa = compress(&mut a, &lut4(), &Selection::default()).unwrap();
    let ob = compress_calibrated(&mut b, &lut4(), &Selection::default(), Some(&cal)).unwrap();
    assert_eq!(oa.compressed.len(), ob.compressed.len());
    let enc = |m: &milkit::ir::Model| {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.mlpackage");
        milkit::package::save_package(m, &p, false, &mut |_| {}).unwrap();
        std::fs::read(p.join("Data/com.apple.CoreML/weights/weight.bin")).unwrap()
    };
    assert!(
        enc(&a) == enc(&b),
        "equal importance must give plain k-means exactly"
    );
}

#[test]
fn calibrated_kmeans_beats_plain_on_held_out_audio() {
    let Some(fx) = common::fixtures() else { return };
    let hf = fx.join("models/whisper-tiny.en");
    let audio = |c: &str| fx.join("audio").join(c);
    let calib_clips = [
        audio("librivox_ss01_0880.wav"),
        audio("ljspeech_LJ001-0006.wav"),
        audio("fleurs_en_000.wav"),
    ];
    let sel = Selection::default();
    let cal = calibrate_encoder(&hf, &calib_clips, &sel, true, &mut |_, _| {}).unwrap();
    // Reproducible: the same audio gives the same statistics, bit for bit.
    let again = calibrate_encoder(&hf, &calib_clips[..], &sel, true, &mut |_, _| {}).unwrap();
    assert_eq!(cal.moments, again.moments);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stats.safetensors");
    cal.save(&path, false).unwrap();
    assert!(cal.save(&path, false).is_err(), "must refuse to overwrite");
    assert_eq!(Calibration::load(&path).unwrap().moments, cal.moments);

    let m = export_encoder(
        &Checkpoint::open(&hf).unwrap(),
        EncoderAbi::WhisperKit,
        Opset::Ios18,
        &mut |_, _| {},
    )
    .unwrap();
    let mut plain = m.clone();
    let mut calibrated = m.clone();
    let op = compress(&mut plain, &lut4(), &sel).unwrap();
    let oc = compress_calibrated(&mut calibrated, &lut4(), &sel, Some(&cal)).unwrap();
    let bytes = |o: &milkit::passes::compress::Outcome| {
        o.compressed.iter().map(|c| c.bytes_after).sum::<u64>()
    };
    assert_eq!(bytes(&op), bytes(&oc), "same bytes");
    // Held out: jfk.wav and a LibriVox clip, neither used for calibration.
    for clip in ["jfk.wav", "librivox_ss01_0870.wav"] {
        let x = mel(&fx, clip);
        let run = |m: &milkit::ir::Model| {
            let mut s = Session::from_model(m.clone()).unwrap();
            f32s(
                &s.predict(&[("melspectrogram_features", x.clone())])
                    .unwrap()[0]
                    .1,
            )
        };
        let want = run(&m);
        let p_plain = psnr(&want, &run(&plain));
        let p_cal = psnr(&want, &run(&calibrated));
        println!("{clip}: encoder output PSNR vs fp16: plain LUT4 {p_plain:.2} dB, calibrated {p_cal:.2} dB");
        assert!(
            p_cal > p_plain,
            "{clip}: calibrated {p_cal:.2} dB is not better than plain {p_plain:.2} dB"
        );
    }
}

#[test]
fn mixed_bits_stay_within_budget_and_never_below_base() {
    let Some(fx) = common::fixtures() else { return };
    let hf = fx.join("models/whisper-tiny.en");
    let m = export_encoder(
        &Checkpoint::open(&hf).unwrap(),
        EncoderAbi::WhisperKit,
        Opset::Ios18,
        &mut |_, _| {},
    )
    .unwrap();
    let Method::Palettize(base) = lut4() else {
        unreachable!()
    };
    let sel = Selection::default();
    let plan =
        milkit::passes::mixed::plan_bits(&m, &base, &sel, None, 4.25, &[2, 3, 4, 6, 8]).unwrap();
    assert_eq!(plan.weights.len(), 26);
    assert!(plan.avg_bits <= 4.25, "{}", plan.avg_bits);
    assert!(plan.weights.iter().all(|w| w.chosen >= 4));
    assert!(
        plan.weights.iter().any(|w| w.chosen > 4),
        "budget left unused"
    );
    // Errors fall with more bits on every measured curve.
    for w in &plan.weights {
        assert!(
            w.curve.windows(2).all(|c| c[1].2 <= c[0].2),
            "{}: {:?}",
            w.weight,
            w.curve
        );
    }
    // The compressed model stores exactly the bits the plan counted.
    let mut c = m.clone();
    let out = milkit::passes::compress::compress_mixed(&mut c, &lut4(), &sel, None, &plan.nbits())
        .unwrap();
    let stored: u64 = out.compressed.iter().map(|r| r.bytes_after).sum();
    let elems: u64 = plan.weights.iter().map(|w| w.elements as u64).sum();
    assert!((stored as f64 * 8.0 / elems as f64 - plan.avg_bits).abs() < 1e-9);
    // A budget below the base width is refused with a clear message.
    let e = milkit::passes::mixed::plan_bits(&m, &base, &sel, None, 3.5, &[2, 4])
        .err()
        .unwrap();
    assert!(format!("{e:#}").contains("lower --nbits"), "{e:#}");
}
