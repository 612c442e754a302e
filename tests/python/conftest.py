"""Fixtures of the Python module's tests: the shared fixtures folder, the `milkit` command
the predictions are compared with, and small coremltools-made packages (built once)."""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fixtures():
    return os.environ.get("MILKIT_FIXTURES") or os.path.join(os.path.dirname(REPO), "shared")


def need(path):
    """A fixture path; the test skips without it unless MILKIT_REQUIRE_FIXTURES=1."""
    if not os.path.exists(path):
        if os.environ.get("MILKIT_REQUIRE_FIXTURES") == "1":
            pytest.fail(f"missing fixture {path}")
        pytest.skip(f"missing fixture {path}")
    return path


def milkit_command():
    """The wheel's `milkit` command beside this python (what `pip install` put there)."""
    exe = os.path.join(os.path.dirname(sys.executable), "milkit")
    return exe if os.path.exists(exe) else shutil.which("milkit")


def milkit_run(pkg, inputs, out, *extra):
    """`milkit run` with inputs saved as .npy; returns {output: array} of the last
    prediction (or of prediction k, for `--repeat`, as `name.k.npy`)."""
    os.makedirs(out, exist_ok=True)
    cmd = [milkit_command(), "run", str(pkg), "--out", str(out), "--quiet", *extra]
    for k, (name, value) in enumerate(inputs.items()):
        f = os.path.join(out, f"in{k}.npy")
        np.save(f, value)
        cmd += ["--input", f"{name}={f}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r


def read_safetensors(path, name):
    """One tensor of a .safetensors file (little-endian header, JSON, data)."""
    import json
    import struct

    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        info = header[name]
        start, end = info["data_offsets"]
        f.seek(8 + n + start)
        data = f.read(end - start)
    dtype = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "I64": np.int64}[info["dtype"]]
    return np.frombuffer(data, dtype=dtype).reshape(info["shape"]).copy()


@pytest.fixture(scope="session")
def ct():
    return pytest.importorskip("coremltools")


@pytest.fixture(scope="session")
def built(tmp_path_factory, ct):
    """Small packages made by coremltools: a stateful accumulator, a chain of many small ops
    and a flexible-shape model. {name: path}."""
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import types

    d = tmp_path_factory.mktemp("ct-models")
    out = {}

    @mb.program(input_specs=[mb.StateTensorSpec((2, 3), dtype=types.fp16),
                             mb.TensorSpec((2, 3), dtype=types.fp16)],
                opset_version=ct.target.iOS18)
    def acc(total, x):
        t = mb.read_state(input=total)
        s = mb.add(x=t, y=x)
        mb.coreml_update_state(state=total, value=s)
        return mb.mul(x=s, y=np.float16(2.0), name="twice")

    out["stateful"] = str(d / "stateful.mlpackage")
    ct.convert(acc, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS18,
               skip_model_load=True).save(out["stateful"])

    @mb.program(input_specs=[mb.TensorSpec((1, 32), dtype=types.fp32)],
                opset_version=ct.target.iOS17)
    def chain(x):
        # Many ops on a few numbers: a prediction too small to be split across cores.
        for k in range(300):
            x = mb.mul(x=x, y=np.float32(0.999)) if k % 2 else mb.add(x=x, y=np.float32(1e-3))
        return mb.identity(x=x, name="y")

    out["chain"] = str(d / "chain.mlpackage")
    ct.convert(chain, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS17,
               compute_precision=ct.precision.FLOAT32, skip_model_load=True).save(out["chain"])

    torch = pytest.importorskip("torch")

    class SumSq(torch.nn.Module):
        def forward(self, x):
            return (x * x).sum(dim=1, keepdim=True)

    traced = torch.jit.trace(SumSq().eval(), torch.rand(1, 4))
    out["flexible"] = str(d / "flexible.mlpackage")
    ct.convert(traced, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS17,
               inputs=[ct.TensorType(name="x", shape=(1, ct.RangeDim(1, 64, default=4)))],
               outputs=[ct.TensorType(name="sumsq")], skip_model_load=True
               ).save(out["flexible"])
    return out


@pytest.fixture(scope="session")
def decoder(tmp_path_factory):
    """milkit's stateful tiny.en TextDecoder, exported with the wheel's command."""
    ckpt = need(os.path.join(fixtures(), "models", "whisper-tiny.en"))
    d = tmp_path_factory.mktemp("milkit-decoder")
    pkg = str(d / "TextDecoder.mlpackage")
    r = subprocess.run([milkit_command(), "export", "--model", ckpt, "--component", "decoder",
                        "--stateful", "--out", pkg], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return pkg


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory):
    """milkit's tiny.en WhisperKit folder, exported with the wheel's command."""
    ckpt = need(os.path.join(fixtures(), "models", "whisper-tiny.en"))
    out = str(tmp_path_factory.mktemp("milkit-tiny") / "tiny.en")
    r = subprocess.run([milkit_command(), "export", "--model", ckpt, "--component", "all",
                        "--out", out], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return out
