"""Comparisons, boolean logic and Where, on bools stored as F32 0/1.

ggml has no comparison kernels; ggml_step (1 where x > 0) gives exact 0/1 results from
differences of finite values. Integers (I32 storage) are compared and selected in F32 where
their interval proves them exact (converters/integer.py): the rounded difference of two exact
values is zero exactly when they are equal and keeps their order's sign.
Where is c*x + (1-c)*y: exact for finite x and y; a constant all-infinite branch (attention
masks' -inf) becomes -+log(1-c) instead, which is exact too. An infinite value inside a
runtime tensor in the branch not taken would still give NaN.
"""

from __future__ import annotations

import numpy as np

from sdkit_ggml.compiler import ops
from sdkit_ggml.compiler.builder import Builder
from sdkit_ggml.compiler.context import BOOL, Node, Tensor, Unsupported, Value
from sdkit_ggml.converters.integer import exact_float
from sdkit_ggml.converters.table import converter
from sdkit_ggml.runtime import lib as L


def _step(b: Builder, x: Tensor) -> Tensor:
    return ops.unary(b, "ggml_step", x)


def _not(b: Builder, x: Tensor) -> Tensor:
    return ops.scale(b, x, -1.0, 1.0)


def _as_bool(t: Tensor) -> Tensor:
    return ops.retype(t, BOOL)


def _float_inputs(b: Builder, node: Node) -> tuple[Tensor, Tensor]:
    x, y = b.tensor(node, 0), b.tensor(node, 1)
    for t in (x, y):
        if t.dtype.kind in "iu":
            raise Unsupported(f"{node.op} on {t.dtype}: ggml compares float tensors only")
    return x, y


def _masked(b: Builder, node: Node, index: int, mask: Tensor) -> Tensor:
    """value * mask (mask 0/1), without inf * 0 = NaN for a constant infinite branch: there
    the term is -+log(1 - mask), which is +-inf where selected and 0 where not."""
    value = node.value(index)
    if not isinstance(value, Tensor):
        array = np.asarray(value)
        if array.size and np.isinf(array).all() and (array == array.reshape(-1)[0]).all():
            log_unselected = ops.unary(b, "ggml_log", _not(b, mask))  # -inf where selected
            return log_unselected if array.reshape(-1)[0] < 0 else ops.unary(b, "ggml_neg", log_unselected)
    return ops.binary(b, "ggml_mul", b.tensor(node, index), mask)


def _compared(b: Builder, node: Node) -> tuple[Tensor, Tensor]:
    if any(node.value(i).dtype.kind in "iu" for i in (0, 1)):
        return exact_float(b, node, 0)[0], exact_float(b, node, 1)[0]
    return _float_inputs(b, node)


@converter(["Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Equal"], since_version=7)
def convert_compare(b: Builder, node: Node) -> list[Value]:
    x, y = _compared(b, node)
    if node.op == "Less":
        result = _step(b, ops.binary(b, "ggml_sub", y, x))
    elif node.op == "Greater":
        result = _step(b, ops.binary(b, "ggml_sub", x, y))
    elif node.op == "LessOrEqual":
        result = _not(b, _step(b, ops.binary(b, "ggml_sub", x, y)))
    elif node.op == "GreaterOrEqual":
        result = _not(b, _step(b, ops.binary(b, "ggml_sub", y, x)))
    else:
        result = _not(b, _step(b, ops.unary(b, "ggml_abs", ops.binary(b, "ggml_sub", x, y))))
    return [_as_bool(result)]


@converter("Not", since_version=1)
def convert_not(b: Builder, node: Node) -> list[Value]:
    return [_as_bool(_not(b, b.tensor(node, 0)))]


@converter(["And", "Or", "Xor"], since_version=7)
def convert_logic(b: Builder, node: Node) -> list[Value]:
    x, y = _float_inputs(b, node)
    if node.op == "And":
        result = ops.binary(b, "ggml_mul", x, y)
    elif node.op == "Or":
        result = _step(b, ops.binary(b, "ggml_add", x, y))
    else:
        result = _step(b, ops.unary(b, "ggml_abs", ops.binary(b, "ggml_sub", x, y)))
    return [_as_bool(result)]


@converter("Where", since_version=9)
def convert_where(b: Builder, node: Node) -> list[Value]:
    cond = node.value(0)
    if not isinstance(cond, Tensor):
        cond_t = b.constant(np.asarray(cond, dtype=np.float32), dtype=np.dtype(np.float32))
    else:
        cond_t = ops.retype(cond, np.dtype(np.float32))
    if node.value(1).dtype.kind in "iu":
        return [_integer_where(b, node, cond_t)]
    picked = _masked(b, node, 1, cond_t)
    other = _masked(b, node, 2, _not(b, cond_t))
    return [ops.retype(ops.binary(b, "ggml_add", picked, other), node.value(1).dtype)]


def _integer_where(b: Builder, node: Node, cond: Tensor) -> Tensor:
    """c*x + (1-c)*y in F32 on exact integers (one term is 0), cast back to I32."""
    (x, bx), (y, by) = exact_float(b, node, 1), exact_float(b, node, 2)
    picked = ops.binary(b, "ggml_mul", x, cond)
    other = ops.binary(b, "ggml_mul", y, _not(b, cond))
    result = ops.cast(b, ops.binary(b, "ggml_add", picked, other), L.GGML_TYPE_I32, node.value(1).dtype)
    return ops.with_bounds(result, (min(bx[0], by[0]), max(bx[1], by[1])))
