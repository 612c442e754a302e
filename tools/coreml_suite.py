#!/usr/bin/env python3
"""coremltools' own MIL op test suite, with milkit standing in for Core ML.

coremltools ships its op tests in its wheel (`coremltools/converters/mil/mil/ops/tests/`,
one folder per opset). On macOS each test converts a small program and compares Core ML's
prediction with the test's expected numbers; elsewhere the predictions are skipped. With the
plugin in tests/coremltools_suite (milkit_coreml.py) they run through the `milkit` module
(`milkit.use_with_coremltools()`), which --python must have installed (`pip install .`).

  coreml_suite.py run   [--sample N] [--jobs J] [--report FILE] [PATH-FILTER ...]
        runs the suite (mlprogram target, fp16 and fp32) and writes one JSON line per test
  coreml_suite.py table [--report FILE]
        rewrites the generated part of docs/conformance.md from a report of the whole suite
  coreml_suite.py check [--report FILE]
        exit 1 when a test that reached a prediction failed and docs/conformance.md does not
        list it with its cause

The sample keeps the tests whose sha256(id) is 0 modulo N (the same tests on every machine).
"""

import argparse
import collections
import datetime
import json
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGIN_DIR = os.path.join(REPO, "tests", "coremltools_suite")
DOC = os.path.join(REPO, "docs", "conformance.md")
DEFAULT_REPORT = os.path.join(REPO, "target", "coreml-suite", "report.jsonl")
BEGIN, END = "<!-- generated: begin -->", "<!-- generated: end -->"

# "test id :: failure message" → a cause; the first pattern that matches names it.
CAUSES = [
    (r"test_compression.py::.*precision='fp32'.*(lut|data)_dtype=fp16\].*AssertionError",
     "fp16 data in an fp32 program: coremltools' expectation is rounded to fp16, the program "
     "computes in fp32 (checked on constexpr_lut_to_sparse; coremltools' own CI runs fp16 only)"),
    (r"precision='fp32'.*(dtype=<class 'numpy\.float16'>|_dtype=\([^)]*numpy\.float16).*"
     r":: AssertionError", "FP32_FP16_DATA"),
    (r"sampling_mode `UNALIGN_CORNERS` is not supported",
     "crop_resize with UNALIGN_CORNERS: coremltools 9 does not define its in-box grid, and the "
     "one test's expectation (an inverted normalized box [2, 2, 1, 1] giving the whole image's "
     "resize) does not determine it; refused by name"),
    (r"fill with a shape of unknown rank", "fill with a run-time shape of unknown length: the "
     "output's rank is unknown at load, and milkit's tensor types have a fixed rank"),
    (r"TestCropResize::test_builder_to_backend_ios1[67]\[.*precision='fp32'.*AssertionError",
     "coremltools' expectation is written to 3 decimals (7.899 where the exact bilinear value "
     "is 7.9, 1e-3 off): within fp16 tolerances, outside fp32 ones"),
    (r"TestResample::test_builder_to_backend_smoke\[.*precision='fp32'.*assert 0 == 2",
     "the test counts the fp16 casts coremltools inserts at fp16 precision (none at fp32): "
     "an assertion on the converted program, not on milkit's prediction"),
    (r"TestNormalizationLocalResponseNorm::test_builder_to_backend_smoke\[.*precision='fp32'",
     "local_response_norm: the test's hard-coded numbers divide each element by "
     "(k + alpha/size * x^2)^beta, its own square alone, for size 2 and for size 3; milkit sums "
     "the squares of `size` neighbouring channels, as PyTorch does (the stress tests compare "
     "with PyTorch at every size and pass); up to 1.1e-2 apart (1.8e-3 relative), within fp16 "
     "tolerances"),
    (r"precision='fp32'.*is declared tensor<fp16, [^>]*> but infers to tensor<fp32",
     "coremltools writes a contradictory program at fp32 precision for iOS15: the fp16 input "
     "is widened to fp32 with its cast to fp16 removed, and the op's output still declared "
     "fp16 (batch_norm of an fp32 x declared fp16); milkit refuses the contradiction"),
    (r"specification version( [1-5] is not|\s*$)", "a NeuralNetwork model (the test converts to "
     "neuralnetwork); milkit runs ML Programs"),
    (r"description says .* program says", "flexible input shape refused at load"),
    (r"floats are not converted to integers", "float data for an integer input refused"),
    (r"has no type", "image input (ImageType)"),
    (r"not supported", "op variant not supported"),
    (r"Not equal to tolerance|Mismatched elements", "wrong numbers"),
    (r"expected shape .* != actual shape|output shape", "wrong output shape"),
    (r"milkit", "not yet diagnosed: milkit refuses the model"),
    (r"AssertionError", "not yet diagnosed: wrong numbers or shape"),
]


def suite_dir(python):
    out = subprocess.run(
        [python, "-c", "import coremltools, os; print(os.path.dirname(coremltools.__file__))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip().splitlines()[-1]
    return os.path.join(out, "converters", "mil", "mil", "ops", "tests")


def need_module(python):
    """Exits with the reason when `python` cannot import the milkit module."""
    r = subprocess.run([python, "-c", "import milkit"], capture_output=True, text=True)
    if r.returncode != 0:
        why = (r.stderr.strip().splitlines() or ["?"])[-1]
        sys.exit(f"{python} cannot import milkit ({why}): install the wheel into it "
                 f"(`{python} -m pip install .` in {REPO}), or pass --python")


def run(args):
    need_module(args.python)
    tests = suite_dir(args.python)
    paths = [os.path.join(tests, p) for p in args.paths] or [tests]
    os.makedirs(os.path.dirname(os.path.abspath(args.report)), exist_ok=True)
    if os.path.exists(args.report):
        os.remove(args.report)
    env = dict(os.environ)
    env["PYTHONPATH"] = PLUGIN_DIR + os.pathsep + env.get("PYTHONPATH", "")
    env["PYMIL_TEST_TARGETS"] = "mlprogram"
    env["INCLUDE_MIL_FP32_UNIT_TESTS"] = "1"
    cmd = [args.python, "-m", "pytest", "-p", "milkit_coreml", "-p", "no:cacheprovider",
           "-q", "--no-header", "-rN", "-W", "ignore", "--tb=no", "--continue-on-collection-errors",
           "--milkit-sample", str(args.sample), "--milkit-report", os.path.abspath(args.report),
           "--milkit-compute", args.compute]
    if args.jobs > 1:
        cmd += ["-n", str(args.jobs)]
    cmd += paths
    print("+", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, env=env, cwd=REPO)
    # pytest's exit code 1 means "some tests failed": `check` judges those.
    if r.returncode not in (0, 1):
        sys.exit(f"pytest exited {r.returncode}")
    summary(read_report(args.report))


def read_report(path):
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


# The fp32 variant of a test that puts fp16 data in its program (a float16 dtype parameter).
FP32_FP16_DATA = (
    "fp32 variant of a test whose program holds fp16 data (a float16 dtype parameter): the op "
    "computes in fp16, or from fp16 weights, and is held to fp32 tolerances (atol 1e-4, rtol "
    "1e-5) against an expectation computed in fp32 from the unrounded weights. "
    "`tools/fp32_evidence.py` recomputes such tests in float64 from the program's own values: "
    "milkit is within 0.5 ulp of that result in the op's dtype, the exact result rounded to "
    "fp16 already fails the tolerance (rnn, conv_transpose), and the expectation is off by up "
    "to 12 times it (docs/conformance.md, fp32 variants); coremltools' own CI runs fp16 "
    "variants only")
# A failing fp32 variant whose fp16 variant (the same test and parameters) passes, and that
# no cause above explains.
FP32_TWIN = ("not yet diagnosed: fp32 variant of a test whose fp16 variant passes")


def cause_of(test_id, message):
    for pattern, cause in CAUSES:
        if re.search(pattern, f"{test_id} :: {message}"):
            return FP32_FP16_DATA if cause == "FP32_FP16_DATA" else cause
    return "not yet diagnosed"


PASSED = ("passed", "xpassed")


def reaches(r):
    """A test that called `predict`, or whose model milkit refused to load: on a Mac, Core ML
    loads the model when coremltools' `MLModel` is made, so such a test reaches Core ML."""
    return r["predicted"] or "Unable to load the model" in (r.get("message") or "")


def failed(r):
    """A test that reached a prediction and failed. coremltools' xfail marks (known Core ML
    bugs) are neither counted as failures nor as tests that reached a prediction."""
    return reaches(r) and r["outcome"] not in PASSED and r["outcome"] != "xfailed"


def counts(records):
    reached = [r for r in records if reaches(r) and r["outcome"] != "xfailed"]
    passed = sum(r["outcome"] in PASSED for r in reached)
    return len(records), len(reached), passed


def fp16_only(records):
    """The records coremltools runs without INCLUDE_MIL_FP32_UNIT_TESTS=1: all but the
    mlprogram fp32 variants."""
    return [r for r in records if "precision='fp32'" not in r["id"]]


def summary(records):
    total, reached, passed = counts(records)
    pct = 100.0 * passed / reached if reached else 0.0
    _, r16, p16 = counts(fp16_only(records))
    print(f"coremltools suite: {total} tests, {reached} reached a prediction, "
          f"{passed} of them passed ({pct:.1f} %); without the fp32 variants "
          f"{p16} of {r16} ({100.0 * p16 / max(r16, 1):.1f} %)")


def file_of(test_id):
    return test_id.split("::")[0]


def known_failures():
    """docs/conformance.md's known failures: test id → cause. The section groups them by
    cause: a `### ` heading, the cause's text as one paragraph, then a `` - `test id` `` line
    per test."""
    known = {}
    if not os.path.exists(DOC):
        return known
    section, cause = False, None
    with open(DOC) as fh:
        for line in fh:
            line = line.rstrip("\n")
            if line.startswith("## "):
                section = line.strip() == "## Known failures"
                continue
            if not section:
                continue
            if line.startswith("### "):
                cause = None
                continue
            m = re.match(r"^- `([^`]+)`\s*$", line)
            if m and cause:
                known[m.group(1)] = cause
            elif line.strip() and cause is None and not line.startswith(("- ", "<!--")):
                cause = line.strip()
    return known


def rerun(args, ids):
    """Runs the tests `ids` once more; returns those that failed again."""
    tests = suite_dir(args.python)
    report = args.report + ".rerun"
    if os.path.exists(report):
        os.remove(report)
    env = dict(os.environ)
    env["PYTHONPATH"] = PLUGIN_DIR + os.pathsep + env.get("PYTHONPATH", "")
    env["PYMIL_TEST_TARGETS"] = "mlprogram"
    env["INCLUDE_MIL_FP32_UNIT_TESTS"] = "1"
    script = ("import sys, pytest; sys.exit(pytest.main(['-p', 'milkit_coreml', '-p', "
              "'no:cacheprovider', '-q', '--tb=no', '-W', 'ignore', '--milkit-report', "
              "sys.argv[1]] + sys.argv[2:]))")
    subprocess.run([args.python, "-c", script, report] + [os.path.join(tests, i) for i in ids],
                   env=env, cwd=REPO, capture_output=True)
    if not os.path.exists(report):
        return set(ids)
    seen = {r["id"]: r for r in read_report(report)}
    return {i for i in ids if i not in seen or failed(seen[i])}


def check(args):
    records = read_report(args.report)
    summary(records)
    known = known_failures()
    new = [r for r in records if failed(r) and r["id"] not in known]
    if new and args.rerun:
        # Some tests draw PyTorch weights unseeded, and a few fp32 variants sit one fp16 ulp
        # from their expectation: a failure counts only when it fails again.
        again = rerun(args, [r["id"] for r in new])
        for r in new:
            if r["id"] not in again:
                print(f"passed when run again: {r['id']}")
        new = [r for r in new if r["id"] in again]
    for r in new:
        print(f"NEW FAILURE {r['id']}: {r['message']}")
    if new:
        sys.exit(f"{len(new)} failing tests are not listed in docs/conformance.md")
    fixed = [r["id"] for r in records if r["id"] in known and r["outcome"] in PASSED]
    for t in fixed:
        print(f"now passes (remove it from docs/conformance.md): {t}")


def table(args):
    records = read_report(args.report)
    total, reached, passed = counts(records)
    _, r16, p16 = counts(fp16_only(records))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=REPO).stdout.strip()
    today = datetime.date.today().isoformat()
    per_file = collections.OrderedDict()
    for r in sorted(records, key=lambda r: r["id"]):
        f = per_file.setdefault(file_of(r["id"]), collections.Counter())
        f["tests"] += 1
        if reaches(r) and r["outcome"] != "xfailed":
            f["reached"] += 1
            f["passed" if r["outcome"] in PASSED else "failed"] += 1
    causes = collections.Counter()
    failing = []
    known = known_failures()
    outcome = {r["id"]: r["outcome"] for r in records}
    for r in records:
        if failed(r):
            c = cause_of(r["id"], r["message"])
            twin = r["id"].replace("precision='fp32'", "precision='fp16'")
            if c.startswith("not yet diagnosed") and twin != r["id"] and outcome.get(twin) == "passed":
                c = FP32_TWIN
            c = known.get(r["id"], c) if c.startswith("not yet diagnosed") else c
            causes[c] += 1
            failing.append((r["id"], c))
    which = "the whole suite" if args.sample == 1 else f"the one-in-{args.sample} sample"
    flag = "" if args.sample == 1 else f" --sample {args.sample}"
    lines = [BEGIN, "",
             f"Measured {today} at commit `{commit}` with coremltools 9.0 on {which} "
             f"(`python3 tools/coreml_suite.py run{flag} && "
             f"python3 tools/coreml_suite.py table{flag}`).",
             "",
             f"**{passed} of {reached} tests that reach a prediction pass "
             f"({100.0 * passed / max(reached, 1):.2f} %)**; {total} tests ran in all "
             f"(the others check conversion or type inference only, or skip as on macOS); "
             f"{sum(r['outcome'] == 'xfailed' for r in records)} more are marked by coremltools "
             f"as expected to fail (known Core ML bugs) and failed, and are not counted.",
             "",
             "Without the fp32 variants, as coremltools runs its suite unless "
             f"`INCLUDE_MIL_FP32_UNIT_TESTS=1`: **{p16} of {r16} pass "
             f"({100.0 * p16 / max(r16, 1):.2f} %)**.",
             "", "### Per test file", "",
             "| file | tests | reached a prediction | passed | failed |", "|---|---|---|---|---|"]
    for f, c in per_file.items():
        lines.append(f"| `{f}` | {c['tests']} | {c['reached']} | {c['passed']} | {c['failed']} |")
    order = [c for c, _ in causes.most_common()]
    lines += ["", "### Failures by cause", "", "| # | cause | tests |", "|---|---|---|"]
    for i, c in enumerate(order, 1):
        lines.append(f"| {i} | {c} | {causes[c]} |")
    lines += ["", "## Known failures", "",
              "Every test that reaches a prediction and fails, under its cause (numbered as in "
              "the table above); `tools/coreml_suite.py check` fails on any other."]
    for i, c in enumerate(order, 1):
        ids = sorted(t for t, tc in failing if tc == c)
        lines += ["", f"### {i}. {len(ids)} test{'s' if len(ids) != 1 else ''}", "", c, ""]
        lines += [f"- `{t}`" for t in ids]
    lines += ["", END]
    with open(DOC) as fh:
        doc = fh.read()
    head, _, rest = doc.partition(BEGIN)
    _, _, tail = rest.partition(END)
    with open(DOC, "w") as fh:
        fh.write(head + "\n".join(lines) + tail)
    summary(records)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("command", choices=["run", "table", "check"])
    p.add_argument("paths", nargs="*", help="test files or folders under the suite (run only)")
    p.add_argument("--sample", type=int, default=1,
                   help="keep one test in N (run); the sample the report holds (table)")
    p.add_argument("--jobs", type=int, default=1, help="pytest-xdist workers (run)")
    p.add_argument("--compute", default="package", choices=("package", "fp32"),
                   help="run: milkit computes in the program's types (default), or fp16 "
                        "programs in fp32")
    p.add_argument("--report", default=DEFAULT_REPORT)
    p.add_argument("--python", default=os.environ.get("MILKIT_PYTHON", sys.executable))
    p.add_argument("--rerun", action="store_true",
                   help="run an unlisted failure once more; it counts if it fails again (check)")
    args = p.parse_args()
    {"run": run, "table": table, "check": check}[args.command](args)


if __name__ == "__main__":
    main()
