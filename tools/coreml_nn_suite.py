#!/usr/bin/env python3
"""coremltools' own NeuralNetwork tests, with milkit standing in for Core ML.

coremltools ships them in its wheel (`coremltools/test/neural_network/`): each builds a
NeuralNetwork with its builder, predicts, and compares with numpy. Elsewhere than on a Mac
they skip their predictions; with the plugin in tests/coremltools_suite (milkit_coreml.py)
they run through the `milkit` module, which --python must have installed (`pip install .`).

  coreml_nn_suite.py run   [--python PY] [--sample N] [--jobs J] [--report FILE]
        runs the tests (one in N, by a hash of the test id) and writes one JSON line per test
  coreml_nn_suite.py check [--report FILE]
        prints the counts and every failure with its cause; exits 1 when a test failed for a
        cause not listed below (wrong numbers, a crash): a regression

docs/conformance.md (section "NeuralNetwork models") holds the numbers of the whole run.
"""

import argparse
import collections
import json
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGIN_DIR = os.path.join(REPO, "tests", "coremltools_suite")
DEFAULT_REPORT = os.path.join(REPO, "target", "coreml-nn-suite", "report.jsonl")
FILES = ["test_numpy_nn_layers.py", "test_simple_nn_inference.py", "test_nn_builder.py",
         "test_neural_networks.py", "test_quantization.py"]

# Causes a failure may have without being a regression: what milkit refuses by name, and
# what the test environment lacks. Everything else fails the check.
KNOWN = [
    (r"is not translated yet", "a layer type milkit does not translate yet, refused by name"),
    (r"flexible NeuralNetwork inputs are not run yet",
     "an input of several shapes, refused by name"),
    (r"scikit-learn is required", "the test's k-means needs scikit-learn, not installed here"),
    (r"TestSimple.*test_topk|NewLayersSimpleTest::test_topk",
     "top-k of tied integer data: the test's reference is numpy's default argsort, which is "
     "not stable (numpy 2.2 on this CPU orders ties otherwise in 1081 of 2000 random "
     "length-10 vectors); milkit gives the lower index first among equal values, as a stable "
     "sort does; the values agree"),
    (r"whose (k is|repetitions are) an input",
     "top-k or tile with a count given as an input, refused by name"),
]


def suite_dir(python):
    out = subprocess.run(
        [python, "-c", "import coremltools, os; print(os.path.dirname(coremltools.__file__))"],
        check=True, capture_output=True, text=True)
    return os.path.join(out.stdout.strip(), "test", "neural_network")


def cause(rec):
    text = rec["id"] + " :: " + rec["message"]
    for pattern, why in KNOWN:
        if re.search(pattern, text):
            return why
    return None


def run(args):
    os.makedirs(os.path.dirname(os.path.abspath(args.report)), exist_ok=True)
    if os.path.exists(args.report):
        os.remove(args.report)
    base = suite_dir(args.python)
    env = dict(os.environ, PYTHONPATH=PLUGIN_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [args.python, "-m", "pytest", "-q", "-p", "milkit_coreml", "-p", "no:cacheprovider",
           "--milkit-sample", str(args.sample), "--milkit-report", args.report]
    if args.jobs > 1:
        cmd += ["-n", str(args.jobs)]
    cmd += [os.path.join(base, f) for f in FILES]
    # pytest's exit status says some test failed; `check` judges the failures.
    subprocess.run(cmd, env=env, cwd=REPO)
    return 0


def check(args):
    recs = [json.loads(line) for line in open(args.report)]
    counts = collections.Counter(r["outcome"] for r in recs)
    predicted = [r for r in recs if r["predicted"]]
    print(f"{len(recs)} tests: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    print(f"{len(predicted)} reached a prediction: "
          f"{sum(r['outcome'] in ('passed', 'xpassed') for r in predicted)} passed")
    bad = 0
    by_cause = collections.Counter()
    for r in recs:
        if r["outcome"] != "failed":
            continue
        why = cause(r)
        if why is None:
            bad += 1
            print(f"REGRESSION {r['id']}: {r['message'][:300]}")
        else:
            by_cause[why] += 1
    for why, n in by_cause.most_common():
        print(f"{n:4d}  {why}")
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--python", default=sys.executable)
    r.add_argument("--sample", type=int, default=1)
    r.add_argument("--jobs", type=int, default=2)
    r.add_argument("--report", default=DEFAULT_REPORT)
    c = sub.add_parser("check")
    c.add_argument("--report", default=DEFAULT_REPORT)
    args = ap.parse_args()
    sys.exit(run(args) if args.cmd == "run" else check(args))


if __name__ == "__main__":
    main()
