"""MaxPool, AveragePool (1-D, 2-D) and the global pools, on ggml_pool_1d/2d and sum_rows."""

from __future__ import annotations

from typing import Any

import numpy as np

from sdkit_ggml.compiler import ops
from sdkit_ggml.compiler.context import Builder, Node, Unsupported, Value
from sdkit_ggml.compiler.registry import ConverterRegistry
from sdkit_ggml.converters.reduce import row_max
from sdkit_ggml.converters.shape import pad_constant
from sdkit_ggml.runtime import lib as L


def check_pool(node: Any) -> str | None:
    attrs = {a.name: a for a in node.attribute}
    if "kernel_shape" in attrs and len(attrs["kernel_shape"].ints) not in (1, 2):
        return "only 1-D and 2-D pooling is lowered to ggml"
    if "ceil_mode" in attrs and attrs["ceil_mode"].i:
        return "ceil_mode=1 is not lowered (ggml pools floor the output size)"
    if "dilations" in attrs and any(d != 1 for d in attrs["dilations"].ints):
        return "dilated pooling is not lowered"
    if node.op_type == "MaxPool" and len([o for o in node.output if o]) > 1:
        return "MaxPool's Indices output is not lowered"
    return None


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
        auto_pad = node.attr("auto_pad", "NOTSET")
        if auto_pad not in ("NOTSET", "VALID"):
            raise Unsupported(f"{node.op} auto_pad {auto_pad}")
        pads = (
            [int(p) for p in (node.attr("pads") or [0] * (2 * spatial))]
            if auto_pad == "NOTSET"
            else [0] * (2 * spatial)
        )
        before, after = pads[:spatial], pads[spatial:]
        is_max = node.op == "MaxPool"
        include_pad = bool(node.attr("count_include_pad", 0))
        if any(before) or any(after):
            if not is_max and not include_pad:
                raise Unsupported("AveragePool with padding and count_include_pad=0 (ggml divides by the full window)")
            if is_max:
                # -inf padding through the exact select: pad with a huge negative value
                x = pad_constant(b, x, [0, 0, *before], [0, 0, *after], float(np.finfo(np.float32).min))
            else:
                x = pad_constant(b, x, [0, 0, *before], [0, 0, *after])
        kind = L.GGML_OP_POOL_MAX if is_max else L.GGML_OP_POOL_AVG
        out = [(x.shape[2 + i] - kernel[i]) // strides[i] + 1 for i in range(spatial)]
        if any(o <= 0 for o in out):
            raise Unsupported(f"{node.op}: kernel {kernel} larger than the input")
        n, c = x.shape[0], x.shape[1]
        if spatial == 1:
            rows = ops.reshape(b, x, (n * c, x.shape[2]))
            y = b.op("ggml_pool_1d", rows.ptr, kind, kernel[0], strides[0], 0, shape=(n * c, out[0]), dtype=x.dtype)
            return [ops.reshape(b, y, (n, c, out[0]))]
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
