//! End-to-end transcription with the bundled runtime: milkit's fp16 tiny.en packages in a
//! WhisperKit-style folder (built here with the library until `export --component all`
//! lands) transcribe the reference clips to exactly the Hugging Face greedy text; the stateful
//! decoder agrees; audio over 30 s is decoded window by window without timestamps; bad audio is an error that
//! names the file; `milkit bench audio --json` follows its schema and its byte count matches an
//! independent count from the checkpoint.

mod common;

use milkit::transcribe::{MelPadding, TranscribeOptions, Transcriber};
use std::path::{Path, PathBuf};

const CLIPS: [&str; 4] = [
    "jfk",
    "librivox_ss01_0870",
    "ljspeech_LJ001-0001",
    "ljspeech_LJ001-0006",
];

fn json(p: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

fn reference_text(fx: &Path, clip: &str) -> String {
    json(&fx.join(format!("reference/tiny.en-{clip}.json")))["text"]
        .as_str()
        .unwrap()
        .to_string()
}

/// (cache-I/O folder, stateful folder), built once per test run.
fn folders(fx: &Path) -> &'static (PathBuf, PathBuf) {
    common::tiny_en_folders(fx, "transcribe-models")
}

#[test]
fn cli_transcribes_reference_clips_exactly() {
    let Some(fx) = common::fixtures() else { return };
    let (io, _) = folders(&fx);
    let mut cmd = common::milkit();
    // The references are greedy without timestamps (Hugging Face's generate() defaults).
    cmd.args([
        "transcribe",
        "--no-timestamps",
        "--temperature",
        "0",
        "--models",
    ])
    .arg(io);
    for c in CLIPS {
        cmd.arg(fx.join(format!("audio/{c}.wav")));
    }
    let o = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "transcribe failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        o.stderr.is_empty(),
        "stderr without --verbose: {:?}",
        String::from_utf8_lossy(&o.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), CLIPS.len(), "one line per file: {stdout}");
    for (c, line) in CLIPS.iter().zip(lines) {
        assert_eq!(line, reference_text(&fx, c).trim(), "clip {c}");
    }
}

#[test]
fn stateful_decoder_and_library_agree_with_reference() {
    let Some(fx) = common::fixtures() else { return };
    let (io, state) = folders(&fx);
    let want = reference_text(&fx, "jfk");
    let wav = fx.join("audio/jfk.wav");
    let greedy = TranscribeOptions::greedy_no_timestamps();
    let mut a = Transcriber::open(io).unwrap();
    assert!(!a.stateful_decoder());
    let ra = a.transcribe_file_with(&wav, &greedy).unwrap();
    assert_eq!(ra.text, want, "cache-I/O decoder, library");
    let mut b = Transcriber::open(state).unwrap();
    assert!(b.stateful_decoder());
    let rb = b.transcribe_file_with(&wav, &greedy).unwrap();
    assert_eq!(rb.text, want, "stateful decoder");
    assert_eq!(
        ra.windows[0].pass.tokens, rb.windows[0].pass.tokens,
        "same tokens"
    );
    // Tokens are the reference's generated ones (prompt and end-of-text dropped).
    let refj = json(&fx.join("reference/tiny.en-jfk.json"));
    let toks: Vec<u32> = refj["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(ra.windows[0].pass.tokens, toks[2..toks.len() - 1]);
    // A second file through the same stateful session: states were reset between files.
    let rb2 = b.transcribe_file_with(&wav, &greedy).unwrap();
    assert_eq!(rb2.text, want);
    println!(
        "jfk: stateful decoder {:.1} ms/step, cache I/O {:.1} ms/step",
        rb.timings.decoder.as_secs_f64() * 1e3 / rb.timings.decoder_steps as f64,
        ra.timings.decoder.as_secs_f64() * 1e3 / ra.timings.decoder_steps as f64
    );
}

/// Every decoder call of a transcription and of teacher forcing runs on a rayon pool
/// worker, so its parallel loops fork inside the pool (a push onto the worker's own deque)
/// instead of waking a worker from outside and blocking until it has taken the jobs.
#[test]
fn decoder_calls_run_on_a_pool_worker() {
    use milkit::transcribe::decoder::TextDecoder;
    use std::sync::{Arc, Mutex};
    let Some(fx) = common::fixtures() else { return };
    let (io, _) = folders(&fx);
    let mut t = Transcriber::open(io).unwrap();
    let seen: Arc<Mutex<Vec<Option<usize>>>> = Arc::default();
    let sink = seen.clone();
    let mut dec = TextDecoder::load(&io.join("TextDecoder.mlpackage")).unwrap();
    dec.set_observer(Box::new(move |_| {
        sink.lock().unwrap().push(rayon::current_thread_index());
        Ok(())
    }));
    t.set_decoder(dec);
    let greedy = TranscribeOptions::greedy_no_timestamps();
    let r = t
        .transcribe_file_with(&fx.join("audio/jfk.wav"), &greedy)
        .unwrap();
    assert_eq!(r.text, reference_text(&fx, "jfk"));
    let calls = std::mem::take(&mut *seen.lock().unwrap());
    assert!(calls.len() > 10, "{} decoder calls observed", calls.len());
    assert!(
        calls.iter().all(Option::is_some),
        "decoder calls outside the pool: {calls:?}"
    );
    let samples = milkit::whisper::audio::load_audio(fx.join("audio/jfk.wav")).unwrap();
    let (_, cross) = t.encode_window(&samples).unwrap();
    let logits = t
        .teacher_force(&cross, &r.windows[0].pass.tokens[..4])
        .unwrap();
    assert_eq!(logits.len(), 4);
    let forced = std::mem::take(&mut *seen.lock().unwrap());
    assert_eq!(forced.len(), 4);
    assert!(forced.iter().all(Option::is_some), "{forced:?}");
}

#[test]
fn long_audio_is_decoded_in_30_second_windows() {
    let Some(fx) = common::fixtures() else { return };
    let (io, _) = folders(&fx);
    // jfk, silence up to exactly 30 s, then LJ001-0006: the first window is jfk zero-padded
    // (what the reference extractor does), the second LJ001-0006 alone.
    let a = milkit::whisper::audio::load_audio(fx.join("audio/jfk.wav")).unwrap();
    let b = milkit::whisper::audio::load_audio(fx.join("audio/ljspeech_LJ001-0006.wav")).unwrap();
    let mut samples = a.clone();
    samples.resize(milkit::whisper::audio::N_SAMPLES, 0.0);
    samples.extend_from_slice(&b);
    assert!(samples.len() > milkit::whisper::audio::N_SAMPLES);
    let dir = tempfile::tempdir().unwrap();
    let wav = dir.path().join("long.wav");
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 16_000,
        bits_per_sample: 32,
        sample_format: hound::SampleFormat::Float,
    };
    let mut w = hound::WavWriter::create(&wav, spec).unwrap();
    for s in &samples {
        w.write_sample(*s).unwrap();
    }
    w.finalize().unwrap();
    let mut t = Transcriber::open(io).unwrap();
    // Without timestamps, windows follow each other every 30 s (one segment each).
    let r = t
        .transcribe_file_with(&wav, &TranscribeOptions::greedy_no_timestamps())
        .unwrap();
    assert_eq!(r.windows.len(), 2);
    assert_eq!(r.windows[1].seek, 3000);
    let (ra, rb) = (
        reference_text(&fx, "jfk"),
        reference_text(&fx, "ljspeech_LJ001-0006"),
    );
    assert_eq!(r.segments.len(), 2);
    assert_eq!(r.segments[0].text, ra);
    assert_eq!(r.segments[1].text, rb);
    assert!((r.segments[1].start - 30.0).abs() < 1e-9);
    assert_eq!(r.text, format!("{ra}{rb}"));
}

#[test]
fn bad_audio_is_an_error_naming_the_file() {
    let Some(fx) = common::fixtures() else { return };
    let (io, _) = folders(&fx);
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("song.mp3");
    std::fs::write(&fake, b"ID3\x03\x00\x00\x00 not a wav at all").unwrap();
    let missing = dir.path().join("missing.wav");
    for bad in [&fake, &missing] {
        let o = common::milkit()
            .arg("transcribe")
            .arg("--models")
            .arg(io)
            .arg(bad)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains(&bad.display().to_string()), "{err}");
        let why = if bad == &fake {
            "not a recognised audio file"
        } else {
            "cannot read"
        };
        assert!(err.contains(why), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    let o = common::milkit()
        .arg("transcribe")
        .arg("--models")
        .arg(dir.path().join("nope"))
        .arg(fx.join("audio/jfk.wav"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("nope"), "{err}");
}

/// faster-whisper's JSON line for `wav` (tools/faster_whisper_bench.py, float32 tiny.en,
/// greedy, no timestamps): with its silence thresholds, or with `--keep-silent` none.
fn faster_whisper_line(py: &Path, wav: &Path, keep_silent: bool) -> serde_json::Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/faster_whisper_bench.py");
    let mut cmd = std::process::Command::new(py);
    cmd.arg(&script)
        .args(["--threads", "2", "--compute-type", "float32"]);
    if keep_silent {
        cmd.arg("--keep-silent");
    }
    let o = cmd.arg(wav).output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let line = stdout.lines().rev().find(|l| l.starts_with('{')).unwrap();
    serde_json::from_str(line).unwrap()
}

/// A 1-s clip of a constant near-zero level (every sample 1 of 32768): with openai-whisper's
/// padding (zero features past the audio) milkit reads it as faster-whisper does, the same
/// text and a no-speech probability and average log-probability within 0.02 and 0.05 of its
/// own when nothing is dropped, and silence, no text, with the usual thresholds. Hugging
/// Face's padding (zero audio) hears a word in the same clip, which is why the mode matters.
#[test]
fn a_near_silent_clip_is_silence_with_feature_padding_as_faster_whisper_reads_it() {
    let Some(fx) = common::fixtures() else { return };
    let Some(py) = common::faster_whisper_python() else {
        return;
    };
    let (io, _) = folders(&fx);
    let dir = tempfile::tempdir().unwrap();
    let wav = dir.path().join("level.wav");
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 16_000,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::create(&wav, spec).unwrap();
    for _ in 0..16_000 {
        w.write_sample(1i16).unwrap();
    }
    w.finalize().unwrap();
    let samples = milkit::whisper::audio::load_audio(&wav).unwrap();
    let mut tr = Transcriber::open(io).unwrap();
    let opts = |mel_padding, keep_silent: bool| TranscribeOptions {
        timestamps: false,
        temperatures: vec![0.0],
        mel_padding,
        no_speech_threshold: (!keep_silent).then_some(0.6),
        logprob_threshold: (!keep_silent).then_some(-1.0),
        ..TranscribeOptions::default()
    };
    let kept = tr
        .transcribe_with(&samples, &opts(MelPadding::Features, true))
        .unwrap();
    let fw = faster_whisper_line(&py, &wav, true);
    let fw_seg = &fw["segments"][0];
    let pass = &kept.windows[0].pass;
    let (nsp, want_nsp) = (
        pass.no_speech_prob.unwrap(),
        fw_seg["no_speech_prob"].as_f64().unwrap(),
    );
    let (lp, want_lp) = (pass.avg_logprob, fw_seg["avg_logprob"].as_f64().unwrap());
    println!("no-speech {nsp:.4} / {want_nsp:.4}, avg log-prob {lp:.4} / {want_lp:.4}");
    assert_eq!(kept.text, fw_seg["text"].as_str().unwrap());
    assert!(
        (nsp - want_nsp).abs() <= 0.02,
        "no-speech {nsp} vs {want_nsp}"
    );
    assert!(
        (lp - want_lp).abs() <= 0.05,
        "avg log-prob {lp} vs {want_lp}"
    );

    let features = tr
        .transcribe_with(&samples, &opts(MelPadding::Features, false))
        .unwrap();
    assert_eq!(faster_whisper_line(&py, &wav, false)["text"], "");
    assert_eq!(features.text, "");
    assert!(features.windows[0].silent && features.segments.is_empty());
    let audio = tr
        .transcribe_with(&samples, &opts(MelPadding::Audio, false))
        .unwrap();
    assert!(!audio.windows[0].silent && !audio.text.is_empty());
}

#[test]
fn every_audio_format_transcribes_as_the_wav_it_was_made_from() {
    let Some(fx) = common::fixtures() else { return };
    let (io, _) = folders(&fx);
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/audio");
    let files = [
        "jfk.flac",
        "jfk.alac.m4a",
        "jfk.mp3",
        "jfk.ogg",
        "jfk.opus",
        "jfk.webm",
        "jfk.m4a",
    ];
    // Output files are named by the audio file's stem: each file is copied under a name of
    // its own (jfk.alac.m4a → jfk-alac-m4a.m4a), and one command transcribes them all.
    let inputs = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let stem_of = |f: &str| f.replace('.', "-");
    let mut cmd = common::milkit();
    cmd.args([
        "transcribe",
        "--temperature",
        "0",
        "--output-format",
        "json",
    ])
    .arg("--output-dir")
    .arg(out.path())
    .arg("--models")
    .arg(io)
    .arg(fx.join("audio/jfk.wav"));
    for f in files {
        let ext = Path::new(f).extension().unwrap().to_str().unwrap();
        let copy = inputs.path().join(format!("{}.{ext}", stem_of(f)));
        std::fs::copy(data.join(f), &copy).unwrap();
        cmd.arg(copy);
    }
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let wav = json(&out.path().join("jfk.json"));
    assert_eq!(wav["audio"]["codec"], "pcm_s16");
    assert_eq!(wav["audio"]["duration_s"], 11.0);
    for f in files {
        let got = json(&out.path().join(format!("{}.json", stem_of(f))));
        assert_eq!(got["text"], wav["text"], "{f}");
        let a = &got["audio"];
        let d = a["duration_s"].as_f64().unwrap();
        assert!((d - 11.0).abs() < 0.08, "{f}: {d} s");
        assert!(a["sample_rate"].as_u64().unwrap() >= 16_000, "{f}: {a}");
        // Segment times agree with the WAV's within one timestamp step (20 ms), or two
        // for AAC, whose priming is not removed (32 ms).
        let step = if f == "jfk.m4a" { 0.041 } else { 0.021 };
        for (g, w) in got["segments"]
            .as_array()
            .unwrap()
            .iter()
            .zip(wav["segments"].as_array().unwrap())
        {
            for k in ["start", "end"] {
                let (g, w) = (g[k].as_f64().unwrap(), w[k].as_f64().unwrap());
                assert!(
                    (g - w).abs() <= step,
                    "{f}: segment {k} {g} against the WAV's {w}"
                );
            }
        }
    }
}

/// What one token of the cache-as-input decoder must read, counted from the checkpoint's
/// tensors and config: every decoder weight except the cross-attention K/V projections
/// (computed once per window from the encoder output; the embedding tables count one row),
/// plus the cross-attention K/V they produce (layers × 2 × 1500 × d fp16), plus the inputs
/// that change every token: the two self-attention caches (layers·d × 448 fp16 each), the
/// two 448-wide fp16 masks, and the two int32 scalars (token, position).
fn independent_decoder_bytes(ckpt: &Path) -> u64 {
    let bytes = std::fs::read(ckpt.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut total = 0u64;
    for (name, t) in st.tensors() {
        if !name.starts_with("model.decoder.")
            || name.contains("encoder_attn.k_proj")
            || name.contains("encoder_attn.v_proj")
        {
            continue;
        }
        let n: usize = t.shape().iter().product();
        if name.contains("embed_") {
            total += 2 * t.shape()[1] as u64;
            if name.contains("embed_tokens") {
                total += 2 * n as u64;
            }
        } else {
            total += 2 * n as u64;
        }
    }
    let cfg: serde_json::Value = json(&ckpt.join("config.json"));
    let c = |k: &str| cfg[k].as_u64().unwrap();
    let (d, layers) = (c("d_model"), c("decoder_layers"));
    let (frames, ctx) = (c("max_source_positions"), c("max_target_positions"));
    let cross = layers * 2 * frames * d * 2;
    let caches = 2 * layers * d * ctx * 2;
    total + cross + caches + 2 * ctx * 2 + 2 * 4
}

#[test]
fn bench_json_follows_schema_and_counts_decoder_bytes() {
    let Some(fx) = common::fixtures() else { return };
    let (io, _) = folders(&fx);
    let o = common::milkit()
        .args(["bench", "audio"])
        .arg(fx.join("audio/jfk.wav"))
        .arg("--models")
        .arg(io)
        .args(["--json", "--profile-ops"])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "bench failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    // `--profile-ops` (stderr): every op by type and name; the vocabulary head runs once a
    // decoder call (in one op or in chunks), as many times as the header's decoder calls.
    let err = String::from_utf8_lossy(&o.stderr);
    let calls: usize = err
        .split("profile (one transcription, ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no profile header in:\n{err}"));
    let head = err.lines().filter(|l| {
        l.starts_with("| TextDecoder | conv lm_head") && l.contains(&format!(" | {calls} | "))
    });
    assert!(
        head.count() >= 1,
        "no head op with {calls} calls in:\n{err}"
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let schema_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/bench-audio.schema.json");
    let schema: serde_json::Value = json(&schema_path);
    let validator = jsonschema::validator_for(&schema).unwrap();
    let errors: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
    assert!(
        errors.is_empty(),
        "bench report violates its schema: {errors:?}"
    );
    let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "bandwidth_gbps",
            "decoder_bytes_per_token",
            "decoder_first_call_ms",
            "decoder_ms_per_token",
            "decoder_warm_median_ms",
            "decoder_warm_ms_per_token",
            "encoder_gflop",
            "encoder_gflops",
            "encoder_ms",
            "floor_median_ms",
            "floor_ms_per_token",
            "mel_ms",
            "total_ms"
        ]
    );
    let f = |k: &str| v[k].as_f64().unwrap();
    let bytes = f("decoder_bytes_per_token");
    let want = independent_decoder_bytes(&fx.join("models/whisper-tiny.en")) as f64;
    assert!(
        (bytes - want).abs() / want < 0.01,
        "decoder bytes/token {bytes} vs {want} counted from the checkpoint"
    );
    // One encoder window's contractions, counted from tiny.en's dimensions (d 384, ffn 1536,
    // 4 layers, 80 mels, 3000 → 1500 frames): the two 3-tap stem convs, then per layer the
    // q/k/v/out projections, fc1 and fc2, and the two attention products Q·Kᵀ and P·V.
    let (d, ffn, t) = (384.0f64, 1536.0, 1500.0);
    let stem = 2.0 * 3000.0 * 80.0 * 3.0 * d + 2.0 * t * d * 3.0 * d;
    let layer = 4.0 * 2.0 * t * d * d + 2.0 * 2.0 * t * d * ffn + 2.0 * 2.0 * t * t * d;
    let gflop = (stem + 4.0 * layer) / 1e9;
    assert!(
        (f("encoder_gflop") - gflop).abs() / gflop < 0.01,
        "encoder GFLOP {} vs {gflop} counted from the dimensions",
        f("encoder_gflop")
    );
    let rate = f("encoder_gflop") / (f("encoder_ms") / 1e3);
    assert!((f("encoder_gflops") - rate).abs() <= 1e-6 * rate.max(1.0));
    let floor = bytes / (f("bandwidth_gbps") * 1e9) * 1e3;
    assert!((floor - f("floor_ms_per_token")).abs() <= 1e-9 * floor.max(1.0));
    assert!(f("bandwidth_gbps") > 0.5);
    // The median pass is no faster than the best one; the warm calls' median lies among
    // the warm calls, so it is positive.
    let (median_floor, median_warm) = (f("floor_median_ms"), f("decoder_warm_median_ms"));
    assert!(
        median_floor >= f("floor_ms_per_token") * (1.0 - 1e-9),
        "median pass {median_floor} ms below the best pass {}",
        f("floor_ms_per_token")
    );
    assert!(median_warm > 0.0 && median_warm < f("total_ms"));
    let parts = f("mel_ms") + f("encoder_ms");
    assert!(parts > 0.0 && parts < f("total_ms"));
    assert!(f("decoder_ms_per_token") > 0.0 && f("decoder_ms_per_token") < f("total_ms"));
    // The decoder's time per call holds the model's calls (warm ones and the first of each
    // pass) plus the decoding rules between them: at least the smaller of the two means.
    let (warm, first) = (f("decoder_warm_ms_per_token"), f("decoder_first_call_ms"));
    let mean = f("decoder_ms_per_token");
    assert!(warm > 0.0 && first > 0.0);
    assert!(
        warm.min(first) * (1.0 - 1e-9) <= mean,
        "mean {mean} ms below both warm {warm} and first {first}"
    );
    println!("bench jfk: {v}");
}

/// A canonical 44-byte PCM WAV header for `data_len` bytes of 16-bit mono 16 kHz audio, with
/// the format tag `format` (1 = PCM).
fn wav_header(format: u16, data_len: u32) -> Vec<u8> {
    let mut h = Vec::new();
    h.extend_from_slice(b"RIFF");
    h.extend_from_slice(&(36u32.wrapping_add(data_len)).to_le_bytes());
    h.extend_from_slice(b"WAVEfmt ");
    h.extend_from_slice(&16u32.to_le_bytes());
    h.extend_from_slice(&format.to_le_bytes());
    h.extend_from_slice(&1u16.to_le_bytes());
    h.extend_from_slice(&16_000u32.to_le_bytes());
    h.extend_from_slice(&32_000u32.to_le_bytes());
    h.extend_from_slice(&2u16.to_le_bytes());
    h.extend_from_slice(&16u16.to_le_bytes());
    h.extend_from_slice(b"data");
    h.extend_from_slice(&data_len.to_le_bytes());
    h
}

#[test]
fn one_bad_file_among_several_is_reported_and_the_others_still_transcribed() {
    let Some(fx) = common::fixtures() else { return };
    let (io, _) = folders(&fx);
    let dir = tempfile::tempdir().unwrap();
    let jfk = std::fs::read(fx.join("audio/jfk.wav")).unwrap();
    let truncated = dir.path().join("truncated.wav");
    std::fs::write(&truncated, &jfk[..jfk.len() / 3 * 2 + 1]).unwrap();
    let absurd = dir.path().join("absurd.wav");
    let mut a = wav_header(1, u32::MAX - 64);
    a.extend_from_slice(&[0u8; 64]);
    std::fs::write(&absurd, a).unwrap();
    let adpcm = dir.path().join("adpcm.wav");
    let mut a = wav_header(2, 64);
    a.extend_from_slice(&[0u8; 64]);
    std::fs::write(&adpcm, a).unwrap();
    let empty = dir.path().join("empty.wav");
    std::fs::write(&empty, b"").unwrap();
    let folder = dir.path().join("a-folder.wav");
    std::fs::create_dir(&folder).unwrap();
    let bad = [&truncated, &absurd, &adpcm, &empty, &folder];
    let mut cmd = common::milkit();
    cmd.args([
        "transcribe",
        "--no-timestamps",
        "--temperature",
        "0",
        "--models",
    ])
    .arg(io)
    .arg(fx.join("audio/jfk.wav"));
    for b in bad {
        cmd.arg(b);
    }
    cmd.arg(fx.join("audio/ljspeech_LJ001-0006.wav"));
    let o = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(2), "one failed: exit 2\n{err}");
    assert!(!err.contains("panicked"), "{err}");
    for b in bad {
        let name = b.display().to_string();
        let lines: Vec<&str> = err.lines().filter(|l| l.contains(&name)).collect();
        assert_eq!(lines.len(), 1, "one line naming {name}:\n{err}");
    }
    assert!(
        err.contains(&format!("{} of 7 files failed", bad.len())),
        "{err}"
    );
    // The good files, before and after the bad ones, are transcribed as usual.
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert_eq!(lines[0], reference_text(&fx, "jfk").trim());
    assert_eq!(lines[1], reference_text(&fx, "ljspeech_LJ001-0006").trim());
}

#[test]
fn bench_whole_times_each_process_with_its_own_peak_memory_and_pairs_the_runs() {
    let Some(fx) = common::fixtures() else { return };
    let (io, _) = folders(&fx);
    let tmp = tempfile::tempdir().unwrap();
    // A stand-in for faster-whisper's python: it touches 200 MiB, so its peak RSS must read
    // at least that (and far from milkit's), and echoes the arguments it was given.
    let fake = tmp.path().join("fakepy");
    std::fs::write(
        &fake,
        "#!/bin/sh\nexec python3 -c 'import json,sys; b=bytearray(200*2**20); b[::4096]=b\"x\"*len(b[::4096]); print(json.dumps({\"text\": \" \".join(sys.argv[2:]), \"total_ms\": 1.0}))' \"$@\"\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let o = common::milkit()
        .args(["bench", "whole"])
        .arg(fx.join("audio/jfk.wav"))
        .arg("--models")
        .arg(io)
        .args(["--runs", "2", "--json", "--faster-whisper"])
        .arg(&fake)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "bench whole failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let schema: serde_json::Value =
        json(&Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/bench-whole.schema.json"));
    let validator = jsonschema::validator_for(&schema).unwrap();
    let errors: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "report violates its schema: {errors:?}");
    let r: milkit::report::WholeBenchReport = serde_json::from_value(v).unwrap();
    assert_eq!(r.sides.len(), 2);
    let (mk, fw) = (&r.sides[0], &r.sides[1]);
    assert_eq!((mk.wall_ms.len(), fw.wall_ms.len()), (2, 2));
    // milkit's side is `milkit transcribe` itself: the same text a direct run prints.
    let direct = common::milkit()
        .args([
            "transcribe",
            "--language",
            "en",
            "--no-timestamps",
            "--temperature",
            "0",
        ])
        .arg("--models")
        .arg(io)
        .arg(fx.join("audio/jfk.wav"))
        .output()
        .unwrap();
    assert_eq!(mk.text, String::from_utf8_lossy(&direct.stdout).trim());
    assert!(
        fw.text.contains("--compute-type int8") && fw.text.contains("--threads 2"),
        "arguments given to the script: {}",
        fw.text
    );
    for rss in &fw.peak_rss_mb {
        assert!(
            (200.0..400.0).contains(rss),
            "the stand-in's peak RSS {rss} MB"
        );
    }
    for rss in &mk.peak_rss_mb {
        assert!(
            *rss > 20.0 && (rss - 200.0).abs() > 1.0,
            "milkit's peak RSS {rss} MB"
        );
    }
    for i in 0..2 {
        let want = mk.wall_ms[i] / fw.wall_ms[i];
        assert!((r.wall_ratios[i] - want).abs() < 1e-9);
        let want = mk.peak_rss_mb[i] / fw.peak_rss_mb[i];
        assert!((r.rss_ratios[i] - want).abs() < 1e-9);
    }
}
