"""Shape ops: Reshape, Flatten, (Un)Squeeze, Transpose, Expand, Tile, and the shape producers
ConstantOfShape and Range. Shape arguments must be compile-time constants (they fold)."""

from __future__ import annotations

import math

import numpy as np

from sdkit_ggml.compiler import ops
from sdkit_ggml.compiler.builder import Builder
from sdkit_ggml.compiler.context import Node, Unsupported, Value
from sdkit_ggml.compiler.fold import evaluate_node
from sdkit_ggml.converters.table import converter
from sdkit_ggml.runtime import lib as L


def axes_of(node: Node, b: Builder, index: int, input_since: int) -> list[int] | None:
    """``axes`` from input ``index`` (opset >= ``input_since``) or from the attribute."""
    if node.opset >= input_since:
        if node.has(index):
            return [int(a) for a in np.asarray(b.const(node, index, "axes")).reshape(-1)]
        return None
    value = node.attr("axes")
    return None if value is None else [int(a) for a in value]


def reshape_target(shape: tuple[int, ...], target: np.ndarray, allowzero: bool) -> tuple[int, ...]:
    dims = [int(d) for d in target.reshape(-1)]
    out = []
    for i, d in enumerate(dims):
        if d == 0 and not allowzero:
            if i >= len(shape):
                raise Unsupported(f"Reshape: 0 at axis {i} copies a dim the input does not have")
            out.append(shape[i])
        else:
            out.append(d)
    if out.count(-1) > 1:
        raise Unsupported("Reshape: more than one -1 in the target shape")
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        total = math.prod(shape)
        if known == 0 or total % known:
            raise Unsupported(f"Reshape: cannot infer -1 reshaping {list(shape)} to {dims}")
        out[out.index(-1)] = total // known
    if math.prod(out) != math.prod(shape) or any(d < 0 for d in out):
        raise Unsupported(f"Reshape: {list(shape)} has {math.prod(shape)} elements, target {dims}")
    return tuple(out)


@converter("Reshape", since_version=5)
def convert_reshape(b: Builder, node: Node) -> list[Value]:
    x = b.tensor(node, 0)
    target = np.asarray(b.const(node, 1, "shape"))
    return [ops.reshape(b, x, reshape_target(x.shape, target, bool(node.attr("allowzero", 0))))]


@converter("Flatten", since_version=1)
def convert_flatten(b: Builder, node: Node) -> list[Value]:
    x = b.tensor(node, 0)
    axis = int(node.attr("axis", 1))
    axis = axis + x.rank if axis < 0 else axis
    return [ops.reshape(b, x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))]


@converter("Squeeze", since_version=1)
def convert_squeeze(b: Builder, node: Node) -> list[Value]:
    x = b.tensor(node, 0)
    axes = axes_of(node, b, 1, 13)
    if axes is None:
        shape = tuple(d for d in x.shape if d != 1)
    else:
        norm = {a % x.rank for a in axes}
        if any(x.shape[a] != 1 for a in norm):
            raise Unsupported(f"Squeeze of axes {axes} of shape {list(x.shape)}: not all are 1")
        shape = tuple(d for i, d in enumerate(x.shape) if i not in norm)
    return [ops.reshape(b, x, shape)]


@converter("Unsqueeze", since_version=1)
def convert_unsqueeze(b: Builder, node: Node) -> list[Value]:
    x = b.tensor(node, 0)
    axes = axes_of(node, b, 1, 13) or []
    rank = x.rank + len(axes)
    shape = list(x.shape)
    for a in sorted(a % rank for a in axes):
        shape.insert(a, 1)
    return [ops.reshape(b, x, shape)]


@converter("Transpose", since_version=1)
def convert_transpose(b: Builder, node: Node) -> list[Value]:
    x = b.tensor(node, 0)
    perm = node.attr("perm") or list(reversed(range(x.rank)))
    return [ops.transpose(b, x, [int(p) for p in perm])]


@converter("Expand", since_version=8)
def convert_expand(b: Builder, node: Node) -> list[Value]:
    x = b.tensor(node, 0)
    target = tuple(int(d) for d in np.asarray(b.const(node, 1, "shape")).reshape(-1))
    return [ops.expand(b, x, ops.broadcast_shape(x.shape, target))]


@converter("Tile", since_version=6)
def convert_tile(b: Builder, node: Node) -> list[Value]:
    x = b.tensor(node, 0)
    repeats = [int(r) for r in np.asarray(b.const(node, 1, "repeats")).reshape(-1)]
    if len(repeats) != x.rank or any(r < 1 for r in repeats):
        raise Unsupported(f"Tile repeats {repeats} for a rank-{x.rank} input (each must be >= 1)")
    shape = tuple(d * r for d, r in zip(x.shape, repeats, strict=True))
    ops.require_rank(x, 4, "Tile")
    if x.ggml_type != L.GGML_TYPE_F32:
        raise Unsupported("ggml tiles F32 tensors only")
    return [b.op("ggml_repeat_4d", x.ptr, *ops.ne_of(shape), shape=shape, dtype=x.dtype)]


@converter(["ConstantOfShape", "Range"], since_version=9)
def convert_shape_producer(b: Builder, node: Node) -> list[Value]:
    """Ops whose inputs decide output shapes: a graph input there specialises the signature
    (the op then folds); computed inputs are unsupported (static ggml graphs)."""
    values = [
        np.asarray(b.const(node, i, "a shape argument")) if node.has(i) else None for i in range(len(node.inputs))
    ]
    return list(evaluate_node(node.proto, values, {"": node.opset}))
