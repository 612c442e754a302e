#!/usr/bin/env python3
"""Real models converted by coremltools from PyTorch, predicted through milkit, checked
against PyTorch float32.

Each model is built with random weights (torch.manual_seed) and small inputs, traced with
torch.jit.trace, converted with `ct.convert(..., convert_to="mlprogram")` once with
compute_precision FLOAT32 and once with FLOAT16, and predicted with coremltools'
`MLModel.predict` (and `make_state` for stateful models), which the plugin
tests/coremltools_suite/milkit_coreml.py routes through the installed `milkit` module
(`milkit.use_with_coremltools()`; `pip install .` from the repository) off macOS.

What is measured, per model and precision, worst over every output and every test input:
- fp32 packages: relative L2 error ||y - ref|| / ||ref||, bound 1e-4;
- fp16 packages: PSNR = 20 log10(max|ref| / rms(y - ref)), bound 40 dB;
- compressed packages (coremltools.optimize.coreml: palettize_weights 4-bit uniform LUT,
  linear_quantize_weights int8 symmetric per channel): the reference is PyTorch float32 run
  with the compressed package's own weights (coremltools' decompress_weights, each
  decompressed constant matched back to the PyTorch parameter it came from), so the same
  bounds apply as for uncompressed packages. Where a compressed constant cannot be matched to
  a parameter, the row says "vs uncompressed" and compares against the uncompressed PyTorch
  output with PSNR, bound 25 dB for int8 and 10 dB for 4-bit (random weights; a sanity bound
  only, the function itself changed).
The reference of a stateful model whose fp32 package keeps its states in fp16 stores the
cache rounded to fp16, as the package does.

Random weights are made to behave like trained ones where that matters: batch norms get
their running statistics from random batches (with torchvision's initial statistics a
MobileNet's logits are about 1e-10, below fp16's normal range, and PyTorch's own fp16 gives
10 dB); the ViT's zero-initialised head gets weights. GPT-2 gets its additive causal mask in
4-D from the wrapper (transformers' own mask builder uses ops coremltools cannot convert).
nn.MultiheadAttention's fast path is turned off for tracing (it traces to
`_native_multi_head_attention`, which coremltools does not convert).

The time column is milkit's wall time per prediction (`milkit run`, process start and .npy
transfer included), the mean over the predictions of that row.

  real_models.py [--only NAME[,NAME...]] [--precision fp32,fp16] [--json FILE] [--list]

Prints a markdown table (model, precision, input shapes, metric, value, bound, result,
milkit predict time), then each failure with milkit's message; full tracebacks go to
--log (target/real-models.log). Exit status 1 when a row fails.

Needs torchvision and transformers (configs only, no weights are downloaded) beside
coremltools and torch.
"""

import argparse
import json
import os
import sys
import time
import traceback
import warnings

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "coremltools_suite"))
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TQDM_DISABLE", "1")

import numpy as np  # noqa: E402

FP32_BOUND = 1e-4
FP16_BOUND = 40.0
LOOSE_BOUND = {"int8": 25.0, "lut4": 10.0}


# ---------------------------------------------------------------------------------------
# metrics


def rel_l2(y, ref):
    y = np.asarray(y, np.float64).ravel()
    ref = np.asarray(ref, np.float64).ravel()
    d = np.linalg.norm(ref)
    return float(np.linalg.norm(y - ref) / (d if d > 0 else 1.0))


def psnr(y, ref):
    y = np.asarray(y, np.float64).ravel()
    ref = np.asarray(ref, np.float64).ravel()
    rms = np.sqrt(np.mean((y - ref) ** 2))
    peak = np.max(np.abs(ref))
    if rms == 0:
        return float("inf")
    return float(20 * np.log10(peak / rms))


# ---------------------------------------------------------------------------------------
# model definitions


class Spec:
    """What one model needs: the torch module, how to convert it, the test inputs.

    module: the torch module traced and used as reference (eval mode).
    trace_inputs: tuple of tensors for torch.jit.trace.
    ct_inputs: coremltools input types (names must match the test dicts' keys).
    outputs: names for the outputs (one per torch output).
    tests: list of tests; each a list of steps; a step is a dict name -> numpy array (what
      `predict` gets). Steps of one test share a state (stateful models).
    to_torch: step dict -> tuple of torch tensors for the module.
    states: dtype -> coremltools StateType list (stateful models), else None.
    target: minimum deployment target (default iOS15).
    shapes: the input-shapes text of the table (default: the first test's shapes).
    """

    def __init__(self, module, trace_inputs, ct_inputs, outputs, tests, to_torch=None,
                 states=None, target=None, reference=None, shapes=None):
        self.module = module
        self.trace_inputs = trace_inputs
        self.ct_inputs = ct_inputs
        self.outputs = outputs
        self.tests = tests
        self.to_torch = to_torch
        self.states = states
        self.target = target
        # reference(precision, test, state_fp16) -> per step, the list of numpy outputs;
        # default: `module` run step by step on to_torch(step).
        self.reference = reference
        self.shapes = shapes
        # None, or how the package's weights are compressed: "int8" or "lut4" (compress()).
        self.compress = None


def _torch():
    import torch

    return torch


def _seeded(seed=0):
    torch = _torch()
    torch.manual_seed(seed)
    np.random.seed(seed)


def _tuple(out):
    torch = _torch()
    if isinstance(out, torch.Tensor):
        return (out,)
    flat = []
    for o in out:
        flat.extend(_tuple(o))
    return tuple(flat)


def _calibrate_bn(module, shape, batches=3, batch=8):
    """Sets the batch norms' running statistics from random batches (train-mode forward
    passes), as training would. With torchvision's initial statistics (mean 0, variance 1)
    a random-weight MobileNet's or EfficientNet's logits are about 1e-10, under fp16's
    smallest normal number, and an fp16 comparison would measure only that underflow."""
    torch = _torch()
    bns = [m for m in module.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return module
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None  # a cumulative average over the batches
    module.train()
    with torch.no_grad():
        for _ in range(batches):
            module(torch.randn(batch, *shape[1:]))
    return module.eval()


def _image_spec(module, shape, name="x"):
    """A CNN with one fixed image-shaped float input."""
    import coremltools as ct

    torch = _torch()
    module = _calibrate_bn(module, shape)
    x = torch.randn(*shape)
    n_out = len(_tuple(module(x)))
    return Spec(
        module,
        (x,),
        [ct.TensorType(name=name, shape=shape)],
        [f"out{k}" for k in range(n_out)],
        [[{name: torch.randn(*shape).numpy()}]],
        to_torch=lambda step: (torch.from_numpy(step[name]),),
    )


def build_resnet18():
    import torchvision

    _seeded(1)
    return _image_spec(torchvision.models.resnet18(weights=None).eval(), (1, 3, 64, 64))


def build_mobilenet_v3_small():
    import torchvision

    _seeded(2)
    return _image_spec(torchvision.models.mobilenet_v3_small(weights=None).eval(), (1, 3, 64, 64))


def build_efficientnet_b0():
    import torchvision

    _seeded(3)
    return _image_spec(torchvision.models.efficientnet_b0(weights=None).eval(), (1, 3, 64, 64))


def build_convnext_tiny():
    import torchvision

    _seeded(4)
    return _image_spec(torchvision.models.convnext_tiny(weights=None).eval(), (1, 3, 64, 64))


def build_vit_tiny():
    from torchvision.models.vision_transformer import VisionTransformer

    _seeded(5)
    m = VisionTransformer(image_size=64, patch_size=16, num_layers=4, num_heads=4,
                          hidden_dim=128, mlp_dim=256, num_classes=100).eval()
    # torchvision starts the classifier head at zero (every output 0); give it weights.
    torch = _torch()
    with torch.no_grad():
        m.heads.head.weight.normal_(0, 0.05)
        m.heads.head.bias.normal_(0, 0.05)
    return _image_spec(m, (1, 3, 64, 64))


class _SegOut(_torch().nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x):
        return self.m(x)["out"]


def build_deeplabv3_mobilenet():
    import torchvision

    _seeded(6)
    m = torchvision.models.segmentation.deeplabv3_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=5, aux_loss=False).eval()
    return _image_spec(_SegOut(m).eval(), (1, 3, 96, 96))


def _seq_spec(module, shape):
    import coremltools as ct

    torch = _torch()
    x = torch.randn(*shape)
    n_out = len(_tuple(module(x)))
    return Spec(
        module,
        (x,),
        [ct.TensorType(name="x", shape=shape)],
        [f"out{k}" for k in range(n_out)],
        [[{"x": torch.randn(*shape).numpy()}]],
        to_torch=lambda step: (torch.from_numpy(step["x"]),),
    )


class _Flat(_torch().nn.Module):
    """An RNN whose outputs are flattened: output, then each final state."""

    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn

    def forward(self, x):
        return _tuple(self.rnn(x))


def build_lstm():
    torch = _torch()
    _seeded(7)
    rnn = torch.nn.LSTM(input_size=16, hidden_size=32, num_layers=2, batch_first=True,
                        bidirectional=True)
    return _seq_spec(_Flat(rnn).eval(), (1, 12, 16))


def build_gru():
    torch = _torch()
    _seeded(8)
    rnn = torch.nn.GRU(input_size=16, hidden_size=32, num_layers=1, batch_first=True)
    return _seq_spec(_Flat(rnn).eval(), (1, 12, 16))


class _Bert(_torch().nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, ids):
        return self.m(input_ids=ids, return_dict=False)[0]


def _causal_mask(ids):
    torch = _torch()
    n = ids.shape[1]
    i = torch.arange(n)
    m = (i[None, :] > i[:, None]).float() * -1e4
    return m[None, None]


class _Gpt2(_torch().nn.Module):
    """GPT2Model with the additive causal mask passed in 4-D (built from the sequence
    length), which transformers uses as it is (its own mask builder does not trace)."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, ids):
        return self.m(input_ids=ids, attention_mask=_causal_mask(ids), return_dict=False,
                      use_cache=False)[0]


def _text_spec(module, lengths, vocab, max_len, default):
    import coremltools as ct

    torch = _torch()
    ids = torch.randint(0, vocab, (1, default))
    shape = (1, ct.RangeDim(lower_bound=1, upper_bound=max_len, default=default))
    tests = [[{"ids": torch.randint(0, vocab, (1, n)).numpy().astype(np.int32)}]
             for n in lengths]
    return Spec(
        module,
        (ids,),
        [ct.TensorType(name="ids", shape=shape, dtype=np.int32)],
        ["hidden"],
        tests,
        to_torch=lambda step: (torch.from_numpy(step["ids"].astype(np.int64)),),
        shapes=f"ids (1, 1..{max_len}) int32 at " + ", ".join(f"(1, {n})" for n in lengths),
    )


def build_bert():
    from transformers import BertConfig, BertModel

    _seeded(9)
    cfg = BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=256, vocab_size=1000, max_position_embeddings=128,
                     attn_implementation="eager")
    m = BertModel(cfg, add_pooling_layer=False).eval()
    return _text_spec(_Bert(m).eval(), (16, 7), 1000, 64, 16)


def build_gpt2():
    from transformers import GPT2Config, GPT2Model

    _seeded(10)
    cfg = GPT2Config(n_embd=128, n_layer=2, n_head=4, vocab_size=1000, n_positions=128,
                     bos_token_id=0, eos_token_id=0, attn_implementation="eager",
                     use_cache=False)
    m = GPT2Model(cfg).eval()
    return _text_spec(_Gpt2(m).eval(), (16, 5), 1000, 64, 16)


class _CausalSdpa(_torch().nn.Module):
    """One causal self-attention block over a variable sequence length, with
    torch.nn.functional.scaled_dot_product_attention (is_causal=True)."""

    def __init__(self, dim=64, heads=4):
        super().__init__()
        torch = _torch()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x):
        torch = _torch()
        b, n, d = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        h = self.heads

        def split(t):
            return t.reshape(b, n, h, d // h).transpose(1, 2)

        y = torch.nn.functional.scaled_dot_product_attention(split(q), split(k), split(v),
                                                             is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, n, d))


def build_sdpa_causal():
    import coremltools as ct

    torch = _torch()
    _seeded(11)
    m = _CausalSdpa().eval()
    x = torch.randn(1, 12, 64)
    lengths = (12, 5)
    return Spec(
        m,
        (x,),
        [ct.TensorType(name="x", shape=(1, ct.RangeDim(1, 64, default=12), 64))],
        ["y"],
        [[{"x": torch.randn(1, n, 64).numpy()}] for n in lengths],
        to_torch=lambda step: (torch.from_numpy(step["x"]),),
        target=ct.target.iOS18,
        shapes="x (1, 1..64, 64) at " + ", ".join(f"(1, {n}, 64)" for n in lengths),
    )


class _KvAttention(_torch().nn.Module):
    """coremltools' stateful-model guide: attention whose key/value cache is a buffer
    updated in place."""

    def __init__(self, embed):
        super().__init__()
        torch = _torch()
        self.query = torch.nn.Linear(embed, embed)
        self.key = torch.nn.Linear(embed, embed)
        self.value = torch.nn.Linear(embed, embed)
        self.round_cache = False  # reference only: store the cache as fp16 stores it

    def forward(self, x, attention_mask, k_cache, v_cache):
        torch = _torch()
        q = self.query(x)
        k = self.key(x)
        v = self.value(x)
        if self.round_cache:
            k = k.half().float()
            v = v.half().float()
        q_len = q.shape[-2]
        end = attention_mask.shape[-1]
        past = end - q_len
        k_cache[:, past:end, :] = k
        v_cache[:, past:end, :] = v
        return torch.nn.functional.scaled_dot_product_attention(
            q, k_cache[:, :end, :], v_cache[:, :end, :], attn_mask=attention_mask)


class _KvModel(_torch().nn.Module):
    def __init__(self, vocab, embed, batch, max_len):
        super().__init__()
        torch = _torch()
        self.embedding = torch.nn.Embedding(vocab, embed)
        self.attention = _KvAttention(embed)
        self.fc = torch.nn.Linear(embed, embed)
        self.kv_shape = (batch, max_len, embed)
        self.register_buffer("k_cache", torch.zeros(self.kv_shape))
        self.register_buffer("v_cache", torch.zeros(self.kv_shape))

    def forward(self, input_ids, causal_mask):
        e = self.embedding(input_ids)
        return self.fc(self.attention(e, causal_mask, self.k_cache, self.v_cache))


def _kv_mask(past, q):
    end = past + q
    m = np.zeros((1, q, end), np.float32)
    for i in range(q):
        m[0, i, past + i + 1:] = -1e4
    return m


def build_kv_cache():
    import copy

    import coremltools as ct

    torch = _torch()
    _seeded(12)
    vocab, embed, max_len = 100, 64, 32
    m = _KvModel(vocab, embed, 1, max_len).eval()
    trace_inputs = (torch.zeros(1, 5, dtype=torch.long), torch.from_numpy(_kv_mask(0, 5)))
    q_dim = ct.RangeDim(1, max_len)
    end_dim = ct.RangeDim(1, max_len)
    # Prefill 5 tokens, then 3 one-token steps, all with one state.
    steps, past = [], 0
    for q in (5, 1, 1, 1):
        steps.append({"input_ids": np.random.randint(0, vocab, (1, q)).astype(np.int32),
                      "causal_mask": _kv_mask(past, q)})
        past += q

    def reference(precision, test, state_fp16):
        ref = copy.deepcopy(m)
        ref.attention.round_cache = state_fp16 and precision == "fp32"
        outs = []
        with torch.no_grad():
            for step in test:
                y = ref(torch.from_numpy(step["input_ids"].astype(np.int64)),
                        torch.from_numpy(step["causal_mask"]))
                outs.append([y.numpy()])
        return outs

    return Spec(
        m,
        trace_inputs,
        [ct.TensorType(shape=(1, q_dim), dtype=np.int32, name="input_ids"),
         ct.TensorType(shape=(1, q_dim, end_dim), dtype=np.float16, name="causal_mask")],
        ["logits"],
        [steps],
        states=lambda dtype: [
            ct.StateType(wrapped_type=ct.TensorType(shape=m.kv_shape, dtype=dtype), name="k_cache"),
            ct.StateType(wrapped_type=ct.TensorType(shape=m.kv_shape, dtype=dtype), name="v_cache"),
        ],
        target=ct.target.iOS18,
        reference=reference,
        shapes="input_ids (1, 1..32), causal_mask (1, 1..32, 1..32); steps of 5, 1, 1, 1 "
               "tokens; states k_cache, v_cache (1, 32, 64)",
    )


# ImageNet normalisation folded into the image input's scale and bias (one scale for all
# channels, as ct.ImageType has).
_STD = 0.226
_MEAN = (0.485, 0.456, 0.406)


def build_resnet18_image():
    import coremltools as ct
    from PIL import Image

    torch = _torch()
    _seeded(13)
    import torchvision

    m = _calibrate_bn(torchvision.models.resnet18(weights=None), (1, 3, 64, 64))
    x = torch.randn(1, 3, 64, 64)
    scale = 1.0 / (255.0 * _STD)
    bias = [-mu / _STD for mu in _MEAN]
    pixels = np.random.randint(0, 256, (64, 64, 3), dtype=np.uint8)
    img = Image.fromarray(pixels, "RGB")

    def to_torch(step):
        a = np.asarray(step["image"], np.float32).transpose(2, 0, 1)[None]
        a = a * scale + np.asarray(bias, np.float32)[None, :, None, None]
        return (torch.from_numpy(a.astype(np.float32)),)

    return Spec(
        m,
        (x,),
        [ct.ImageType(name="image", shape=(1, 3, 64, 64), scale=scale, bias=bias,
                      color_layout=ct.colorlayout.RGB)],
        ["logits"],
        [[{"image": img}]],
        to_torch=to_torch,
        shapes="image RGB 64x64, scale 1/(255*0.226), bias -mean/0.226",
    )


def build_resnet18_enum():
    import coremltools as ct
    import torchvision

    torch = _torch()
    _seeded(14)
    m = _calibrate_bn(torchvision.models.resnet18(weights=None), (1, 3, 64, 64))
    shapes = [(1, 3, 64, 64), (1, 3, 96, 96), (1, 3, 80, 48)]
    return Spec(
        m,
        (torch.randn(*shapes[0]),),
        [ct.TensorType(name="x", shape=ct.EnumeratedShapes(shapes=shapes, default=shapes[0]))],
        ["logits"],
        [[{"x": torch.randn(*s).numpy()}] for s in shapes],
        to_torch=lambda step: (torch.from_numpy(step["x"]),),
        shapes="x enumerated " + ", ".join(str(s) for s in shapes) + ", each run",
    )


def _fused_resnet18(seed):
    """resnet18 with batch norms folded into the convolutions before tracing, so that each
    weight of the converted program is a PyTorch parameter (the compressed variants map
    the decompressed weights back onto them)."""
    import torch.fx.experimental.optimization as fxopt
    import torchvision

    _seeded(seed)
    m = _calibrate_bn(torchvision.models.resnet18(weights=None), (1, 3, 64, 64))
    return fxopt.fuse(m).eval()


def build_resnet18_int8():
    spec = _image_spec(_fused_resnet18(15), (1, 3, 64, 64))
    spec.compress = "int8"
    import coremltools as ct

    spec.target = ct.target.iOS16
    return spec


def build_resnet18_lut4():
    spec = _image_spec(_fused_resnet18(16), (1, 3, 64, 64))
    spec.compress = "lut4"
    import coremltools as ct

    spec.target = ct.target.iOS18
    return spec


def build_gpt2_lut4():
    spec = build_gpt2()
    spec.compress = "lut4"
    import coremltools as ct

    spec.target = ct.target.iOS16
    return spec


def build_bert_int8():
    spec = build_bert()
    spec.compress = "int8"
    import coremltools as ct

    spec.target = ct.target.iOS18
    return spec


MODELS = {
    "resnet18": build_resnet18,
    "mobilenet_v3_small": build_mobilenet_v3_small,
    "efficientnet_b0": build_efficientnet_b0,
    "convnext_tiny": build_convnext_tiny,
    "vit_tiny": build_vit_tiny,
    "deeplabv3_mobilenet": build_deeplabv3_mobilenet,
    "lstm": build_lstm,
    "gru": build_gru,
    "bert": build_bert,
    "gpt2": build_gpt2,
    "sdpa_causal": build_sdpa_causal,
    "kv_cache": build_kv_cache,
    "resnet18_image": build_resnet18_image,
    "resnet18_enum": build_resnet18_enum,
    "resnet18_int8": build_resnet18_int8,
    "resnet18_lut4": build_resnet18_lut4,
    "gpt2_lut4": build_gpt2_lut4,
    "bert_int8": build_bert_int8,
}

DESCRIPTION = {
    "resnet18": "torchvision resnet18",
    "mobilenet_v3_small": "torchvision mobilenet_v3_small",
    "efficientnet_b0": "torchvision efficientnet_b0",
    "convnext_tiny": "torchvision convnext_tiny",
    "vit_tiny": "torchvision VisionTransformer, 4 layers, dim 128, patch 16",
    "deeplabv3_mobilenet": "torchvision deeplabv3_mobilenet_v3_large, 5 classes",
    "lstm": "nn.LSTM 2 layers bidirectional, hidden 32",
    "gru": "nn.GRU 1 layer, hidden 32",
    "bert": "transformers BertModel, 2 layers, dim 128, RangeDim sequence",
    "gpt2": "transformers GPT2Model, 2 layers, dim 128, RangeDim sequence",
    "sdpa_causal": "causal scaled_dot_product_attention, iOS18, RangeDim sequence",
    "kv_cache": "stateful KV cache (coremltools guide), iOS18 states, 4 steps",
    "resnet18_image": "resnet18 with ct.ImageType input (RGB, scale, bias)",
    "resnet18_enum": "resnet18 with EnumeratedShapes input",
    "resnet18_int8": "resnet18 (BN folded), linear_quantize_weights int8, iOS16",
    "resnet18_lut4": "resnet18 (BN folded), palettize_weights 4-bit, iOS18",
    "gpt2_lut4": "gpt2 above, palettize_weights 4-bit, iOS16",
    "bert_int8": "bert above, linear_quantize_weights int8, iOS18",
}


# ---------------------------------------------------------------------------------------
# conversion, compression, reference


def convert(spec, precision):
    import coremltools as ct
    import torch

    # nn.MultiheadAttention's inference fast path traces to an op coremltools has no
    # conversion for (_native_multi_head_attention); the regular path is the same function.
    torch.backends.mha.set_fastpath_enabled(False)
    with torch.no_grad():
        traced = torch.jit.trace(spec.module, spec.trace_inputs)
    kw = {}
    if spec.states is not None:
        # coremltools' guide keeps states in fp16; the fp32 package keeps them in fp16 too.
        kw["states"] = spec.states(np.float16)
    target = spec.target or ct.target.iOS15
    return ct.convert(
        traced,
        inputs=spec.ct_inputs,
        outputs=[ct.TensorType(name=n) for n in spec.outputs],
        convert_to="mlprogram",
        compute_precision=ct.precision.FLOAT32 if precision == "fp32" else ct.precision.FLOAT16,
        minimum_deployment_target=target,
        **kw,
    )


def compress(ml, how):
    import coremltools.optimize.coreml as cto

    if how == "int8":
        op = cto.OpLinearQuantizerConfig(mode="linear_symmetric", dtype="int8",
                                         granularity="per_channel")
        return cto.linear_quantize_weights(ml, cto.OptimizationConfig(global_config=op))
    if how == "lut4":
        op = cto.OpPalettizerConfig(mode="uniform", nbits=4, granularity="per_tensor")
        return cto.palettize_weights(ml, cto.OptimizationConfig(global_config=op))
    raise ValueError(how)


def _weights(ml):
    import coremltools.optimize.coreml as cto

    return {k: np.asarray(v.val) for k, v in cto.get_weights_metadata(ml, weight_threshold=0).items()}


def compressed_module(spec, ml, cml):
    """A copy of spec.module with the compressed package's decompressed weights, or
    (None, why) when a compressed constant cannot be matched to a parameter.

    coremltools' decompress_weights turns each compressed constant back into a const named
    after it (`..._quantized`, `..._palettized`); each is matched to the parameter of the
    same size (as is, or transposed for a 2-D weight) nearest to it in relative L2, which
    must be clearly nearer than any other parameter."""
    import copy

    import coremltools.optimize.coreml as cto

    torch = _torch()
    before = _weights(ml)
    after = _weights(cto.decompress_weights(cml))
    if getattr(cml, "_mil_program", None) is not None:
        names = [op.outputs[0].name for f in cml._mil_program.functions.values()
                 for op in f.operations if op.op_type.startswith("constexpr_")]
    else:
        names = [k for k in after if k not in before
                 and (k.endswith("_quantized") or k.endswith("_palettized"))]
    missing = [k for k in names if k not in after]
    if missing:
        return None, f"compressed constant {missing[0]} not found decompressed"
    changed = {k: after[k] for k in names}
    if not changed:
        return None, "no compressed constant found"
    module = copy.deepcopy(spec.module)
    params = dict(module.named_parameters())
    used = set()
    for cname, dec in changed.items():
        dec = dec.astype(np.float32)
        scored = []
        for pname, p in params.items():
            p = p.detach().numpy()
            if p.size != dec.size:
                continue
            cands = [("same", p.reshape(dec.shape))]
            if p.ndim == 2 and p.T.shape == dec.shape:
                cands.append(("T", p.T))
            for how, q in cands:
                if q.shape == dec.shape:
                    scored.append((rel_l2(dec, q), pname, how))
        scored.sort()
        if not scored or scored[0][0] > 0.5 or (len(scored) > 1 and scored[1][0] < 2 * scored[0][0]):
            return None, f"constant {cname} {dec.shape} matches no single parameter"
        _, pname, how = scored[0]
        if pname in used:
            return None, f"parameter {pname} matched twice"
        used.add(pname)
        val = dec.T if how == "T" else dec
        with torch.no_grad():
            params[pname].copy_(
                torch.from_numpy(np.ascontiguousarray(val)).reshape(params[pname].shape))
    return module, f"{len(used)} weights"


def reference(spec, precision, test, module=None):
    torch = _torch()
    if spec.reference is not None:
        return spec.reference(precision, test, True)
    module = module or spec.module
    outs = []
    with torch.no_grad():
        for step in test:
            outs.append([t.numpy() for t in _tuple(module(*spec.to_torch(step)))])
    return outs


def shapes_text(spec):
    if spec.shapes:
        return spec.shapes
    parts = []
    for name, v in spec.tests[0][0].items():
        a = np.asarray(v)
        parts.append(f"{name} {tuple(a.shape)}")
    return ", ".join(parts)


# ---------------------------------------------------------------------------------------
# running


def _short_error(e):
    text = str(e).strip()
    # milkit's panic messages carry a backtrace; keep the message lines.
    lines = [ln for ln in text.splitlines() if ln.strip()]
    keep = []
    for ln in lines:
        if ln.strip().startswith("stack backtrace"):
            break
        keep.append(ln.strip())
    return " | ".join(keep)[:600] or type(e).__name__


def run_one(name, spec, precision, log):
    row = {"model": name, "precision": precision, "shapes": shapes_text(spec)}
    comp = spec.compress
    loose = False
    stage = "convert"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ml = convert(spec, precision)
            ref_module = None
            if comp:
                stage = "compress"
                cml = compress(ml, comp)
                ref_module, why = compressed_module(spec, ml, cml)
                row["reference"] = ("torch fp32 with decompressed weights (" + why + ")"
                                    if ref_module is not None else "uncompressed torch fp32: " + why)
                loose = ref_module is None
                ml = cml
        stage = "predict"
        values, times = [], []
        for test in spec.tests:
            state = ml.make_state() if spec.states is not None else None
            ys = []
            for step in test:
                t0 = time.perf_counter()
                out = ml.predict(step, state=state) if state is not None else ml.predict(step)
                times.append(time.perf_counter() - t0)
                ys.append([out[n] for n in spec.outputs])
            refs = reference(spec, precision, test, ref_module)
            for y_step, r_step in zip(ys, refs):
                for y, r in zip(y_step, r_step):
                    if tuple(np.shape(y)) != tuple(np.shape(r)):
                        raise AssertionError(
                            f"output shape {np.shape(y)}, PyTorch gives {np.shape(r)}")
                    if not np.any(np.asarray(r)):
                        raise AssertionError("PyTorch's output is all zeros: nothing to compare")
                    values.append((rel_l2(y, r), psnr(y, r)))
        stage = "compare"
        row["time_ms"] = 1000 * float(np.mean(times))
        if loose:
            row["metric"] = "PSNR dB vs uncompressed"
            row["value"] = min(v[1] for v in values)
            row["bound"] = LOOSE_BOUND[comp]
            row["pass"] = row["value"] >= row["bound"]
        elif precision == "fp32":
            row["metric"] = "rel L2"
            row["value"] = max(v[0] for v in values)
            row["bound"] = FP32_BOUND
            row["pass"] = row["value"] <= row["bound"]
        else:
            row["metric"] = "PSNR dB"
            row["value"] = min(v[1] for v in values)
            row["bound"] = FP16_BOUND
            row["pass"] = row["value"] >= row["bound"]
        row["rel_l2"] = max(v[0] for v in values)
        row["psnr_db"] = min(v[1] for v in values)
    except Exception as e:  # one model's failure does not stop the others
        row["pass"] = False
        row["stage"] = stage
        row["error"] = _short_error(e)
        log.write(f"--- {name} {precision}: failed at {stage}\n{traceback.format_exc()}\n")
    return row


def fmt_value(row):
    v = row.get("value")
    if v is None:
        return "-"
    if row["metric"] == "rel L2":
        return f"{v:.2e}"
    return f"{v:.1f}"


def fmt_bound(row):
    b = row.get("bound")
    if b is None:
        return "-"
    return f"<= {b:.0e}" if row["metric"] == "rel L2" else f">= {b:.0f}"


def table(rows):
    out = ["| model | precision | input shapes | metric | value | bound | result | milkit predict |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        result = "pass" if r.get("pass") else ("fail" if "error" not in r else f"error ({r['stage']})")
        t = f"{r['time_ms']:.0f} ms" if "time_ms" in r else "-"
        out.append(f"| {r['model']} | {r['precision']} | {r['shapes']} | {r.get('metric', '-')} | "
                   f"{fmt_value(r)} | {fmt_bound(r)} | {result} | {t} |")
    errors = [r for r in rows if "error" in r]
    if errors:
        out.append("")
        out.append("Errors:")
        out.append("")
        for r in errors:
            out.append(f"- {r['model']} {r['precision']} ({r['stage']}): {r['error']}")
    refs = [r for r in rows if "reference" in r]
    if refs:
        out.append("")
        out.append("Compressed references:")
        out.append("")
        for r in refs:
            out.append(f"- {r['model']} {r['precision']}: {r['reference']}")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated model names (see --list)")
    ap.add_argument("--json", help="write the rows here as JSON")
    ap.add_argument("--precision", default="fp32,fp16", help="fp32, fp16 or both (default)")
    ap.add_argument("--log", default=os.path.join(REPO, "target", "real-models.log"),
                    help="full tracebacks of the failures (default target/real-models.log)")
    ap.add_argument("--list", action="store_true", help="list the models and exit")
    args = ap.parse_args()

    if args.list:
        for k, v in MODELS.items():
            print(f"{k:22s} {DESCRIPTION[k]}")
        return 0
    names = list(MODELS)
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in names if n not in MODELS]
        if unknown:
            ap.error(f"unknown model(s) {', '.join(unknown)}; --list shows them")
    precisions = [p.strip() for p in args.precision.split(",")]

    import milkit
    import milkit_coreml

    milkit_coreml.install()
    runtime = f"milkit {milkit.__version__} ({os.path.dirname(milkit.__file__)})"
    import logging

    logging.getLogger("coremltools").setLevel(logging.ERROR)
    import torch

    torch.set_num_threads(max(1, os.cpu_count() or 1))

    os.makedirs(os.path.dirname(os.path.abspath(args.log)), exist_ok=True)
    rows = []
    t_start = time.time()
    with open(args.log, "w") as log:
        for name in names:
            t0 = time.time()
            try:
                spec = MODELS[name]()
            except Exception as e:
                for p in precisions:
                    rows.append({"model": name, "precision": p, "shapes": "-", "pass": False,
                                 "stage": "build", "error": _short_error(e)})
                log.write(f"--- {name}: failed to build\n{traceback.format_exc()}\n")
                continue
            for p in precisions:
                row = run_one(name, spec, p, log)
                rows.append(row)
                status = "pass" if row.get("pass") else "FAIL"
                print(f"{name} {p}: {status} {row.get('metric', '')} {fmt_value(row)}"
                      + (f"  [{row['stage']}] {row['error'][:200]}" if "error" in row else ""),
                      file=sys.stderr, flush=True)
            print(f"  ({time.time() - t0:.1f} s)", file=sys.stderr, flush=True)
    print(table(rows))
    n_pass = sum(1 for r in rows if r.get("pass"))
    print(f"\n{n_pass} of {len(rows)} pass; {time.time() - t_start:.0f} s; "
          f"{runtime}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"milkit": runtime, "rows": rows}, fh, indent=1,
                      default=float)
    return 0 if n_pass == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
