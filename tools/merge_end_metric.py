"""Copies the end-metric sensitivity curves of one `milkit calibrate` statistics file into
another: OUT = DST with every `milkit.calibration.end_metric*` metadata key of SRC added.

Use: python3 tools/merge_end_metric.py DST.st SRC.st OUT.st
(e.g. DST from `calibrate --component decoder --gram`, SRC from `--sensitivity-recipe`, both
on the same clips). Only the safetensors header is rewritten; tensor data and offsets are
unchanged. Standard library only."""
import json
import struct
import sys


def read(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8 : 8 + n]), b[8 + n :]


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: merge_end_metric.py DST.st SRC.st OUT.st")
    dst, data = read(sys.argv[1])
    src, _ = read(sys.argv[2])
    meta = dst.setdefault("__metadata__", {})
    added = 0
    for k, v in src.get("__metadata__", {}).items():
        if k.startswith("milkit.calibration.end_metric"):
            meta[k] = v
            added += 1
    if added == 0:
        sys.exit(f"{sys.argv[2]}: no end-metric curves to copy")
    h = json.dumps(dst, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(sys.argv[3], "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)
    print(f"{sys.argv[3]}: {added} end-metric keys copied")


main()
