"""Taking tensors apart and together: Concat, Split, Slice, Gather. Slice and split arguments
must be compile-time constants; Gather takes runtime indices it can range-check."""

from __future__ import annotations

import math

import numpy as np

from sdkit_ggml.compiler import ops
from sdkit_ggml.compiler.builder import Builder
from sdkit_ggml.compiler.context import Node, Tensor, Unsupported, Value
from sdkit_ggml.converters.table import converter
from sdkit_ggml.runtime import lib as L


@converter("Concat", since_version=4)
def convert_concat(b: Builder, node: Node) -> list[Value]:
    tensors = [b.tensor(node, i) for i in range(len(node.inputs)) if node.has(i)]
    tensors = [t for t in tensors if t.size > 0] or tensors[:1]
    axis = int(node.attr("axis"))
    if len(tensors) == 1:
        return [tensors[0]]
    return [ops.concat(b, tensors, axis)]


def _split_sizes(b: Builder, node: Node, dim: int) -> list[int]:
    if node.opset >= 13 and node.has(1):
        return [int(s) for s in np.asarray(b.const(node, 1, "split")).reshape(-1)]
    if node.opset < 13 and node.attr("split") is not None:
        return [int(s) for s in node.attr("split")]
    n = int(node.attr("num_outputs", len(node.proto.output)))
    chunk = -(-dim // n)
    return [min(chunk, dim - i * chunk) for i in range(n)]


@converter("Split", since_version=2)
def convert_split(b: Builder, node: Node) -> list[Value]:
    x = b.tensor(node, 0)
    axis = int(node.attr("axis", 0)) % max(x.rank, 1)
    sizes = _split_sizes(b, node, x.shape[axis])
    if sum(sizes) != x.shape[axis]:
        raise Unsupported(f"Split sizes {sizes} do not add up to {x.shape[axis]}")
    results: list[Value] = []
    start = 0
    for size in sizes:
        starts = [0] * x.rank
        lengths = list(x.shape)
        starts[axis], lengths[axis] = start, size
        results.append(ops.slice_view(b, x, starts, lengths, [1] * x.rank))
        start += size
    return results


def _slice_arguments(b: Builder, node: Node, rank: int) -> tuple[list[int], list[int], list[int], list[int]]:
    """(axes, starts, ends, steps) from the attributes (opset < 10) or the inputs."""
    if node.opset < 10:
        starts_v, ends_v = node.attr("starts"), node.attr("ends")
        axes_v, steps_v = node.attr("axes"), None
    else:
        starts_v = b.const(node, 1, "starts")
        ends_v = b.const(node, 2, "ends")
        axes_v = b.const(node, 3, "axes") if node.has(3) else None
        steps_v = b.const(node, 4, "steps") if node.has(4) else None
    starts = [int(v) for v in np.asarray(starts_v).reshape(-1)]
    ends = [int(v) for v in np.asarray(ends_v).reshape(-1)]
    axes = [int(v) % rank for v in np.asarray(axes_v).reshape(-1)] if axes_v is not None else list(range(len(starts)))
    steps = [int(v) for v in np.asarray(steps_v).reshape(-1)] if steps_v is not None else [1] * len(starts)
    return axes, starts, ends, steps


@converter("Slice", since_version=1)
def convert_slice(b: Builder, node: Node) -> list[Value]:
    x = b.tensor(node, 0)
    begin, size, step = [0] * x.rank, list(x.shape), [1] * x.rank
    for axis, s, e, k in zip(*_slice_arguments(b, node, x.rank), strict=True):
        if k <= 0:
            raise Unsupported("Slice with a negative or zero step: ggml views only stride forward")
        lo, hi, _ = slice(s, e, k).indices(x.shape[axis])
        begin[axis], step[axis] = lo, k
        size[axis] = max(0, -(-(hi - lo) // k))
    if 0 in size:
        raise Unsupported("Slice producing an empty tensor")
    return [ops.slice_view(b, x, begin, size, step)]


def _gather_rows(b: Builder, data: Tensor, indices: Tensor, axis: int, checked: bool = False) -> Tensor:
    """ggml_get_rows over ``axis`` of ``data`` (axis must have only 1-sized dims before it)."""
    if indices.ggml_type != L.GGML_TYPE_I32:
        raise Unsupported("Gather indices must be integers")
    source = "" if checked else b.input_names.get(indices.ptr)  # checked: constants, recursion
    dim = data.shape[axis]
    if source is None:
        proven = indices.bounds is not None and indices.bounds[0] >= 0 and indices.bounds[1] < dim
        if not proven:
            raise Unsupported("Gather with computed indices not provably in range (ggml would abort on a bad index)")
        source = ""
    if source:  # a graph input: its values are range-checked (and negatives wrapped) before each run
        b.index_bounds[source] = min(dim, b.index_bounds.get(source, dim))
        b.index_dims.setdefault(source, set()).add(dim)
    if math.prod(data.shape[:axis]) != 1:
        # move the gathered axis outermost, gather rows, move the result axes back
        r = data.rank
        front = ops.transpose(b, data, [axis, *range(axis), *range(axis + 1, r)])
        gathered = _gather_rows(b, front, indices, 0, checked=True)
        k = indices.rank
        order = [*range(k, k + axis), *range(k), *range(k + axis, k + r - 1)]
        return ops.transpose(b, gathered, order)
    inner = math.prod(data.shape[axis + 1 :])
    rows = ops.reshape(b, data, (data.shape[axis], inner))
    flat = ops.reshape(b, indices, (indices.size,))
    got = b.op("ggml_get_rows", rows.ptr, flat.ptr, shape=(indices.size, inner), dtype=data.dtype)
    return ops.reshape(b, got, (*data.shape[:axis], *indices.shape, *data.shape[axis + 1 :]))


@converter("Gather", since_version=1)
def convert_gather(b: Builder, node: Node) -> list[Value]:
    data = b.tensor(node, 0)
    axis = int(node.attr("axis", 0)) % max(data.rank, 1)
    indices = node.value(1)
    if isinstance(indices, Tensor):
        return [_gather_rows(b, data, indices, axis)]
    idx = np.asarray(b.const(node, 1, "indices")).astype(np.int64)
    dim = data.shape[axis]
    if idx.size and (idx.min() < -dim or idx.max() >= dim):
        raise Unsupported(f"Gather indices out of range for a dim of {dim}")
    idx = np.where(idx < 0, idx + dim, idx)
    out_shape = (*data.shape[:axis], *idx.shape, *data.shape[axis + 1 :])
    flat = idx.reshape(-1)
    if (flat.size and np.all(np.diff(flat) == 1)) or flat.size == 1:
        starts = [0] * data.rank
        sizes = list(data.shape)
        starts[axis], sizes[axis] = int(flat[0]), int(flat.size)
        return [ops.reshape(b, ops.slice_view(b, data, starts, sizes, [1] * data.rank), out_shape)]
    index_tensor = b.constant(idx.reshape(-1).astype(np.int32), dtype=np.dtype(np.int32))
    result = _gather_rows(b, data, index_tensor, axis, checked=True)
    return [ops.reshape(b, result, out_shape)]
