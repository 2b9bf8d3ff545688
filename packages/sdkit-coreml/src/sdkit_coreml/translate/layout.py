"""Shape and layout ops: Constant, Shape, Reshape, Transpose, Concat, (Un)Squeeze, Flatten,
Gather, Slice, Expand, Tile, ConstantOfShape, Range, Split, ArgMax.

With static input shapes MIL folds the Shape -> Gather -> Concat -> Reshape chains that
exporters emit into constants; with flexible shapes they stay as int32 ops on symbolic dims.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from sdkit_coreml.translate.context import INT32, Context, attrs, fail, mil, rank_of, to_mil_array
from sdkit_coreml.translate.registry import converter


def _axes(ctx: Context, node: onnx.NodeProto, input_index: int = 1) -> list[int] | None:
    """Axes from the attribute (older opsets) or from input ``input_index`` (newer)."""
    if "axes" in attrs(node):
        return [int(a) for a in attrs(node)["axes"]]
    if ctx.optional(node, input_index) is None:
        return None
    return [int(a) for a in ctx.known(node, input_index, "axes").reshape(-1)]


@converter("Constant")
def constant(ctx: Context, node: onnx.NodeProto) -> None:
    found = attrs(node)
    if "value" in found:
        value = np.asarray(found["value"])
    elif "value_float" in found or "value_int" in found:
        value = np.asarray(found.get("value_float", found.get("value_int")))
    elif "value_floats" in found or "value_ints" in found:
        value = np.asarray(found.get("value_floats", found.get("value_ints")))
    else:
        raise fail(node, ctx.opset, "Constant without a numeric value")
    ctx.set(node.output[0], ctx.const(value, name=node.output[0]))


@converter("Shape")
def shape(ctx: Context, node: onnx.NodeProto) -> None:
    x = ctx.get(node.input[0])
    found = attrs(node)
    result = mil().shape(x=x)
    if "start" in found or "end" in found:
        rank = rank_of(x)
        start, end = int(found.get("start", 0)), int(found.get("end", rank))
        result = mil().slice_by_index(x=result, begin=[start % rank if start < 0 else start], end=[min(end, rank)])
    ctx.set(node.output[0], mil().identity(x=result, name=node.output[0]))


def zero_means_copy(ctx: Context, x: Any, shape: Any) -> Any:
    """ONNX Reshape: 0 copies the input's dim at that position. Known dims are written out
    (MIL allows 0 only when the ranks agree, and coremltools' reshape-merging pass carries a
    0 over to another input); unknown ones are read with ``shape`` at run time."""
    known = ctx.value(shape)
    if known is None or not (known == 0).any():
        return shape
    dims = tuple(x.shape)
    copied = [dims[i] if d == 0 else d for i, d in enumerate(known)]
    if all(isinstance(d, (int, np.integer)) for d in copied):
        return ctx.const(np.array(copied))
    parts = [mil().slice_by_index(x=mil().shape(x=x), begin=[i], end=[i + 1]) if d == 0 else ctx.const(np.array([d]))
             for i, d in enumerate(known)]  # fmt: skip
    return mil().concat(values=parts, axis=0)


@converter("Reshape", since=5)
def reshape(ctx: Context, node: onnx.NodeProto) -> None:
    x, target = ctx.get(node.input[0]), ctx.get(node.input[1])
    if int(attrs(node).get("allowzero", 0)):
        known = ctx.value(target)
        if known is None or (known == 0).any():
            raise fail(node, ctx.opset, "Reshape with allowzero=1 and a zero dim")
    ctx.set(node.output[0], mil().reshape(x=x, shape=zero_means_copy(ctx, x, target), name=node.output[0]))


@converter("Flatten")
def flatten(ctx: Context, node: onnx.NodeProto) -> None:
    x = ctx.get(node.input[0])
    axis = int(attrs(node).get("axis", 1))
    axis = axis + rank_of(x) if axis < 0 else axis
    if axis == 0:
        new_shape = ctx.const(np.array([1, -1]))
    else:
        head = mil().reduce_prod(x=mil().slice_by_index(x=mil().shape(x=x), begin=[0], end=[axis]), keep_dims=True)
        new_shape = mil().concat(values=[head, ctx.const(np.array([-1]))], axis=0)
    ctx.set(node.output[0], mil().reshape(x=x, shape=new_shape, name=node.output[0]))


@converter("Transpose")
def transpose(ctx: Context, node: onnx.NodeProto) -> None:
    x = ctx.get(node.input[0])
    perm = attrs(node).get("perm") or list(reversed(range(rank_of(x))))
    ctx.set(node.output[0], mil().transpose(x=x, perm=[int(p) for p in perm], name=node.output[0]))


@converter("Concat")
def concat(ctx: Context, node: onnx.NodeProto) -> None:
    values = [ctx.get(n) for n in node.input if n]
    axis = int(attrs(node)["axis"])
    if len(values) == 1:
        ctx.set(node.output[0], mil().identity(x=values[0], name=node.output[0]))
        return
    ctx.set(node.output[0], mil().concat(values=values, axis=axis, name=node.output[0]))


@converter("Unsqueeze")
def unsqueeze(ctx: Context, node: onnx.NodeProto) -> None:
    axes = _axes(ctx, node)
    if axes is None:
        raise fail(node, ctx.opset, "Unsqueeze without axes")
    ctx.set(node.output[0], mil().expand_dims(x=ctx.get(node.input[0]), axes=axes, name=node.output[0]))


@converter("Squeeze")
def squeeze(ctx: Context, node: onnx.NodeProto) -> None:
    x, axes = ctx.get(node.input[0]), _axes(ctx, node)
    if rank_of(x) == 1 and (axes is None or axes in ([0], [-1])):  # MIL squeeze keeps rank >= 1
        ctx.set(node.output[0], mil().reshape(x=x, shape=ctx.const(np.zeros(0, np.int32)), name=node.output[0]))
        return
    result = mil().squeeze(x=x, axes=axes, name=node.output[0]) if axes else mil().squeeze(x=x, name=node.output[0])
    ctx.set(node.output[0], result)


@converter("Gather")
def gather(ctx: Context, node: onnx.NodeProto) -> None:
    x, indices = ctx.get(node.input[0]), ctx.get(node.input[1])
    axis = int(attrs(node).get("axis", 0))
    known = ctx.value(indices)
    dims = tuple(x.shape)
    if known is not None and (known < 0).any():
        size = dims[axis]
        if not isinstance(size, (int, np.integer)):
            raise fail(node, ctx.opset, "negative Gather indices on a dimension of unknown size")
        indices = ctx.const(np.where(known < 0, known + int(size), known))
    from coremltools.converters.mil.mil import types

    if x.dtype == types.bool:  # MIL gathers numbers only (T5's attention mask is a bool gather)
        picked = mil().gather(x=mil().cast(x=x, dtype="int32"), indices=indices, axis=axis)
        ctx.set(node.output[0], mil().cast(x=picked, dtype="bool", name=node.output[0]))
        return
    ctx.set(node.output[0], mil().gather(x=x, indices=indices, axis=axis, name=node.output[0]))


def _slice_bound(values: np.ndarray | None, var: Any, position: int) -> Any:
    if values is not None:
        return np.asarray([np.clip(values[position], INT32.min, INT32.max)], np.int32)
    return mil().slice_by_index(x=var, begin=[position], end=[position + 1])


@converter("Slice", since=10)
def slice_(ctx: Context, node: onnx.NodeProto) -> None:
    x = ctx.get(node.input[0])
    rank = rank_of(x)
    starts_var, ends_var = ctx.get(node.input[1]), ctx.get(node.input[2])
    starts, ends = ctx.value(starts_var), ctx.value(ends_var)
    count = len(starts) if starts is not None else int(starts_var.shape[0])
    axes = _axes(ctx, node, 3) or list(range(count))
    steps_var = ctx.optional(node, 4)
    steps = [1] * count if steps_var is None else [int(s) for s in ctx.known(node, 4, "steps").reshape(-1)]
    begin: list[Any] = [np.zeros(1, np.int32)] * rank
    end: list[Any] = [np.zeros(1, np.int32)] * rank
    stride, begin_mask, end_mask = [1] * rank, [True] * rank, [True] * rank
    for position, given in enumerate(axes):
        axis = given + rank if given < 0 else given
        begin[axis], end[axis] = _slice_bound(starts, starts_var, position), _slice_bound(ends, ends_var, position)
        stride[axis], begin_mask[axis] = steps[position], False
        # INT64 "to the end" sentinels (saturated to INT32) are left to the mask
        end_mask[axis] = ends is not None and abs(int(ends[position])) >= INT32.max
    begin_var = ctx.const(np.concatenate(begin)) if starts is not None else mil().concat(values=begin, axis=0)
    end_var = ctx.const(np.concatenate(end)) if ends is not None else mil().concat(values=end, axis=0)
    result = mil().slice_by_index(
        x=x, begin=begin_var, end=end_var, stride=stride, begin_mask=begin_mask, end_mask=end_mask, name=node.output[0]
    )
    ctx.set(node.output[0], result)


@converter("Split", since=13)
def split(ctx: Context, node: onnx.NodeProto) -> None:
    x = ctx.get(node.input[0])
    axis = int(attrs(node).get("axis", 0))
    sizes = ctx.optional(node, 1)
    if sizes is not None:
        parts = mil().split(x=x, split_sizes=ctx.known(node, 1, "split").astype(np.int32), axis=axis)
    else:
        parts = mil().split(x=x, num_splits=len(node.output), axis=axis)
    for name, part in zip(node.output, parts, strict=True):
        ctx.set(name, part)


def _fill(ctx: Context, shape_var: Any, value: np.ndarray) -> Any:
    known = ctx.value(shape_var)
    if known is not None:  # one element broadcast (stride 0): a fill of any size costs no memory
        scalar = to_mil_array(value.reshape(-1)[:1])[0]
        return ctx.const(np.broadcast_to(scalar, tuple(int(d) for d in known)))
    scalar = value.reshape(-1)[0]
    return mil().fill(shape=shape_var, value=scalar.item() if value.dtype.kind != "f" else float(scalar))


@converter("ConstantOfShape")
def constant_of_shape(ctx: Context, node: onnx.NodeProto) -> None:
    value = np.asarray(attrs(node).get("value", np.zeros(1, np.float32)))
    filled = _fill(ctx, ctx.get(node.input[0]), value)
    ctx.set(node.output[0], mil().identity(x=filled, name=node.output[0]))


@converter("Expand", since=8)
def expand(ctx: Context, node: onnx.NodeProto) -> None:
    x, target = ctx.get(node.input[0]), ctx.get(node.input[1])
    from coremltools.converters.mil.mil import types

    is_bool = x.dtype == types.bool
    base = mil().cast(x=x, dtype="int32") if is_bool else x
    zero = np.zeros(1, np.int32 if is_bool or types.is_int(x.dtype) else np.float32)
    result = mil().add(x=base, y=_fill(ctx, target, zero))
    result = mil().cast(x=result, dtype="bool", name=node.output[0]) if is_bool else result
    ctx.set(node.output[0], mil().identity(x=result, name=node.output[0]) if not is_bool else result)


@converter("Tile", since=6)
def tile(ctx: Context, node: onnx.NodeProto) -> None:
    x, repeats = ctx.get(node.input[0]), ctx.get(node.input[1])
    ctx.set(node.output[0], mil().tile(x=x, reps=repeats, name=node.output[0]))


@converter("Range", since=11)
def range_(ctx: Context, node: onnx.NodeProto) -> None:
    start, limit, delta = (ctx.get(n) for n in node.input)
    ctx.set(node.output[0], mil().range_1d(start=start, end=limit, step=delta, name=node.output[0]))


@converter("ArgMax", "ArgMin")
def arg_reduce(ctx: Context, node: onnx.NodeProto) -> None:
    found = attrs(node)
    if int(found.get("select_last_index", 0)):
        raise fail(node, ctx.opset, "select_last_index=1 is not supported")
    op = mil().reduce_argmax if node.op_type == "ArgMax" else mil().reduce_argmin
    keep = bool(found.get("keepdims", 1))
    ctx.set(node.output[0], op(x=ctx.get(node.input[0]), axis=int(found.get("axis", 0)), keep_dims=keep,
                               name=node.output[0]))  # fmt: skip
