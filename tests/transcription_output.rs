//! Transcript files (`transcribe::output`): the json output follows the checked-in schema
//! `schemas/transcription.schema.json` and reads back to the same result; srt and vtt files,
//! parsed back by the small parser here, have the cues, times (milliseconds rounded half to
//! even, as Python's `round`; hours always in srt, in vtt only from one hour on) and texts
//! openai-whisper's writers give; an empty result gives empty files; `write_all` writes
//! `<stem>.<ext>` for each format and nothing at all when a time is invalid.

use milkit::report::{TranscriptionResult, TranscriptionSegment, WordTiming};
use milkit::transcribe::output::{
    format_timestamp, to_json, to_srt, to_txt, to_vtt, write_all, OutputFormat,
};
use std::path::Path;

fn segment(id: u64, start: f64, end: f64, text: &str) -> TranscriptionSegment {
    TranscriptionSegment {
        id,
        seek: 0,
        start,
        end,
        text: text.to_string(),
        tokens: vec![50364, 843, 523, 50414],
        temperature: 0.0,
        avg_logprob: -0.25,
        compression_ratio: 1.2,
        no_speech_prob: 0.01,
        words: None,
    }
}

fn word(word: &str, start: f64, end: f64) -> WordTiming {
    WordTiming {
        word: word.to_string(),
        start,
        end,
        probability: 0.9,
    }
}

/// Two segments, the second past one hour; times chosen to test rounding (62.5 ms → 62,
/// 187.5 ms → 188: half to even) and a `-->` in a text.
fn sample() -> TranscriptionResult {
    TranscriptionResult {
        text: " And so my fellow --> Americans ask not.".into(),
        segments: vec![
            segment(0, 0.0625, 2.1875, " And so my fellow --> Americans"),
            segment(1, 3725.5, 3727.0, " ask not."),
        ],
        language: "en".into(),
        audio: None,
    }
}

fn with_words() -> TranscriptionResult {
    let mut r = sample();
    r.segments[0].words = Some(vec![
        word(" And", 0.3, 0.5),
        word(" so", 0.5, 0.75),
        word(" my", 0.75, 1.0),
    ]);
    r.segments[1].words = Some(vec![
        word(" ask", 3725.6, 3726.0),
        word(" not.", 3726.0, 3726.9),
    ]);
    r
}

/// Milliseconds of `[HH:]MM:SS<marker>mmm`, written independently of the library.
fn parse_time(s: &str, marker: char) -> u64 {
    let (hms, ms) = s
        .split_once(marker)
        .unwrap_or_else(|| panic!("no {marker} in {s}"));
    assert_eq!(ms.len(), 3, "three millisecond digits in {s}");
    let parts: Vec<u64> = hms.split(':').map(|p| p.parse().unwrap()).collect();
    let (h, m, sec) = match parts[..] {
        [h, m, s] => (h, m, s),
        [m, s] => (0, m, s),
        _ => panic!("bad time {s}"),
    };
    assert!(m < 60 && sec < 60, "{s}");
    ((h * 60 + m) * 60 + sec) * 1000 + ms.parse::<u64>().unwrap()
}

/// (index or 0, start ms, end ms, text, whether hours were written) of each cue.
fn parse_cues(body: &str, marker: char, numbered: bool) -> Vec<(u64, u64, u64, String, bool)> {
    let mut out = vec![];
    for block in body.split("\n\n").filter(|b| !b.is_empty()) {
        let mut lines = block.lines();
        let n = if numbered {
            lines.next().unwrap().parse().unwrap()
        } else {
            0
        };
        let times = lines.next().unwrap();
        let (a, b) = times.split_once(" --> ").unwrap();
        let hours = a.matches(':').count() == 2;
        let text: Vec<&str> = lines.collect();
        out.push((
            n,
            parse_time(a, marker),
            parse_time(b, marker),
            text.join("\n"),
            hours,
        ));
    }
    out
}

/// Python's round(seconds * 1000): half to even, in f64 arithmetic written out here.
fn python_ms(seconds: f64) -> u64 {
    let x = seconds * 1000.0;
    let f = x.floor();
    let d = x - f;
    (if d > 0.5 || (d == 0.5 && f % 2.0 == 1.0) {
        f + 1.0
    } else {
        f
    }) as u64
}

#[test]
fn json_output_follows_the_checked_in_schema_and_reads_back() {
    let schema_path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/transcription.schema.json");
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&schema_path).unwrap()).unwrap();
    let v = jsonschema::validator_for(&schema).unwrap();
    for r in [
        sample(),
        with_words(),
        TranscriptionResult {
            text: String::new(),
            segments: vec![],
            language: "en".into(),
            audio: Some(milkit::report::AudioInfo {
                container: "m4a".into(),
                codec: "aac".into(),
                sample_rate: 44_100,
                channels: 2,
                duration_s: 1.5,
                skipped_packets: 0,
            }),
        },
    ] {
        let text = to_json(&r).unwrap();
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        let errors: Vec<String> = v.iter_errors(&doc).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "schema violations: {errors:?}");
        // openai-whisper's field names, no others.
        let seg_keys: Vec<String> = doc["segments"]
            .as_array()
            .unwrap()
            .first()
            .map(|s| s.as_object().unwrap().keys().cloned().collect())
            .unwrap_or_default();
        for k in &seg_keys {
            assert!(
                [
                    "id",
                    "seek",
                    "start",
                    "end",
                    "text",
                    "tokens",
                    "temperature",
                    "avg_logprob",
                    "compression_ratio",
                    "no_speech_prob",
                    "words"
                ]
                .contains(&k.as_str()),
                "unexpected segment field {k}"
            );
        }
        let back: TranscriptionResult = serde_json::from_str(&text).unwrap();
        assert_eq!(back, r);
    }
    // The schema rejects a segment without its times, and an unknown field.
    let mut doc = serde_json::to_value(sample()).unwrap();
    doc["segments"][0].as_object_mut().unwrap().remove("start");
    assert!(!v.is_valid(&doc));
    let mut doc = serde_json::to_value(sample()).unwrap();
    doc["extra"] = serde_json::json!(1);
    assert!(!v.is_valid(&doc));
}

#[test]
fn srt_cues_are_numbered_with_hours_and_comma_milliseconds() {
    let r = sample();
    let srt = to_srt(&r).unwrap();
    let cues = parse_cues(&srt, ',', true);
    assert_eq!(cues.len(), 2);
    for (k, (seg, cue)) in r.segments.iter().zip(&cues).enumerate() {
        assert_eq!(cue.0, k as u64 + 1, "cue number");
        assert_eq!(cue.1, python_ms(seg.start));
        assert_eq!(cue.2, python_ms(seg.end));
        assert!(cue.4, "srt always writes hours");
    }
    assert_eq!(cues[0].1, 62, "62.5 ms rounds to even");
    assert_eq!(cues[0].2, 2188, "2187.5 ms rounds to even");
    assert_eq!(cues[1].1, 3_725_500);
    assert_eq!(
        cues[0].3, "And so my fellow -> Americans",
        "trimmed, arrow defused"
    );
    assert!(
        srt.starts_with("1\n00:00:00,062 --> 00:00:02,188\n"),
        "{srt}"
    );
    assert!(
        srt.contains("2\n01:02:05,500 --> 01:02:07,000\nask not.\n\n"),
        "{srt}"
    );
}

#[test]
fn vtt_has_a_header_and_shows_hours_only_when_needed() {
    let r = sample();
    let vtt = to_vtt(&r).unwrap();
    let body = vtt.strip_prefix("WEBVTT\n\n").expect("WEBVTT header");
    let cues = parse_cues(body, '.', false);
    assert_eq!(cues.len(), 2);
    assert!(!cues[0].4, "no hours under one hour");
    assert!(cues[1].4, "hours from one hour on");
    for (seg, cue) in r.segments.iter().zip(&cues) {
        assert_eq!(cue.1, python_ms(seg.start));
        assert_eq!(cue.2, python_ms(seg.end));
    }
    assert!(body.starts_with("00:00.062 --> 00:02.188\n"), "{vtt}");
    assert!(body.contains("01:02:05.500 --> 01:02:07.000\nask not.\n"));
}

#[test]
fn word_timings_set_the_cue_span_and_text() {
    let r = with_words();
    for (text, marker, numbered) in [
        (to_srt(&r).unwrap(), ',', true),
        (
            to_vtt(&r)
                .unwrap()
                .strip_prefix("WEBVTT\n\n")
                .unwrap()
                .to_string(),
            '.',
            false,
        ),
    ] {
        let cues = parse_cues(&text, marker, numbered);
        assert_eq!(cues.len(), 2);
        assert_eq!((cues[0].1, cues[0].2), (300, 1000), "first to last word");
        assert_eq!(cues[0].3, "And so my");
        assert_eq!((cues[1].1, cues[1].2), (3_725_600, 3_726_900));
        assert_eq!(cues[1].3, "ask not.");
    }
}

#[test]
fn txt_is_one_trimmed_segment_per_line_and_empty_results_give_empty_files() {
    assert_eq!(
        to_txt(&sample()),
        "And so my fellow --> Americans\nask not.\n"
    );
    let empty = TranscriptionResult {
        text: String::new(),
        segments: vec![],
        language: "de".into(),
        audio: None,
    };
    assert_eq!(to_txt(&empty), "");
    assert_eq!(to_srt(&empty).unwrap(), "");
    assert_eq!(to_vtt(&empty).unwrap(), "WEBVTT\n\n");
}

#[test]
fn timestamps_round_like_python_and_refuse_negative_times() {
    assert_eq!(format_timestamp(0.0, false, '.').unwrap(), "00:00.000");
    assert_eq!(format_timestamp(0.0005, true, ',').unwrap(), "00:00:00,000");
    assert_eq!(format_timestamp(0.0015, true, ',').unwrap(), "00:00:00,002");
    assert_eq!(format_timestamp(59.9996, false, '.').unwrap(), "01:00.000");
    assert_eq!(
        format_timestamp(36_000.0, false, '.').unwrap(),
        "10:00:00.000"
    );
    assert!(format_timestamp(-0.01, false, '.').is_err());
    assert!(format_timestamp(f64::NAN, false, '.').is_err());
}

#[test]
fn write_all_writes_each_format_once_and_nothing_on_error() {
    let dir = tempfile::tempdir().unwrap();
    let r = with_words();
    let paths = write_all(
        &r,
        dir.path(),
        "jfk",
        &[OutputFormat::All, OutputFormat::Srt],
        false,
    )
    .unwrap();
    let names: Vec<String> = paths
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["jfk.txt", "jfk.json", "jfk.srt", "jfk.vtt"]);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("jfk.srt")).unwrap(),
        to_srt(&r).unwrap()
    );
    // An existing file is kept without force, and nothing is written...
    let before = std::fs::read_to_string(dir.path().join("jfk.txt")).unwrap();
    let e = write_all(&sample(), dir.path(), "jfk", &[OutputFormat::Txt], false).unwrap_err();
    assert!(format!("{e:#}").contains("--force"), "{e:#}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("jfk.txt")).unwrap(),
        before
    );
    // ...and replaced with it.
    let again = write_all(&sample(), dir.path(), "jfk", &[OutputFormat::Txt], true).unwrap();
    assert_eq!(
        std::fs::read_to_string(&again[0]).unwrap(),
        to_txt(&sample())
    );
    // A negative time: an error, and no file written.
    let mut bad = sample();
    bad.segments[1].start = -1.0;
    let fresh = tempfile::tempdir().unwrap();
    let e = write_all(
        &bad,
        fresh.path(),
        "bad",
        &[OutputFormat::Txt, OutputFormat::Srt],
        false,
    )
    .unwrap_err();
    assert!(format!("{e:#}").contains("srt"), "{e:#}");
    assert_eq!(std::fs::read_dir(fresh.path()).unwrap().count(), 0);
    assert!(write_all(&r, dir.path(), "a/b", &[OutputFormat::Txt], true).is_err());
    assert!(write_all(&r, dir.path(), "", &[OutputFormat::Txt], true).is_err());
}
