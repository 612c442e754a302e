#!/usr/bin/env python3
"""Per-folder tables from `milkit eval --against FP16 --manifest M --json` reports
(docs/recipes.md), and the size-against-quality picture as SVG.

Each argument is LABEL=BITS=REPORT.json (BITS the folder's bits per compressed weight, from
`milkit eval --models DIR`; 16 for fp16). Clips are grouped by the folder in their audio path
(`.../more/FOLDER/clip.wav`). Per group and over all clips it prints: clips, reference
words, fp16's and the candidate's corpus WER against the texts, their difference with a 95 %
paired bootstrap interval (clips resampled with replacement, 2000 resamples, seed 1), WER of
the candidate's transcripts against fp16's, mean next-token KL and top-1 agreement
(position-weighted) and QoI (share of clips not worse than fp16). A language with several
folders (the folder name's prefix before `_`) also gets a row over all of them.

A folder named by --fidelity-only (a language the model cannot transcribe, such as
whisper-base on Malayalam, where both WERs are over 100 % and their difference is noise)
keeps its fidelity columns and leaves its clips out of every WER column, "all" included.

    python3 tools/report_split.py [--svg OUT.svg --title T] [--fidelity-only FOLDER ...] LABEL=BITS=REPORT.json ...
"""
import argparse
import json
import os
import random


def group_of(audio):
    parts = audio.replace("\\", "/").split("/")
    return parts[-2] if len(parts) >= 2 else "."


def bootstrap(clips, n=2000, seed=1):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        b = c = w = 0
        for _ in range(len(clips)):
            k = clips[rng.randrange(len(clips))]
            b += k["baseline_errors"]
            c += k["candidate_errors"]
            w += k["reference_words"]
        out.append(100.0 * (c - b) / w if w else 0.0)
    out.sort()
    return out[round(0.025 * (n - 1))], out[round(0.975 * (n - 1))]


def summary(clips):
    refs = [c for c in clips if c.get("reference_words") is not None]
    pos = sum(c["positions"] for c in clips)
    s = {
        "clips": len(clips),
        "kl": sum(c["mean_kl"] * c["positions"] for c in clips) / pos,
        "top1": 100 * sum(c["top1_agreement"] * c["positions"] for c in clips) / pos,
        "vs_fp16": 100 * sum(c["errors_vs_baseline"] for c in clips)
        / max(1, sum(c["baseline_words"] for c in clips)),
    }
    if refs:
        w = sum(c["reference_words"] for c in refs)
        s["words"] = w
        s["fp16_wer"] = 100 * sum(c["baseline_errors"] for c in refs) / w
        s["wer"] = 100 * sum(c["candidate_errors"] for c in refs) / w
        s["delta"] = s["wer"] - s["fp16_wer"]
        s["ci"] = bootstrap(refs)
        s["qoi"] = 100 * sum(c["candidate_errors"] <= c["baseline_errors"] for c in refs) / len(refs)
    return s


def row(label, bits, group, s):
    if "words" in s:
        wer = (
            f"{s['words']} | {s['fp16_wer']:.2f} % | {s['wer']:.2f} % | "
            f"{s['delta']:+.2f} ({s['ci'][0]:+.2f} to {s['ci'][1]:+.2f}) | {s['qoi']:.1f} %"
        )
    else:
        wer = "— | — | — | — | —"
    return (
        f"| {label} | {bits} | {group} | {s['clips']} | {wer} | {s['vs_fp16']:.2f} % | "
        f"{s['kl']:.4f} | {s['top1']:.2f} % |"
    )


def svg(points, title, path):
    """points: (label, bits, delta, lo, hi, kl) of the 'all' group."""
    W, H, L, R, T, B = 640, 360, 60, 60, 40, 50
    xs = [p[1] for p in points]
    x0, x1 = 0.0, max(16.0, max(xs))
    ys = [v for p in points for v in (p[3], p[4], 0.0)]
    y0, y1 = min(ys) - 0.5, max(ys) + 0.5
    k1 = max(p[5] for p in points) * 1.1 or 1.0
    X = lambda x: L + (x - x0) / (x1 - x0) * (W - L - R)
    Y = lambda y: T + (y1 - y) / (y1 - y0) * (H - T - B)
    K = lambda k: T + (k1 - k) / k1 * (H - T - B)
    e = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
        f'<rect width="{W}" height="{H}" fill="white"/>',
        f'<text x="{W / 2}" y="18" text-anchor="middle" font-size="13">{title}</text>',
        f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
        f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>',
        f'<line x1="{W - R}" y1="{T}" x2="{W - R}" y2="{H - B}" stroke="#c60"/>',
        f'<line x1="{L}" y1="{Y(0)}" x2="{W - R}" y2="{Y(0)}" stroke="#999" stroke-dasharray="3,3"/>',
        f'<text x="{W / 2}" y="{H - 12}" text-anchor="middle">bits per compressed weight</text>',
        f'<text x="14" y="{T + (H - T - B) / 2}" transform="rotate(-90 14 {T + (H - T - B) / 2})" text-anchor="middle">WER − fp16 (points, 95 % CI)</text>',
        f'<text x="{W - 14}" y="{T + (H - T - B) / 2}" transform="rotate(90 {W - 14} {T + (H - T - B) / 2})" text-anchor="middle" fill="#c60">mean KL vs fp16 (nats)</text>',
    ]
    for b in (2, 4, 6, 8, 10, 12, 14, 16):
        e.append(f'<text x="{X(b)}" y="{H - B + 14}" text-anchor="middle">{b}</text>')
    for i in range(5):
        v = y0 + i * (y1 - y0) / 4
        e.append(f'<text x="{L - 4}" y="{Y(v) + 4}" text-anchor="end">{v:+.1f}</text>')
        k = i * k1 / 4
        e.append(f'<text x="{W - R + 4}" y="{K(k) + 4}" fill="#c60">{k:.3f}</text>')
    for label, bits, d, lo, hi, kl in sorted(points, key=lambda p: p[1]):
        e.append(f'<line x1="{X(bits)}" y1="{Y(lo)}" x2="{X(bits)}" y2="{Y(hi)}" stroke="#036"/>')
        e.append(f'<circle cx="{X(bits)}" cy="{Y(d)}" r="4" fill="#036"/>')
        e.append(f'<rect x="{X(bits) - 3}" y="{K(kl) - 3}" width="6" height="6" fill="#c60"/>')
        e.append(f'<text x="{X(bits) + 6}" y="{Y(d) - 6}">{label}</text>')
    e.append("</svg>")
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("\n".join(e) + "\n")
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--svg")
    ap.add_argument("--title", default="size against quality")
    ap.add_argument("--fidelity-only", action="append", default=[], metavar="FOLDER",
                    help="a clip folder whose WER is left out (fidelity columns only)")
    ap.add_argument("reports", nargs="+", help="LABEL=BITS=REPORT.json")
    a = ap.parse_args()
    print("| folder | bits | clips from | clips | words | WER fp16 | WER | Δ points (95 % CI) | QoI | WER vs fp16 output | mean KL | top-1 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    points = []
    for spec in a.reports:
        label, bits, path = spec.split("=", 2)
        clips = json.load(open(path, encoding="utf-8"))["clips"]
        for c in clips:
            if group_of(c["audio"]) in a.fidelity_only:
                c["reference_words"] = None
        groups = {}
        for c in clips:
            groups.setdefault(group_of(c["audio"]), []).append(c)
        for g in sorted(groups):
            print(row(label, bits, g, summary(groups[g])))
        # A language with several folders (`en_common_voice`, `en_ljspeech`, ...) also gets a
        # row of its own.
        langs = {}
        for g in groups:
            langs.setdefault(g.split("_")[0], []).append(g)
        for lang in sorted(langs):
            if len(langs[lang]) > 1:
                clips_of = [c for g in langs[lang] for c in groups[g]]
                print(row(label, bits, f"{lang}_* ({len(langs[lang])} folders)", summary(clips_of)))
        s = summary(clips)
        all_label = "**all**"
        if a.fidelity_only:
            all_label += " (WER without " + ", ".join(sorted(a.fidelity_only)) + ")"
        print(row(label, bits, all_label, s))
        if "delta" in s:
            points.append((label, float(bits), s["delta"], s["ci"][0], s["ci"][1], s["kl"]))
    if a.svg and points:
        svg(points, a.title, a.svg)


if __name__ == "__main__":
    main()
