"""MaxPool, AveragePool (1-D, 2-D) and the global pools, on ggml_pool_1d/2d and sum_rows."""

from __future__ import annotations

from typing import Any

import numpy as np

from sdkit_ggml.compiler import ops
from sdkit_ggml.compiler.context import Builder, Node, Unsupported, Value
from sdkit_ggml.compiler.registry import ConverterRegistry
from sdkit_ggml.converters.conv import spatial_pads
from sdkit_ggml.converters.reduce import row_max
from sdkit_ggml.converters.shape import pad_constant
from sdkit_ggml.runtime import lib as L


def check_pool(node: Any) -> str | None:
    attrs = {a.name: a for a in node.attribute}
    if "kernel_shape" in attrs and len(attrs["kernel_shape"].ints) not in (1, 2):
        return "only 1-D and 2-D pooling is lowered to ggml"
    if "dilations" in attrs and any(d != 1 for d in attrs["dilations"].ints):
        return "dilated pooling is not lowered"
    if node.op_type == "MaxPool" and len([o for o in node.output if o]) > 1:
        return "MaxPool's Indices output is not lowered"
    return None


def _pool_pads(node: Node, sizes: list[int], kernel: list[int], strides: list[int]) -> tuple[list[int], list[int]]:
    return spatial_pads(node, sizes, kernel, strides, [1] * len(kernel))


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


def register(registry: ConverterRegistry) -> None:
    @registry.register(["MaxPool", "AveragePool"], since_version=1, check=check_pool)
    def convert_pool(b: Builder, node: Node) -> list[Value]:
        x = b.tensor(node, 0)
        ops.require_float(x, what=node.op)
        spatial = x.rank - 2
        if spatial not in (1, 2):
            raise Unsupported(f"{spatial}-D {node.op}: only 1-D and 2-D are lowered")
        kernel = [int(k) for k in node.attr("kernel_shape")]
        strides = [int(s) for s in (node.attr("strides") or [1] * spatial)]
        in_sizes = list(x.shape[2:])
        before, after = _pool_pads(node, in_sizes, kernel, strides)
        # ceil_mode: extra zeros on the right so ggml's floor division yields ONNX's sizes;
        # they are never counted as window elements.
        extra = [0] * spatial
        if node.attr("ceil_mode", 0):
            for i in range(spatial):
                span = in_sizes[i] + before[i] + after[i] - kernel[i]
                out_i = -(-span // strides[i]) + 1
                if (out_i - 1) * strides[i] >= in_sizes[i] + before[i]:
                    out_i -= 1
                extra[i] = max(0, (out_i - 1) * strides[i] + kernel[i] - (in_sizes[i] + before[i] + after[i]))
        is_max = node.op == "MaxPool"
        right = [a + e for a, e in zip(after, extra, strict=True)]
        padded = any(before) or any(right)
        if is_max and padded:
            # padding never wins a max: pad with the lowest float through the exact select
            x = pad_constant(b, x, [0, 0, *before], [0, 0, *right], float(np.finfo(np.float32).min))
        elif padded:
            x = pad_constant(b, x, [0, 0, *before], [0, 0, *right])
        divisor = None
        if not is_max and padded:
            # average = avg_pool(zero-padded x) / avg_pool(mask of the counted positions)
            mask = np.zeros((1, 1, *x.shape[2:]), np.float32)
            include = bool(node.attr("count_include_pad", 0))
            lo = [0 if include else p for p in before]
            hi = [in_sizes[i] + before[i] + (after[i] if include else 0) for i in range(spatial)]
            region: tuple[Any, ...] = (0, 0, *[slice(lo[i], hi[i]) for i in range(spatial)])
            mask[region] = 1.0
            divisor = mask
        kind = L.GGML_OP_POOL_MAX if is_max else L.GGML_OP_POOL_AVG
        out = [(x.shape[2 + i] - kernel[i]) // strides[i] + 1 for i in range(spatial)]
        if any(o <= 0 for o in out):
            raise Unsupported(f"{node.op}: kernel {kernel} larger than the input")
        n, c = x.shape[0], x.shape[1]
        if spatial == 1:
            rows = ops.reshape(b, x, (n * c, x.shape[2]))
            y = b.op("ggml_pool_1d", rows.ptr, kind, kernel[0], strides[0], 0, shape=(n * c, out[0]), dtype=x.dtype)
            y = ops.reshape(b, y, (n, c, out[0]))
        else:
            y = b.op(
                "ggml_pool_2d",
                x.ptr,
                kind,
                kernel[1],
                kernel[0],
                strides[1],
                strides[0],
                0.0,
                0.0,
                shape=(n, c, *out),
                dtype=x.dtype,
            )
        if divisor is not None:
            y = ops.binary(b, "ggml_mul", y, b.constant(_window_factor(divisor, kernel, strides, out)))
        return [y]

    @registry.register(["GlobalAveragePool", "GlobalMaxPool"], since_version=1)
    def convert_global_pool(b: Builder, node: Node) -> list[Value]:
        x = b.tensor(node, 0)
        ops.require_float(x, what=node.op)
        n, c = x.shape[0], x.shape[1]
        rows = ops.reshape(b, x, (n * c, x.size // max(n * c, 1)))
        if node.op == "GlobalMaxPool":
            y = row_max(b, rows)
        else:
            y = b.op("ggml_mean", rows.ptr, shape=(n * c, 1), dtype=x.dtype)
        return [ops.reshape(b, y, (n, c) + (1,) * (x.rank - 2))]
