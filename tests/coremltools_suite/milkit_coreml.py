"""milkit standing in for Core ML inside coremltools, off macOS.

A pytest plugin (``pytest -p milkit_coreml``) and a plain hook (``install()``) over the
installed ``milkit`` module (the wheel: ``pip install .`` from the repository):
``milkit.use_with_coremltools()`` gives coremltools' ``MLModel`` a model proxy that predicts
with milkit's runtime in this process and makes coremltools' platform checks answer as on
macOS 15, so that its own op tests take the path they take on a Mac (convert, predict,
compare with their expected numbers) instead of skipping every prediction.

The plugin also
- keeps one test in ``--milkit-sample N`` (by a hash of the test id, so the sample is the
  same on every machine and every run);
- records whether each test reached a prediction;
- writes one JSON line per test to ``--milkit-report FILE``: the id, the outcome, whether
  the test reached a prediction, and the first line of the failure.
"""

import hashlib
import json
import random
import sys

import numpy as np
import pytest

# Set while a test runs: whether a prediction was asked for.
_REACHED = {"predict": False}


def install(compute="package"):
    """Makes coremltools, in this process, predict through milkit as if on macOS (computing
    as ``compute`` says), counting the predictions a test asks for. Returns the coremltools
    module."""
    import coremltools
    import coremltools.models.model as model
    import milkit
    from milkit import _coremltools

    milkit.use_with_coremltools(force=True, compute=compute)

    class Counted(_coremltools.Proxy):
        def predict(self, data, state=None):
            _REACHED["predict"] = True
            return super().predict(data, state=state)

    model._MLModelProxy = Counted
    return coremltools


# ---------------------------------------------------------------------------------------
# pytest plugin


def pytest_addoption(parser):
    g = parser.getgroup("milkit")
    g.addoption("--milkit-sample", type=int, default=1,
                help="keep one test in N, chosen by a hash of its id")
    g.addoption("--milkit-report", default=None, help="write one JSON line per test here")
    g.addoption("--milkit-compute", default="package", choices=("package", "fp32"),
                help="how milkit computes: in the program's types, or fp16 programs in fp32")


def pytest_configure(config):
    install(config.getoption("--milkit-compute"))
    global _CONFIG
    _CONFIG = config
    config._milkit_report = None
    path = config.getoption("--milkit-report")
    if path and not hasattr(config, "workerinput"):
        config._milkit_report = open(path, "a", buffering=1)


def pytest_unconfigure(config):
    if getattr(config, "_milkit_report", None):
        config._milkit_report.close()


def in_sample(nodeid, n):
    """Whether a test id is in the one-in-n sample (stable: sha256 of the id)."""
    if n <= 1:
        return True
    h = int.from_bytes(hashlib.sha256(nodeid.encode()).digest()[:8], "big")
    return h % n == 0


def pytest_collection_modifyitems(config, items):
    n = config.getoption("--milkit-sample")
    if n > 1:
        keep = [i for i in items if in_sample(short_id(i.nodeid), n)]
        config.hook.pytest_deselected(items=[i for i in items if i not in set(keep)])
        items[:] = keep


def short_id(nodeid):
    """A test id without the folder that holds the installed coremltools."""
    key = "coremltools/converters/mil/mil/ops/tests/"
    i = nodeid.find(key)
    return nodeid[i + len(key):] if i >= 0 else nodeid


def pytest_runtest_logstart(nodeid, location):
    # Before the test's setup (a skip mark ends the setup before other setup hooks run).
    _REACHED["predict"] = False
    # coremltools seeds NumPy once per process, so a test's random inputs depend on the
    # tests that ran before it in that process (and, under pytest-xdist, on which worker
    # got it). Seeded from the test's id, every test sees the same inputs on every run. Tests
    # that draw PyTorch weights or references (torch.rand, nn.Module initialisation) do so
    # unseeded: torch gets the same seed, where the test files imported it.
    seed = int.from_bytes(hashlib.sha256(short_id(nodeid).encode()).digest()[:4], "big")
    np.random.seed(seed)
    random.seed(seed)
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "manual_seed"):
        torch.manual_seed(seed)


def _first_line(report):
    text = str(report.longrepr) if report.longrepr is not None else ""
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        text = crash.message
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line[:500]
    return ""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    # Carried to the controlling process under pytest-xdist with the report.
    outcome.get_result().user_properties.append(("milkit_predicted", _REACHED["predict"]))


def pytest_runtest_logreport(report):
    config = _CONFIG
    fh = getattr(config, "_milkit_report", None)
    if fh is None or hasattr(config, "workerinput"):
        return  # xdist workers leave the writing to the controlling process
    # One line per test: its call, or its setup where that skipped or failed.
    if report.when == "teardown" or (report.when == "setup" and report.outcome == "passed"):
        return
    # A test coremltools marks as expected to fail (a known Core ML bug) "xfailed" when it
    # fails and "xpassed" when milkit's prediction passes it.
    outcome = report.outcome
    if hasattr(report, "wasxfail"):
        outcome = "xpassed" if report.outcome == "passed" else "xfailed"
    rec = {
        "id": short_id(report.nodeid),
        "outcome": outcome,
        "predicted": dict(report.user_properties).get("milkit_predicted", False),
        "message": "" if outcome == "passed" else _first_line(report),
    }
    fh.write(json.dumps(rec) + "\n")


_CONFIG = None


def pytest_sessionstart(session):
    global _CONFIG
    _CONFIG = session.config
