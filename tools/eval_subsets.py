#!/usr/bin/env python3
"""Aggregate `milkit eval --json` reports over a subset of their clips (docs/quality.md).

A report covers every clip of its manifest; to compare two calibrations on the clips both hold
out, or to show the clips newly held out, the same aggregates are needed over part of them.
Each JSON file is either an `eval --against BASE --json` report (per clip: positions, mean_kl,
top1_agreement, errors_vs_baseline, baseline_words, candidate_wer, baseline_wer,
encoder_psnr_db) or an `eval --manifest M --json` report (per clip: errors, words). For the
clips whose audio path contains PATTERN, for the others and for all, it prints what milkit
prints overall: mean KL and top-1 weighted by positions, WER vs the baseline output as summed
errors over summed words, QoI as the share of clips not worse than the baseline, encoder PSNR
as the mean over clips; WER as summed errors over summed words.

    python3 tools/eval_subsets.py --match _000 DIR.rep.json DIR.wer.json ...
"""
import argparse
import json


def dense(clips):
    pos = sum(c["positions"] for c in clips)
    psnr = [c["encoder_psnr_db"] for c in clips if c.get("encoder_psnr_db") is not None]
    out = (
        f"KL {sum(c['mean_kl'] * c['positions'] for c in clips) / pos:.4f}  "
        f"top-1 {100 * sum(c['top1_agreement'] * c['positions'] for c in clips) / pos:.2f} %  "
        f"WER vs baseline output {100 * sum(c['errors_vs_baseline'] for c in clips) / sum(c['baseline_words'] for c in clips):.2f} % "
        f"({sum(c['errors_vs_baseline'] for c in clips)}/{sum(c['baseline_words'] for c in clips)})  "
        f"QoI {100 * sum(c['candidate_wer'] <= c['baseline_wer'] for c in clips) / len(clips):.1f} %  "
        f"positions {pos}"
    )
    if len(psnr) == len(clips):
        out += f"  encoder PSNR {sum(psnr) / len(psnr):.2f} dB"
    return out


def wer(clips):
    e, w = sum(c["errors"] for c in clips), sum(c["words"] for c in clips)
    return f"WER {100 * e / w:.2f} % ({e}/{w})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--match", required=True, help="substring of the audio path selecting the subset")
    ap.add_argument("reports", nargs="+")
    a = ap.parse_args()
    for f in a.reports:
        clips = json.load(open(f))["clips"]
        kind = dense if clips and "positions" in clips[0] else wer
        parts = [
            ("all", clips),
            (f"*{a.match}*", [c for c in clips if a.match in c["audio"]]),
            ("others", [c for c in clips if a.match not in c["audio"]]),
        ]
        print(f)
        for name, sel in parts:
            if sel:
                print(f"  {name:10s} {len(sel):3d} clips  {kind(sel)}")


if __name__ == "__main__":
    main()
