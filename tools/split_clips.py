#!/usr/bin/env python3
"""Split the clips of ../shared/audio/more into calibrate / choose / report (docs/quality.md).

The rule, deterministic and independent of order or of clips added later: h = FNV-1a 64 of the
clip's path relative to `more/` ("FOLDER/FILE.wav", UTF-8); h mod 10 in 0-1 is `calibrate`
(statistics, and the held-back part of a quality search), 2-4 `choose` (comparing settings),
5-9 `report` (numbers in the docs, nothing tuned on them). No clip does two jobs.

Writes splits/more-{calibrate,choose,report}.jsonl: the manifest lines of every folder with
`audio` rewritten relative to splits/ (../../shared/audio/more/FOLDER/FILE: the fixtures
beside the repository, as MILKIT_FIXTURES defaults) and a `folder` field added; and
splits/more-SPLIT-en.jsonl, the English lines only (for English-only checkpoints).

    python3 tools/split_clips.py [--more ../shared/audio/more] [--out splits]
"""
import argparse
import json
import os


def fnv1a64(s):
    h = 0xCBF29CE484222325
    for b in s.encode("utf-8"):
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def split_of(rel):
    r = fnv1a64(rel) % 10
    return "calibrate" if r < 2 else "choose" if r < 5 else "report"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--more", default="../shared/audio/more")
    ap.add_argument("--out", default="splits")
    a = ap.parse_args()
    out = {"calibrate": [], "choose": [], "report": []}
    for folder in sorted(os.listdir(a.more)):
        m = os.path.join(a.more, folder, "manifest.jsonl")
        if not os.path.isfile(m):
            continue
        for line in open(m, encoding="utf-8"):
            if not line.strip():
                continue
            d = json.loads(line)
            rel = f"{folder}/{d['audio']}"
            d["audio"] = "../../shared/audio/more/" + rel
            d["folder"] = folder
            out[split_of(rel)].append(d)
    os.makedirs(a.out, exist_ok=True)
    for name in list(out):
        out[name + "-en"] = [d for d in out[name] if d.get("language") == "en"]
    for name, lines in out.items():
        tmp = os.path.join(a.out, f".more-{name}.jsonl.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for d in lines:
                f.write(json.dumps(d, ensure_ascii=False) + "\n")
        os.replace(tmp, os.path.join(a.out, f"more-{name}.jsonl"))
        by = {}
        for d in lines:
            by[d["folder"]] = by.get(d["folder"], 0) + 1
        print(name, len(lines), by)


if __name__ == "__main__":
    main()
