"""MaxPool, AveragePool (1-D, 2-D) and the global pools, on ggml_pool_1d/2d and sum_rows."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from sdkit_ggml.compiler import ops
from sdkit_ggml.compiler.builder import Builder
from sdkit_ggml.compiler.context import Node, Tensor, Unsupported, Value
from sdkit_ggml.converters.conv import spatial_pads
from sdkit_ggml.converters.pad import pad_constant
from sdkit_ggml.converters.reduce import row_max
from sdkit_ggml.converters.table import converter
from sdkit_ggml.runtime import lib as L


def check_pool(node: onnx.NodeProto) -> str | None:
    attrs = {a.name: a for a in node.attribute}
    if "kernel_shape" in attrs and len(attrs["kernel_shape"].ints) not in (1, 2):
        return "only 1-D and 2-D pooling is lowered to ggml"
    if "dilations" in attrs and any(d != 1 for d in attrs["dilations"].ints):
        return "dilated pooling is not lowered"
    if node.op_type == "MaxPool" and len([o for o in node.output if o]) > 1:
        return "MaxPool's Indices output is not lowered"
    return None


def _window_factor(mask: np.ndarray, kernel: list[int], strides: list[int], out: list[int]) -> np.ndarray:
    """kernel size / counted elements per output window (a compile-time constant from shapes):
    turns ggml's average over the full window into ONNX's average over counted elements."""
    counts = np.zeros((1, 1, *out), np.float64)
    for index in np.ndindex(*out):
        window = tuple(slice(i * s, i * s + k) for i, s, k in zip(index, strides, kernel, strict=True))
        key: tuple[Any, ...] = (0, 0, *window)
        target: tuple[Any, ...] = (0, 0, *index)
        counts[target] = mask[key].sum()
    factor = float(np.prod(kernel)) / np.maximum(counts, 1.0)
    return factor.astype(np.float32)


def _ceil_extra(node: Node, sizes: list[int], kernel: list[int], strides: list[int], pads: list[int]) -> list[int]:
    """ceil_mode: extra zeros on the right so ggml's floor division yields ONNX's sizes;
    they are never counted as window elements. ``pads``: before + after."""
    spatial = len(kernel)
    extra = [0] * spatial
    if not node.attr("ceil_mode", 0):
        return extra
    before, after = pads[:spatial], pads[spatial:]
    for i in range(spatial):
        span = sizes[i] + before[i] + after[i] - kernel[i]
        out_i = -(-span // strides[i]) + 1
        if (out_i - 1) * strides[i] >= sizes[i] + before[i]:
            out_i -= 1
        extra[i] = max(0, (out_i - 1) * strides[i] + kernel[i] - (sizes[i] + before[i] + after[i]))
    return extra


def _counted(
    node: Node, padded_sizes: tuple[int, ...], sizes: list[int], before: list[int], after: list[int]
) -> np.ndarray:
    """1 where an AveragePool window element counts (the input, and the pads with
    count_include_pad), 0 elsewhere (ceil_mode's extra zeros always)."""
    mask = np.zeros((1, 1, *padded_sizes), np.float32)
    include = bool(node.attr("count_include_pad", 0))
    lo = [0 if include else p for p in before]
    hi = [sizes[i] + before[i] + (after[i] if include else 0) for i in range(len(sizes))]
    region: tuple[Any, ...] = (0, 0, *[slice(lo[i], hi[i]) for i in range(len(sizes))])
    mask[region] = 1.0
    return mask


def _pool(b: Builder, x: Tensor, kind: int, kernel: list[int], strides: list[int], out: list[int]) -> Tensor:
    n, c = x.shape[0], x.shape[1]
    if len(kernel) == 1:
        rows = ops.reshape(b, x, (n * c, x.shape[2]))
        y = ops.pool_rows(b, rows, kind, kernel[0], strides[0], out[0])
        return ops.reshape(b, y, (n, c, out[0]))
    window = (kernel[1], kernel[0], strides[1], strides[0], 0.0, 0.0)
    return b.op("ggml_pool_2d", x.ptr, kind, *window, shape=(n, c, *out), dtype=x.dtype)


@converter(["MaxPool", "AveragePool"], since_version=1, check=check_pool)
def convert_pool(b: Builder, node: Node) -> list[Value]:
    x = b.tensor(node, 0)
    ops.require_float(x, what=node.op)
    spatial = x.rank - 2
    if spatial not in (1, 2):
        raise Unsupported(f"{spatial}-D {node.op}: only 1-D and 2-D are lowered")
    kernel = [int(k) for k in node.attr("kernel_shape")]
    strides = [int(s) for s in (node.attr("strides") or [1] * spatial)]
    sizes = list(x.shape[2:])
    before, after = spatial_pads(node, sizes, kernel, strides, [1] * spatial)
    extra = _ceil_extra(node, sizes, kernel, strides, before + after)
    right = [a + e for a, e in zip(after, extra, strict=True)]
    is_max = node.op == "MaxPool"
    padded = any(before) or any(right)
    if padded:
        # padding never wins a max: pad with the lowest float through the exact select
        fill = float(np.finfo(np.float32).min) if is_max else 0.0
        x = pad_constant(b, x, [0, 0, *before], [0, 0, *right], fill)
    out = [(x.shape[2 + i] - kernel[i]) // strides[i] + 1 for i in range(spatial)]
    if any(o <= 0 for o in out):
        raise Unsupported(f"{node.op}: kernel {kernel} larger than the input")
    y = _pool(b, x, L.GGML_OP_POOL_MAX if is_max else L.GGML_OP_POOL_AVG, kernel, strides, out)
    if not is_max and padded:
        # average = avg_pool(zero-padded x) / avg_pool(mask of the counted positions)
        mask = _counted(node, x.shape[2:], sizes, before, after)
        y = ops.binary(b, "ggml_mul", y, b.constant(_window_factor(mask, kernel, strides, out)))
    return [y]


@converter(["GlobalAveragePool", "GlobalMaxPool"], since_version=1)
def convert_global_pool(b: Builder, node: Node) -> list[Value]:
    x = b.tensor(node, 0)
    ops.require_float(x, what=node.op)
    n, c = x.shape[0], x.shape[1]
    rows = ops.reshape(b, x, (n * c, x.size // max(n * c, 1)))
    if node.op == "GlobalMaxPool":
        return [ops.reshape(b, row_max(b, rows), (n, c) + (1,) * (x.rank - 2))]
    y = b.op("ggml_mean", rows.ptr, shape=(n * c, 1), dtype=x.dtype)
    return [ops.reshape(b, y, (n, c) + (1,) * (x.rank - 2))]
