//! Decoding as Whisper users run it, against Hugging Face's float32 references
//! (`../shared/reference/*.timestamps.json`): fp16 tiny.en and whisper-base folders reproduce
//! the greedy texts with and without timestamps, the detected languages and their
//! probabilities, the no-speech probabilities and the translations; silence yields no
//! segment; sequential long-form decoding loses no more than the reference's; WhisperKit's
//! context prefill, compiled, stands in for the language call; the CLI refuses options the
//! model cannot honour.

mod common;

use milkit::convert::bundle::{write_whisperkit_folder, BundleOptions};
use milkit::transcribe::{Compute, OpenOptions, TranscribeOptions, Transcriber};
use milkit::whisper::audio::load_audio;
use milkit::whisper::checkpoint::Checkpoint;
use milkit::whisper::generate::Task;
use milkit::whisper::wer::{rate, word_errors_with, Normalization};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

const TINY_CLIPS: [&str; 4] = [
    "jfk",
    "librivox_ss01_0870",
    "ljspeech_LJ001-0001",
    "ljspeech_LJ001-0006",
];

fn json(p: &Path) -> Value {
    let bytes = std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("a token list")
        .iter()
        .map(|t| t.as_u64().expect("a token id") as u32)
        .collect()
}

/// An fp16 WhisperKit folder of `model`, written once per test run under target/.
fn folder(model: &Path, name: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("decoding-models");
    let dir = root.join(name);
    let opts = BundleOptions {
        opset: milkit::ir::Opset::Ios18,
        decoder: Default::default(),
        encoder_compression: None,
        decoder_compression: None,
    };
    write_whisperkit_folder(
        &Checkpoint::open(model).unwrap(),
        &dir,
        &opts,
        true,
        &mut |_| {},
    )
    .unwrap_or_else(|e| panic!("exporting {}: {e:#}", model.display()));
    dir
}

fn tiny(fx: &Path) -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| folder(&fx.join("models/whisper-tiny.en"), "tiny.en"))
}

fn base() -> Option<&'static PathBuf> {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let ckpt = common::whisper_base()?;
    Some(DIR.get_or_init(|| folder(&ckpt, "base")))
}

/// Greedy with timestamps, no fallback, no silence skipping: Hugging Face's
/// `generate(return_timestamps=True)`.
fn greedy_timestamps() -> TranscribeOptions {
    TranscribeOptions {
        timestamps: true,
        ..TranscribeOptions::greedy_no_timestamps()
    }
}

/// (reference json, wav path) of each clip ≤ 30 s with a base reference.
fn base_clips(fx: &Path) -> Vec<(Value, PathBuf)> {
    let mut out = vec![(
        json(&fx.join("reference/base-jfk.timestamps.json")),
        fx.join("audio/jfk.wav"),
    )];
    let manifest = std::fs::read_to_string(fx.join("audio/multilingual/manifest.jsonl")).unwrap();
    for line in manifest.lines().filter(|l| !l.trim().is_empty()) {
        let audio = serde_json::from_str::<Value>(line).unwrap()["audio"]
            .as_str()
            .unwrap()
            .to_string();
        let stem = audio.trim_end_matches(".wav");
        out.push((
            json(&fx.join(format!("reference/base-{stem}.timestamps.json"))),
            fx.join("audio/multilingual").join(&audio),
        ));
    }
    out
}

fn segments_of(v: &Value) -> Vec<(f64, f64, String)> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["start"].as_f64().unwrap(),
                s["end"].as_f64().unwrap(),
                s["text"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn tiny_en_decodes_every_short_reference_clip_as_hugging_face_does() {
    let Some(fx) = common::fixtures() else { return };
    let mut tr = Transcriber::open(tiny(&fx)).unwrap();
    assert!(!tr.rules().is_multilingual());
    let (mut errors, mut words) = (0, 0);
    for clip in TINY_CLIPS {
        let r = json(&fx.join(format!("reference/tiny.en-{clip}.timestamps.json")));
        let wav = fx.join(format!("audio/{clip}.wav"));
        let plain = tr
            .transcribe_file_with(&wav, &TranscribeOptions::greedy_no_timestamps())
            .unwrap();
        assert_eq!(plain.text, r["text"].as_str().unwrap(), "{clip}: text");
        assert_eq!(plain.windows[0].pass.tokens, ids(&r["tokens"]), "{clip}");
        let nsp = plain.windows[0].pass.no_speech_prob.unwrap();
        let want = r["no_speech_prob"].as_f64().unwrap();
        assert!(
            (nsp - want).abs() <= 0.01,
            "{clip}: no_speech {nsp} vs {want}"
        );
        let (e, n) = word_errors_with(
            r["text"].as_str().unwrap(),
            &plain.text,
            Normalization::Ascii,
        );
        errors += e;
        words += n;

        let ts = tr.transcribe_file_with(&wav, &greedy_timestamps()).unwrap();
        assert_eq!(
            ts.windows[0].pass.tokens,
            ids(&r["timestamped_tokens"]),
            "{clip}: timestamped tokens"
        );
        assert_eq!(ts.text, r["timestamped_text"].as_str().unwrap(), "{clip}");
        let got: Vec<(f64, f64, String)> = ts
            .segments
            .iter()
            .map(|s| (s.start, s.end, s.text.clone()))
            .collect();
        let want = segments_of(&r["segments"]);
        assert_eq!(
            got.len(),
            want.len(),
            "{clip}: segments {got:?} vs {want:?}"
        );
        for (g, w) in got.iter().zip(&want) {
            assert!(
                (g.0 - w.0).abs() < 1e-6 && (g.1 - w.1).abs() < 1e-6 && g.2 == w.2,
                "{clip}: segment {g:?} vs {w:?}"
            );
        }
    }
    assert_eq!(
        errors, 0,
        "tiny.en texts are the reference's, word for word"
    );
    assert!(words > 50);
}

#[test]
fn base_detects_the_language_and_reproduces_the_references_on_13_clips() {
    let Some(fx) = common::fixtures() else { return };
    let Some(dir) = base() else { return };
    let mut tr = Transcriber::open(dir).unwrap();
    assert!(tr.rules().is_multilingual());
    let clips = base_clips(&fx);
    assert_eq!(clips.len(), 13);
    let (mut same_text, mut same_ts) = (0, 0);
    let (mut errors, mut words) = (0, 0);
    for (i, (r, wav)) in clips.iter().enumerate() {
        let name = wav.file_name().unwrap().to_string_lossy().to_string();
        let samples = load_audio(wav).unwrap();
        // The probabilities a transcription detects with; `detect_language` (the CLI's
        // `--detect-language`) gives the same, checked on the first clip.
        let plain = tr
            .transcribe_with(&samples, &TranscribeOptions::greedy_no_timestamps())
            .unwrap();
        let probs = &plain.language_probs;
        if i == 0 {
            assert_eq!(&tr.detect_language(&samples).unwrap(), probs, "{name}");
        }
        assert_eq!(
            probs[0].0,
            r["language"].as_str().unwrap(),
            "{name}: language"
        );
        for (lang, p) in r["language_probs_top5"].as_object().unwrap() {
            let got = probs
                .iter()
                .find(|(c, _)| c == lang)
                .map(|x| x.1)
                .unwrap_or(0.0);
            let want = p.as_f64().unwrap();
            assert!(
                (got - want).abs() <= 0.01,
                "{name}: P({lang}) {got} vs {want}"
            );
        }
        assert_eq!(plain.language.as_deref(), r["language"].as_str());
        let nsp = plain.windows[0].pass.no_speech_prob.unwrap();
        let want = r["no_speech_prob"].as_f64().unwrap();
        assert!(
            (nsp - want).abs() <= 0.01,
            "{name}: no_speech {nsp} vs {want}"
        );
        let want_text = r["text"].as_str().unwrap();
        same_text += usize::from(plain.text == want_text);
        if plain.text != want_text {
            println!(
                "{name}: text differs:\n  got  {}\n  want {want_text}",
                plain.text
            );
        }
        let (e, n) = word_errors_with(want_text, &plain.text, Normalization::Unicode);
        errors += e;
        words += n;
        let ts = tr.transcribe_with(&samples, &greedy_timestamps()).unwrap();
        let want_ts = ids(&r["timestamped_tokens"]);
        same_ts += usize::from(ts.windows[0].pass.tokens == want_ts);
        let (e, n) = word_errors_with(
            r["timestamped_text"].as_str().unwrap(),
            &ts.text,
            Normalization::Unicode,
        );
        errors += e;
        words += n;
    }
    println!(
        "base: {same_text}/13 texts and {same_ts}/13 timestamped token sequences equal; \
         WER against the references {:.2} % ({errors}/{words})",
        100.0 * rate((errors, words))
    );
    assert!(
        same_text >= 11,
        "{same_text} of 13 texts equal the reference"
    );
    assert!(same_ts >= 11, "{same_ts} of 13 timestamped sequences equal");
    assert!(rate((errors, words)) <= 0.01);
}

/// WhisperKit's context prefill, compiled as the Hub ships it, stands in for the language
/// call: base with `prefill` makes one decoder call fewer per pass (the prompt
/// `<|startoftranscript|> <|lang|> <|transcribe|>` keeps its first and last call). Its
/// caches are estimated without the audio, and the texts show it: 8 of the 13 clips give
/// the same text, 5 change a word or two (jfk loses a comma), with 13 word errors against
/// Hugging Face's references where the exact decoding makes 15 (373 words). The bounds
/// leave room for another CPU's rounding.
#[test]
fn base_with_its_compiled_context_prefill_skips_a_call_a_pass_and_keeps_the_texts() {
    use milkit::package::mil_write::write_compiled_dir;
    let Some(fx) = common::fixtures() else { return };
    let Some(dir) = base() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let folder = tmp.path().join("base-compiled-prefill");
    std::fs::create_dir(&folder).unwrap();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_owned();
        if name == "TextDecoderContextPrefill.mlpackage" {
            let m = milkit::package::load_package(&p).unwrap();
            let out = folder.join("TextDecoderContextPrefill.mlmodelc");
            std::fs::create_dir(&out).unwrap();
            write_compiled_dir(&m, &out).unwrap();
        } else {
            std::os::unix::fs::symlink(&p, folder.join(name)).unwrap();
        }
    }
    let open = |prefill| {
        Transcriber::open_with(
            &folder,
            &OpenOptions {
                prefill,
                ..Default::default()
            },
        )
        .unwrap()
    };
    let (mut plain, mut pre) = (open(false), open(true));
    assert!(pre.uses_prefill() && !plain.uses_prefill());
    let (mut same, mut n) = (0, 0);
    let (mut errs, mut words) = ([0, 0], 0);
    for (r, wav) in base_clips(&fx) {
        let a = plain
            .transcribe_file_with(&wav, &greedy_timestamps())
            .unwrap();
        let b = pre
            .transcribe_file_with(&wav, &greedy_timestamps())
            .unwrap();
        let want = r["text"].as_str().unwrap();
        for (k, got) in [&a.text, &b.text].into_iter().enumerate() {
            let (e, w) = word_errors_with(want, got, Normalization::Ascii);
            errs[k] += e;
            words = if k == 0 { words + w } else { words };
        }
        let (ta, tb) = (&a.timings, &b.timings);
        assert_eq!(ta.decoder_passes, tb.decoder_passes, "{}", wav.display());
        assert!(tb.decoder_passes > 0);
        if a.text == b.text {
            same += 1;
            // Greedy: one decoding pass a window (language detection is a pass of one call).
            assert_eq!(
                ta.decoder_steps - tb.decoder_steps,
                b.windows.len(),
                "{}: decoder calls",
                wav.display()
            );
        } else {
            println!(
                "{}:\n  plain   {}\n  prefill {}",
                wav.display(),
                a.text,
                b.text
            );
        }
        n += 1;
    }
    println!(
        "context prefill: {same} of {n} texts equal; word errors against the references \
         {} without, {} with ({words} words)",
        errs[0], errs[1]
    );
    assert_eq!(n, 13);
    assert!(same >= 6, "{same} of {n} texts equal");
    assert!(errs[1] <= errs[0] + 6, "{errs:?} word errors of {words}");
}

/// `prefill` needs the component and a cache-I/O decoder, and says which is missing.
#[test]
fn prefill_is_refused_for_a_folder_without_one_naming_the_file() {
    let Some(fx) = common::fixtures() else { return };
    let e = Transcriber::open_with(
        tiny(&fx),
        &OpenOptions {
            prefill: true,
            ..Default::default()
        },
    )
    .err()
    .map(|e| format!("{e:#}"))
    .unwrap();
    assert!(e.contains("TextDecoderContextPrefill"), "{e}");
}

/// WER of base's translations of the 12 multilingual clips against Hugging Face's
/// `translate_text`, computing the fp16 packages at `compute` precision.
fn translation_wer(fx: &Path, dir: &Path, compute: Compute) -> (usize, usize) {
    let open = OpenOptions {
        compute,
        ..Default::default()
    };
    let mut tr = Transcriber::open_with(dir, &open).unwrap();
    let opts = TranscribeOptions {
        task: Task::Translate,
        ..TranscribeOptions::greedy_no_timestamps()
    };
    let (mut errors, mut words) = (0, 0);
    for (r, wav) in base_clips(fx).iter().skip(1) {
        let got = tr.transcribe_file_with(wav, &opts).unwrap();
        let want = r["translate_text"].as_str().unwrap();
        let (e, n) = word_errors_with(want, &got.text, Normalization::Ascii);
        if e > 0 {
            println!(
                "{compute:?} {}: {e} errors\n  got  {}\n  want {want}",
                wav.display(),
                got.text
            );
        }
        errors += e;
        words += n;
    }
    println!(
        "base translate ({compute:?}): WER against the reference translations {:.2} % \
         ({errors}/{words})",
        100.0 * rate((errors, words))
    );
    (errors, words)
}

/// Issue 15's ≤ 3 % is met computing in float32, as the reference does (`--compute fp32`).
/// At the packages' own fp16 it measured 5.75 % (21/365): the divergences start at fp16
/// ties — on fleurs_de_001 the decoder's fp16 logits for "." and " on" are equal where
/// float32 picks " on" — and translation, less certain than transcription, meets such ties
/// earlier and changes more words after them.
#[test]
fn base_translates_the_multilingual_clips_into_english() {
    let Some(fx) = common::fixtures() else { return };
    let Some(dir) = base() else { return };
    let (errors, words) = translation_wer(&fx, dir, Compute::Fp32);
    assert!(words > 100);
    assert!(rate((errors, words)) <= 0.03, "{errors}/{words}");
    let (errors, words) = translation_wer(&fx, dir, Compute::Package);
    assert!(rate((errors, words)) <= 0.06, "{errors}/{words}");
}

#[test]
fn silence_and_a_tone_give_no_segment_where_the_reference_finds_no_speech() {
    let Some(fx) = common::fixtures() else { return };
    let mut cases = vec![
        (tiny(&fx).clone(), "tiny.en", "near_silence_10s"),
        (tiny(&fx).clone(), "tiny.en", "tone_sweep_8s"),
    ];
    if let Some(b) = base() {
        cases.push((b.clone(), "base", "near_silence_10s"));
    }
    let mut checked_silent = 0;
    for (dir, model, clip) in cases {
        let r = json(&fx.join(format!("reference/{model}-{clip}.timestamps.json")));
        let wav = fx.join(format!("audio/edge/{clip}.wav"));
        let mut tr = Transcriber::open(&dir).unwrap();
        let nsp_ref = r["no_speech_prob"].as_f64().unwrap();
        let default = tr
            .transcribe_file_with(&wav, &TranscribeOptions::default())
            .unwrap();
        let nsp = default.windows[0].pass.no_speech_prob.unwrap();
        assert!(
            (nsp - nsp_ref).abs() <= 0.01,
            "{model} {clip}: {nsp} vs {nsp_ref}"
        );
        if nsp_ref > 0.6 {
            assert!(
                default.segments.is_empty(),
                "{model} {clip}: no speech (p = {nsp}), yet {:?}",
                default.segments
            );
            assert!(default.windows[0].silent);
            checked_silent += 1;
        } else {
            // Speech by the model's own account: the reference's greedy text, with the
            // default thresholds still applied.
            let opts = TranscribeOptions {
                temperatures: vec![0.0],
                ..TranscribeOptions::default()
            };
            let got = tr.transcribe_file_with(&wav, &opts).unwrap();
            assert_eq!(got.text, r["timestamped_text"].as_str().unwrap(), "{clip}");
        }
    }
    assert!(checked_silent >= 1);
}

/// WER of a long-form transcript against the true text, and of the reference's.
fn long_form(fx: &Path, dir: &Path, model: &str, opts: &TranscribeOptions) -> (f64, f64) {
    let truth = std::fs::read_to_string(fx.join("audio/long/manifest.jsonl")).unwrap();
    let truth = serde_json::from_str::<Value>(truth.lines().next().unwrap()).unwrap()["text"]
        .as_str()
        .unwrap()
        .to_string();
    let r = json(&fx.join(format!("reference/{model}-dev18_concat.timestamps.json")));
    let ref_text: String = segments_of(&r["segments"])
        .into_iter()
        .map(|s| s.2)
        .collect();
    let mut tr = Transcriber::open(dir).unwrap();
    let got = tr
        .transcribe_file_with(&fx.join("audio/long/dev18_concat.wav"), opts)
        .unwrap();
    // Segments are in time order and never overlap.
    for w in got.segments.windows(2) {
        assert!(
            w[0].start <= w[0].end && w[0].end <= w[1].start + 1e-9,
            "{w:?}"
        );
    }
    let ours = rate(word_errors_with(&truth, &got.text, Normalization::Ascii));
    let theirs = rate(word_errors_with(&truth, &ref_text, Normalization::Ascii));
    println!(
        "{model} dev18_concat (152.8 s): WER {:.2} % over {} windows ({} passes), reference \
         long-form {:.2} %",
        100.0 * ours,
        got.windows.len(),
        got.windows.iter().map(|w| w.passes).sum::<usize>(),
        100.0 * theirs
    );
    (ours, theirs)
}

#[test]
fn tiny_en_long_form_loses_no_more_than_the_reference() {
    let Some(fx) = common::fixtures() else { return };
    let (ours, theirs) = long_form(&fx, tiny(&fx), "tiny.en", &greedy_timestamps());
    assert!(ours <= theirs, "{ours} vs the reference's {theirs}");
    let (fallback, _) = long_form(&fx, tiny(&fx), "tiny.en", &TranscribeOptions::default());
    assert!(fallback <= theirs, "with fallback {fallback} vs {theirs}");
    let conditioned = TranscribeOptions {
        condition_on_previous_text: true,
        ..TranscribeOptions::default()
    };
    let (cond, _) = long_form(&fx, tiny(&fx), "tiny.en", &conditioned);
    // Conditioning on the previous window's text (the fallback guarding it against
    // repetition loops) measured 37.79 %: 2 points behind the unconditioned reference on
    // these joined, unrelated utterances (docs/transcription.md); held within 3.
    assert!(cond <= theirs + 0.03, "conditioned {cond} vs {theirs}");
}

#[test]
fn base_long_form_loses_no_more_than_the_reference() {
    let Some(fx) = common::fixtures() else { return };
    let Some(dir) = base() else { return };
    let (ours, theirs) = long_form(&fx, dir, "base", &greedy_timestamps());
    assert!(ours <= theirs, "{ours} vs the reference's {theirs}");
    let (fallback, _) = long_form(&fx, dir, "base", &TranscribeOptions::default());
    assert!(fallback <= theirs, "with fallback {fallback} vs {theirs}");
    let conditioned = TranscribeOptions {
        condition_on_previous_text: true,
        ..TranscribeOptions::default()
    };
    let (cond, _) = long_form(&fx, dir, "base", &conditioned);
    // Measured 33.14 %.
    assert!(cond <= theirs + 0.03, "conditioned {cond} vs {theirs}");
}

#[test]
fn eval_of_base_on_the_multilingual_clips_matches_hugging_face() {
    let Some(fx) = common::fixtures() else { return };
    let Some(dir) = base() else { return };
    let manifest = fx.join("audio/multilingual/manifest.jsonl");
    let o = common::milkit()
        .args([
            "eval",
            "--json",
            "--no-timestamps",
            "--temperature",
            "0",
            "--models",
        ])
        .arg(dir)
        .arg("--manifest")
        .arg(&manifest)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["normalization"].as_str().unwrap().starts_with("NFKC"));
    // Hugging Face's WER on the same clips, from the reference texts, scored the same way.
    let (mut errors, mut words) = (0, 0);
    for (r, wav) in base_clips(&fx).iter().skip(1) {
        let name = wav.file_name().unwrap().to_string_lossy().to_string();
        let truth = v["clips"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["audio"] == name.as_str())
            .unwrap()["reference"]
            .as_str()
            .unwrap()
            .to_string();
        let (e, n) = word_errors_with(&truth, r["text"].as_str().unwrap(), Normalization::Unicode);
        errors += e;
        words += n;
    }
    let hf = rate((errors, words));
    let ours = v["wer"].as_f64().unwrap();
    println!(
        "base multilingual WER: milkit {:.2} %, Hugging Face {:.2} %",
        100.0 * ours,
        100.0 * hf
    );
    assert!((ours - hf).abs() <= 0.005, "{ours} vs {hf}");
    // The published figure (../shared/audio/README.md: 19.83 %, HF float32), to the issue's
    // 0.5 points.
    assert!((ours - 0.1983).abs() <= 0.005, "{ours} vs 19.83 %");
}

#[test]
fn cli_refuses_options_an_english_only_model_cannot_honour() {
    let Some(fx) = common::fixtures() else { return };
    let dir = tiny(&fx);
    let wav = fx.join("audio/jfk.wav");
    for (args, needle) in [
        (&["--language", "fr"][..], "English-only"),
        (&["--task", "translate"][..], "cannot translate"),
        (&["--detect-language"][..], "English-only"),
    ] {
        let o = common::milkit()
            .arg("transcribe")
            .arg("--models")
            .arg(dir)
            .args(args)
            .arg(&wav)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    if let Some(b) = base() {
        let o = common::milkit()
            .arg("transcribe")
            .arg("--models")
            .arg(b)
            .args(["--language", "xx"])
            .arg(&wav)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains("unknown language code \"xx\""), "{err}");
        let o = common::milkit()
            .arg("transcribe")
            .arg("--models")
            .arg(b)
            .arg("--detect-language")
            .arg(fx.join("audio/multilingual/fleurs_fr_000.wav"))
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let langs = out.split(": ").nth(1).unwrap();
        assert_eq!(langs.split(", ").count(), 5, "{out}");
        assert!(langs.starts_with("fr 0.9"), "{out}");
    }
}

/// Start of each `HH:MM:SS,mmm --> HH:MM:SS,mmm` line of an SRT file, in seconds.
fn srt_cues(text: &str) -> Vec<(f64, f64, String)> {
    let secs = |t: &str| {
        let (hms, ms) = t.trim().split_once(',').unwrap();
        let p: Vec<f64> = hms.split(':').map(|x| x.parse().unwrap()).collect();
        p[0] * 3600.0 + p[1] * 60.0 + p[2] + ms.parse::<f64>().unwrap() / 1000.0
    };
    text.split("\n\n")
        .filter(|c| !c.trim().is_empty())
        .map(|c| {
            let lines: Vec<&str> = c.lines().collect();
            let (a, b) = lines[1].split_once(" --> ").unwrap();
            (secs(a), secs(b), lines[2..].join("\n"))
        })
        .collect()
}

#[test]
fn cli_writes_subtitles_and_word_timed_json() {
    let Some(fx) = common::fixtures() else { return };
    let out = tempfile::tempdir().unwrap();
    // tiny.en, jfk: json with word timings, schema-valid, words inside their segments and
    // near Hugging Face's word times.
    let o = common::milkit()
        .arg("transcribe")
        .arg("--models")
        .arg(tiny(&fx))
        .args([
            "--word-timestamps",
            "--output-format",
            "json",
            "--output-format",
            "srt",
        ])
        .arg("--output-dir")
        .arg(out.path())
        .arg(fx.join("audio/jfk.wav"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(o.stdout.is_empty(), "files asked for: stdout stays empty");
    let v = json(&out.path().join("jfk.json"));
    let schema =
        json(&Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/transcription.schema.json"));
    let validator = jsonschema::validator_for(&schema).unwrap();
    let errors: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(v["language"], "en");
    let r = json(&fx.join("reference/tiny.en-jfk.timestamps.json"));
    let want: Vec<(f64, f64)> = r["words"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| (w["start"].as_f64().unwrap(), w["end"].as_f64().unwrap()))
        .collect();
    let mut got = vec![];
    for s in v["segments"].as_array().unwrap() {
        let (ss, se) = (s["start"].as_f64().unwrap(), s["end"].as_f64().unwrap());
        for w in s["words"].as_array().unwrap() {
            let (a, b) = (w["start"].as_f64().unwrap(), w["end"].as_f64().unwrap());
            assert!(
                a <= b && a >= ss - 0.5 && b <= se + 0.5,
                "{w} in [{ss}, {se}]"
            );
            let p = w["probability"].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&p));
            got.push((a, b));
        }
    }
    assert_eq!(got.len(), want.len(), "one timing per reference word");
    let close = got
        .iter()
        .zip(&want)
        .filter(|(g, w)| (g.0 - w.0).abs() <= 0.1 && (g.1 - w.1).abs() <= 0.1)
        .count();
    println!(
        "jfk words: {close}/{} within 0.1 s of Hugging Face's (start and end)",
        got.len()
    );
    // The mean over heads is all a WhisperKit decoder offers (tests/word_timestamps.rs
    // measures the alignment itself); in free decoding most words land within 0.1 s.
    assert!(close * 4 >= got.len() * 3, "{close}/{}", got.len());
    let cues = srt_cues(&std::fs::read_to_string(out.path().join("jfk.srt")).unwrap());
    assert_eq!(cues.len(), v["segments"].as_array().unwrap().len());
    assert!(cues.windows(2).all(|c| c[0].1 <= c[1].0 + 1e-9));

    // base, one German clip: SRT cues with the reference's segment times and text; a second
    // run refuses to overwrite without --force.
    let Some(b) = base() else { return };
    let wav = fx.join("audio/multilingual/fleurs_de_000.wav");
    let run = |force: bool| {
        let mut c = common::milkit();
        c.arg("transcribe")
            .arg("--models")
            .arg(b)
            .args(["--output-format", "srt", "--output-dir"])
            .arg(out.path())
            .arg(&wav);
        if force {
            c.arg("--force");
        }
        c.output().unwrap()
    };
    let o = run(false);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let srt = std::fs::read_to_string(out.path().join("fleurs_de_000.srt")).unwrap();
    let r = json(&fx.join("reference/base-fleurs_de_000.timestamps.json"));
    let want = segments_of(&r["segments"]);
    let cues = srt_cues(&srt);
    assert_eq!(cues.len(), want.len(), "{srt}");
    for (c, w) in cues.iter().zip(&want) {
        assert!(
            (c.0 - w.0).abs() < 1e-3 && (c.1 - w.1).abs() < 1e-3,
            "{c:?} vs {w:?}"
        );
        assert_eq!(c.2, w.2.trim());
    }
    let o = run(false);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--force"));
    assert!(run(true).status.success());
}

/// `export --component all`: the TextDecoder has `alignment_heads_weights_per_head`
/// [1, 8, 1500] by default (conformance-valid), and `transcribe --word-timestamps` on that
/// folder, decoding freely, meets issue 15's target against Hugging Face's word times on every
/// tiny.en clip: ≥ 90 % of starts and of ends within 0.1 s, median |difference| ≤ 0.05 s.
#[test]
fn a_whole_folder_export_gives_word_times_within_the_target_on_every_tiny_en_clip() {
    let Some(fx) = common::fixtures() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tiny-per-head");
    let o = common::milkit()
        .args(["export", "--quiet", "--component", "all"])
        .arg("--model")
        .arg(fx.join("models/whisper-tiny.en"))
        .arg("--out")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let pkg = dir.join("TextDecoder.mlpackage");
    let m = milkit::package::load_package(&pkg).unwrap();
    let per_head: Vec<_> = m
        .description
        .outputs
        .iter()
        .filter(|f| f.name == "alignment_heads_weights_per_head")
        .map(|f| f.shape.clone())
        .collect();
    assert_eq!(per_head, [vec![1, 8, 1500]]);
    common::validate(&pkg);
    let v = common::milkit()
        .args(["verify", "--expect-abi", "whisperkit"])
        .arg(&pkg)
        .output()
        .unwrap();
    assert!(
        v.status.success(),
        "verify --expect-abi whisperkit: {}{}",
        String::from_utf8_lossy(&v.stdout),
        String::from_utf8_lossy(&v.stderr)
    );

    let mut tr = Transcriber::open(&dir).unwrap();
    let opts = TranscribeOptions {
        word_timestamps: true,
        ..greedy_timestamps()
    };
    for clip in TINY_CLIPS {
        let r = json(&fx.join(format!("reference/tiny.en-{clip}.timestamps.json")));
        let got = tr
            .transcribe_file_with(&fx.join(format!("audio/{clip}.wav")), &opts)
            .unwrap();
        let ours: Vec<(String, f64, f64)> = got
            .segments
            .iter()
            .flat_map(|s| &s.words)
            .map(|w| (w.word.trim().to_string(), w.start, w.end))
            .collect();
        let want: Vec<(String, f64, f64)> = r["words"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| {
                (
                    w["word"].as_str().unwrap().trim().to_string(),
                    w["start"].as_f64().unwrap(),
                    w["end"].as_f64().unwrap(),
                )
            })
            .collect();
        let words = |v: &[(String, f64, f64)]| v.iter().map(|w| w.0.clone()).collect::<Vec<_>>();
        assert_eq!(words(&ours), words(&want), "{clip}: the words");
        let (mut starts, mut ends): (Vec<f64>, Vec<f64>) = ours
            .iter()
            .zip(&want)
            .map(|(a, b)| ((a.1 - b.1).abs(), (a.2 - b.2).abs()))
            .unzip();
        for (what, d) in [("start", &mut starts), ("end", &mut ends)] {
            let within = d.iter().filter(|&&x| x <= 0.1 + 1e-9).count() as f64 / d.len() as f64;
            d.sort_by(f64::total_cmp);
            let median = d[d.len() / 2];
            println!(
                "{clip}: {what} {:.1} % within 0.1 s, median {median:.3} s",
                100.0 * within
            );
            assert!(
                within >= 0.9 && median <= 0.05,
                "{clip} {what}: {within} {median}"
            );
        }
    }
}
