"""Overhead of the Python module's predict against the Rust library and `milkit run`
(docs/python.md): python tools/python_overhead.py TextDecoder.mlpackage, with the python of
a venv holding the milkit wheel; the fixtures from $MILKIT_FIXTURES (default ../shared)."""

import os, re, statistics, subprocess, sys, tempfile, time
import numpy as np
import milkit

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
from conftest import fixtures, read_safetensors  # noqa: E402

MILKIT = os.path.join(os.path.dirname(sys.executable), "milkit")

def inputs_for(model, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for name, f in model.input_description.items():
        out[name] = ((rng.standard_normal(f.shape) * 0.1).astype(f.dtype)
                     if f.dtype.startswith("float") else np.zeros(f.shape, dtype=f.dtype))
    return out

def bench(name, pkg, inputs, n, nproc, alternate=None):
    m = milkit.MLModel(pkg)
    st = m.make_state() if len(m.state_description) else None
    m.predict(inputs, state=st)
    py = []
    for k in range(n):
        x = alternate if (alternate is not None and k % 2) else inputs
        t0 = time.perf_counter(); m.predict(x, state=st); py.append(time.perf_counter() - t0)
    d = tempfile.mkdtemp()
    args = []
    for k, (nm, v) in enumerate(inputs.items()):
        f = os.path.join(d, f"in{k}.npy"); np.save(f, v); args += ["--input", f"{nm}={f}"]
    # Alternating inputs on both sides: the library takes each input's files in turn.
    turns = []
    if alternate is not None:
        for k, (nm, v) in enumerate(alternate.items()):
            f = os.path.join(d, f"alt{k}.npy"); np.save(f, v); turns += ["--input", f"{nm}={f}"]
    r = subprocess.run([MILKIT, "run", pkg, "--out", d + "/o", "--quiet", "--repeat", str(n + 1), "--profile", *args, *turns],
                       capture_output=True, text=True, check=True)
    lib = [float(x) / 1e3 for x in re.findall(r"prediction (\d+): ([0-9.]+) ms", r.stderr) for x in [x[1]]][1:]
    proc = []
    for _ in range(nproc):
        t0 = time.perf_counter()
        r = subprocess.run([MILKIT, "run", pkg, "--out", d + "/p", "--quiet", "--profile", *args],
                           check=True, capture_output=True, text=True)
        proc.append(time.perf_counter() - t0)
    med = lambda v: statistics.median(v) * 1e3
    print(f"| {name} | {med(py):.2f} | {med(lib):.2f} | {med(py) - med(lib):+.2f} | {med(proc):.0f} |")

print("| model | Python predict, median ms | library predict (`milkit run --repeat --profile`), median ms | Python − library | `milkit run` process, median ms |")
print("|---|---|---|---|---|")
bench("tiny.en TextDecoder step (stateful, milkit)", sys.argv[1], inputs_for(milkit.MLModel(sys.argv[1])), 100, 20)
mel = read_safetensors(os.path.join(fixtures(), "reference", "tiny.en-jfk.safetensors"), "input_features")
bench("tiny.en encoder fp16 (coremltools)", os.path.join(fixtures(), "coremltools", "tiny.en-encoder-fp16.mlpackage"), {"logmel_data": mel}, 100, 15,
      alternate={"logmel_data": (mel * 0.99).astype(np.float32)})
