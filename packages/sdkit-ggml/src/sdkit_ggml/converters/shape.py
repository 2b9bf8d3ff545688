"""Data movement: Reshape, Flatten, (Un)Squeeze, Transpose, Concat, Split, Slice, Gather,
Expand, Tile, Pad. Shape arguments must be compile-time constants (they fold)."""

from __future__ import annotations

import math

import numpy as np

from sdkit_ggml.compiler import ops
from sdkit_ggml.compiler.context import Builder, Node, Tensor, Unsupported, Value
from sdkit_ggml.compiler.registry import ConverterRegistry
from sdkit_ggml.compiler.static_checks import check_pad
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


def register(registry: ConverterRegistry) -> None:
    @registry.register("Reshape", since_version=5)
    def convert_reshape(b: Builder, node: Node) -> list[Value]:
        x = b.tensor(node, 0)
        target = np.asarray(b.const(node, 1, "shape"))
        return [ops.reshape(b, x, reshape_target(x.shape, target, bool(node.attr("allowzero", 0))))]

    @registry.register("Flatten", since_version=1)
    def convert_flatten(b: Builder, node: Node) -> list[Value]:
        x = b.tensor(node, 0)
        axis = int(node.attr("axis", 1))
        axis = axis + x.rank if axis < 0 else axis
        return [ops.reshape(b, x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))]

    @registry.register("Squeeze", since_version=1)
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

    @registry.register("Unsqueeze", since_version=1)
    def convert_unsqueeze(b: Builder, node: Node) -> list[Value]:
        x = b.tensor(node, 0)
        axes = axes_of(node, b, 1, 13) or []
        rank = x.rank + len(axes)
        norm = sorted(a % rank for a in axes)
        shape = list(x.shape)
        for a in norm:
            shape.insert(a, 1)
        return [ops.reshape(b, x, shape)]

    @registry.register("Transpose", since_version=1)
    def convert_transpose(b: Builder, node: Node) -> list[Value]:
        x = b.tensor(node, 0)
        perm = node.attr("perm") or list(reversed(range(x.rank)))
        return [ops.transpose(b, x, [int(p) for p in perm])]

    @registry.register("Concat", since_version=4)
    def convert_concat(b: Builder, node: Node) -> list[Value]:
        tensors = [b.tensor(node, i) for i in range(len(node.inputs)) if node.has(i)]
        tensors = [t for t in tensors if t.size > 0] or tensors[:1]
        axis = int(node.attr("axis"))
        if len(tensors) == 1:
            return [tensors[0]]
        return [ops.concat(b, tensors, axis)]

    @registry.register("Split", since_version=2)
    def convert_split(b: Builder, node: Node) -> list[Value]:
        x = b.tensor(node, 0)
        axis = int(node.attr("axis", 0)) % max(x.rank, 1)
        outputs = len(node.proto.output)
        if node.opset >= 13 and node.has(1):
            sizes = [int(s) for s in np.asarray(b.const(node, 1, "split")).reshape(-1)]
        elif node.opset < 13 and node.attr("split") is not None:
            sizes = [int(s) for s in node.attr("split")]
        else:
            n = int(node.attr("num_outputs", outputs))
            chunk = -(-x.shape[axis] // n)
            sizes = [min(chunk, x.shape[axis] - i * chunk) for i in range(n)]
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

    @registry.register("Slice", since_version=1)
    def convert_slice(b: Builder, node: Node) -> list[Value]:
        x = b.tensor(node, 0)
        if node.opset < 10:
            starts_v, ends_v = node.attr("starts"), node.attr("ends")
            axes_v, steps_v = node.attr("axes"), None
        else:
            starts_v = b.const(node, 1, "starts")
            ends_v = b.const(node, 2, "ends")
            axes_v = b.const(node, 3, "axes") if node.has(3) else None
            steps_v = b.const(node, 4, "steps") if node.has(4) else None
        starts_l = [int(v) for v in np.asarray(starts_v).reshape(-1)]
        ends_l = [int(v) for v in np.asarray(ends_v).reshape(-1)]
        axes_l = (
            [int(v) % x.rank for v in np.asarray(axes_v).reshape(-1)]
            if axes_v is not None
            else list(range(len(starts_l)))
        )
        steps_l = [int(v) for v in np.asarray(steps_v).reshape(-1)] if steps_v is not None else [1] * len(starts_l)
        begin, size, step = [0] * x.rank, list(x.shape), [1] * x.rank
        for axis, s, e, k in zip(axes_l, starts_l, ends_l, steps_l, strict=True):
            if k <= 0:
                raise Unsupported("Slice with a negative or zero step: ggml views only stride forward")
            dim = x.shape[axis]
            lo, hi, _ = slice(s, e, k).indices(dim)
            begin[axis], step[axis] = lo, k
            size[axis] = max(0, -(-(hi - lo) // k))
        if 0 in size:
            raise Unsupported("Slice producing an empty tensor")
        return [ops.slice_view(b, x, begin, size, step)]

    @registry.register("Gather", since_version=1)
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

    @registry.register("Expand", since_version=8)
    def convert_expand(b: Builder, node: Node) -> list[Value]:
        x = b.tensor(node, 0)
        target = tuple(int(d) for d in np.asarray(b.const(node, 1, "shape")).reshape(-1))
        return [ops.expand(b, x, ops.broadcast_shape(x.shape, target))]

    @registry.register("Tile", since_version=6)
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

    @registry.register("Pad", since_version=2, check=check_pad)
    def convert_pad(b: Builder, node: Node) -> list[Value]:
        x = b.tensor(node, 0)
        mode = node.attr("mode", "constant")
        if node.opset < 11:
            pads = [int(p) for p in node.attr("pads")]
            value = float(node.attr("value", 0.0))
        else:
            pads = [int(p) for p in np.asarray(b.const(node, 1, "pads")).reshape(-1)]
            value = float(np.asarray(b.const(node, 2, "constant_value")).reshape(-1)[0]) if node.has(2) else 0.0
            if node.has(3):
                axes = [int(a) % x.rank for a in np.asarray(b.const(node, 3, "axes")).reshape(-1)]
                if len(pads) != 2 * len(axes):
                    raise Unsupported(f"Pad: {len(pads)} pads for {len(axes)} axes")
                full = [0] * (2 * x.rank)
                for i, a in enumerate(axes):
                    full[a], full[a + x.rank] = pads[i], pads[i + len(axes)]
                pads = full
        if len(pads) != 2 * x.rank:
            raise Unsupported(f"Pad: {len(pads)} pads for a rank-{x.rank} input")
        if mode in ("edge", "reflect", "wrap"):
            return [pad_copying(b, x, pads[: x.rank], pads[x.rank :], mode)]
        if mode != "constant":
            raise Unsupported(f"Pad mode {mode!r}")
        return [pad_constant(b, x, pads[: x.rank], pads[x.rank :], value)]


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


def pad_copying(b: Builder, x: Tensor, before: list[int], after: list[int], mode: str) -> Tensor:
    """edge / reflect / wrap padding, one axis at a time, from slices of ``x`` and concat."""
    if any(p < 0 for p in [*before, *after]):
        raise Unsupported(f"Pad mode {mode!r} with negative pads")
    result = x
    for axis in range(x.rank):
        dim = result.shape[axis]
        if mode == "reflect" and max(before[axis], after[axis]) >= dim:
            raise Unsupported(f"Pad reflect by {max(before[axis], after[axis])} on a dim of {dim}")
        if mode == "wrap" and max(before[axis], after[axis]) > dim:
            raise Unsupported(f"Pad wrap by more than the dim ({dim})")

        def piece(start: int, size: int, current: Tensor = result, axis: int = axis) -> Tensor:
            starts, sizes = [0] * current.rank, list(current.shape)
            starts[axis], sizes[axis] = start, size
            return ops.slice_view(b, current, starts, sizes, [1] * current.rank)

        if mode == "edge":
            left = [piece(0, 1)] * before[axis]
            right = [piece(dim - 1, 1)] * after[axis]
        elif mode == "reflect":  # mirror without repeating the border: x[p], ..., x[1]
            left = [piece(i, 1) for i in range(before[axis], 0, -1)]
            right = [piece(dim - 2 - i, 1) for i in range(after[axis])]
        else:  # wrap
            left = [piece(dim - before[axis], before[axis])] if before[axis] else []
            right = [piece(0, after[axis])] if after[axis] else []
        parts = [*left, result, *right]
        if len(parts) > 1:
            result = ops.concat(b, parts, axis)
    return result


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
    if source:  # a graph input: its values are range-checked before each run
        bound = data.shape[axis]
        b.index_bounds[source] = min(bound, b.index_bounds.get(source, bound))
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


def register_shape_producers(registry: ConverterRegistry) -> None:
    """Ops whose inputs decide output shapes: a graph input there specialises the signature
    (the op then folds); computed inputs are unsupported (static ggml graphs)."""

    @registry.register(["ConstantOfShape", "Range"], since_version=9)
    def convert_shape_producer(b: Builder, node: Node) -> list[Value]:
        from sdkit_ggml.compiler.fold import evaluate_node

        values = [
            np.asarray(b.const(node, i, "a shape argument")) if node.has(i) else None for i in range(len(node.inputs))
        ]
        return list(evaluate_node(node.proto, values, {"": node.opset}))
