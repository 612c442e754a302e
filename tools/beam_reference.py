#!/usr/bin/env python3
"""Beam-search reference for `milkit transcribe --beam-size`: PyTorch float32 Whisper
(Hugging Face transformers) decoded two ways, one JSON line per clip on stdout.

`openai`: openai-whisper's rules (`whisper/decoding.py`: `BeamSearchDecoder` with
`patience`, `MaximumLikelihoodRanker` with `length_penalty`), written out here over the
Hugging Face model's logits, with milkit's logit filters for decoding without timestamps
(the generation config's suppress_tokens, begin_suppress_tokens at the first step, every
timestamp token masked), a 448-token limit, prompt included, as milkit. Candidate scores
are float64 sums (openai's are float32). The decoder is run on the whole sequence at every
step (no cache): slow, and independent of any cache bookkeeping.

`hf`: `model.generate(num_beams=B)`, Hugging Face's own beam search (its beam scorer,
length_penalty 1.0, its early stopping), for comparison.

With --fp16-weights the weights are rounded to float16 and computed in float32, as milkit
computes fp16 packages with `--compute fp32`, so only the search rules differ.

Usage: beam_reference.py MODEL_DIR WAV... [--beam-size 5] [--patience P]
       [--length-penalty A] [--fp16-weights] [--no-hf]
Output: {"clip": stem, "openai": [tokens], "openai_sum_logprob": x, "hf": [tokens]}
(generated tokens, end-of-text excluded).
"""
import argparse
import json
import math
import os
import sys
import wave

import numpy as np
import torch
import transformers
from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

transformers.logging.set_verbosity_error()


def read_wav(path):
    with wave.open(path, "rb") as w:
        if w.getsampwidth() != 2 or w.getframerate() != 16000:
            sys.exit(f"{path}: expected 16-bit PCM at 16 kHz")
        x = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32)
        x = x.reshape(-1, w.getnchannels()).mean(axis=1)
    return x / 32768.0


class Rules:
    """milkit's logit filters without timestamps (`DecodingRules::apply`)."""

    def __init__(self, gen, vocab):
        self.eot = gen["eos_token_id"]
        self.suppress = gen.get("suppress_tokens") or []
        self.begin_suppress = gen.get("begin_suppress_tokens") or []
        self.ts_begin = gen["no_timestamps_token_id"] + 1
        forced = sorted(gen.get("forced_decoder_ids") or [], key=lambda p: p[0])
        self.prompt = [gen["decoder_start_token_id"]] + [t for _, t in forced]
        self.max_length = gen.get("max_length", 448)
        self.vocab = vocab

    def apply(self, logits, generated):
        logits[self.suppress] = -math.inf
        if not generated:
            logits[self.begin_suppress] = -math.inf
        logits[self.ts_begin:] = -math.inf


def last_logits(model, enc, seqs):
    ids = torch.tensor(seqs, dtype=torch.long)
    out = model.model.decoder(input_ids=ids, encoder_hidden_states=enc.expand(len(seqs), -1, -1))
    return model.proj_out(out.last_hidden_state[:, -1]).float()


def openai_beam(model, rules, enc, beam_size, patience, length_penalty):
    max_candidates = round(beam_size * (patience or 1.0))
    prompt = rules.prompt
    # openai starts from beam_size copies of the prompt; identical candidates collapse.
    tokens = [list(prompt) for _ in range(beam_size)]
    sums = [0.0] * beam_size
    finished = {}
    while True:
        logits = last_logits(model, enc, tokens)
        scores, sources = {}, {}
        for j, seq in enumerate(tokens):
            row = logits[j].clone()
            rules.apply(row, seq[len(prompt):])
            logprobs = torch.log_softmax(row.double(), dim=-1)
            lp, ids = logprobs.topk(beam_size + 1)
            for l, t in zip(lp.tolist(), ids.tolist()):
                cand = tuple(seq + [t])
                scores[cand] = sums[j] + l
                sources[cand] = j
        kept, newly = [], {}
        for cand in sorted(scores, key=scores.get, reverse=True):
            if cand[-1] == rules.eot:
                newly[cand] = scores[cand]
            else:
                kept.append(cand)
                if len(kept) == beam_size:
                    break
        for cand in sorted(newly, key=newly.get, reverse=True):
            if len(finished) >= max_candidates:
                break
            finished[cand] = newly[cand]
        tokens = [list(c) for c in kept]
        sums = [scores[c] for c in kept]
        if len(finished) >= max_candidates or len(tokens[0]) >= rules.max_length:
            break
    if len(finished) < beam_size:
        for j in sorted(range(len(sums)), key=lambda j: -sums[j]):
            finished[tuple(tokens[j] + [rules.eot])] = sums[j]
            if len(finished) >= beam_size:
                break

    def score(seq, s):
        n = len(seq) - len(prompt) - 1
        penalty = n if length_penalty is None else ((5 + n) / 6) ** length_penalty
        return s / penalty

    best = max(finished.items(), key=lambda kv: score(*kv))  # first on ties, as np.argmax
    return list(best[0][len(prompt):-1]), best[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("wavs", nargs="+")
    ap.add_argument("--beam-size", type=int, default=5)
    ap.add_argument("--patience", type=float)
    ap.add_argument("--length-penalty", type=float)
    ap.add_argument("--fp16-weights", action="store_true")
    ap.add_argument("--no-hf", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    model = WhisperForConditionalGeneration.from_pretrained(a.model, dtype=torch.float32).eval()
    if a.fp16_weights:
        model = model.half().float()
    fe = WhisperFeatureExtractor.from_pretrained(a.model)
    with open(os.path.join(a.model, "generation_config.json")) as f:
        gen = json.load(f)
    rules = Rules(gen, model.config.vocab_size)
    with torch.no_grad():
        for path in a.wavs:
            feats = fe(read_wav(path), sampling_rate=16000, return_tensors="pt").input_features
            enc = model.model.encoder(feats).last_hidden_state
            toks, s = openai_beam(model, rules, enc, a.beam_size, a.patience, a.length_penalty)
            row = {"clip": os.path.splitext(os.path.basename(path))[0], "openai": toks,
                   "openai_sum_logprob": s}
            if not a.no_hf:
                out = model.generate(feats, num_beams=a.beam_size, return_timestamps=False,
                                     max_new_tokens=rules.max_length - len(rules.prompt))
                seq = out.tolist()[0] if torch.is_tensor(out) else out["sequences"].tolist()[0]
                while seq and seq[0] in rules.prompt:
                    seq = seq[1:]
                row["hf"] = [t for t in seq if t != rules.eot]
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
