#!/usr/bin/env python
"""faster-whisper's voice activity detection, as the reference for milkit's (`src/vad/`).

    python vad_reference.py rules < cases.json       # the span rules on given probabilities
    python vad_reference.py probs CLIP.wav ...       # faster-whisper's Silero (ONNX) probabilities
    python vad_reference.py spans CLIP.wav ... [--threshold X] [--min-speech-duration-ms N]
        [--max-speech-duration-s X] [--min-silence-duration-ms N] [--speech-pad-ms N]

Needs `pip install faster-whisper` (it brings its Silero VAD v6 ONNX model and onnxruntime).

`rules` reads a JSON list of cases {"probs": [...], "samples": N, "options": {VadOptions
fields}, "times": [[t, is_end], ...]} and prints, per case, {"spans": [[start, end], ...],
"times": [mapped, ...]}: `get_speech_timestamps` with the model replaced by the given
probabilities, and `SpeechTimestampsMap.get_original_time` of each time.

`probs` and `spans` read 16-bit PCM 16 kHz mono WAV files (as milkit reads them: sample /
32768) and print {"CLIP.wav": [...]} with one probability per 512 samples, or the speech
spans in samples.
"""
import argparse
import json
import sys
import wave

import numpy as np
from faster_whisper import vad


def read_wav(path):
    with wave.open(path, "rb") as w:
        if w.getframerate() != 16000 or w.getnchannels() != 1 or w.getsampwidth() != 2:
            sys.exit(f"{path}: not 16-bit PCM 16 kHz mono")
        data = w.readframes(w.getnframes())
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


def rules(cases):
    out = []
    real = vad.get_vad_model
    try:
        for case in cases:
            probs = np.asarray(case["probs"], dtype=np.float32)
            vad.get_vad_model = lambda probs=probs: (lambda audio: probs)
            audio = np.zeros(case["samples"], dtype=np.float32)
            opts = vad.VadOptions(**case.get("options", {}))
            spans = vad.get_speech_timestamps(audio, opts)
            times = []
            if spans:
                m = vad.SpeechTimestampsMap(spans, 16000)
                times = [m.get_original_time(t, is_end=e) for t, e in case.get("times", [])]
            out.append({"spans": [[s["start"], s["end"]] for s in spans], "times": times})
    finally:
        vad.get_vad_model = real
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["rules", "probs", "spans"])
    ap.add_argument("clips", nargs="*")
    ap.add_argument("--threshold", type=float, default=0.5)
    ap.add_argument("--min-speech-duration-ms", type=int, default=0)
    ap.add_argument("--max-speech-duration-s", type=float, default=float("inf"))
    ap.add_argument("--min-silence-duration-ms", type=int, default=2000)
    ap.add_argument("--speech-pad-ms", type=int, default=400)
    a = ap.parse_args()
    if a.mode == "rules":
        print(json.dumps(rules(json.load(sys.stdin))))
        return
    opts = vad.VadOptions(
        threshold=a.threshold,
        min_speech_duration_ms=a.min_speech_duration_ms,
        max_speech_duration_s=a.max_speech_duration_s,
        min_silence_duration_ms=a.min_silence_duration_ms,
        speech_pad_ms=a.speech_pad_ms,
    )
    result = {}
    for clip in a.clips:
        audio = read_wav(clip)
        if a.mode == "probs":
            padded = np.pad(audio, (0, 512 - audio.shape[0] % 512))
            result[clip] = [float(p) for p in np.ravel(vad.get_vad_model()(padded))]
        else:
            spans = vad.get_speech_timestamps(audio, opts)
            result[clip] = [[s["start"], s["end"]] for s in spans]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
