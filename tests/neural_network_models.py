"""NeuralNetwork models made with coremltools' own NeuralNetworkBuilder, each with an input
and its expected output computed here in float64 numpy (tests/neural_network.rs runs them).

    python tests/neural_network_models.py DIR

writes DIR/NAME.mlmodel, DIR/NAME.in.npy and DIR/NAME.out.npy per model, and prints the names.
"""
import contextlib
import os
import sys

import numpy as np
from coremltools.models import datatypes
from coremltools.models.neural_network import NeuralNetworkBuilder
from coremltools.models.utils import save_spec

rng = np.random.default_rng(7)


def rnd(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def conv2d(x, w, b, stride, pad):
    """x [C, H, W], w [O, C, kh, kw], pad (top, bottom, left, right)."""
    x = np.pad(x, ((0, 0), (pad[0], pad[1]), (pad[2], pad[3])))
    o, c, kh, kw = w.shape
    ho = (x.shape[1] - kh) // stride + 1
    wo = (x.shape[2] - kw) // stride + 1
    y = np.zeros((o, ho, wo))
    for i in range(ho):
        for j in range(wo):
            patch = x[:, i * stride:i * stride + kh, j * stride:j * stride + kw]
            y[:, i, j] = np.tensordot(w, patch, axes=([1, 2, 3], [0, 1, 2]))
    return y + b[:, None, None]


def cnn():
    """Rank-5 layers: strided convolution, batchnorm, leaky ReLU, average pooling (ceil
    mode), depthwise convolution, upsampling, concat, global max pooling, inner product."""
    c, h, w = 3, 9, 9
    b = NeuralNetworkBuilder([("x", datatypes.Array(c, h, w))], [("y", datatypes.Array(5))])
    w1, b1 = rnd(8, c, 3, 3), rnd(8)
    b.add_convolution("conv1", kernel_channels=c, output_channels=8, height=3, width=3,
                      stride_height=2, stride_width=2, border_mode="same", groups=1,
                      W=w1.transpose(2, 3, 1, 0), b=b1, has_bias=True,
                      input_name="x", output_name="c1")
    g, bt, m, v = rnd(8), rnd(8), rnd(8), np.abs(rnd(8)) + 0.5
    b.add_batchnorm("bn", 8, g, bt, mean=m, variance=v, input_name="c1", output_name="bn",
                    epsilon=1e-5)
    b.add_activation("lrelu", "LEAKYRELU", "bn", "a1", params=[0.1])
    wd = rnd(8, 1, 3, 3)
    b.add_convolution("dw", kernel_channels=1, output_channels=8, height=3, width=3,
                      stride_height=1, stride_width=1, border_mode="valid", groups=8,
                      W=wd.transpose(2, 3, 1, 0), b=None, has_bias=False,
                      input_name="a1", output_name="d1")
    b.add_upsample("up", scaling_factor_h=2, scaling_factor_w=2, input_name="d1",
                   output_name="u1", mode="NN")
    b.add_pooling("avg", height=2, width=2, stride_height=2, stride_width=2,
                  layer_type="AVERAGE", padding_type="VALID", input_name="u1",
                  output_name="p1")
    b.add_pooling("gmax", height=1, width=1, stride_height=1, stride_width=1,
                  layer_type="MAX", padding_type="VALID", input_name="p1", output_name="g1",
                  is_global=True)
    wf, bf = rnd(5, 8), rnd(5)
    b.add_inner_product("fc", W=wf, b=bf, input_channels=8, output_channels=5, has_bias=True,
                        input_name="g1", output_name="y")
    x = rnd(c, h, w)
    # same padding for 9 → 5 with stride 2, kernel 3: total 2, one on each side.
    y = conv2d(x.astype(np.float64), w1, b1, 2, (1, 1, 1, 1))
    y = g[:, None, None] * (y - m[:, None, None]) / np.sqrt(v[:, None, None] + 1e-5) \
        + bt[:, None, None]
    y = np.where(y >= 0, y, 0.1 * y)
    yd = np.stack([conv2d(y[i:i + 1], wd[i:i + 1], np.zeros(1), 1, (0, 0, 0, 0))[0]
                   for i in range(8)])
    yu = yd.repeat(2, axis=1).repeat(2, axis=2)
    yp = yu.reshape(8, 3, 2, 3, 2).mean(axis=(2, 4))
    yg = yp.max(axis=(1, 2))
    out = wf @ yg + bf
    return b.spec, x, out


def attention():
    """Rank-N layers: batched matmul with weights, reshape, transpose, scaled softmax,
    layer normalization, GELU, split and concat."""
    t, d, heads = 6, 8, 2
    b = NeuralNetworkBuilder([("x", datatypes.Array(t, d))], [("y", datatypes.Array(t, d))],
                             disable_rank5_shape_mapping=True)
    wq, wk, wv = rnd(d, d), rnd(d, d), rnd(d, d)
    for n, wm in (("q", wq), ("k", wk), ("v", wv)):
        b.add_batched_mat_mul(n, ["x"], n, W=wm, weight_matrix_rows=d, weight_matrix_columns=d)
        b.add_reshape_static(n + "_heads", n, n + "_h", (t, heads, d // heads))
        b.add_transpose(n + "_t", (1, 0, 2), n + "_h", n + "_t")
    b.add_batched_mat_mul("scores", ["q_t", "k_t"], "s", transpose_b=True)
    b.add_elementwise("scale", ["s"], "s_scaled", mode="MULTIPLY",
                      alpha=1.0 / np.sqrt(d // heads))
    b.add_softmax_nd("attn", "s_scaled", "p", axis=-1)
    b.add_batched_mat_mul("ctx", ["p", "v_t"], "c")
    b.add_transpose("ctx_t", (1, 0, 2), "c", "c_t")
    b.add_reshape_static("merge", "c_t", "c_m", (t, d))
    b.add_add_broadcastable("residual", ["c_m", "x"], "r")
    gamma, beta = rnd(d), rnd(d)
    b.add_layer_normalization("ln", "r", "n", normalized_shape=[d], gamma=gamma, beta=beta,
                              eps=1e-5)
    b.add_gelu("gelu", "n", "gl", mode="EXACT")
    b.add_split_nd("split", "gl", ["a", "bb"], axis=-1, num_splits=2)
    b.add_concat_nd("cat", ["bb", "a"], "y", axis=-1)
    x = rnd(t, d).astype(np.float64)

    def heads_of(m):
        return (x @ m).reshape(t, heads, d // heads).transpose(1, 0, 2)

    q, k, v = heads_of(wq), heads_of(wk), heads_of(wv)
    p = softmax(q @ k.transpose(0, 2, 1) / np.sqrt(d // heads), -1)
    c = (p @ v).transpose(1, 0, 2).reshape(t, d) + x
    mu = c.mean(-1, keepdims=True)
    var = c.var(-1, keepdims=True)
    n = (c - mu) / np.sqrt(var + 1e-5) * gamma + beta
    from math import erf
    gl = 0.5 * n * (1 + np.vectorize(erf)(n / np.sqrt(2)))
    out = np.concatenate([gl[:, d // 2:], gl[:, :d // 2]], axis=-1)
    return b.spec, x.astype(np.float32), out


def quantized():
    """An inner product whose weights are 4-bit linearly quantized, one scale and bias per
    output channel (coremltools' own quantization utility packs them), then a sigmoid."""
    from coremltools.models.neural_network.quantization_utils import (
        _quantize_nn_spec, AdvancedQuantizedLayerSelector)
    cin, cout = 12, 6
    b = NeuralNetworkBuilder([("x", datatypes.Array(cin))], [("y", datatypes.Array(cout))])
    w, bias = rnd(cout, cin), rnd(cout)
    b.add_inner_product("fc", W=w, b=bias, input_channels=cin, output_channels=cout,
                        has_bias=True, input_name="x", output_name="h")
    b.add_activation("sig", "SIGMOID", "h", "y")
    spec = b.spec
    spec.specificationVersion = 3
    sel = AdvancedQuantizedLayerSelector(minimum_conv_kernel_channels=1,
                                         minimum_conv_weight_count=1)
    with contextlib.redirect_stdout(sys.stderr):  # its progress lines
        _quantize_nn_spec(spec.neuralNetwork, 4, "_linear_quantization", selector=sel)
    # The reference dequantizes what coremltools wrote (weights and bias alike): its codes,
    # most significant bit first, times a scale plus a bias, one or one per output channel.
    ip = spec.neuralNetwork.layers[0].innerProduct
    wq = dequantized(ip.weights, cout * cin).reshape(cout, cin)
    ip_bias = dequantized(ip.bias, cout)
    assert np.abs(wq - w).max() < 0.5, "the quantized weights are far from the originals"
    x = rnd(cin)
    out = 1 / (1 + np.exp(-(wq @ x + ip_bias)))
    return spec, x, out


def dequantized(wp, n):
    lin = wp.quantization.linearQuantization
    bits = wp.quantization.numberOfBits
    codes = np.unpackbits(np.frombuffer(wp.rawValue, dtype=np.uint8))[:n * bits]
    codes = codes.reshape(n, bits) @ (1 << np.arange(bits - 1, -1, -1))
    rows = len(lin.scale)
    scale = np.repeat(np.array(lin.scale, dtype=np.float64), n // rows)
    offset = np.repeat(np.array(lin.bias, dtype=np.float64), n // rows)
    return scale * codes + offset


if __name__ == "__main__":
    out_dir = sys.argv[1]
    for name, make in (("cnn", cnn), ("attention", attention), ("quantized", quantized)):
        spec, x, y = make()
        save_spec(spec, os.path.join(out_dir, name + ".mlmodel"))
        np.save(os.path.join(out_dir, name + ".in.npy"), x)
        np.save(os.path.join(out_dir, name + ".out.npy"), np.asarray(y, dtype=np.float64))
        print(name)
