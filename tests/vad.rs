//! Voice activity detection: the speech-span rules on synthetic probabilities (hysteresis,
//! minimum silence and speech, padding, splitting of long speech, the time map), and
//! against faster-whisper's own
//! `get_speech_timestamps` and `SpeechTimestampsMap` on random probability sequences, Silero
//! VAD v6 (FluidInference's Core ML conversion) on milkit's runtime against faster-whisper's
//! ONNX Silero v6 (both need a Python with faster_whisper in `MILKIT_PYTHON`, and skip
//! otherwise); the package and the compiled model agree; models the rules cannot use and
//! Hub ids that cannot be fetched are clear errors; `transcribe --vad` gives nothing on
//! near-silence and keeps the long clip's speech on its own timeline.

mod common;

use milkit::transcribe::Compute;
use milkit::vad::silero::Silero;
use milkit::vad::{
    concat_spans, speech_spans, windows, Span, SpeechMap, VadOptions, SAMPLE_RATE, WINDOW,
};
use std::path::{Path, PathBuf};
use std::process::Command;

const PAIR: &str = "compiled/pairs/FluidInference-mobius__silero-vad-unified-v6.0.0";

fn reference_tool() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/vad_reference.py")
}

/// Runs tools/vad_reference.py with `args` and `stdin`; its JSON output.
fn reference(py: &Path, args: &[&std::ffi::OsStr], stdin: &str) -> serde_json::Value {
    use std::io::Write;
    let mut child = Command::new(py)
        .arg(reference_tool())
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "vad_reference.py failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// SplitMix64, for reproducible random cases.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
    fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[self.below(v.len() as u64) as usize]
    }
}

/// Probabilities that stay in speech or silence for a random while, with values near both
/// thresholds as often as far from them.
fn random_probs(rng: &mut Rng, n: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(n);
    let mut speech = rng.below(2) == 0;
    while out.len() < n {
        let longest = if rng.below(4) == 0 { 200 } else { 40 };
        let run = 1 + rng.below(longest) as usize;
        for _ in 0..run.min(n - out.len()) {
            let p = match (speech, rng.below(5)) {
                (true, 0) => 0.3 + 0.25 * rng.unit(),
                (true, _) => 0.5 + 0.5 * rng.unit(),
                (false, 0) => 0.3 + 0.25 * rng.unit(),
                (false, _) => 0.3 * rng.unit(),
            };
            out.push(p);
        }
        speech = !speech;
    }
    out
}

#[test]
fn speech_spans_and_the_time_map_match_faster_whisper_on_random_probabilities() {
    let Some(py) = common::faster_whisper_python() else {
        return;
    };
    let mut rng = Rng(49);
    let mut cases = vec![];
    let mut ours = vec![];
    for case in 0..300 {
        let samples = match case % 10 {
            0 => 512 * rng.below(200) as usize, // whole windows: one more, of zeros
            _ => rng.below(1_500_000) as usize,
        };
        let probs = random_probs(&mut rng, windows(samples));
        let o = VadOptions {
            threshold: rng.pick(&[0.5, 0.3, 0.7, 0.45]),
            neg_threshold: rng.pick(&[None, None, Some(0.2)]),
            min_speech_duration_ms: rng.pick(&[0, 0, 250, 1000]),
            max_speech_duration_s: rng.pick(&[f64::INFINITY, f64::INFINITY, 3.0, 10.0, 30.0]),
            min_silence_duration_ms: rng.pick(&[2000, 2000, 100, 500, 0]),
            speech_pad_ms: rng.pick(&[400, 400, 0, 30, 1000]),
        };
        let spans = speech_spans(&probs, samples, &o);
        let total: usize = spans.iter().map(Span::len).sum();
        let times: Vec<(f64, bool)> = (0..20)
            .map(|_| {
                let t = (rng.below(total as u64 + 1) as f64 / 16000.0 * 50.0).round() / 50.0;
                (t, rng.below(2) == 0)
            })
            .collect();
        let map = SpeechMap::new(&spans);
        let mapped: Vec<f64> = if spans.is_empty() {
            vec![]
        } else {
            times
                .iter()
                .map(|&(t, e)| map.original_time(t, None, e))
                .collect()
        };
        let mut opts = serde_json::json!({
            "threshold": o.threshold,
            "min_speech_duration_ms": o.min_speech_duration_ms,
            "min_silence_duration_ms": o.min_silence_duration_ms,
            "speech_pad_ms": o.speech_pad_ms,
        });
        if let Some(n) = o.neg_threshold {
            opts["neg_threshold"] = n.into();
        }
        if o.max_speech_duration_s.is_finite() {
            opts["max_speech_duration_s"] = o.max_speech_duration_s.into();
        }
        cases.push(serde_json::json!({
            "probs": probs,
            "samples": samples,
            "options": opts,
            "times": times,
        }));
        ours.push((spans, mapped, o));
    }
    let want = reference(
        &py,
        &["rules".as_ref()],
        &serde_json::Value::from(cases).to_string(),
    );
    let want = want.as_array().unwrap();
    let mut with_speech = 0;
    for (i, ((spans, mapped, o), w)) in ours.iter().zip(want).enumerate() {
        let w_spans: Vec<Span> = w["spans"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| Span {
                start: s[0].as_u64().unwrap() as usize,
                end: s[1].as_u64().unwrap() as usize,
            })
            .collect();
        assert_eq!(spans, &w_spans, "case {i} ({o:?})");
        let w_times: Vec<f64> = w["times"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_f64().unwrap())
            .collect();
        assert_eq!(mapped, &w_times, "case {i}: mapped times");
        with_speech += usize::from(!spans.is_empty());
    }
    // The cases are worth something: most have speech, some none.
    assert!(
        with_speech > 200 && with_speech < 300,
        "{with_speech} of 300"
    );
}

/// Probabilities for `secs` seconds of windows, `p` where `speech(t)` holds at the
/// window's start time, 0.01 elsewhere.
fn probs(secs: f64, p: f32, speech: impl Fn(f64) -> bool) -> (Vec<f32>, usize) {
    let samples = (secs * SAMPLE_RATE as f64) as usize;
    let v = (0..windows(samples))
        .map(|i| {
            let t = (i * WINDOW) as f64 / SAMPLE_RATE as f64;
            if speech(t) {
                p
            } else {
                0.01
            }
        })
        .collect();
    (v, samples)
}

fn spans_s(spans: &[Span]) -> Vec<(f64, f64)> {
    spans
        .iter()
        .map(|s| {
            (
                s.start as f64 / SAMPLE_RATE as f64,
                s.end as f64 / SAMPLE_RATE as f64,
            )
        })
        .collect()
}

#[test]
fn silence_alone_has_no_speech() {
    let (p, n) = probs(10.0, 0.0, |_| false);
    assert!(speech_spans(&p, n, &VadOptions::default()).is_empty());
}

#[test]
fn one_burst_is_padded_by_400_ms_each_side() {
    // Speech from window 64 (2.048 s) to window 128 (4.096 s), exclusive.
    let (p, n) = probs(10.0, 0.9, |t| (2.048..4.096).contains(&t));
    let s = speech_spans(&p, n, &VadOptions::default());
    assert_eq!(
        s,
        vec![Span {
            start: 64 * 512 - 6400,
            end: 128 * 512 + 6400
        }]
    );
}

#[test]
fn probabilities_between_the_thresholds_keep_speech_going_but_do_not_start_it() {
    // 0.4 is under 0.5 but over 0.35: it continues a span, never opens one.
    let mut p = vec![0.01f32; 200];
    p[20] = 0.9;
    for x in &mut p[21..150] {
        *x = 0.4;
    }
    let s = speech_spans(&p, 200 * 512, &VadOptions::default());
    // Silence starts at window 150; it would last 2 s only beyond the end, so the span
    // runs to the end of the audio.
    assert_eq!(
        s,
        vec![Span {
            start: 20 * 512 - 6400,
            end: 200 * 512
        }]
    );
    let lone = vec![0.4f32; 100];
    assert!(speech_spans(&lone, 100 * 512, &VadOptions::default()).is_empty());
}

#[test]
fn a_gap_shorter_than_the_minimum_silence_does_not_split_speech() {
    let (p, n) = probs(20.0, 0.9, |t| {
        (1.0..4.0).contains(&t) || (5.5..8.0).contains(&t)
    });
    let s = speech_spans(&p, n, &VadOptions::default());
    assert_eq!(s.len(), 1, "{:?}", spans_s(&s));
    let split = VadOptions {
        min_silence_duration_ms: 1000,
        ..VadOptions::default()
    };
    let s = speech_spans(&p, n, &split);
    assert_eq!(s.len(), 2, "{:?}", spans_s(&s));
    // Speech in windows 32..=124 and 172..=249: the gap of 47 windows is wider than
    // twice the padding, so each side gets 400 ms.
    assert_eq!(
        s[0],
        Span {
            start: 32 * 512 - 6400,
            end: 125 * 512 + 6400
        }
    );
    assert_eq!(s[1].start, 172 * 512 - 6400);
}

#[test]
fn spans_closer_than_twice_the_padding_share_the_gap() {
    let o = VadOptions {
        min_silence_duration_ms: 100,
        ..VadOptions::default()
    };
    // Speech windows 20..40 and 60..90: the gap of 20 windows (10240 samples) is under
    // 2 × 6400, so each side takes half of it and they meet.
    let p: Vec<f32> = (0..200)
        .map(|i| {
            if (20..40).contains(&i) || (60..90).contains(&i) {
                0.9
            } else {
                0.0
            }
        })
        .collect();
    let s = speech_spans(&p, 200 * 512, &o);
    assert_eq!(s.len(), 2);
    assert_eq!(s[0].end, s[1].start);
    assert_eq!(s[0].end, 40 * 512 + 10 * 512);
    assert_eq!(s[0].start, 20 * 512 - 6400);
    assert_eq!(s[1].end, 90 * 512 + 6400);
}

#[test]
fn short_speech_is_dropped_with_a_minimum_duration() {
    let o = VadOptions {
        min_speech_duration_ms: 250,
        min_silence_duration_ms: 100,
        ..VadOptions::default()
    };
    // 5 windows (160 ms) of speech, then 20 (640 ms).
    let p: Vec<f32> = (0..300)
        .map(|i| {
            if (10..15).contains(&i) || (100..120).contains(&i) {
                0.9
            } else {
                0.0
            }
        })
        .collect();
    let s = speech_spans(&p, 300 * 512, &o);
    assert_eq!(
        s,
        vec![Span {
            start: 100 * 512 - 6400,
            end: 120 * 512 + 6400
        }]
    );
}

#[test]
fn long_speech_is_split_at_its_last_pause_or_else_cut_hard() {
    let o = VadOptions {
        max_speech_duration_s: 5.0,
        speech_pad_ms: 0,
        ..VadOptions::default()
    };
    // Continuous speech: cut hard past 5 s − one window (155.25 windows), at window 156;
    // the window of the cut opens the next span.
    let p = vec![0.9f32; 600];
    let s = speech_spans(&p, 600 * 512, &o);
    let w = |a: usize, b: usize| Span {
        start: a * 512,
        end: b * 512,
    };
    assert_eq!(s, vec![w(0, 156), w(157, 313), w(314, 470), w(471, 600)]);
    // A 0.2-s pause (6 windows) at 3 s: the split lands at its start.
    let p: Vec<f32> = (0..600)
        .map(|i| if (94..100).contains(&i) { 0.0 } else { 0.9 })
        .collect();
    let s = speech_spans(&p, 600 * 512, &o);
    assert_eq!(
        s[0],
        Span {
            start: 0,
            end: 94 * 512
        }
    );
    assert_eq!(s[1].start, 100 * 512);
}

#[test]
fn the_map_puts_times_of_the_concatenation_back_on_the_recording() {
    // Spans 1–2 s and 5–7 s: 1 s of silence removed before the first, 4 s before the second.
    let spans = [
        Span {
            start: 16000,
            end: 32000,
        },
        Span {
            start: 80000,
            end: 112000,
        },
    ];
    let m = SpeechMap::new(&spans);
    assert_eq!(m.original_time(0.0, None, false), 1.0);
    assert_eq!(m.original_time(0.5, None, false), 1.5);
    // 1.0 s of the concatenation is the first span's end when it ends something…
    assert_eq!(m.original_time(1.0, None, true), 2.0);
    // …and the second span's start otherwise.
    assert_eq!(m.original_time(1.0, None, false), 5.0);
    assert_eq!(m.original_time(2.5, None, false), 6.5);
    // Past the end: the last span.
    assert_eq!(m.original_time(4.0, None, true), 8.0);
    assert_eq!(m.original_time(0.2, Some(1), false), 4.2);
    let x = [1.0f32, 2.0, 3.0, 4.0, 5.0];
    let c = concat_spans(&x, &[Span { start: 0, end: 1 }, Span { start: 3, end: 9 }]);
    assert_eq!(c, vec![1.0, 4.0, 5.0]);
}

#[test]
fn mapped_times_round_as_python_does_ties_to_even_on_the_exact_value() {
    // No silence before the only span: times come back rounded alone. 0.125 and 0.375 are
    // exact in binary: ties, to even. The double of 0.005 is 0.00500000000000000010…, so
    // up; that of 2.675 is 2.67499999…, so down.
    let m = SpeechMap::new(&[Span {
        start: 0,
        end: 160_000,
    }]);
    let r = |t: f64| m.original_time(t, Some(0), false);
    assert_eq!(r(0.125), 0.12);
    assert_eq!(r(0.375), 0.38);
    assert_eq!(r(0.005), 0.01);
    assert_eq!(r(2.675), 2.67);
}

#[test]
fn bad_options_are_refused_with_their_value() {
    let o = VadOptions {
        threshold: 1.5,
        ..VadOptions::default()
    };
    assert!(o.validate().unwrap_err().to_string().contains("1.5"));
    let o = VadOptions {
        neg_threshold: Some(0.7),
        ..VadOptions::default()
    };
    assert!(o.validate().is_err());
    assert_eq!(VadOptions::default().neg_threshold(), 0.5 - 0.15);
}

fn silero_pair(fx: &Path) -> Option<PathBuf> {
    let d = fx.join(PAIR);
    if d.join("model.mlmodelc/model.mil").exists() {
        return Some(d);
    }
    assert!(!common::require(), "{} is missing", d.display());
    eprintln!("SKIP: {} is missing", d.display());
    None
}

/// Largest |difference| of two probability sequences, and how many windows were
/// classified differently at 0.5.
fn compare(a: &[f32], b: &[f32]) -> (f32, usize) {
    assert_eq!(a.len(), b.len());
    let max = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max);
    let flips = a
        .iter()
        .zip(b)
        .filter(|(x, y)| (**x >= 0.5) != (**y >= 0.5))
        .count();
    (max, flips)
}

/// Silero on milkit's runtime (fp16 inside, as the Core ML model says, and widened to
/// fp32) against onnxruntime's float32 Silero v6, window by window on speech,
/// near-silence and a tone sweep. Measured, fp16 / fp32: largest |difference| 0.0492 /
/// 0.0249 (jfk), 0.0004 / 0.0004 (near_silence_10s), 0.0466 / 0.0393 (tone_sweep_8s), no
/// window on the other side of 0.5. (Over the 153-s long clip the two drift apart after
/// ~11 s, up to 0.76: see docs/transcription.md.)
#[test]
fn silero_on_the_runtime_matches_faster_whisper_onnx_silero_on_short_clips() {
    let Some(fx) = common::fixtures() else { return };
    let Some(pair) = silero_pair(&fx) else { return };
    let Some(py) = common::faster_whisper_python() else {
        return;
    };
    let clips = [
        fx.join("audio/jfk.wav"),
        fx.join("audio/edge/near_silence_10s.wav"),
        fx.join("audio/edge/tone_sweep_8s.wav"),
    ];
    let mut args: Vec<&std::ffi::OsStr> = vec!["probs".as_ref()];
    args.extend(clips.iter().map(|c| c.as_os_str()));
    let want = reference(&py, &args, "");
    let mut m = Silero::load(&pair.join("model.mlmodelc")).unwrap();
    let mut m32 = Silero::load_with(&pair.join("model.mlmodelc"), Compute::Fp32).unwrap();
    for clip in &clips {
        let samples = milkit::whisper::audio::load_audio(clip).unwrap();
        let got = m.probabilities(&samples).unwrap();
        let got32 = m32.probabilities(&samples).unwrap();
        let w: Vec<f32> = want[clip.to_str().unwrap()]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        let (max, flips) = compare(&got, &w);
        let (max32, flips32) = compare(&got32, &w);
        eprintln!(
            "{}: {} windows, max |Δp| {max:.4}, {flips} flipped at 0.5; fp32: {max32:.4}, \
             {flips32} flipped",
            clip.display(),
            got.len()
        );
        assert!(max < 0.05, "{}: max |Δp| {max}", clip.display());
        assert!(max32 < 0.04, "{}: fp32 max |Δp| {max32}", clip.display());
        assert_eq!((flips, flips32), (0, 0), "{}", clip.display());
    }
}

#[test]
fn the_package_and_the_compiled_model_give_the_same_probabilities() {
    let Some(fx) = common::fixtures() else { return };
    let Some(pair) = silero_pair(&fx) else { return };
    let samples = milkit::whisper::audio::load_audio(fx.join("audio/jfk.wav")).unwrap();
    let a = Silero::load(&pair.join("model.mlpackage"))
        .unwrap()
        .probabilities(&samples)
        .unwrap();
    let b = Silero::load(&pair.join("model.mlmodelc"))
        .unwrap()
        .probabilities(&samples)
        .unwrap();
    assert_eq!(a.len(), windows(samples.len()));
    assert_eq!(a, b);
    // jfk is speech from ~0.3 s on, with pauses: both classes occur.
    let speech = a.iter().filter(|&&p| p >= 0.5).count();
    assert!(
        speech > a.len() / 2 && speech < a.len(),
        "{speech} of {}",
        a.len()
    );
}

#[test]
fn a_vad_model_with_one_probability_per_eight_windows_is_refused_naming_the_file() {
    let Some(fx) = common::fixtures() else { return };
    let p =
        fx.join("compiled-samples/FluidInference-mobius__silero-vad-unified-256ms-v6.0.0.mlmodelc");
    if !p.exists() {
        assert!(!common::require(), "{} is missing", p.display());
        eprintln!("SKIP: {} is missing", p.display());
        return;
    }
    let e = format!("{:#}", Silero::load(&p).unwrap_err());
    assert!(
        e.contains("256ms") && e.contains("4160") && e.contains("576"),
        "{e}"
    );
}

#[test]
fn a_missing_vad_model_and_an_uncached_hub_id_offline_are_clear_errors() {
    let cache = tempfile::tempdir().unwrap();
    let run = |model: &str| {
        let o = common::milkit()
            .args([
                "transcribe",
                "--models",
                "no-such-models",
                "--vad",
                model,
                "x.wav",
            ])
            .env("HF_HUB_OFFLINE", "1")
            .env("HF_HUB_CACHE", cache.path())
            .output()
            .unwrap();
        assert!(!o.status.success());
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let e = run("FluidInference/silero-vad-coreml");
    assert!(
        e.contains("HF_HUB_OFFLINE")
            && e.contains("silero-vad-unified-v6.0.0.mlmodelc/model.mil")
            && !e.contains("panicked"),
        "{e}"
    );
    let e = run("FluidInference/silero-vad-coreml:weights.bin");
    assert!(e.contains("neither a .mlmodelc nor a .mlpackage"), "{e}");
    let e = run("./no/such/model.mlmodelc");
    assert!(
        e.contains("./no/such/model.mlmodelc") && e.contains("does not exist"),
        "{e}"
    );
}

/// A tiny.en folder from `milkit export --component all`.
fn tiny_folder(fx: &Path, dir: &Path) -> PathBuf {
    let out = dir.join("tiny");
    let o = common::milkit()
        .args(["export", "--quiet", "--component", "all"])
        .arg("--model")
        .arg(fx.join("models/whisper-tiny.en"))
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    out
}

/// The json transcript `milkit transcribe --vad` writes for `clip`.
fn transcribe_json(models: &Path, vad: &Path, clip: &Path, out: &Path) -> serde_json::Value {
    let o = common::milkit()
        .arg("transcribe")
        .arg("--models")
        .arg(models)
        .arg("--vad")
        .arg(vad)
        .args(["--output-format", "json", "--force", "--output-dir"])
        .arg(out)
        .arg(clip)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stem = clip.file_stem().unwrap().to_str().unwrap();
    serde_json::from_slice(&std::fs::read(out.join(format!("{stem}.json"))).unwrap()).unwrap()
}

#[test]
fn transcribing_with_vad_gives_nothing_on_near_silence_and_keeps_the_long_clip_timeline() {
    let Some(fx) = common::fixtures() else { return };
    let Some(pair) = silero_pair(&fx) else { return };
    let tmp = tempfile::tempdir().unwrap();
    let models = tiny_folder(&fx, tmp.path());
    let vad = pair.join("model.mlmodelc");
    for clip in ["near_silence_10s", "tone_sweep_8s"] {
        let r = transcribe_json(
            &models,
            &vad,
            &fx.join(format!("audio/edge/{clip}.wav")),
            tmp.path(),
        );
        assert_eq!(r["text"], "", "{clip}: {r}");
        assert_eq!(r["segments"].as_array().unwrap().len(), 0, "{clip}");
    }

    // The long clip: the spans the library finds, and every segment inside one of them
    // on the recording's timeline, in order, ending by the recording's end.
    let long = fx.join("audio/long/dev18_concat.wav");
    let samples = milkit::whisper::audio::load_audio(&long).unwrap();
    let probs = Silero::load(&vad).unwrap().probabilities(&samples).unwrap();
    let spans = speech_spans(&probs, samples.len(), &VadOptions::default());
    assert!(spans.len() > 1, "{spans:?}");
    let removed = samples.len() - spans.iter().map(Span::len).sum::<usize>();
    assert!(removed > 16000, "VAD removed only {removed} samples");
    let r = transcribe_json(&models, &vad, &long, tmp.path());
    let segs = r["segments"].as_array().unwrap();
    assert!(segs.len() > 10, "{r}");
    let duration = samples.len() as f64 / 16000.0;
    let mut last = 0.0;
    for s in segs {
        let (a, b) = (s["start"].as_f64().unwrap(), s["end"].as_f64().unwrap());
        assert!(a >= last - 1e-9 && a < b && b <= duration + 0.01, "{s}");
        // Start and end each in a span (a segment may run across a removed stretch, as
        // faster-whisper maps it: its start by the start's span, its end by the end's).
        let inside = |t: f64| {
            spans.iter().any(|sp| {
                t >= sp.start as f64 / 16000.0 - 0.011 && t <= sp.end as f64 / 16000.0 + 0.011
            })
        };
        assert!(
            inside(a) && inside(b),
            "segment {a}–{b} s starts or ends outside every speech span {spans:?}"
        );
        last = a;
    }
    // A segment starting after the first removed stretch: its time is the recording's,
    // past the total length of the speech before it.
    let first_gap_end = spans[1].start as f64 / 16000.0;
    assert!(
        segs.iter()
            .any(|s| s["start"].as_f64().unwrap() >= first_gap_end - 0.011),
        "no segment after {first_gap_end} s"
    );
    // The same speech: the words of the transcript without VAD, nearly all.
    let plain = common::milkit()
        .arg("transcribe")
        .arg("--models")
        .arg(&models)
        .arg(&long)
        .output()
        .unwrap();
    assert!(plain.status.success());
    let (errors, n) = milkit::whisper::wer::word_errors(
        &String::from_utf8_lossy(&plain.stdout),
        r["text"].as_str().unwrap(),
    );
    let wer = errors as f64 / n as f64;
    eprintln!(
        "long clip: {} spans, {:.1} s removed, {} segments, \
         {:.1} % of the words differ ({errors} of {n})",
        spans.len(),
        removed as f64 / 16000.0,
        segs.len(),
        wer * 100.0
    );
    // Measured: 15.4 % (41 of 267), where the spans differ from faster-whisper's.
    assert!(wer < 0.2, "{:.1} % of the words differ", wer * 100.0);
}
