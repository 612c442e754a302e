//! Transcription of the speech alone: the spans a voice activity detector found
//! ([`crate::vad`]) are concatenated and decoded as any recording, and every time of the
//! result — segments, words, window starts — is put back on the recording's timeline, as
//! faster-whisper's `vad_filter` does (`collect_chunks`, then `restore_speech_timestamps`).

use super::{TranscribeOptions, Transcriber, Transcript};
use crate::vad::{concat_spans, Span, SpeechMap};
use crate::whisper::audio::{HOP_LENGTH, SAMPLE_RATE};
use anyhow::Result;

/// Seconds per mel frame.
const FRAME: f64 = HOP_LENGTH as f64 / SAMPLE_RATE as f64;

impl Transcriber {
    /// Transcribes only `spans` of 16 kHz mono `samples` (sorted, not overlapping, in
    /// samples): their samples one after another, decoded as [`Transcriber::transcribe_with`]
    /// decodes a recording, with times mapped back onto `samples`' timeline. A segment with
    /// word timings takes its words' span (the one their middle falls in) and its first and
    /// last word's times; one without, the span of its start and the span its end closes.
    /// Without spans the transcript is empty.
    pub fn transcribe_spans(
        &mut self,
        samples: &[f32],
        spans: &[Span],
        opts: &TranscribeOptions,
    ) -> Result<Transcript> {
        let speech = concat_spans(samples, spans);
        let mut t = self.transcribe_with(&speech, opts)?;
        if spans.is_empty() {
            return Ok(t);
        }
        let map = SpeechMap::new(spans);
        let frames = |seek: usize| {
            let s = map.original_time(seek as f64 * FRAME, None, false);
            (s / FRAME).round() as usize
        };
        for s in &mut t.segments {
            s.seek = frames(s.seek);
            if s.words.is_empty() {
                s.start = map.original_time(s.start, None, false);
                s.end = map.original_time(s.end, None, true);
                continue;
            }
            for w in &mut s.words {
                let chunk = map.chunk_index((w.start + w.end) / 2.0, false);
                w.start = map.original_time(w.start, Some(chunk), false);
                w.end = map.original_time(w.end, Some(chunk), false);
            }
            s.start = s.words[0].start;
            s.end = s.words[s.words.len() - 1].end;
        }
        for w in &mut t.windows {
            w.seek = frames(w.seek);
        }
        Ok(t)
    }
}
