"""Writes small mlprogram packages made by coremltools' own MIL builder, one per op of
tests/op_conformance.rs's `coremltools_made_*` test: conv_transpose, conv_quantized, the
resize family, ... and classifiers (`ct.convert` with a `ClassifierConfig`, which appends
coremltools' `classify` op and writes the classifier description). For each case NAME it writes OUT/NAME.mlpackage and the values it used as
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


def save(name, prog, target, arrays, precision=ct.precision.FLOAT32, classifier=None):
    m = ct.convert(
        prog,
        convert_to="mlprogram",
        minimum_deployment_target=target,
        compute_precision=precision,
        classifier_config=classifier,
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


# Recurrent ops (iOS17, fp32): x [4, 2, 3], h0 [2, 5], c0 [2, 10] (bidirectional lstm).
S, B, I, H = 4, 2, 3, 5
rw = {
    "rnn_wi": rand(H, I), "rnn_wh": rand(H, H), "rnn_b": rand(H),
    "gru_wi": rand(3 * H, I), "gru_wh": rand(3 * H, H), "gru_b": rand(3 * H),
    "lstm_wi": rand(4 * H, I), "lstm_wh": rand(4 * H, H), "lstm_b": rand(4 * H),
    "lstm_p": rand(3 * H), "lstm_wib": rand(4 * H, I), "lstm_whb": rand(4 * H, H),
    "lstm_bb": rand(4 * H), "lstm_pb": rand(3 * H),
}


@mb.program(
    input_specs=[
        mb.TensorSpec(shape=(S, B, I)),
        mb.TensorSpec(shape=(B, H)),
        mb.TensorSpec(shape=(B, 2 * H)),
        mb.TensorSpec(shape=(B, 2 * H)),
    ],
    opset_version=ct.target.iOS17,
)
def prog_rec(x, h0, hb, cb):
    r = mb.rnn(
        x=x, initial_h=h0, weight_ih=rw["rnn_wi"], weight_hh=rw["rnn_wh"], bias=rw["rnn_b"],
        direction="reverse", output_sequence=True, activation="tanh", name="rnn",
    )
    g = mb.gru(
        x=x, initial_h=h0, weight_ih=rw["gru_wi"], weight_hh=rw["gru_wh"], bias=rw["gru_b"],
        output_sequence=True, name="gru",
    )
    l = mb.lstm(
        x=x, initial_h=hb, initial_c=cb, weight_ih=rw["lstm_wi"], weight_hh=rw["lstm_wh"],
        bias=rw["lstm_b"], peephole=rw["lstm_p"], weight_ih_back=rw["lstm_wib"],
        weight_hh_back=rw["lstm_whb"], bias_back=rw["lstm_bb"], peephole_back=rw["lstm_pb"],
        direction="bidirectional", output_sequence=True, clip=np.float32(0.7), name="lstm",
    )
    return r[0], r[1], g[0], g[1], l[0], l[1], l[2]


save("recurrent", prog_rec, ct.target.iOS17, rw)


# non_maximum_suppression (iOS15 layout): boxes [1, 8, 4], scores [1, 8, 2].
@mb.program(
    input_specs=[mb.TensorSpec(shape=(1, 8, 4)), mb.TensorSpec(shape=(1, 8, 2))],
    opset_version=ct.target.iOS15,
)
def prog_nms(boxes, scores):
    return mb.non_maximum_suppression(
        boxes=boxes, scores=scores, iou_threshold=np.float32(0.2),
        score_threshold=np.float32(0.1), max_boxes=5, per_class_suppression=True, name="nms",
    )


save("nms", prog_nms, ct.target.iOS15, {})


# resample, affine, crop_resize (iOS17) on x [2, 2, 4, 5].
aff = np.array([[0.9, 0.2, 0.1, -0.15, 1.1, -0.05]], dtype=np.float32)
crop_boxes = np.array([[0.5, 0.2, 3.5, 4.4], [-0.5, 1.0, 2.0, 5.5]], dtype=np.float32)


@mb.program(
    input_specs=[mb.TensorSpec(shape=(2, 2, 4, 5)), mb.TensorSpec(shape=(2, 3, 6, 2))],
    opset_version=ct.target.iOS17,
)
def prog_s(x, coords):
    a = mb.resample(
        x=x, coordinates=coords, sampling_mode="bilinear", padding_mode="border",
        padding_value=np.float32(0.0), coordinates_mode="normalized_zero_to_one",
        align_corners=True, name="resample",
    )
    b = mb.affine(
        x=x, transform_matrix=aff, output_height=3, output_width=6, sampling_mode="bilinear",
        padding_mode="constant", padding_value=np.float32(0.0),
        coordinates_mode="normalized_minus_one_to_one", align_corners=True, name="affine",
    )
    c = mb.crop_resize(
        x=x, boxes=crop_boxes, box_indices=np.array([1, 0], dtype=np.int32), target_height=3,
        target_width=4, box_coordinate_mode="CORNERS_HEIGHT_FIRST",
        sampling_mode="ALIGN_CORNERS", pad_value=np.float32(0.5), name="crop_resize",
    )
    return a, b, c


save("sampling", prog_s, ct.target.iOS17, {"aff": aff, "boxes": crop_boxes})


# Classifiers: string classes on a softmax of x [1, 5] (iOS15, fp32), int64 classes on a
# sigmoid of x [2, 3] (iOS18, fp16 compute: coremltools casts the probabilities to fp32).
@mb.program(input_specs=[mb.TensorSpec(shape=(1, 5))], opset_version=ct.target.iOS15)
def prog_cls_str(x):
    return mb.softmax(x=x, axis=-1, name="probs")


save(
    "classifier_str", prog_cls_str, ct.target.iOS15, {},
    classifier=ct.ClassifierConfig(["cat", "dog", "eel", "fox", "gnu"]),
)


@mb.program(input_specs=[mb.TensorSpec(shape=(2, 3))], opset_version=ct.target.iOS18)
def prog_cls_int(x):
    return mb.sigmoid(x=x, name="probs")


save(
    "classifier_int", prog_cls_int, ct.target.iOS18, {}, precision=ct.precision.FLOAT16,
    classifier=ct.ClassifierConfig([10, -3, 7, 1 << 40, 0, 5], predicted_feature_name="id"),
)
