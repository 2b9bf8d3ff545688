"""Softmax, LogSoftmax, Reduce* and ArgMax/ArgMin: the reduced axes are moved innermost and
reduced along ggml rows (sum_rows, pool_1d max, soft_max, argmax)."""

from __future__ import annotations

import math

import numpy as np

from sdkit_ggml.compiler import ops
from sdkit_ggml.compiler.builder import Builder
from sdkit_ggml.compiler.context import Node, Tensor, Unsupported, Value
from sdkit_ggml.converters.integer import exact_float
from sdkit_ggml.converters.shape import axes_of
from sdkit_ggml.converters.table import converter
from sdkit_ggml.runtime import lib as L

REDUCE_OPS = (
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceSumSquare",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSumExp",
    "ReduceLogSum",
)


def _rows_last(b: Builder, x: Tensor, axes: list[int]) -> tuple[Tensor, list[int], int]:
    """Move ``axes`` innermost; returns (2-D tensor [kept, reduced], kept dims, reduced size)."""
    kept = [i for i in range(x.rank) if i not in axes]
    moved = ops.transpose(b, x, kept + sorted(axes))
    reduced = math.prod(x.shape[a] for a in axes)
    kept_shape = [x.shape[i] for i in kept]
    return ops.reshape(b, moved, (math.prod(kept_shape), reduced)), kept_shape, reduced


def _tie_argmax(b: Builder, rows: Tensor, last: bool = False) -> Tensor:
    """The first (ONNX's default) or last (``select_last_index``) maximum of each row, whatever
    tie rule the device's ggml_argmax has: the CPU keeps the last of equal maxima, ggml-vulkan's
    parallel reduction another one (a CLIP's pooled output, an ArgMax over token ids padded with
    the end token, then read the wrong token on Vulkan). The maxima are marked exactly
    (``m - x`` is 0 only where ``x == m``), weighted ``n..1`` (first) or ``1..n`` (last), and
    the argmax of those distinct weights is unique."""
    n = rows.shape[1]
    not_max = ops.unary(b, "ggml_step", ops.binary(b, "ggml_sub", row_max(b, rows), rows))  # 1 where x < m
    is_max = ops.scale(b, not_max, -1.0, 1.0)
    ramp = np.arange(1, n + 1, dtype=np.float32) if last else np.arange(n, 0, -1, dtype=np.float32)
    weighted = ops.binary(b, "ggml_mul", is_max, b.constant(ramp, np.dtype(np.float32)))
    return b.op("ggml_argmax", weighted.ptr, shape=(rows.shape[0],), dtype=np.dtype(np.int64))


def row_max(b: Builder, rows: Tensor) -> Tensor:
    n = rows.shape[1]
    return ops.pool_rows(b, rows, L.GGML_OP_POOL_MAX, n, n, 1)


def softmax_rows(b: Builder, x: Tensor, axes: list[int]) -> Tensor:
    """softmax over the (contiguous after transposing) ``axes`` of ``x``."""
    ops.require_float(x, what="Softmax")
    rows, _, _ = _rows_last(b, x, axes)
    result = b.op("ggml_soft_max", rows.ptr, shape=rows.shape, dtype=x.dtype)
    kept = [i for i in range(x.rank) if i not in axes]
    order = kept + sorted(axes)
    moved = ops.reshape(b, result, [x.shape[i] for i in order])
    return ops.transpose(b, moved, [order.index(i) for i in range(x.rank)])


@converter(["Softmax", "LogSoftmax"], since_version=1)
def convert_softmax(b: Builder, node: Node) -> list[Value]:
    x = b.tensor(node, 0)
    if x.rank == 0:
        raise Unsupported("Softmax of a scalar")
    if node.opset >= 13:
        axes = [int(node.attr("axis", -1)) % x.rank]
    else:
        axis = int(node.attr("axis", 1)) % x.rank
        axes = list(range(axis, x.rank))  # coerced to 2-D: all trailing axes
    y = softmax_rows(b, x, axes)
    if node.op == "LogSoftmax":
        y = ops.unary(b, "ggml_log", y)
    return [y]


@converter(REDUCE_OPS, since_version=1)
def convert_reduce(b: Builder, node: Node) -> list[Value]:
    x = b.tensor(node, 0)
    ops.require_float(x, what=node.op)
    input_since = 13 if node.op == "ReduceSum" else 18
    axes = axes_of(node, b, 1, input_since)
    if not axes:
        if node.attr("noop_with_empty_axes", 0):
            return [x]
        axes = list(range(x.rank))
    axes = sorted({a % x.rank for a in axes})
    keepdims = bool(node.attr("keepdims", 1))
    out_shape = (
        [1 if i in axes else d for i, d in enumerate(x.shape)]
        if keepdims
        else [d for i, d in enumerate(x.shape) if i not in axes]
    )
    if x.size == 0:
        raise Unsupported("reduction of an empty tensor")
    rows, _, n = _rows_last(b, x, axes)
    return [ops.reshape(b, reduce_rows(b, node.op, rows, n), out_shape)]


def reduce_rows(b: Builder, op: str, rows: Tensor, n: int) -> Tensor:
    """Reduce* ``op`` along each row of a 2-D tensor of ``n`` columns: a [rows, 1] tensor."""
    if op in ("ReduceSumSquare", "ReduceL2"):
        rows = ops.unary(b, "ggml_sqr", rows)
    elif op == "ReduceL1":
        rows = ops.unary(b, "ggml_abs", rows)
    if op == "ReduceMax":
        return row_max(b, rows)
    if op == "ReduceMin":
        return ops.unary(b, "ggml_neg", row_max(b, ops.unary(b, "ggml_neg", rows)))
    if op == "ReduceLogSumExp":
        peak = row_max(b, rows)
        shifted = ops.unary(b, "ggml_exp", ops.binary(b, "ggml_sub", rows, peak))
        total = b.op("ggml_sum_rows", shifted.ptr, shape=(rows.shape[0], 1), dtype=rows.dtype)
        return ops.binary(b, "ggml_add", ops.unary(b, "ggml_log", total), peak)
    y = b.op("ggml_sum_rows", rows.ptr, shape=(rows.shape[0], 1), dtype=rows.dtype)
    if op == "ReduceMean":
        y = ops.binary(b, "ggml_div", y, b.constant(np.array([n], dtype=np.float32)))
    elif op == "ReduceL2":
        y = ops.unary(b, "ggml_sqrt", y)
    elif op == "ReduceLogSum":
        y = ops.unary(b, "ggml_log", y)
    return y


@converter(["ArgMax", "ArgMin"], since_version=1)
def convert_argmax(b: Builder, node: Node) -> list[Value]:
    x = b.tensor(node, 0)
    if x.ggml_type == L.GGML_TYPE_I32:  # token ids (CLIP's pooled output): exact in F32 within 2**24
        x = exact_float(b, node, 0)[0]
    ops.require_float(x, what=node.op)
    axis = int(node.attr("axis", 0)) % x.rank
    rows, _, _ = _rows_last(b, x, [axis])
    if node.op == "ArgMin":
        rows = ops.unary(b, "ggml_neg", rows)
    n = rows.shape[1]
    result = _tie_argmax(b, rows, last=bool(node.attr("select_last_index", 0)))
    result = ops.with_bounds(result, (0, n - 1))
    shape = list(x.shape)
    if node.attr("keepdims", 1):
        shape[axis] = 1
    else:
        shape.pop(axis)
    return [ops.reshape(b, result, shape)]
