#!/usr/bin/env python3
"""Outlier decomposition screened on weight error before building it (docs/quality.md).

For every 2-D encoder weight of a Hugging Face Whisper checkpoint this compares, per group of
16 output rows sharing one table (the encoder recipe's granularity):

  * LUT4: plain 1-D k-means with 16 entries over the whole weight;
  * outlier decomposition at t sigma: the elements with |w - mean| > t * std kept exactly as
    an iOS18 sparse tensor (a uint1 mask over every element plus the fp16 values: 1 + 16 p
    bits per weight for an outlier share p), the rest palettized by k-means with 8 entries.

It prints each weight's relative RMS error ||W - Q|| / ||W|| and bits per weight (tables
included), then the element-weighted means. Plain k-means on both sides: the calibrated
importance weighting of `milkit compress` would move both alike.

    python3 tools/outlier_prescreen.py MODEL/model.safetensors
"""
import json
import struct
import sys

import numpy as np


def tensors(path):
    f = open(path, "rb")
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    base = 8 + n
    dtypes = {"F32": np.float32, "F16": np.float16}

    def load(name):
        h = header[name]
        a, b = h["data_offsets"]
        f.seek(base + a)
        raw = np.frombuffer(f.read(b - a), dtype=dtypes[h["dtype"]])
        return raw.astype(np.float64).reshape(h["shape"])

    return header, load


def kmeans_1d(v, k, iters=30):
    """Lloyd's iterations from quantile seeds; returns every value replaced by its centroid."""
    c = np.quantile(v, (np.arange(k) + 0.5) / k)
    for _ in range(iters):
        idx = np.searchsorted((c[1:] + c[:-1]) / 2, v)
        s = np.bincount(idx, v, k)
        m = np.bincount(idx, None, k)
        nc = np.sort(np.where(m > 0, s / np.maximum(m, 1), c))
        if np.allclose(nc, c):
            break
        c = nc
    return c[np.searchsorted((c[1:] + c[:-1]) / 2, v)]


def palettize(w, k, group=16, exact=None):
    q = w.copy()
    for r in range(0, w.shape[0], group):
        blk = w[r : r + group]
        if exact is None:
            q[r : r + group] = kmeans_1d(blk.ravel(), k).reshape(blk.shape)
        else:
            keep = ~exact[r : r + group]
            out = blk.copy()
            if keep.any():
                out[keep] = kmeans_1d(blk[keep], k)
            q[r : r + group] = out
    return q


def rel(w, q):
    return float(np.sqrt(((w - q) ** 2).sum() / (w**2).sum()))


def main():
    header, load = tensors(sys.argv[1])
    names = sorted(
        k
        for k in header
        if k.startswith("model.encoder.layers")
        and k.endswith("weight")
        and len(header[k]["shape"]) == 2
    )
    rows = {}
    for name in names:
        w = load(name)
        table_bits = lambda k: k * 16 / (16 * w.shape[1])
        cells = [("LUT4", rel(w, palettize(w, 16)), 4 + table_bits(16))]
        for t in (3.0, 2.5, 2.0):
            exact = np.abs(w - w.mean()) > t * w.std()
            p = float(exact.mean())
            cells.append(
                (f"OD {t}σ", rel(w, palettize(w, 8, exact=exact)), 3 + 1 + 16 * p + table_bits(8))
            )
        print(name, " | ".join(f"{n}: rel {e:.4f} at {b:.3f} bits" for n, e, b in cells))
        for n, e, b in cells:
            rows.setdefault(n, []).append((e, b, w.size))
    print("| method | bits per weight | relative RMS error |")
    print("|---|---|---|")
    for n, v in rows.items():
        total = sum(s for *_, s in v)
        e = sum(e * s for e, _, s in v) / total
        b = sum(b * s for _, b, s in v) / total
        print(f"| {n} | {b:.3f} | {e:.4f} |")


if __name__ == "__main__":
    main()
