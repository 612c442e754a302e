"""Writes a package made by coremltools' own MIL builder that uses cond, while_loop and every
list op, for tests/control_flow.rs to load and run with milkit:

    python coremltools_control_flow.py OUT.mlpackage

Inputs x: fp32 (2, 3), n: int32 (1,) (at most 4). Program:
    acc = x; ls = make_list(4 fixed elements of (2, 3)); i = 0
    while i < n: acc = acc * 1.5 + x; ls[i] = acc; i += 1
    dyn = make_list(dynamic, 1 element of (3,)); dyn = list_scatter(dyn, [1, 0], acc)
Outputs:
    y = cond(sum(acc) > 0, acc * 2, acc - 1)   g = list_gather(ls, [0, 1])   i
    r = list_read(dyn, 1)                      len = list_length(dyn)
"""
import sys

import numpy as np
import coremltools as ct
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import types


@mb.program(
    input_specs=[mb.TensorSpec(shape=(2, 3)), mb.TensorSpec(shape=(1,), dtype=types.int32)],
    opset_version=ct.target.iOS15,
)
def prog(x, n):
    ls = mb.make_list(init_length=4, dynamic_length=False, elem_shape=(2, 3), dtype="fp32")
    bound = mb.squeeze(x=n)

    def cond(i, acc, ls):
        return mb.less(x=i, y=bound)

    def body(i, acc, ls):
        acc2 = mb.add(x=mb.mul(x=acc, y=1.5), y=x)
        return mb.add(x=i, y=1), acc2, mb.list_write(ls=ls, index=i, value=acc2)

    i, acc, ls = mb.while_loop(_cond=cond, _body=body, loop_vars=(np.int32(0), x, ls))
    g = mb.list_gather(ls=ls, indices=[0, 1])
    pos = mb.greater(x=mb.reduce_sum(x=acc), y=0.0)
    y = mb.cond(
        pred=pos,
        _true_fn=lambda: mb.mul(x=acc, y=2.0),
        _false_fn=lambda: mb.sub(x=acc, y=1.0),
    )
    dyn = mb.make_list(init_length=1, dynamic_length=True, elem_shape=(3,), dtype="fp32")
    dyn = mb.list_scatter(ls=dyn, indices=[1, 0], value=acc)
    r = mb.list_read(ls=dyn, index=1)
    length = mb.list_length(ls=dyn)
    return (
        mb.identity(x=y, name="y"),
        mb.identity(x=g, name="g"),
        mb.identity(x=i, name="i"),
        mb.identity(x=r, name="r"),
        mb.identity(x=length, name="len"),
    )


m = ct.convert(
    prog,
    convert_to="mlprogram",
    minimum_deployment_target=ct.target.iOS15,
    compute_precision=ct.precision.FLOAT32,
    skip_model_load=True,
)
m.save(sys.argv[1])
