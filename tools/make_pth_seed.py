"""Writes a tiny PyTorch zip checkpoint (pytorch_model.bin layout) without torch: the
pickle names torch._utils._rebuild_tensor_v2 and torch.HalfStorage/FloatStorage exactly as
torch.save does, with the storages as archive/data/N. Used for the fuzz seed of the pytorch
target and the hostile-input tests. Usage: make_pth_seed.py OUT"""
import collections
import pickle
import struct
import sys
import types
import zipfile

torch = types.ModuleType("torch")
utils = types.ModuleType("torch._utils")


def _rebuild_tensor_v2(*args):
    raise NotImplementedError


_rebuild_tensor_v2.__module__ = "torch._utils"
_rebuild_tensor_v2.__qualname__ = "_rebuild_tensor_v2"
utils._rebuild_tensor_v2 = _rebuild_tensor_v2


class HalfStorage:
    pass


class FloatStorage:
    pass


for cls in (HalfStorage, FloatStorage):
    cls.__module__ = "torch"
    setattr(torch, cls.__name__, cls)
torch._utils = utils
sys.modules["torch"] = torch
sys.modules["torch._utils"] = utils


class Storage:
    def __init__(self, cls, key, numel):
        self.cls, self.key, self.numel = cls, key, numel


class Tensor:
    def __init__(self, storage, shape, offset=0):
        self.storage, self.shape, self.offset = storage, shape, offset

    def __reduce__(self):
        stride, acc = [], 1
        for d in reversed(self.shape):
            stride.insert(0, acc)
            acc *= d
        return (
            _rebuild_tensor_v2,
            (self.storage, self.offset, tuple(self.shape), tuple(stride), False,
             collections.OrderedDict()),
        )


class Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, Storage):
            return ("storage", obj.cls, obj.key, "cpu", obj.numel)
        return None


def write(path, tensors):
    """tensors: name -> (cls, shape, raw bytes)."""
    state = collections.OrderedDict()
    blobs = {}
    for i, (name, (cls, shape, raw)) in enumerate(tensors.items()):
        size = 2 if cls is HalfStorage else 4
        st = Storage(cls, str(i), len(raw) // size)
        state[name] = Tensor(st, shape)
        blobs[str(i)] = raw
    import io
    buf = io.BytesIO()
    Pickler(buf, protocol=2).dump(state)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", buf.getvalue())
        for k, raw in blobs.items():
            z.writestr(f"archive/data/{k}", raw)
        z.writestr("archive/version", "3\n")


if __name__ == "__main__":
    write(sys.argv[1], {
        "model.encoder.conv1.bias": (HalfStorage, [2], struct.pack("<2e", 1.0, -1.0)),
        "proj_out.weight": (FloatStorage, [1, 2], struct.pack("<2f", 0.5, 2.0)),
    })
