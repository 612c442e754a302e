"""milkit standing in for Core ML inside coremltools, off macOS.

A pytest plugin (``pytest -p milkit_coreml``) and a plain hook (``install()``): coremltools'
``MLModel`` gets a model proxy whose ``predict``, ``batchPredict`` and ``newState`` run the
model with ``milkit run``, and coremltools' platform checks answer as on macOS 15, so that
its own op tests take the path they take on a Mac (convert, predict, compare with their
expected numbers) instead of skipping every prediction.

The plugin also
- keeps one test in ``--milkit-sample N`` (by a hash of the test id, so the sample is the
  same on every machine and every run);
- writes one JSON line per test to ``--milkit-report FILE``: the id, the outcome, whether
  the test reached a prediction, and the first line of the failure.

The binary is ``$MILKIT_BIN`` (default ``target/release/milkit`` beside this folder's repo).
"""

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

# The macOS version coremltools is told it runs on: iOS18's opset runs there, and every
# check of the form `_macos_version() < (15, x)` takes the current path.
PRETEND_MACOS = (15, 5)

# Set while a test runs: whether a prediction was asked for.
_REACHED = {"predict": False}


def milkit_bin():
    return os.environ.get("MILKIT_BIN") or os.path.join(REPO, "target", "release", "milkit")


class MilkitError(RuntimeError):
    """`milkit run` refused the model or its inputs; the message is milkit's."""


def _sanitize(name):
    # As `milkit run` names output files (src/cli/run.rs, file_name).
    return "".join(c if (c.isascii() and c.isalnum()) or c in "_-." else "_" for c in name)


class _State:
    """A Core ML state (`MLState`'s proxy): one array per state of the model, zeros until
    written or predicted with, as `makeState()` gives them."""

    def __init__(self, proxy):
        self._proxy = proxy
        self.values = {}

    def read_state(self, name):
        if name not in self.values:
            shape, dtype = self._proxy._state_types()[name]
            return np.zeros(shape, dtype=dtype)
        return self.values[name].copy()

    def write_state(self, name, value):
        types = self._proxy._state_types()
        if name not in types:
            raise MilkitError(f"the model has no state `{name}` (states: {', '.join(types)})")
        shape, dtype = types[name]
        value = np.asarray(value)
        if tuple(value.shape) != tuple(shape):
            raise MilkitError(f"state `{name}` has shape {tuple(shape)}, got {value.shape}")
        self.values[name] = value.astype(dtype)


class _Proxy:
    """What coremltools' `_MLModelProxy` is on macOS, over `milkit run`."""

    def __init__(self, path, compute_units="CPU_ONLY", function_name="", hints=None, asset=None):
        self._tmp = tempfile.mkdtemp(prefix="milkit-coreml-")
        # The model is read now, as Core ML reads it at load: coremltools removes a
        # single-file model right after the proxy is made.
        if os.path.isdir(path):
            self._path = path
        else:
            self._path = os.path.join(self._tmp, os.path.basename(path))
            shutil.copyfile(path, self._path)
        self._function = function_name or None
        self._spec = None

    def __del__(self):
        shutil.rmtree(getattr(self, "_tmp", ""), ignore_errors=True)

    @staticmethod
    def maximum_supported_specification_version():
        return 9

    def _load_spec(self):
        if self._spec is None:
            from coremltools.models.utils import load_spec

            self._spec = load_spec(self._path)
        return self._spec

    def _description(self):
        d = self._load_spec().description
        if len(d.functions) > 0:
            name = self._function or d.defaultFunctionName
            for f in d.functions:
                if f.name == name:
                    return f
        return d

    def _state_types(self):
        from coremltools.proto import FeatureTypes_pb2 as ft

        out = {}
        for s in self._description().state:
            a = s.type.stateType.arrayType
            dtype = {
                ft.ArrayFeatureType.FLOAT16: np.float16,
                ft.ArrayFeatureType.FLOAT32: np.float32,
                ft.ArrayFeatureType.DOUBLE: np.float64,
                ft.ArrayFeatureType.INT32: np.int32,
            }.get(a.dataType, np.float32)
            out[s.name] = (tuple(a.shape), dtype)
        return out

    def newState(self):
        return _State(self)

    def batchPredict(self, data):
        return [self.predict(d, None) for d in data]

    def predict(self, data, state=None):
        _REACHED["predict"] = True
        work = tempfile.mkdtemp(dir=self._tmp)
        try:
            cmd = [milkit_bin(), "run", self._path, "--out", os.path.join(work, "out"), "--quiet"]
            if self._function:
                cmd += ["--function", self._function]
            for k, (name, value) in enumerate(data.items()):
                f = os.path.join(work, f"in{k}.npy")
                if hasattr(value, "save") and hasattr(value, "mode"):  # a PIL image
                    value = np.asarray(value)
                np.save(f, np.asarray(value))
                cmd += ["--input", f"{name}={f}"]
            if state is not None:
                for k, (name, value) in enumerate(state.values.items()):
                    f = os.path.join(work, f"state{k}.npy")
                    np.save(f, value)
                    cmd += ["--state", f"{name}={f}"]
                cmd += ["--save-states"]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                # Worded as Core ML words a failed load or prediction (coremltools' tests
                # look for those words), with milkit's reason after it.
                why = r.stderr.strip() or f"milkit exited {r.returncode}"
                if "cannot load" in why:
                    raise MilkitError(f"Unable to load the model. milkit: {why}")
                raise MilkitError(
                    f"Unable to compute the prediction using ML Program. milkit: {why}")
            out = os.path.join(work, "out")
            outputs = {}
            for o in self._description().output:
                base = os.path.join(out, _sanitize(o.name))
                if os.path.exists(base + ".npy"):
                    outputs[o.name] = np.load(base + ".npy")
                elif os.path.exists(base + ".json"):
                    with open(base + ".json") as fh:
                        v = json.load(fh)
                    if isinstance(v, dict) and o.type.WhichOneof("Type") == "dictionaryType":
                        if o.type.dictionaryType.WhichOneof("KeyType") == "int64KeyType":
                            v = {int(k): x for k, x in v.items()}
                    outputs[o.name] = v
            if state is not None:
                for name in self._state_types():
                    f = os.path.join(out, "states", _sanitize(name) + ".npy")
                    if os.path.exists(f):
                        state.values[name] = np.load(f)
            return outputs
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def get_compiled_model_path(self):
        return self._path


def install():
    """Makes coremltools, in this process, predict through milkit as if on macOS."""
    import coremltools
    import coremltools._deps as deps
    import coremltools.models.model as model
    import coremltools.models.utils as utils

    def is_macos():
        return True

    def macos_version():
        return PRETEND_MACOS

    deps._IS_MACOS = True
    deps._MACOS_VERSION = PRETEND_MACOS
    model._MLModelProxy = _Proxy
    # Every coremltools module imported so far that copied the flag or the functions.
    originals = (utils._is_macos, utils._macos_version)
    for name, mod in list(sys.modules.items()):
        if not name.startswith("coremltools") or mod is None:
            continue
        if getattr(mod, "_IS_MACOS", None) is False:
            mod._IS_MACOS = True
        if getattr(mod, "_is_macos", None) is originals[0]:
            mod._is_macos = is_macos
        if getattr(mod, "_macos_version", None) is originals[1]:
            mod._macos_version = macos_version
    return coremltools


# ---------------------------------------------------------------------------------------
# pytest plugin


def pytest_addoption(parser):
    g = parser.getgroup("milkit")
    g.addoption("--milkit-sample", type=int, default=1,
                help="keep one test in N, chosen by a hash of its id")
    g.addoption("--milkit-report", default=None, help="write one JSON line per test here")


def pytest_configure(config):
    install()
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
