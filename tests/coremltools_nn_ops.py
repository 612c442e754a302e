"""Writes small mlprogram packages made by coremltools' own MIL builder, one per op of
tests/op_conformance.rs's `coremltools_made_*` test: conv_transpose, conv_quantized and the
resize family. For each case NAME it writes OUT/NAME.mlpackage and the values it used as
OUT/NAME.<tensor>.npy (float64 or int), so the Rust side can compute its own float64
reference. Usage: python coremltools_nn_ops.py OUT_DIR
"""

import os
import sys

import numpy as np
import coremltools as ct
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import types

OUT = sys.argv[1]
rng = np.random.default_rng(7)


def save(name, prog, target, arrays):
    m = ct.convert(
        prog,
        convert_to="mlprogram",
        minimum_deployment_target=target,
        compute_precision=ct.precision.FLOAT32,
    )
    m.save(os.path.join(OUT, name + ".mlpackage"))
    for k, v in arrays.items():
        np.save(os.path.join(OUT, f"{name}.{k}.npy"), v)


def rand(*shape):
    return rng.uniform(-1, 1, size=shape).astype(np.float32)


# conv_transpose: 2-D, groups 2, strides 2x1, dilations 1x2, custom pad, bias (iOS15 and iOS17).
for target, tag in [(ct.target.iOS15, "ios15"), (ct.target.iOS17, "ios17")]:
    w = rand(4, 3, 3, 2)
    b = rand(6)

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 4, 3, 4))], opset_version=target)
    def prog(x):
        return mb.conv_transpose(
            x=x,
            weight=w,
            bias=b,
            strides=[2, 1],
            dilations=[1, 2],
            pad_type="custom",
            pad=[1, 0, 0, 2],
            groups=2,
            name="y",
        )

    save(f"conv_transpose_{tag}", prog, target, {"w": w, "b": b})

# conv_quantized (iOS15): uint8 weight, per-channel scale, scalar bias, same padding.
wq = rng.integers(0, 256, size=(3, 2, 3, 3)).astype(np.uint8)
qs = np.array([0.01, -0.02, 0.005], dtype=np.float32)


@mb.program(input_specs=[mb.TensorSpec(shape=(1, 2, 4, 5))], opset_version=ct.target.iOS15)
def prog_q(x):
    return mb.conv_quantized(
        x=x,
        weight=wq,
        quantization_type="linear",
        nbits=8,
        quant_scale=qs,
        quant_bias=np.float32(-0.5),
        pad_type="same",
        name="y",
    )


save("conv_quantized", prog_q, ct.target.iOS15, {"w": wq, "s": qs})


# The resize family on one [1, 2, 3, 4] input.
@mb.program(input_specs=[mb.TensorSpec(shape=(1, 2, 3, 4))], opset_version=ct.target.iOS17)
def prog_r(x):
    a = mb.upsample_bilinear(
        x=x, scale_factor_height=2.0, scale_factor_width=3.0, align_corners=False, name="up_bi"
    )
    b = mb.upsample_nearest_neighbor(
        x=x, scale_factor_height=2, scale_factor_width=2, name="up_nn"
    )
    c = mb.resize_bilinear(
        x=x, target_size_height=5, target_size_width=7, sampling_mode="ALIGN_CORNERS", name="rs_bi"
    )
    d = mb.resize_nearest_neighbor(x=x, target_size_height=2, target_size_width=6, name="rs_nn")
    e = mb.crop(x=x, crop_height=[1, 0], crop_width=[1, 2], name="crop")
    f = mb.resize(
        x=x,
        shape=np.array([6, 3], dtype=np.int32),
        resized_dims=np.uint32(2),
        interpolation_mode="LINEAR",
        sampling_mode="UNALIGN_CORNERS",
        name="resize",
    )
    return a, b, c, d, e, f


save("resize_family", prog_r, ct.target.iOS17, {})
