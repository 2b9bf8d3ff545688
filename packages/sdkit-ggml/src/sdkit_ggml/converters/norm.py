"""Normalizations: Instance, Group, Layer, (inference) Batch normalization and LRN.

All reduce to ggml_norm, which normalizes along ne[0]: the tensor is reshaped so that the
normalized elements are contiguous rows, then scale and bias broadcast per channel.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from sdkit_ggml.compiler import ops
from sdkit_ggml.compiler.builder import Builder
from sdkit_ggml.compiler.context import Node, Tensor, Unsupported, Value, attributes
from sdkit_ggml.converters.pad import pad_constant
from sdkit_ggml.converters.table import converter


def normalize_rows(b: Builder, x: Tensor, rows: int, eps: float) -> Tensor:
    """Zero mean, unit variance over each of ``rows`` contiguous rows of ``x``."""
    ops.require_float(x, what="normalization")
    flat = ops.reshape(b, x, (rows, x.size // rows))
    normed = b.op("ggml_norm", flat.ptr, float(eps), shape=flat.shape, dtype=x.dtype)
    return ops.reshape(b, normed, x.shape)


def _per_channel(b: Builder, node: Node, index: int, channels: int, rank: int) -> Tensor:
    t = b.tensor(node, index)
    if t.size != channels:
        raise Unsupported(f"input {index} has {t.size} values for {channels} channels")
    return ops.reshape(b, t, (1, channels) + (1,) * (rank - 2))


@converter("InstanceNormalization", since_version=6)
def convert_instance_norm(b: Builder, node: Node) -> list[Value]:
    x = b.tensor(node, 0)
    if x.rank < 3:
        raise Unsupported("InstanceNormalization needs a rank >= 3 input")
    y = normalize_rows(b, x, x.shape[0] * x.shape[1], float(node.attr("epsilon", 1e-5)))
    y = ops.binary(b, "ggml_mul", y, _per_channel(b, node, 1, x.shape[1], x.rank))
    return [ops.binary(b, "ggml_add", y, _per_channel(b, node, 2, x.shape[1], x.rank))]


@converter("GroupNormalization", since_version=18)
def convert_group_norm(b: Builder, node: Node) -> list[Value]:
    x = b.tensor(node, 0)
    groups = int(node.attr("num_groups"))
    channels = x.shape[1]
    if x.rank < 2 or channels % groups:
        raise Unsupported(f"GroupNormalization: {channels} channels do not split into {groups} groups")
    y = normalize_rows(b, x, x.shape[0] * groups, float(node.attr("epsilon", 1e-5)))
    scale, bias = b.tensor(node, 1), b.tensor(node, 2)
    if node.opset < 21 and scale.size == groups and groups != channels:
        # opset 18: scale and bias are per group
        grouped = ops.reshape(b, y, (x.shape[0], groups, channels // groups, math.prod(x.shape[2:])))
        y4 = ops.binary(b, "ggml_mul", grouped, ops.reshape(b, scale, (1, groups, 1, 1)))
        y4 = ops.binary(b, "ggml_add", y4, ops.reshape(b, bias, (1, groups, 1, 1)))
        return [ops.reshape(b, y4, x.shape)]
    y = ops.binary(b, "ggml_mul", y, _per_channel(b, node, 1, channels, x.rank))
    return [ops.binary(b, "ggml_add", y, _per_channel(b, node, 2, channels, x.rank))]


def _statistics(b: Builder, x: Tensor, rows: int, axis: int, eps: float) -> list[Value]:
    """LayerNormalization's Mean and InvStdDev outputs: per-row statistics with the
    normalized axes kept as 1."""
    flat = ops.reshape(b, x, (rows, x.size // rows))
    n = np.array([flat.shape[1]], dtype=np.float32)
    mean = ops.binary(b, "ggml_div", b.op("ggml_sum_rows", flat.ptr, shape=(rows, 1), dtype=x.dtype), b.constant(n))
    centred = ops.unary(b, "ggml_sqr", ops.binary(b, "ggml_sub", flat, mean))
    var = ops.binary(b, "ggml_div", b.op("ggml_sum_rows", centred.ptr, shape=(rows, 1), dtype=x.dtype), b.constant(n))
    one = b.constant(np.ones((1,), np.float32))
    inv_std = ops.binary(b, "ggml_div", one, ops.unary(b, "ggml_sqrt", ops.scale(b, var, 1.0, eps)))
    stats_shape = (*x.shape[:axis], *([1] * (x.rank - axis)))
    return [ops.reshape(b, mean, stats_shape), ops.reshape(b, inv_std, stats_shape)]


@converter("LayerNormalization", since_version=17)
def convert_layer_norm(b: Builder, node: Node) -> list[Value]:
    x = b.tensor(node, 0)
    axis = int(node.attr("axis", -1)) % x.rank
    rows = math.prod(x.shape[:axis])
    y = normalize_rows(b, x, rows, float(node.attr("epsilon", 1e-5)))
    norm_shape = x.shape[axis:]
    scale = b.tensor(node, 1)
    y = ops.binary(b, "ggml_mul", y, scale)
    if node.has(2):
        y = ops.binary(b, "ggml_add", y, b.tensor(node, 2))
    if y.shape != x.shape:
        raise Unsupported(f"LayerNormalization scale shape {list(scale.shape)} does not fit {list(norm_shape)}")
    if len(node.proto.output) < 2 or not any(node.proto.output[1:]):
        return [y]
    return [y, *_statistics(b, x, rows, axis, float(node.attr("epsilon", 1e-5)))]


def check_batch_norm(node: onnx.NodeProto) -> str | None:
    if attributes(node).get("training_mode", 0):
        return "BatchNormalization in training mode"
    if len([o for o in node.output if o]) > 1:
        return "BatchNormalization's extra statistics outputs are not lowered"
    return None


@converter("BatchNormalization", since_version=6, check=check_batch_norm)
def convert_batch_norm(b: Builder, node: Node) -> list[Value]:
    x = b.tensor(node, 0)
    channels = x.shape[1] if x.rank > 1 else 1
    eps = float(node.attr("epsilon", 1e-5))
    rank = max(x.rank, 2)
    scale, bias = _per_channel(b, node, 1, channels, rank), _per_channel(b, node, 2, channels, rank)
    mean, var = _per_channel(b, node, 3, channels, rank), _per_channel(b, node, 4, channels, rank)
    # (x - mean) / sqrt(var + eps) * scale + bias, in ggml on the per-channel tensors.
    std = ops.unary(b, "ggml_sqrt", ops.scale(b, var, 1.0, eps))
    y = ops.binary(b, "ggml_div", ops.binary(b, "ggml_sub", x, mean), std)
    return [ops.binary(b, "ggml_add", ops.binary(b, "ggml_mul", y, scale), bias)]


@converter("LRN", since_version=1)
def convert_lrn(b: Builder, node: Node) -> list[Value]:
    """Local response normalization across channels:
    ``x / (bias + alpha / size * sum of x^2 over the size-wide channel window) ** beta``.
    The window sum is ``size`` shifted views of the channel-padded squares, added."""
    x = b.tensor(node, 0)
    ops.require_float(x, what="LRN")
    size = int(node.attr("size", 0))
    if x.rank < 3 or size < 1:
        raise Unsupported(f"LRN of size {size} on a rank-{x.rank} input (needs size >= 1, rank >= 3)")
    n, channels = x.shape[0], x.shape[1]
    flat = ops.reshape(b, x, (n, channels, math.prod(x.shape[2:])))
    squares = ops.unary(b, "ggml_sqr", flat)
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    padded = pad_constant(b, squares, [0, before, 0], [0, after, 0])
    windows = [ops.slice_view(b, padded, [0, shift, 0], list(flat.shape), [1, 1, 1]) for shift in range(size)]
    total = windows[0]
    for window in windows[1:]:
        total = ops.binary(b, "ggml_add", total, window)
    alpha, beta, bias = float(node.attr("alpha", 1e-4)), float(node.attr("beta", 0.75)), float(node.attr("bias", 1.0))
    base = ops.scale(b, total, alpha / size, bias)
    denominator = ops.unary(b, "ggml_exp", ops.scale(b, ops.unary(b, "ggml_log", base), beta))
    return [ops.reshape(b, ops.binary(b, "ggml_div", flat, denominator), x.shape)]
