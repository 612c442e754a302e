"""coremltools predicting through milkit: the model proxy coremltools' ``MLModel`` gets in
place of Core ML's, and the platform answers that make coremltools take its prediction path.
Installed by :func:`milkit.use_with_coremltools`."""

import os
import shutil
import sys
import tempfile

import numpy as np

from milkit import MLModel, MilkitError

# The macOS version coremltools is told it runs on: iOS18's opset runs there, and every
# check of the form `_macos_version() < (15, x)` takes the current path.
PRETEND_MACOS = (15, 5)

# How the proxies compute (:class:`milkit.MLModel`'s ``compute``); set by :func:`install`.
COMPUTE = "package"


class Proxy:
    """What coremltools' ``_MLModelProxy`` is on macOS, over :class:`milkit.MLModel`."""

    def __init__(self, path, compute_units="CPU_ONLY", function_name="", hints=None, asset=None):
        path = os.path.expanduser(path)
        self._tmp = None
        if not os.path.isdir(path):
            # A single-file model: coremltools may remove it right after the proxy is made,
            # and the compiled-model path must stay valid.
            self._tmp = tempfile.mkdtemp(prefix="milkit-coreml-")
            copy = os.path.join(self._tmp, os.path.basename(path))
            shutil.copyfile(path, copy)
            path = copy
        self._path = path
        try:
            self._model = MLModel(path, function_name=function_name or None, compute=COMPUTE)
        except MilkitError as e:
            # Worded as Core ML words a failed load, with milkit's reason after it.
            raise MilkitError(f"Unable to load the model. milkit: {e}") from None

    def __del__(self):
        if getattr(self, "_tmp", None):
            shutil.rmtree(self._tmp, ignore_errors=True)

    @staticmethod
    def maximum_supported_specification_version():
        return 9

    def newState(self):
        return self._model.make_state()

    def predict(self, data, state=None):
        try:
            return self._model.predict(data, state=state)
        except MilkitError as e:
            raise MilkitError(
                f"Unable to compute the prediction using ML Program. milkit: {e}") from None

    def batchPredict(self, data):
        return [self.predict(d) for d in data]

    def get_compiled_model_path(self):
        return self._path


def install(compute="package"):
    """Makes coremltools, in this process, predict through milkit as if on macOS, the
    models computing as ``compute`` says."""
    global COMPUTE
    COMPUTE = compute
    import coremltools
    import coremltools._deps as deps
    import coremltools.models.model as model
    import coremltools.models.utils as utils

    if model._MLModelProxy is Proxy:
        return coremltools

    def is_macos():
        return True

    def macos_version():
        return PRETEND_MACOS

    deps._IS_MACOS = True
    deps._MACOS_VERSION = PRETEND_MACOS
    model._MLModelProxy = Proxy
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
