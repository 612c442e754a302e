//! Beam search end to end on milkit's tiny.en packages: 5 beams give, token for token, what
//! openai-whisper's rules give over PyTorch float32 (tools/beam_reference.py, weights rounded
//! to fp16 as the packages hold them, milkit computing at fp32); the stateful decoder's beams
//! are the cache-I/O decoder's; word timings of a beam-searched window are those of its kept
//! sequence; the CLI takes the options and rejects bad ones as openai-whisper does.

mod common;

use milkit::transcribe::{Compute, OpenOptions, TranscribeOptions, Transcriber};
use milkit::whisper::generate::Search;
use std::path::{Path, PathBuf};

const CLIPS: [&str; 4] = [
    "jfk",
    "librivox_ss01_0870",
    "ljspeech_LJ001-0001",
    "fleurs_en_003",
];

fn folders(fx: &Path) -> &'static (PathBuf, PathBuf) {
    common::tiny_en_folders(fx, "beam-search-models")
}

fn beams(n: usize) -> Search {
    Search {
        beam_size: Some(n),
        ..Search::default()
    }
}

/// A python that also imports torch and transformers, or None (after saying why).
fn torch_python() -> Option<PathBuf> {
    let py = common::python()?;
    let ok = std::process::Command::new(&py)
        .args(["-c", "import torch, transformers"])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        return Some(py);
    }
    if common::require() {
        panic!(
            "{} lacks torch/transformers and MILKIT_REQUIRE_FIXTURES=1",
            py.display()
        );
    }
    eprintln!(
        "SKIP: {} cannot import torch and transformers",
        py.display()
    );
    None
}

#[test]
fn five_beams_give_openai_whisper_rules_tokens_on_reference_clips() {
    let Some(fx) = common::fixtures() else { return };
    let Some(py) = torch_python() else { return };
    let (io, _) = folders(&fx);
    let wavs: Vec<PathBuf> = CLIPS
        .iter()
        .map(|c| fx.join(format!("audio/{c}.wav")))
        .collect();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/beam_reference.py");
    let mut cmd = std::process::Command::new(py);
    cmd.arg(&script)
        .arg(fx.join("models/whisper-tiny.en"))
        .args(&wavs)
        .args(["--beam-size", "5", "--fp16-weights"]);
    let out = cmd.output().expect("run tools/beam_reference.py");
    assert!(
        out.status.success(),
        "beam_reference.py failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(rows.len(), CLIPS.len());
    let open = OpenOptions {
        compute: Compute::Fp32,
        ..OpenOptions::default()
    };
    let mut tr = Transcriber::open_with(io, &open).unwrap();
    let opts = TranscribeOptions {
        search: beams(5),
        ..TranscribeOptions::greedy_no_timestamps()
    };
    let greedy = TranscribeOptions::greedy_no_timestamps();
    let tokens = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect()
    };
    let (mut differ_from_greedy, mut hf_same) = (0, 0);
    for (wav, row) in wavs.iter().zip(&rows) {
        let clip = row["clip"].as_str().unwrap();
        let t = tr.transcribe_file_with(wav, &opts).unwrap();
        let pass = &t.windows[0].pass;
        assert_eq!(pass.tokens, tokens(&row["openai"]), "{clip}: beam-5 tokens");
        assert!(pass.finished, "{clip}");
        // Log-probabilities of PyTorch's and milkit's fp32 arithmetic: 1e-3 over a sequence
        // of ~25 tokens (each token's log-probability agrees to ~1e-5).
        let want = row["openai_sum_logprob"].as_f64().unwrap();
        assert!(
            (pass.sum_logprob - want).abs() < 1e-3,
            "{clip}: sum of log-probabilities {} vs {want}",
            pass.sum_logprob
        );
        let g = tr.transcribe_file_with(wav, &greedy).unwrap();
        differ_from_greedy += (g.windows[0].pass.tokens != pass.tokens) as usize;
        assert!(
            pass.sum_logprob >= g.windows[0].pass.sum_logprob - 1e-9
                || pass.tokens.len() != g.windows[0].pass.tokens.len(),
            "{clip}: beam search kept a lower-scoring sequence of greedy's length"
        );
        if let Some(hf) = row.get("hf") {
            hf_same += (tokens(hf) == pass.tokens) as usize;
        }
    }
    println!(
        "beam 5 vs openai-whisper rules: {n}/{n} clips token for token; differ from greedy on \
         {differ_from_greedy}; Hugging Face generate(num_beams=5) gives the same tokens on \
         {hf_same}/{n}",
        n = CLIPS.len()
    );
}

#[test]
fn stateful_and_cache_io_decoders_keep_the_same_beams() {
    let Some(fx) = common::fixtures() else { return };
    let (io, state) = folders(&fx);
    let opts = TranscribeOptions {
        search: Search {
            beam_size: Some(4),
            patience: Some(1.5),
            ..Search::default()
        },
        ..TranscribeOptions::default()
    };
    let mut a = Transcriber::open(io).unwrap();
    let mut b = Transcriber::open(state).unwrap();
    assert!(b.stateful_decoder() && !a.stateful_decoder());
    for clip in ["jfk", "ljspeech_LJ001-0006"] {
        let wav = fx.join(format!("audio/{clip}.wav"));
        let ra = a.transcribe_file_with(&wav, &opts).unwrap();
        let rb = b.transcribe_file_with(&wav, &opts).unwrap();
        assert_eq!(ra.windows.len(), rb.windows.len());
        for (wa, wb) in ra.windows.iter().zip(&rb.windows) {
            assert_eq!(wa.pass.tokens, wb.pass.tokens, "{clip}");
            assert!((wa.pass.sum_logprob - wb.pass.sum_logprob).abs() < 1e-4);
        }
        assert!(
            ra.windows[0]
                .pass
                .tokens
                .iter()
                .any(|&t| tr_is_timestamp(&a, t)),
            "{clip}: decoded with timestamps"
        );
        assert_eq!(ra.text, rb.text);
    }
    // The stateful session's states were reset between windows and files: greedy after
    // beams gives greedy's text.
    let wav = fx.join("audio/jfk.wav");
    let greedy = TranscribeOptions::greedy_no_timestamps();
    let after = b.transcribe_file_with(&wav, &greedy).unwrap();
    let fresh = Transcriber::open(state)
        .unwrap()
        .transcribe_file_with(&wav, &greedy)
        .unwrap();
    assert_eq!(after.windows[0].pass.tokens, fresh.windows[0].pass.tokens);
}

fn tr_is_timestamp(tr: &Transcriber, t: u32) -> bool {
    tr.rules().is_timestamp(t)
}

#[test]
fn word_timings_of_a_beam_searched_window_are_its_kept_sequences() {
    let Some(fx) = common::fixtures() else { return };
    let (io, _) = folders(&fx);
    let mut tr = Transcriber::open(io).unwrap();
    for clip in ["jfk", "librivox_ss01_0870"] {
        let wav = fx.join(format!("audio/{clip}.wav"));
        let with_words = |search| TranscribeOptions {
            word_timestamps: true,
            search,
            ..TranscribeOptions::default()
        };
        let beam = tr
            .transcribe_file_with(&wav, &with_words(beams(5)))
            .unwrap();
        let pass = &beam.windows[0].pass;
        // Every fed position has its alignment row: the prompt and the kept tokens.
        assert_eq!(
            beam.windows[0].alignment.len(),
            pass.prompt.len() + pass.tokens.len(),
            "{clip}"
        );
        let words: Vec<_> = beam.segments.iter().flat_map(|s| &s.words).collect();
        assert!(!words.is_empty(), "{clip}");
        let word_text: String = words.iter().map(|w| w.word.as_str()).collect();
        let seg_text: String = beam.segments.iter().map(|s| s.text.as_str()).collect();
        assert_eq!(
            word_text.trim(),
            seg_text.trim(),
            "{clip}: words spell the text"
        );
        for w in &words {
            assert!(w.start <= w.end && w.end <= 30.0, "{clip}: {w:?}");
        }
        // The rows are a function of the fed tokens: the kept sequence fed greedily (the
        // same tokens when greedy finds it) gives the same words and times.
        let greedy = tr
            .transcribe_file_with(&wav, &with_words(Search::default()))
            .unwrap();
        if greedy.windows[0].pass.tokens == pass.tokens {
            assert_eq!(
                greedy.windows[0].alignment, beam.windows[0].alignment,
                "{clip}"
            );
            let gw: Vec<_> = greedy.segments.iter().flat_map(|s| &s.words).collect();
            assert_eq!(format!("{gw:?}"), format!("{words:?}"), "{clip}");
        }
    }
}

#[test]
fn cli_takes_openai_whisper_search_options_and_rejects_bad_ones() {
    let Some(fx) = common::fixtures() else { return };
    let (io, _) = folders(&fx);
    let wav = fx.join("audio/jfk.wav");
    let run = |args: &[&str]| {
        common::milkit()
            .arg("transcribe")
            .arg("--models")
            .arg(io)
            .arg(&wav)
            .args(args)
            .output()
            .unwrap()
    };
    let o = run(&[
        "--beam-size",
        "3",
        "--patience",
        "2",
        "--length-penalty",
        "0.6",
        "--best-of",
        "2",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("ask not what your country"), "{text}");
    for (args, says) in [
        (&["--patience", "2"][..], "patience requires beam_size"),
        (
            &["--beam-size", "5", "--length-penalty", "1.5"],
            "between 0 and 1",
        ),
        (&["--beam-size", "0"], "beam_size must be at least 1"),
        (&["--best-of", "0"], "best_of must be at least 1"),
    ] {
        let o = run(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} was accepted");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}
