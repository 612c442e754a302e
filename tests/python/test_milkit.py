"""The `milkit` wheel: its module predicts exactly as `milkit run` does, keeps states, takes
flexible shapes, raises milkit's errors, predicts from two threads at once and stands in
for Core ML inside coremltools."""

import os
import subprocess
import threading
import time

import numpy as np
import pytest

import milkit
from conftest import fixtures, milkit_command, milkit_run, need, read_safetensors

CT_PACKAGES = ["tiny.en-encoder-fp16", "tiny.en-encoder-lut4-kmeans", "tiny.en-encoder-int4-block32"]


def jfk_mel():
    ref = need(os.path.join(fixtures(), "reference", "tiny.en-jfk.safetensors"))
    return read_safetensors(ref, "input_features")


def sample_inputs(model, seed=0):
    """Inputs of every described shape and dtype: small random floats, zero integers."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, f in model.input_description.items():
        if f.dtype.startswith("float"):
            out[name] = (rng.standard_normal(f.shape) * 0.1).astype(f.dtype)
        else:
            out[name] = np.zeros(f.shape, dtype=f.dtype)
    return out


def assert_same_bits(got, want):
    assert set(got) == set(want)
    for k in want:
        assert got[k].dtype == want[k].dtype, k
        assert got[k].shape == want[k].shape, k
        assert got[k].tobytes() == want[k].tobytes(), f"output {k} differs"


@pytest.mark.parametrize("name", CT_PACKAGES)
def test_coremltools_packages_predict_bit_for_bit_as_milkit_run(name, tmp_path):
    pkg = need(os.path.join(fixtures(), "coremltools", name + ".mlpackage"))
    mel = jfk_mel()
    model = milkit.MLModel(pkg)
    assert list(model.input_description) == ["logmel_data"]
    assert model.input_description["logmel_data"].shape == (1, 80, 3000)
    got = model.predict({"logmel_data": mel})
    milkit_run(pkg, {"logmel_data": mel}, tmp_path)
    assert_same_bits(got, {"output": np.load(tmp_path / "output.npy")})
    # Close to the float32 PyTorch reference of the same weights: it really ran.
    ref = read_safetensors(os.path.join(fixtures(), "coremltools", name + ".reference.safetensors"),
                           "encoder_output")
    assert np.abs(got["output"] - ref).max() < 0.5


def test_a_non_contiguous_float64_input_is_converted_as_milkit_run_converts_it(tmp_path):
    pkg = need(os.path.join(fixtures(), "coremltools", "tiny.en-encoder-fp16.mlpackage"))
    mel = jfk_mel()
    wide = np.asfortranarray(mel.astype(np.float64))
    assert not wide.flags.c_contiguous
    got = milkit.MLModel(pkg).predict({"logmel_data": wide})
    milkit_run(pkg, {"logmel_data": mel.astype(np.float64)}, tmp_path)
    assert_same_bits(got, {"output": np.load(tmp_path / "output.npy")})


def test_a_milkit_whisper_decoder_keeps_its_states_across_predictions_as_milkit_run(decoder, tmp_path):
    model = milkit.MLModel(decoder)
    assert len(model.state_description) > 0
    inputs = sample_inputs(model)
    state = model.make_state()
    first = model.predict(inputs, state=state)
    second = model.predict(inputs, state=state)
    milkit_run(decoder, inputs, tmp_path, "--repeat", "2", "--save-states")
    for k, got in enumerate((first, second)):
        want = {n: np.load(tmp_path / f"{n}.{k}.npy") for n in got}
        assert_same_bits(got, want)
    for name in model.state_description:
        assert state.read_state(name).tobytes() == np.load(tmp_path / "states" / f"{name}.npy").tobytes()
    # The state moved: the second prediction saw the first one's cache.
    logits = [n for n in first if "logits" in n][0]
    assert first[logits].tobytes() != second[logits].tobytes() or any(
        np.any(state.read_state(n)) for n in model.state_description)
    # Without a state every prediction starts from zeros: the same as a fresh state's first.
    assert_same_bits(model.predict(inputs), first)


def test_states_accumulate_and_can_be_read_and_written(built):
    model = milkit.MLModel(built["stateful"])
    assert list(model.state_description) == ["total"]
    x = np.ones((2, 3), dtype=np.float16)
    s = model.make_state()
    assert s.read_state("total").tolist() == np.zeros((2, 3)).tolist()
    assert model.predict({"x": x}, state=s)["twice"].tolist() == (2 * np.ones((2, 3))).tolist()
    assert model.predict({"x": x}, state=s)["twice"].tolist() == (4 * np.ones((2, 3))).tolist()
    assert s.read_state("total").tolist() == (2 * np.ones((2, 3))).tolist()
    s.write_state("total", np.full((2, 3), 10, dtype=np.float32))
    assert model.predict({"x": x}, state=s)["twice"].tolist() == (22 * np.ones((2, 3))).tolist()
    # Another state of the same model is independent.
    other = model.make_state()
    assert model.predict({"x": x}, state=other)["twice"].tolist() == (2 * np.ones((2, 3))).tolist()
    with pytest.raises(milkit.MilkitError, match="no state `nope`"):
        s.read_state("nope")
    with pytest.raises(milkit.MilkitError, match="shape"):
        s.write_state("total", np.zeros((3, 2), dtype=np.float16))


def test_a_flexible_shape_model_takes_every_shape_in_its_range(built, tmp_path):
    model = milkit.MLModel(built["flexible"])
    f = model.input_description["x"]
    assert f.shape == (1, 4) and f.flexible == {"ranges": [(1, 1), (1, 64)]}
    assert f.accepts((1, 64)) and not f.accepts((1, 65))
    for n in (1, 7, 64):
        x = np.arange(n, dtype=np.float32).reshape(1, n) / 8
        got = model.predict({"x": x})
        milkit_run(built["flexible"], {"x": x}, tmp_path / str(n))
        assert_same_bits(got, {"sumsq": np.load(tmp_path / str(n) / "sumsq.npy")})
        assert abs(float(got["sumsq"][0, 0]) - float((x * x).sum())) < 1e-2 * max(1, (x * x).sum())
    with pytest.raises(milkit.MilkitError, match=r"\[1, 65\]"):
        model.predict({"x": np.zeros((1, 65), dtype=np.float32)})
    assert [r["sumsq"].shape for r in model.predict([{"x": np.ones((1, 2), np.float32)}] * 2)] == [(1, 1)] * 2


def test_errors_are_milkit_errors_with_milkit_messages(built, tmp_path):
    missing = str(tmp_path / "nothing.mlpackage")
    with pytest.raises(milkit.MilkitError, match="cannot load .*nothing.mlpackage"):
        milkit.MLModel(missing)
    r = subprocess.run([milkit_command(), "run", missing, "--out", str(tmp_path / "o")],
                       capture_output=True, text=True)
    with pytest.raises(milkit.MilkitError) as e:
        milkit.MLModel(missing)
    assert r.returncode == 2 and r.stderr.strip() == f"error: {e.value}"
    assert issubclass(milkit.MilkitError, RuntimeError)
    model = milkit.MLModel(built["flexible"])
    with pytest.raises(milkit.MilkitError, match="missing input `x`"):
        model.predict({})
    with pytest.raises(milkit.MilkitError, match="unknown input `y`"):
        model.predict({"x": np.ones((1, 4), np.float32), "y": np.ones(1, np.float32)})
    with pytest.raises(milkit.MilkitError, match="unsupported dtype"):
        model.predict({"x": np.ones((1, 4), np.complex64)})
    with pytest.raises(milkit.MilkitError, match="no function `other`"):
        milkit.MLModel(built["flexible"], function_name="other")
    with pytest.raises(milkit.MilkitError, match="compute"):
        milkit.MLModel(built["flexible"], compute="fp64")
    with pytest.raises(milkit.MilkitError, match="another model"):
        milkit.MLModel(built["stateful"]).predict(
            {"x": np.ones((2, 3), np.float16)}, state=milkit.MLModel(built["stateful"]).make_state())


def test_the_gil_is_released_while_a_prediction_runs():
    pkg = need(os.path.join(fixtures(), "coremltools", "tiny.en-encoder-fp16.mlpackage"))
    model = milkit.MLModel(pkg)
    mel = jfk_mel()
    done = threading.Event()
    counts = []

    def count():
        n = 0
        while not done.is_set():
            n += 1
        counts.append(n)

    t = threading.Thread(target=count)
    t.start()
    t0 = time.perf_counter()
    model.predict({"logmel_data": mel})
    took = time.perf_counter() - t0
    done.set()
    t.join()
    # With the GIL held the counting thread would have had at most a switch interval or two.
    assert took > 0.05 and counts[0] > 1000, (took, counts)


def two_threads_against_serial(path, steps, rounds=3):
    """Best of `rounds` rounds of `steps` predictions on each of two models of `path`, one
    after the other and in two threads at once: (serial s, parallel s, overlap share)."""
    models = [milkit.MLModel(path), milkit.MLModel(path)]
    # Inputs that change every call, so that no step is skipped as input-invariant.
    inputs = [sample_inputs(models[0], seed) for seed in (0, 1)]
    spans = {0: [], 1: []}

    def work(k):
        for i in range(steps):
            t0 = time.perf_counter()
            models[k].predict(inputs[i % 2])
            spans[k].append((t0, time.perf_counter()))

    work(0)  # warm
    work(1)
    serial, parallel = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        work(0)
        work(1)
        serial.append(time.perf_counter() - t0)
        spans[0].clear()
        spans[1].clear()
        threads = [threading.Thread(target=work, args=(k,)) for k in (0, 1)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        parallel.append(time.perf_counter() - t0)
    # How long both threads were inside a prediction at once in the last round.
    both = sum(max(0.0, min(b0, b1) - max(a0, a1))
               for a0, b0 in spans[0] for a1, b1 in spans[1])
    wall = max(e for s in spans.values() for _, e in s) - min(b for s in spans.values() for b, _ in s)
    serial, parallel = min(serial), min(parallel)
    print(f"{os.path.basename(path)}: two threads {parallel:.3f} s, one after the other "
          f"{serial:.3f} s, overlap {both / wall:.0%}, load {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores")
    return serial, parallel, both / wall


def test_two_threads_predict_at_once_without_waiting_for_each_other(decoder):
    # Decoder steps: both threads are inside a prediction at once for most of the time, so
    # neither the GIL nor a shared lock makes one wait for the other. Faster is not asserted
    # here: a step's products run on the runtime's worker pool (a thread per core), so on a
    # 2-core machine one step already fills both cores.
    serial, parallel, overlap = two_threads_against_serial(decoder, 20)
    assert overlap > 0.5, overlap
    assert parallel < 1.3 * serial, (parallel, serial)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores")
def test_two_threads_predicting_small_models_finish_sooner_than_one_after_the_other(built):
    # 300 ops on 32 numbers: too little work to split one prediction across cores, so two
    # predictions at once keep two cores busy.
    serial, parallel, overlap = two_threads_against_serial(built["chain"], 300, rounds=7)
    assert overlap > 0.5, overlap
    assert parallel < 0.9 * serial, (parallel, serial)


def test_use_with_coremltools_makes_a_converted_model_predict_off_macos(ct, built):
    assert milkit.use_with_coremltools() is True
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import types

    @mb.program(input_specs=[mb.TensorSpec((2, 3), dtype=types.fp32)], opset_version=ct.target.iOS17)
    def prog(x):
        return mb.add(x=mb.mul(x=x, y=3.0), y=1.0, name="y")

    m = ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS17,
                   compute_precision=ct.precision.FLOAT32)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert m.predict({"x": x})["y"].tolist() == (3 * x + 1).tolist()
    # A saved package through ct.models.MLModel, with its state.
    s = ct.models.MLModel(built["stateful"])
    st = s.make_state()
    one = np.ones((2, 3), dtype=np.float16)
    s.predict({"x": one}, st)
    assert s.predict({"x": one}, st)["twice"].tolist() == (4 * one).tolist()
    assert st.read_state("total").tolist() == (2 * one).tolist()
    # The same numbers as milkit's own MLModel.
    pkg = os.path.join(fixtures(), "coremltools", "tiny.en-encoder-lut4-kmeans.mlpackage")
    if os.path.exists(pkg):
        mel = jfk_mel()
        assert_same_bits(ct.models.MLModel(pkg).predict({"logmel_data": mel}),
                         milkit.MLModel(pkg).predict({"logmel_data": mel}))


def test_use_with_coremltools_can_compute_fp16_programs_in_fp32(ct):
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import types

    @mb.program(input_specs=[mb.TensorSpec((1,), dtype=types.fp32)], opset_version=ct.target.iOS17)
    def prog(x):
        h = mb.add(x=mb.cast(x=x, dtype="fp16"), y=np.float16(1.0))
        return mb.cast(x=h, dtype="fp32", name="y")

    x = np.array([1e-3], dtype=np.float32)
    in_fp16 = float(np.float16(np.float16(x[0]) + np.float16(1.0)))
    try:
        for compute, want, tol in (("package", in_fp16, 0.0), ("fp32", 1.0 + 1e-3, 1e-6)):
            milkit.use_with_coremltools(compute=compute)
            m = ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS17,
                           compute_precision=ct.precision.FLOAT32)
            got = float(m.predict({"x": x})["y"][0])
            assert abs(got - want) <= tol, (compute, got, want)
        assert abs(in_fp16 - (1.0 + 1e-3)) > 1e-5, "the two computations differ"
    finally:
        milkit.use_with_coremltools()


def test_the_module_and_the_command_explain_themselves():
    doc = milkit.MLModel.__doc__
    assert "predict" in doc and "make_state" in doc and "MilkitError" in doc
    assert "read_state" in dir(milkit.MLState) and milkit.MLState.__doc__
    r = subprocess.run([milkit_command(), "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("milkit ")
    r = subprocess.run([milkit_command(), "run"], capture_output=True, text=True)
    assert r.returncode == 2 and "Usage" in r.stderr


def test_transcribe_returns_what_milkit_transcribe_writes(tiny_folder, tmp_path):
    import json

    wav = need(os.path.join(fixtures(), "audio", "jfk.wav"))
    got = milkit.transcribe(tiny_folder, wav, word_timestamps=True)
    r = subprocess.run([milkit_command(), "transcribe", "--models", tiny_folder, wav,
                        "--word-timestamps", "--output-format", "json",
                        "--output-dir", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    with open(tmp_path / "jfk.json") as f:
        assert got == json.load(f)
    assert "country" in got["text"] and got["language"] == "en"
    assert got["segments"] and got["segments"][0]["words"]
    with pytest.raises(milkit.MilkitError, match="temperature"):
        milkit.transcribe(tiny_folder, wav, temperature="hot")
    with pytest.raises(milkit.MilkitError, match="nothing.wav"):
        milkit.transcribe(tiny_folder, str(tmp_path / "nothing.wav"))


def test_verify_reports_as_milkit_verify_json(tmp_path):
    import json

    pkg = need(os.path.join(fixtures(), "coremltools", "tiny.en-encoder-lut4-kmeans.mlpackage"))
    got = milkit.verify(pkg, expect_lut_ops=26, placement=True)
    r = subprocess.run([milkit_command(), "verify", pkg, "--expect-lut-ops", "26", "--placement",
                        "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    want = json.loads(r.stdout)
    assert got["ok"] is True and got["mismatches"] == []
    # The receipt names the command line that made it; the rest is the same report.
    got.pop("receipt")
    want.pop("receipt")
    assert got == want
    bad = milkit.verify(pkg, expect_lut_ops=3)
    assert bad["ok"] is False and any("3" in m for m in bad["mismatches"])
    with pytest.raises(milkit.MilkitError, match="nothing.mlpackage"):
        milkit.verify(str(tmp_path / "nothing.mlpackage"))
    with pytest.raises(milkit.MilkitError, match="expect-abi"):
        milkit.verify(pkg, expect_abi="nonesuch")


def test_export_writes_what_milkit_export_writes(tmp_path):
    ckpt = need(os.path.join(fixtures(), "models", "whisper-tiny.en"))
    flags = {"component": "encoder", "quantize": "int8", "quiet": True}
    got = milkit.export(ckpt, tmp_path / "py.mlpackage", **flags)
    assert got["out"] == str(tmp_path / "py.mlpackage") and got["files"] == ["py.mlpackage"]
    r = subprocess.run([milkit_command(), "export", "--model", ckpt, "--component", "encoder",
                        "--quantize", "int8", "--quiet", "--out", str(tmp_path / "cli.mlpackage")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr

    def package_files(root):
        out = {}
        for d, _, names in os.walk(root):
            for n in names:
                p = os.path.join(d, n)
                with open(p, "rb") as fh:
                    out[os.path.relpath(p, root)] = fh.read()
        return out

    py, cli = package_files(tmp_path / "py.mlpackage"), package_files(tmp_path / "cli.mlpackage")
    assert sorted(py) == sorted(cli)
    assert py == cli, [k for k in py if py[k] != cli[k]]
    assert got["bytes"] == sum(len(v) for v in py.values())
    described = milkit.MLModel(got["out"]).output_description
    assert described["encoder_output_embeds"].shape == (1, 384, 1, 1500)
    with pytest.raises(milkit.MilkitError, match="already exists"):
        milkit.export(ckpt, tmp_path / "py.mlpackage", **flags)
    with pytest.raises(milkit.MilkitError, match="quantize"):
        milkit.export(ckpt, tmp_path / "other.mlpackage", component="encoder", quantize="int3")
    assert not os.path.exists(tmp_path / "other.mlpackage")


def test_a_scalar_feeds_an_input_of_one_element_as_milkit_run_feeds_a_0_d_array(ct, tmp_path):
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import types

    @mb.program(input_specs=[mb.TensorSpec((1,), dtype=types.fp32)],
                opset_version=ct.target.iOS17)
    def twice(x):
        return mb.mul(x=x, y=np.float32(2.0), name="y")

    pkg = str(tmp_path / "twice.mlpackage")
    ct.convert(twice, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS17,
               compute_precision=ct.precision.FLOAT32, skip_model_load=True).save(pkg)
    model = milkit.MLModel(pkg)
    for v in (np.float32(3.0), 3.0, 3, np.array(3.0)):
        got = model.predict({"x": v})["y"]
        assert got.shape == (1,) and got[0] == 6.0, (v, got)
    milkit_run(pkg, {"x": np.array(3.0, dtype=np.float32)}, tmp_path)
    assert np.load(tmp_path / "y.npy").tolist() == [6.0]
    # More than one element is not a scalar: the shape must match.
    with pytest.raises(milkit.MilkitError, match=r"shape \[2\]"):
        model.predict({"x": np.array([3.0, 4.0], dtype=np.float32)})


def test_a_neuralnetwork_with_an_image_input_predicts_through_coremltools(ct):
    """coremltools' NeuralNetworkBuilder: a BGR image input with the network's scale and
    per-channel biases, then a classifier; numbers from numpy."""
    from coremltools.models import datatypes
    from coremltools.models.neural_network import NeuralNetworkBuilder
    from PIL import Image

    assert milkit.use_with_coremltools() is True
    h, w, classes = 4, 5, ["left", "right"]
    b = NeuralNetworkBuilder([("image", datatypes.Array(3, h, w))], [("y", None)])
    b.add_activation("id", "LINEAR", "image", "y", params=[1.0, 0.0])
    b.set_pre_processing_parameters(image_input_names=["image"], is_bgr=True, red_bias=-1.0,
                                    green_bias=-2.0, blue_bias=-3.0, image_scale=0.5)
    px = (np.arange(h * w * 3).reshape(h, w, 3) * 3).astype(np.uint8)
    out = ct.models.MLModel(b.spec).predict({"image": Image.fromarray(px)})["y"]
    want = np.stack([px[..., 2] * 0.5 - 3, px[..., 1] * 0.5 - 2, px[..., 0] * 0.5 - 1])
    assert np.abs(np.asarray(out).reshape(want.shape) - want).max() == 0

    c = NeuralNetworkBuilder([("x", datatypes.Array(3))], [("probs", None)], mode="classifier")
    wm = np.array([[1.0, 0.0, -1.0], [-1.0, 0.5, 1.0]], dtype=np.float32)
    c.add_inner_product("fc", W=wm, b=None, input_channels=3, output_channels=2,
                        has_bias=False, input_name="x", output_name="logits")
    c.add_softmax("sm", "logits", "probs")
    c.set_class_labels(classes, predicted_feature_name="label", prediction_blob="probs")
    x = np.array([0.2, -1.0, 0.7], dtype=np.float32)
    got = ct.models.MLModel(c.spec).predict({"x": x})
    logits = wm.astype(np.float64) @ x
    p = np.exp(logits - logits.max())
    p /= p.sum()
    assert got["label"] == classes[int(np.argmax(p))]
    assert abs(got["probs"]["right"] - p[1]) < 1e-6
