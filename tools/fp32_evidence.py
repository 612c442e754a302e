#!/usr/bin/env python3
"""Why coremltools' fp32 variants of tests that hold fp16 data fail: a float64 reference
computed from exactly the values the program holds.

coremltools runs its mlprogram op tests at fp16 precision only (unless
INCLUDE_MIL_FP32_UNIT_TESTS=1). Many tests put fp16 data in the program (dtype=float16
parameters: fp16 inputs and weights) and compute the expected output in float32 from the
unrounded weights (torch or numpy); the fp32 variant compares at atol 1e-4, rtol 1e-5.

For each test given (default: a handful of rnn, conv_transpose and l2_norm tests), this
runs it in-process with milkit standing in for Core ML (tests/coremltools_suite), catches
what it compares (the model, its inputs, the expected outputs, the tolerances), and computes
the op once more in float64 from the program's own constants and the inputs as the program
receives them (rounded to the input's dtype): an independent reference (numpy / torch
float64, not milkit). It prints, per output, the worst ratio |a - b| / (atol + rtol |b|)
(at most 1 passes np.testing.assert_allclose) for
  milkit vs the float64 reference,  shipped expectation vs the float64 reference,
and for an fp16 output also milkit vs the float64 reference rounded to fp16, in ulps.

  fp32_evidence.py [--json FILE] [TEST-ID ...]     (ids relative to coremltools' ops/tests)

milkit is the installed `milkit` module (`pip install .` from the repository).
"""

import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGIN_DIR = os.path.join(REPO, "tests", "coremltools_suite")
sys.path.insert(0, PLUGIN_DIR)
os.environ["PYMIL_TEST_TARGETS"] = "mlprogram"
os.environ["INCLUDE_MIL_FP32_UNIT_TESTS"] = "1"

import numpy as np  # noqa: E402

_B = "compute_unit=ComputeUnit.CPU_ONLY-backend=BackendConfig(backend='mlprogram', precision='fp32', "
_I17 = "opset_version=<AvailableTarget.iOS17: 8>)"
_I15 = "opset_version=<AvailableTarget.iOS15: 6>)"
_F16 = "<class 'numpy.float16'>"
_F32 = "<class 'numpy.float32'>"
_CT = ("config={'padding': (1, 2, 3), 'DHWKdKhKw': (10, 12, 14, 3, 2, 4), 'stride': (2, 1, 1), "
       "'dilation': (1, 1, 1), 'has_bias': False, 'groups': 1, 'test_symbolic': False, "
       "'test_output_shape': True}")
_CT2 = ("config={'padding': (2, 2, 2), 'DHWKdKhKw': (10, 12, 14, 3, 2, 4), 'stride': (2, 2, 2), "
        "'dilation': (2, 1, 1), 'has_bias': False, 'groups': 2, 'test_symbolic': True, "
        "'test_output_shape': False}")
DEFAULT_TESTS = [
    f"iOS17/test_recurrent.py::TestRNN::test_builder_to_backend_smoke[{_B}{_I17}-seq_len=2-"
    f"batch_size=1-input_size=64-hidden_size=1-has_bias=True-output_sequence=False-"
    f"direction=reverse-symbolic=False-dtype={_F16}]",
    f"iOS17/test_recurrent.py::TestRNN::test_builder_to_backend_smoke[{_B}{_I17}-seq_len=8-"
    f"batch_size=32-input_size=64-hidden_size=16-has_bias=True-output_sequence=True-"
    f"direction=forward-symbolic=False-dtype={_F16}]",
    f"iOS17/test_conv.py::TestConvTranspose::test_builder_to_backend_stress[{_B}{_I17}-"
    f"conv_dim=conv1d-{_CT}-x_weight_dtype=({_F16}, {_F16})]",
    f"iOS17/test_conv.py::TestConvTranspose::test_builder_to_backend_stress[{_B}{_I17}-"
    f"conv_dim=conv1d-{_CT}-x_weight_dtype=({_F16}, {_F32})]",
    f"iOS14/test_conv.py::TestConvTranspose::test_builder_to_backend_stress[{_B}{_I15}-"
    f"conv_dim=conv1d-{_CT2}-x_weight_dtype=({_F16}, {_F16})]",
    f"iOS17/test_normalization.py::TestNormalizationL2Norm::test_builder_to_backend_stress["
    f"{_B}{_I17}-rank=3-epsilon=0.0001-x_param_dtype=({_F16}, {_F16})]",
    f"iOS14/test_normalization.py::TestNormalizationL2Norm::test_builder_to_backend_stress["
    f"{_B}{_I15}-rank=3-epsilon=5.7-x_param_dtype=({_F16}, {_F16})]",
]

CAUGHT = {}
_CURRENT = {"id": None}


class _Track:
    """A pytest plugin object: which test is running, so a comparison is filed under it."""

    @staticmethod
    def pytest_runtest_setup(item):
        import milkit_coreml

        _CURRENT["id"] = milkit_coreml.short_id(item.nodeid)


def _catch():
    """Wraps the comparison coremltools' op tests end in, keeping what it compares."""
    import coremltools.converters.mil.mil.ops.tests.testing_utils as tu

    original = tu.compare_backend

    def compare_backend(mlmodel, input_key_values, expected_outputs, **kw):
        CAUGHT[_CURRENT["id"]] = (mlmodel, dict(input_key_values), dict(expected_outputs or {}),
                                  kw.get("atol", 1e-4), kw.get("rtol", 1e-5))
        return original(mlmodel, input_key_values, expected_outputs, **kw)

    tu.compare_backend = compare_backend


def _val(var, inputs):
    """The value the program holds for `var`: a constant, or a function input as the
    program receives it (rounded to its dtype)."""
    from coremltools.converters.mil.mil import types

    if var.val is not None:
        return np.asarray(var.val)
    if var.name in inputs:
        return np.asarray(inputs[var.name]).astype(types.nptype_from_builtin(var.dtype))
    if var.op is not None and var.op.op_type == "cast":
        return _val(var.op.x, inputs).astype(types.nptype_from_builtin(var.dtype))
    raise ValueError(f"`{var.name}` is computed by another op; not a case this tool handles")


def _rnn(op, g):
    x, h = g("x").astype(np.float64), g("initial_h").astype(np.float64)
    wi, wh = g("weight_ih").astype(np.float64), g("weight_hh").astype(np.float64)
    b = g("bias").astype(np.float64) if op.bias is not None else 0.0
    act = {"tanh": np.tanh, "relu": lambda v: np.maximum(v, 0),
           "sigmoid": lambda v: 1 / (1 + np.exp(-v))}[op.activation.val if op.activation is not None else "tanh"]
    steps = x[::-1] if op.direction is not None and op.direction.val == "reverse" else x
    ys = []
    for xt in steps:
        h = act(xt @ wi.T + h @ wh.T + b)
        ys.append(h)
    seq = op.output_sequence is not None and op.output_sequence.val
    return [np.stack(ys) if seq else h[None], h]


def _conv_transpose(op, g):
    import torch

    x = torch.from_numpy(g("x").astype(np.float64))
    w = torch.from_numpy(g("weight").astype(np.float64))
    nd = x.dim() - 2
    stride = list(op.strides.val) if op.strides is not None else [1] * nd
    dil = list(op.dilations.val) if op.dilations is not None else [1] * nd
    groups = int(op.groups.val) if op.groups is not None else 1
    f = {1: torch.nn.functional.conv_transpose1d, 2: torch.nn.functional.conv_transpose2d,
         3: torch.nn.functional.conv_transpose3d}[nd]
    y = f(x, w, stride=stride, dilation=dil, groups=groups)  # no padding: the full result
    pad_type = op.pad_type.val if op.pad_type is not None else "valid"
    pad = list(op.pad.val) if (op.pad is not None and pad_type == "custom") else [0] * (2 * nd)
    out = list(op.outputs[0].shape[2:])
    for d in range(nd):
        n = y.shape[2 + d]
        begin, end = pad[2 * d], pad[2 * d + 1]
        if pad_type == "same":
            total = n - x.shape[2 + d] * stride[d]
            begin, end = total // 2, total - total // 2
        size = out[d] if isinstance(out[d], (int, np.integer)) else n - begin - end
        y = y.narrow(2 + d, begin, min(size, n - begin))
        if y.shape[2 + d] < size:  # output_shape asks for more: zeros (then the bias)
            shape = list(y.shape)
            shape[2 + d] = size - y.shape[2 + d]
            y = torch.cat([y, torch.zeros(shape, dtype=y.dtype)], dim=2 + d)
    if op.bias is not None:
        y = y + torch.from_numpy(g("bias").astype(np.float64)).reshape([1, -1] + [1] * nd)
    return [y.numpy()]


def _l2_norm(op, g):
    x = g("x").astype(np.float64)
    eps = float(op.epsilon.val) if op.epsilon is not None else 1e-6
    s = np.sum(x * x, axis=(-3, -2, -1), keepdims=True)
    return [x / np.sqrt(s + eps)]


REFERENCES = {"rnn": _rnn, "conv_transpose": _conv_transpose, "l2_norm": _l2_norm}


def _worst(a, b, atol, rtol):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b) / (atol + rtol * np.abs(b))))


def evidence(test_id, caught):
    mlmodel, inputs, expected, atol, rtol = caught
    prog = mlmodel._mil_program
    ops = [op for op in prog.functions["main"].operations if op.op_type in REFERENCES]
    if len(ops) != 1:
        return {"test": test_id, "error": f"{len(ops)} ops of a known type"}
    op = ops[0]
    g = lambda name: _val(getattr(op, name), inputs)  # noqa: E731
    ref = REFERENCES[op.op_type](op, g)
    pred = mlmodel.predict(inputs)  # milkit, through the plugin
    rows = []
    names = [o.name for o in prog.functions["main"].outputs]
    from coremltools.converters.mil.mil import types

    for name, r, out in zip(names, ref, op.outputs):
        if name not in expected:
            continue
        m = np.asarray(pred[name])
        # The dtype the op computes in (a cast to fp32 may follow it).
        dt = np.dtype(types.nptype_from_builtin(out.dtype))
        rounded = r.astype(dt)
        row = {
            "output": name, "op_dtype": str(dt), "atol": atol, "rtol": rtol,
            "milkit_vs_f64": _worst(m, r, atol, rtol),
            "rounded_f64_vs_f64": _worst(rounded, r, atol, rtol),
            "expected_vs_f64": _worst(expected[name], r, atol, rtol),
            "milkit_vs_expected": _worst(m, expected[name], atol, rtol),
            "milkit_vs_f64_in_ulps": float(np.max(
                np.abs(m.astype(np.float64) - r)
                / np.spacing(np.abs(rounded)).astype(np.float64))),
        }
        rows.append(row)
    held = sorted({str(getattr(op, k).dtype) for k in op.inputs if hasattr(getattr(op, k), "dtype")})
    return {"test": test_id, "op": op.op_type, "program_dtypes": held, "outputs": rows}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("tests", nargs="*", default=DEFAULT_TESTS)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    import milkit_coreml
    import pytest

    ct = milkit_coreml.install()
    suite = os.path.join(os.path.dirname(ct.__file__), "converters", "mil", "mil", "ops", "tests")
    _catch()
    pytest.main(["-p", "no:cacheprovider", "-q", "--tb=no", "-W", "ignore", "-p", "milkit_coreml"]
                + [os.path.join(suite, t) for t in args.tests], plugins=[_Track()])
    results = []
    for t in args.tests:
        if t not in CAUGHT:
            results.append({"test": t, "error": "the test did not run or compared nothing"})
            continue
        results.append(evidence(t, CAUGHT[t]))
    print()
    print("| test | op, dtype it computes in | milkit vs f64 | f64 rounded to that dtype vs f64 "
          "| expectation vs f64 | milkit vs expectation |")
    print("|---|---|---|---|---|---|")
    for r in results:
        short = r["test"].split("::", 1)[-1].replace(_B, "")
        if "error" in r:
            print(f"| `{short}` | {r['error']} | | | | |")
            continue
        for o in r["outputs"]:
            print(f"| `{short}` | {r['op']}, {o['op_dtype']} | {o['milkit_vs_f64']:.3g} "
                  f"({o['milkit_vs_f64_in_ulps']:.2f} ulp) | {o['rounded_f64_vs_f64']:.3g} | "
                  f"{o['expected_vs_f64']:.3g} | {o['milkit_vs_expected']:.3g} |")
    print("\nratios are max |a - b| / (atol + rtol |b|) at the test's atol and rtol (at most 1 "
          "passes); ulp: of the dtype the op computes in")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
