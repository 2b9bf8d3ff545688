"""Pad (constant, edge, reflect, wrap), and the padding helpers Conv and pooling use."""

from __future__ import annotations

import numpy as np
import onnx

from sdkit_ggml.compiler import ops
from sdkit_ggml.compiler.builder import Builder
from sdkit_ggml.compiler.context import Node, Tensor, Unsupported, Value, attributes
from sdkit_ggml.converters.table import converter

MODES = ("constant", "edge", "reflect", "wrap")


def check_pad(node: onnx.NodeProto) -> str | None:
    mode = attributes(node).get("mode", "constant")
    return None if mode in MODES else f"Pad mode {mode!r}"


def pad_constant(b: Builder, x: Tensor, before: list[int], after: list[int], value: float = 0.0) -> Tensor:
    """Zero padding with ggml_pad_ext; a non-zero value is added where the padding went."""
    ops.require_rank(x, 4, "Pad")
    ops.require_float(x, what="Pad")
    if any(d + p + q < 1 for d, p, q in zip(x.shape, before, after, strict=True)):
        raise Unsupported(f"Pad: pads {before} {after} leave nothing of {list(x.shape)}")
    if any(p < 0 for p in [*before, *after]):
        starts = [max(0, -p) for p in before]
        sizes = [d - max(0, -p) - max(0, -q) for d, p, q in zip(x.shape, before, after, strict=True)]
        x = ops.slice_view(b, x, starts, sizes, [1] * x.rank)
        before, after = [max(0, p) for p in before], [max(0, p) for p in after]
    r = x.rank
    args = [0] * 8
    for axis in range(r):
        k = r - 1 - axis
        args[2 * k], args[2 * k + 1] = before[axis], after[axis]
    shape = tuple(d + p + q for d, p, q in zip(x.shape, before, after, strict=True))
    padded = b.op("ggml_pad_ext", x.ptr, *args, shape=shape, dtype=x.dtype)
    if value == 0.0:
        return padded
    inside = b.op("ggml_pad_ext", b.constant(np.ones(x.shape, np.float32)).ptr, *args, shape=shape)
    fill = ops.scale(b, inside, -value, value)  # value where padded, 0 inside
    return ops.binary(b, "ggml_add", padded, fill)


def _copied_borders(b: Builder, x: Tensor, axis: int, before: int, after: int, mode: str) -> list[Tensor]:
    """The slices of ``x`` that edge / reflect / wrap padding puts around it on ``axis``."""
    dim = x.shape[axis]
    if mode == "reflect" and max(before, after) >= dim:
        raise Unsupported(f"Pad reflect by {max(before, after)} on a dim of {dim}")
    if mode == "wrap" and max(before, after) > dim:
        raise Unsupported(f"Pad wrap by more than the dim ({dim})")

    def piece(start: int, size: int) -> Tensor:
        starts, sizes = [0] * x.rank, list(x.shape)
        starts[axis], sizes[axis] = start, size
        return ops.slice_view(b, x, starts, sizes, [1] * x.rank)

    if mode == "edge":
        left, right = [piece(0, 1)] * before, [piece(dim - 1, 1)] * after
    elif mode == "reflect":  # mirror without repeating the border: x[p], ..., x[1]
        left = [piece(i, 1) for i in range(before, 0, -1)]
        right = [piece(dim - 2 - i, 1) for i in range(after)]
    else:  # wrap
        left = [piece(dim - before, before)] if before else []
        right = [piece(0, after)] if after else []
    return [*left, x, *right]


def pad_copying(b: Builder, x: Tensor, before: list[int], after: list[int], mode: str) -> Tensor:
    """edge / reflect / wrap padding, one axis at a time, from slices of ``x`` and concat."""
    if any(p < 0 for p in [*before, *after]):
        raise Unsupported(f"Pad mode {mode!r} with negative pads")
    result = x
    for axis in range(x.rank):
        parts = _copied_borders(b, result, axis, before[axis], after[axis], mode)
        if len(parts) > 1:
            result = ops.concat(b, parts, axis)
    return result


def _pads(b: Builder, node: Node, rank: int) -> tuple[list[int], float]:
    """(pads for every axis, constant value) from the attributes (opset < 11) or inputs."""
    if node.opset < 11:
        return [int(p) for p in node.attr("pads")], float(node.attr("value", 0.0))
    pads = [int(p) for p in np.asarray(b.const(node, 1, "pads")).reshape(-1)]
    value = float(np.asarray(b.const(node, 2, "constant_value")).reshape(-1)[0]) if node.has(2) else 0.0
    if node.has(3):
        axes = [int(a) % rank for a in np.asarray(b.const(node, 3, "axes")).reshape(-1)]
        if len(pads) != 2 * len(axes):
            raise Unsupported(f"Pad: {len(pads)} pads for {len(axes)} axes")
        full = [0] * (2 * rank)
        for i, a in enumerate(axes):
            full[a], full[a + rank] = pads[i], pads[i + len(axes)]
        pads = full
    return pads, value


@converter("Pad", since_version=2, check=check_pad)
def convert_pad(b: Builder, node: Node) -> list[Value]:
    x = b.tensor(node, 0)
    pads, value = _pads(b, node, x.rank)
    if len(pads) != 2 * x.rank:
        raise Unsupported(f"Pad: {len(pads)} pads for a rank-{x.rank} input")
    mode = node.attr("mode", "constant")
    if mode == "constant":
        return [pad_constant(b, x, pads[: x.rank], pads[x.rank :], value)]
    return [pad_copying(b, x, pads[: x.rank], pads[x.rank :], mode)]
