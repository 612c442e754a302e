#!/usr/bin/env python3
"""Times coremltools' weight compression of one .mlpackage for `milkit bench compress`.

Usage: ct_compress_bench.py PACKAGE [--methods lut4-kmeans-g16,int4-block32]

For each method: load the package (skip_model_load: no Core ML runtime on Linux), run
coremltools.optimize.coreml.palettize_weights (OpPalettizerConfig mode kmeans, nbits 4,
per_grouped_channel, group_size 16, default single k-means worker) or linear_quantize_weights
(OpLinearQuantizerConfig linear_symmetric int4 per_block block_size 32), then save. Prints one
JSON line: a list of {method, version, ops, pass_s, pass_cpu_s, end_to_end_s,
weight_bin_after}, where
pass_s times the compression call alone and end_to_end_s adds loading and saving.

coremltools' k-means hands groups under 10,000 values to scikit-learn, so the Python needs
scikit-learn besides coremltools (e.g. PYTHONPATH pointing at a `pip install --target` dir).
"""

import argparse
import json
import os
import sys
import tempfile
import time


def config(cto, method):
    if method == "lut4-kmeans-g16":
        op = cto.OpPalettizerConfig(
            mode="kmeans", nbits=4, granularity="per_grouped_channel", group_size=16
        )
        return cto.palettize_weights, cto.OptimizationConfig(global_config=op), "constexpr_lut_to_dense"
    if method == "int4-block32":
        op = cto.OpLinearQuantizerConfig(
            mode="linear_symmetric", dtype="int4", granularity="per_block", block_size=32
        )
        return (
            cto.linear_quantize_weights,
            cto.OptimizationConfig(global_config=op),
            "constexpr_blockwise_shift_scale",
        )
    raise SystemExit(f"unknown method {method!r} (lut4-kmeans-g16, int4-block32)")


def count_ops(model, op_type):
    # The compressed model keeps its MIL program; count the emitted constexpr ops.
    prog = getattr(model, "_mil_program", None)
    if prog is None:
        return None
    return sum(len(f.find_ops(op_type=op_type)) for f in prog.functions.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("package")
    ap.add_argument("--methods", default="lut4-kmeans-g16,int4-block32")
    args = ap.parse_args()

    import coremltools as ct
    import coremltools.optimize.coreml as cto

    results = []
    for method in args.methods.split(","):
        fn, cfg, op_type = config(cto, method)
        t0 = time.perf_counter()
        model = ct.models.MLModel(args.package, skip_model_load=True)
        t1, c1 = time.perf_counter(), time.process_time()
        out = fn(model, cfg)
        t2, c2 = time.perf_counter(), time.process_time()
        with tempfile.TemporaryDirectory() as d:
            dst = os.path.join(d, "out.mlpackage")
            out.save(dst)
            t3 = time.perf_counter()
            size = os.path.getsize(os.path.join(dst, "Data/com.apple.CoreML/weights/weight.bin"))
        results.append(
            {
                "method": method,
                "version": ct.__version__,
                "ops": count_ops(out, op_type),
                "pass_s": t2 - t1,
                "pass_cpu_s": c2 - c1,
                "end_to_end_s": t3 - t0,
                "weight_bin_after": size,
            }
        )
        print(f"coremltools {method}: {t2 - t1:.2f} s", file=sys.stderr)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
