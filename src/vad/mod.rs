//! Voice activity detection: which stretches of a 16 kHz recording hold speech, as
//! faster-whisper's `vad.py` decides it (Silero VAD's rules), and the map from the
//! concatenated speech back to the recording's timeline.
//!
//! [`speech_spans`] turns one speech probability per 512-sample window (what a Silero VAD
//! model gives, [`silero`]) into speech spans: hysteresis between `threshold` and
//! `neg_threshold`, a span closed only after `min_silence_duration_ms` of silence, spans
//! longer than `max_speech_duration_s` split at the last silence of more than 98 ms (else
//! cut hard), spans shorter than `min_speech_duration_ms` dropped, then `speech_pad_ms` of
//! padding on each side (half the gap each where two spans are closer than twice the
//! padding). [`SpeechMap`] is faster-whisper's `SpeechTimestampsMap`: a time in the
//! concatenation of the spans ([`concat_spans`]) → the recording's time. The rules are
//! restated here from faster-whisper 1.2.1, with its defaults ([`VadOptions::default`]);
//! nothing here knows Whisper.

pub mod silero;

use anyhow::{ensure, Result};

/// The sample rate the rules and Silero VAD work at.
pub const SAMPLE_RATE: usize = 16_000;
/// Samples per speech probability (Silero VAD's window at 16 kHz).
pub const WINDOW: usize = 512;
/// Samples of the previous window a Silero VAD model sees before each window.
pub const CONTEXT: usize = 64;

/// faster-whisper's `VadOptions`, with its defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct VadOptions {
    /// A window is speech when its probability is at least this.
    pub threshold: f64,
    /// Below this a window is silence; between the two it continues what came before.
    /// `None`: `max(threshold − 0.15, 0.01)`.
    pub neg_threshold: Option<f64>,
    /// Spans of speech this short or shorter are dropped.
    pub min_speech_duration_ms: u32,
    /// Spans longer than this are split (infinite: never).
    pub max_speech_duration_s: f64,
    /// Silence this long ends a span.
    pub min_silence_duration_ms: u32,
    /// Padding added on each side of a span.
    pub speech_pad_ms: u32,
}

impl Default for VadOptions {
    fn default() -> Self {
        VadOptions {
            threshold: 0.5,
            neg_threshold: None,
            min_speech_duration_ms: 0,
            max_speech_duration_s: f64::INFINITY,
            min_silence_duration_ms: 2000,
            speech_pad_ms: 400,
        }
    }
}

impl VadOptions {
    /// Checks the values: thresholds in [0, 1] with `neg_threshold` ≤ `threshold`, a
    /// positive maximum duration.
    pub fn validate(&self) -> Result<()> {
        ensure!(
            (0.0..=1.0).contains(&self.threshold),
            "VAD threshold {} is not a probability in [0, 1]",
            self.threshold
        );
        if let Some(n) = self.neg_threshold {
            ensure!(
                (0.0..=self.threshold).contains(&n),
                "VAD negative threshold {n} is not in [0, threshold = {}]",
                self.threshold
            );
        }
        ensure!(
            self.max_speech_duration_s > 0.0,
            "VAD maximum speech duration {} s is not positive",
            self.max_speech_duration_s
        );
        Ok(())
    }

    /// The silence threshold in force.
    pub fn neg_threshold(&self) -> f64 {
        self.neg_threshold
            .unwrap_or((self.threshold - 0.15).max(0.01))
    }
}

/// A stretch of the recording, in samples: `start..end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub start: usize,
    pub end: usize,
}

impl Span {
    pub fn len(&self) -> usize {
        self.end.saturating_sub(self.start)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How many probabilities a recording of `samples` samples has: faster-whisper pads it
/// with zeros to the next multiple of [`WINDOW`] (a whole window more when it already is
/// one).
pub fn windows(samples: usize) -> usize {
    samples / WINDOW + 1
}

/// Speech spans from one probability per [`WINDOW`] samples of a recording of `samples`
/// samples (faster-whisper's `get_speech_timestamps` after the model), sorted and not
/// overlapping.
pub fn speech_spans(probs: &[f32], samples: usize, o: &VadOptions) -> Vec<Span> {
    let sr = SAMPLE_RATE as f64;
    let (w, len) = (WINDOW as i64, samples as i64);
    let ms = |v: u32| (SAMPLE_RATE as i64) * i64::from(v) / 1000;
    let min_speech = ms(o.min_speech_duration_ms);
    let pad = ms(o.speech_pad_ms);
    let min_silence = ms(o.min_silence_duration_ms);
    let max_speech = sr * o.max_speech_duration_s - WINDOW as f64 - 2.0 * pad as f64;
    let min_silence_at_max_speech = (SAMPLE_RATE as i64) * 98 / 1000;
    let (threshold, neg) = (o.threshold, o.neg_threshold());

    let mut spans: Vec<(i64, i64)> = Vec::new();
    let mut triggered = false;
    // The open span's start; 0 stands for "unset" in the three below, as in faster-whisper.
    let mut start = 0i64;
    let (mut temp_end, mut prev_end, mut next_start) = (0i64, 0i64, 0i64);
    for (i, &p) in probs.iter().enumerate() {
        let p = f64::from(p);
        let at = w * i as i64;
        if p >= threshold && temp_end != 0 {
            temp_end = 0;
            if next_start < prev_end {
                next_start = at;
            }
        }
        if p >= threshold && !triggered {
            triggered = true;
            start = at;
            continue;
        }
        if triggered && (at - start) as f64 > max_speech {
            if prev_end != 0 {
                spans.push((start, prev_end));
                // Silence was reached and speech has not come back: the span is closed;
                // otherwise the next one starts where speech came back.
                if next_start < prev_end {
                    triggered = false;
                } else {
                    start = next_start;
                }
                (prev_end, next_start, temp_end) = (0, 0, 0);
            } else {
                spans.push((start, at));
                (prev_end, next_start, temp_end) = (0, 0, 0);
                triggered = false;
                continue;
            }
        }
        if p < neg && triggered {
            if temp_end == 0 {
                temp_end = at;
            }
            if at - temp_end > min_silence_at_max_speech {
                prev_end = temp_end;
            }
            if at - temp_end < min_silence {
                continue;
            }
            if temp_end - start > min_speech {
                spans.push((start, temp_end));
            }
            (prev_end, next_start, temp_end) = (0, 0, 0);
            triggered = false;
        }
    }
    if triggered && len - start > min_speech {
        spans.push((start, len));
    }

    let n = spans.len();
    for i in 0..n {
        if i == 0 {
            spans[0].0 = (spans[0].0 - pad).max(0);
        }
        if i + 1 < n {
            let silence = spans[i + 1].0 - spans[i].1;
            if silence < 2 * pad {
                let half = silence.div_euclid(2);
                spans[i].1 += half;
                spans[i + 1].0 = (spans[i + 1].0 - half).max(0);
            } else {
                spans[i].1 = (spans[i].1 + pad).min(len);
                spans[i + 1].0 = (spans[i + 1].0 - pad).max(0);
            }
        } else {
            spans[i].1 = (spans[i].1 + pad).min(len);
        }
    }
    spans
        .into_iter()
        .map(|(s, e)| Span {
            start: s.max(0) as usize,
            end: e.max(0) as usize,
        })
        .collect()
}

/// The samples of `spans`, one after another (faster-whisper's `collect_chunks` without a
/// maximum duration); empty without spans.
pub fn concat_spans(samples: &[f32], spans: &[Span]) -> Vec<f32> {
    let mut out = Vec::with_capacity(spans.iter().map(Span::len).sum());
    for s in spans {
        let (a, b) = (s.start.min(samples.len()), s.end.min(samples.len()));
        out.extend_from_slice(&samples[a..b.max(a)]);
    }
    out
}

/// Times in the concatenated speech → times in the recording (faster-whisper's
/// `SpeechTimestampsMap`, 2 decimals).
#[derive(Clone, Debug, PartialEq)]
pub struct SpeechMap {
    /// Each span's end, in samples of the concatenation.
    chunk_end: Vec<i64>,
    /// The silence removed before each span, in seconds.
    silence_before: Vec<f64>,
}

impl SpeechMap {
    pub fn new(spans: &[Span]) -> SpeechMap {
        let (mut previous_end, mut silent) = (0i64, 0i64);
        let (mut chunk_end, mut silence_before) = (vec![], vec![]);
        for s in spans {
            silent += s.start as i64 - previous_end;
            previous_end = s.end as i64;
            chunk_end.push(s.end as i64 - silent);
            silence_before.push(silent as f64 / SAMPLE_RATE as f64);
        }
        SpeechMap {
            chunk_end,
            silence_before,
        }
    }

    /// The span a time of the concatenation falls in: the first whose end is past it (an
    /// end time exactly on a span's end belongs to that span); the last one beyond.
    pub fn chunk_index(&self, time: f64, is_end: bool) -> usize {
        let sample = (time * SAMPLE_RATE as f64) as i64;
        if is_end {
            if let Some(i) = self.chunk_end.iter().position(|&e| e == sample) {
                return i;
            }
        }
        let after = self.chunk_end.partition_point(|&e| e <= sample);
        after.min(self.chunk_end.len().saturating_sub(1))
    }

    /// The recording's time of `time` in the concatenation, in span `chunk` (else the span
    /// [`SpeechMap::chunk_index`] finds), rounded to 2 decimals as Python's `round`.
    pub fn original_time(&self, time: f64, chunk: Option<usize>, is_end: bool) -> f64 {
        if self.chunk_end.is_empty() {
            return time;
        }
        let i = chunk.unwrap_or_else(|| self.chunk_index(time, is_end));
        round2(self.silence_before[i] + time)
    }
}

/// `x` rounded to 2 decimals from its exact binary value, ties to even (Python's
/// `round(x, 2)`).
fn round2(x: f64) -> f64 {
    format!("{x:.2}").parse().unwrap_or(x)
}
