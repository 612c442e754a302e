"""milkit: run Core ML ML Program packages (``.mlpackage``) on any OS.

The names mirror coremltools', so code moves over unchanged::

    import milkit
    model = milkit.MLModel("model.mlpackage")
    out = model.predict({"x": x})            # dict name -> numpy array

    state = model.make_state()                # a stateful model's states
    out = model.predict({"x": x}, state=state)

Or make coremltools itself predict through milkit, off macOS::

    import milkit
    milkit.use_with_coremltools()
    ct.models.MLModel("model.mlpackage").predict({"x": x})

Every error milkit reports is a ``milkit.MilkitError`` carrying milkit's message. The
reference is docs/python.md.
"""

import json
import os
import sys
from collections.abc import Mapping

import numpy as np

from milkit._milkit import MilkitError, MLState, __version__
from milkit import _milkit

__all__ = [
    "MLModel",
    "MLState",
    "MilkitError",
    "Feature",
    "FeatureDescription",
    "use_with_coremltools",
    "transcribe",
    "verify",
    "__version__",
]


class Feature:
    """One input, output or state of a model.

    Attributes: ``name``; ``type`` (``"multiArray"``, ``"image"``, ``"int64"``, ``"double"``,
    ``"string"``, ``"dictionary"`` or ``"state"``); ``dtype`` (a numpy dtype name such as
    ``"float16"``, or None); ``shape`` (the default shape, a tuple); ``flexible`` (None for a
    fixed shape, else ``{"ranges": [(lo, hi or None), ...]}`` per dimension or
    ``{"shapes": [shape, ...]}``); ``doc`` (the model's short description of it).
    """

    __slots__ = ("name", "type", "dtype", "shape", "flexible", "doc", "color_space")

    def __init__(self, d):
        self.name = d["name"]
        self.type = d["type"]
        self.dtype = d["dtype"]
        self.shape = None if d["shape"] is None else tuple(d["shape"])
        flex = d["flexible"]
        if flex is not None and "ranges" in flex:
            flex = {"ranges": [tuple(r) for r in flex["ranges"]]}
        elif flex is not None:
            flex = {"shapes": [tuple(s) for s in flex["shapes"]]}
        self.flexible = flex
        self.doc = d["doc"]
        self.color_space = d.get("color_space")

    def accepts(self, shape):
        """Whether an array of this shape is a valid value (the default shape, or one the
        feature's flexibility allows)."""
        shape = tuple(shape)
        if self.flexible is None:
            return self.shape is None or shape == self.shape
        if "ranges" in self.flexible:
            r = self.flexible["ranges"]
            return len(shape) == len(r) and all(
                lo <= s and (hi is None or s <= hi) for s, (lo, hi) in zip(shape, r))
        return shape == self.shape or shape in self.flexible["shapes"]

    def __repr__(self):
        flex = "" if self.flexible is None else f", flexible={self.flexible}"
        return f"Feature({self.name!r}, {self.type}, {self.dtype}, shape={self.shape}{flex})"


class FeatureDescription(Mapping):
    """A model's inputs (or outputs, or states) by name, in the model's order: iterate for the
    names as with coremltools' ``input_description``; ``desc[name]`` is a :class:`Feature`."""

    def __init__(self, features):
        self._features = {f.name: f for f in features}

    def __getitem__(self, name):
        return self._features[name]

    def __iter__(self):
        return iter(self._features)

    def __len__(self):
        return len(self._features)

    def __repr__(self):
        return "\n".join(repr(f) for f in self._features.values())


def _as_array(name, value):
    if isinstance(value, np.ndarray):
        return value  # read in place: no copy before the one into the runtime
    if hasattr(value, "save") and hasattr(value, "mode"):  # a PIL image
        return np.asarray(value)
    try:
        return np.asarray(value)
    except Exception as e:
        raise MilkitError(f"input `{name}`: not an array ({e})") from None


class MLModel:
    """A Core ML model loaded by milkit's runtime, coremltools' ``MLModel`` API.

    ``MLModel(path, function_name=None, compute="package")`` loads an ``.mlpackage`` (or
    anything else milkit's runtime opens) and prepares it to run:

    - ``function_name``: the function of a multifunction package to run (default: the
      package's default function).
    - ``compute``: ``"package"`` computes in the package's own types, as a device does;
      ``"fp32"`` widens every fp16 tensor to float32; ``"bf16"`` runs encoder-sized products
      on bfloat16-rounded inputs (needs AVX512-BF16). As ``milkit run --compute``.
    - ``seed``: the seed of the random ops; ``max_memory``: refuse a model that would need
      more bytes than this (default: the machine's memory).

    ``predict(data, state=None)`` takes a dict name -> numpy array (or a list of such dicts)
    and returns a dict name -> numpy array in the model's output dtype (or a list). Inputs
    are converted at the boundary as ``milkit run`` converts them (float32 data for a float16
    input, ...); an array whose dtype is one milkit reads (float32, float16, float64, int32,
    int64, uint8, bool) is read in place, with one copy into the runtime. The GIL is released
    while the model runs. One ``MLModel`` runs one prediction at a time; load one per thread
    to predict in parallel.

    ``make_state()`` returns an :class:`MLState` (zeros) for a stateful model; pass it as
    ``state=`` and it is read and updated by the prediction.

    ``input_description``, ``output_description``, ``state_description``: the features by
    name (:class:`FeatureDescription`); ``function_names``: every function of the package.

    Errors raise :class:`MilkitError` with milkit's message.
    """

    def __init__(self, model, function_name=None, compute="package", *, seed=0,
                 max_memory=None, compute_units=None):
        # compute_units is accepted for coremltools code and ignored: milkit runs on the CPU.
        self._model = _milkit.Model(os.fspath(model), function_name, compute, seed, max_memory)
        self._desc = None

    @property
    def package_path(self):
        """The path the model was loaded from."""
        return str(self._model.path)

    @property
    def function_name(self):
        """The function given at load (None: the package's default)."""
        return self._model.function_name

    @property
    def function_names(self):
        """Every function of the package, sorted."""
        return list(self._model.function_names)

    def _described(self):
        if self._desc is None:
            i, o, s = self._model.describe()
            self._desc = tuple(FeatureDescription([Feature(f) for f in x]) for x in (i, o, s))
        return self._desc

    @property
    def input_description(self):
        """The inputs of the function run, by name (:class:`FeatureDescription`)."""
        return self._described()[0]

    @property
    def output_description(self):
        """The outputs of the function run, by name (:class:`FeatureDescription`)."""
        return self._described()[1]

    @property
    def state_description(self):
        """The states of the model, by name (:class:`FeatureDescription`)."""
        return self._described()[2]

    def make_state(self):
        """A new :class:`MLState` for this model: every state zeros."""
        return self._model.make_state()

    def predict(self, data, state=None):
        """Runs the model: ``data`` a dict name -> array (a list of dicts gives a list of
        results); ``state`` an :class:`MLState` from :meth:`make_state`, read and updated.
        Without ``state`` a stateful model starts from zeros. Returns name -> numpy array (a
        classifier's label as str, its probabilities as a dict)."""
        if isinstance(data, list):
            if state is not None:
                raise MilkitError("a state can only be used with one prediction, not a list")
            return [self.predict(d) for d in data]
        if not isinstance(data, dict):
            raise TypeError(f"data must be a dict or a list of dicts, not {type(data).__name__}")
        feeds = {k: _as_array(k, v) for k, v in data.items()}
        return self._model.predict(feeds, state)

    def __repr__(self):
        return repr(self._model)


def use_with_coremltools(force=False, compute="package"):
    """Makes coremltools, in this process, predict through milkit: from then on
    ``ct.models.MLModel(...).predict(...)``, ``make_state()`` and the model ``ct.convert(...)``
    returns run with milkit's runtime instead of Core ML. coremltools' platform checks answer
    as on macOS 15 so that it takes its prediction path.

    ``compute`` is :class:`MLModel`'s: ``"package"`` computes in the program's own types,
    ``"fp32"`` computes fp16 programs in fp32 (as a CPU that widens fp16 ops would).

    On macOS, where Core ML itself runs the models, it does nothing unless ``force=True``.
    Returns whether coremltools now predicts through milkit.
    """
    if sys.platform == "darwin" and not force:
        return False
    from milkit import _coremltools

    _coremltools.install(compute)
    return True


def _flags(options, renames=None):
    """Keywords as command-line flags: True a switch, False/None left out, a sequence
    comma-joined."""
    argv = []
    for key, value in options.items():
        key = (renames or {}).get(key, key)
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, (list, tuple)):
            argv += [flag, ",".join(str(v) for v in value)]
        else:
            argv += [flag, str(value)]
    return argv


def export(model, out, **options):
    """Exports a Whisper checkpoint as ``milkit export`` does, in this process, and returns
    what it wrote: ``{"out": path, "files": [names], "bytes": total}``.

    ``model`` is a Hugging Face checkpoint folder (or a Hub id when the Hub is reachable);
    ``out`` the package (one component) or folder (``component="all"``, the default being
    that command's). ``options`` are ``milkit export``'s flags as keywords, with its defaults:
    ``component`` (``"encoder"``, ``"decoder"``, ``"mel"``, ``"all"``, ...), ``target``
    (``"ios18"``), ``recipe`` (a recipe file such as ``models/whisperkit-faithful.toml``),
    ``palettize="kmeans"`` with ``nbits=4``, ``quantize="int8"``, ``stateful``, ``force``,
    ``quiet``, ``calibrate_on``, ``target_quality`` (docs/cli.md lists them all). ``True`` turns
    a switch on; ``False`` and ``None`` leave the flag out. Progress goes to stderr; the GIL
    is released while it runs. Raises :class:`MilkitError` with the command's message.
    """
    argv = ["--model", os.fspath(model), "--out", os.fspath(out), *_flags(options)]
    _milkit.export_run(argv)
    out = os.fspath(out)
    if os.path.isdir(out) and not out.endswith(".mlpackage"):
        files = sorted(os.listdir(out))
    else:
        files = [os.path.basename(out)]
    total = 0
    for root, _, names in os.walk(out):
        total += sum(os.path.getsize(os.path.join(root, n)) for n in names)
    return {"out": out, "files": files, "bytes": total}


def verify(package, **expectations):
    """Checks a package's claims as ``milkit verify --json`` does and returns its report
    (schemas/verify.schema.json) as a dict: ``ok``, ``mismatches``, the I/O, op counts,
    weights and, with ``placement=True``, the predicted compute unit of every op.

    ``expectations`` are that command's flags as keywords: ``expect_lut_ops=26``,
    ``expect_ops=["linear=24", "conv=2"]``, ``expect_abi="whisperkit"``, ``placement=True``.
    A mismatch is reported (``ok`` False), not raised; an unreadable package raises
    :class:`MilkitError`.
    """
    argv = [os.fspath(package), *_flags(expectations)]
    return json.loads(_milkit.verify_json(argv))


def transcribe(models, audio, **options):
    """Transcribes an audio file (WAV, FLAC, MP3, Ogg Vorbis, Opus, M4A, ...) with a models
    folder (``milkit export --component all``), as ``milkit transcribe`` does, and returns
    openai-whisper's result dict: ``text``, ``language``, ``segments`` (each with ``words``
    when ``word_timestamps=True``), and milkit's ``audio`` (container, codec, sample rate,
    channels, duration of the file).

    ``options`` are ``milkit transcribe``'s flags as keywords, with its defaults:
    ``language`` (default ``"auto"``), ``task`` (``"transcribe"`` or ``"translate"``),
    ``word_timestamps``, ``temperature`` (a number or a sequence tried in order),
    ``compression_ratio_threshold``, ``logprob_threshold``, ``no_speech_threshold``,
    ``condition_on_previous_text``, ``initial_prompt``, ``without_timestamps``, ``seed``,
    ``beam_size``, ``patience``, ``length_penalty``, ``best_of`` (openai-whisper's beam search
    and best-of), ``mel_padding`` (``"audio"``, Hugging Face's, or ``"features"``,
    openai-whisper's and faster-whisper's), ``compute``, ``mel_package``, ``prefill``; voice
    activity detection with ``vad`` (a Silero VAD ``.mlpackage``/``.mlmodelc`` folder or a
    Hub id such as ``"FluidInference/silero-vad-coreml"``: only the speech is transcribed,
    times stay on the file's timeline) and faster-whisper's parameters ``vad_threshold``,
    ``vad_neg_threshold``, ``vad_min_speech_duration_ms``, ``vad_max_speech_duration_s``,
    ``vad_min_silence_duration_ms``, ``vad_speech_pad_ms``. ``True`` turns a switch on;
    ``False`` and ``None`` leave the flag out. The GIL is released while it runs.
    """
    argv = [os.fspath(audio), "--models", os.fspath(models),
            *_flags(options, {"without_timestamps": "no_timestamps"})]
    return json.loads(_milkit.transcribe_json(argv))
