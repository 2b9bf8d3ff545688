"""Integer arithmetic and comparisons on runtime tensors, for index computations (CLIP's
pooled-token gather: ``argmax((input_ids == eos_token_id).int())``).

ggml's CPU binary kernels are float-only, so integers are computed in F32 and cast back to
I32. That is exact only while every value stays within 2**24 in magnitude, so each integer
tensor carries a value interval known at compile time (from its dtype, an ArgMax, a Cast from
bool, or constants) and an op whose operands or result are not provably exact is reported
unsupported. An integer graph input (token ids) has no such interval from its dtype; it gets
one checked at run time instead: its values must lie within 2**24 in magnitude (an InputError
before compute otherwise, as out-of-range Gather indices get).
"""

from __future__ import annotations

import numpy as np

from sdkit_ggml.compiler import ops
from sdkit_ggml.compiler.builder import Builder
from sdkit_ggml.compiler.context import Node, Tensor, Unsupported, Value
from sdkit_ggml.runtime import lib as L

EXACT_LIMIT = 1 << 24  # integers F32 represents exactly
_INTERVALS = {"Add": "ggml_add", "Sub": "ggml_sub", "Mul": "ggml_mul"}


def is_integer(value: Value) -> bool:
    dtype = value.dtype
    return bool(np.dtype(dtype).kind in "iu")


def value_bounds(value: Value) -> tuple[int, int] | None:
    """The interval an integer value is known to lie in, or None."""
    if not isinstance(value, Tensor):
        array = np.asarray(value)
        return (int(array.min()), int(array.max())) if array.size else (0, 0)
    if value.bounds is not None:
        return value.bounds
    if value.dtype.itemsize <= 2:  # int8/uint8/int16/uint16 inputs: the dtype bounds them
        info = np.iinfo(value.dtype)
        return int(info.min), int(info.max)
    return None


def exact_bounds(b: Builder, value: Value, what: str) -> tuple[int, int]:
    """``value``'s interval, proven within F32's exact integers: from the value itself, or for
    a graph input from a range check of its feeds before each run."""
    bounds = value_bounds(value)
    name = b.input_names.get(value.ptr) if isinstance(value, Tensor) else None
    if bounds is None and name:
        bounds = b.input_ranges.setdefault(name, (-EXACT_LIMIT, EXACT_LIMIT))
    if bounds is None:
        raise Unsupported(f"{what} on integer values of unknown range (ggml computes integers in F32)")
    if max(abs(bounds[0]), abs(bounds[1])) > EXACT_LIMIT:
        raise Unsupported(f"{what} on integers in [{bounds[0]}, {bounds[1]}]: F32 holds them exactly within 2**24 only")
    return bounds


def exact_float(b: Builder, node: Node, index: int) -> tuple[Tensor, tuple[int, int]]:
    """Integer input ``index`` of ``node`` as F32 (exact, see ``exact_bounds``) and its interval."""
    value = _operand(b, node, index)
    return _as_float(b, value), exact_bounds(b, value, node.op)


def _combine(op: str, x: tuple[int, int], y: tuple[int, int]) -> tuple[int, int]:
    if op == "Add":
        return x[0] + y[0], x[1] + y[1]
    if op == "Sub":
        return x[0] - y[1], x[1] - y[0]
    corners = [a * c for a in x for c in y]
    return min(corners), max(corners)


def _as_float(b: Builder, value: Value) -> Tensor:
    if isinstance(value, Tensor):
        return ops.cast(b, value, L.GGML_TYPE_F32, np.dtype(np.float32))
    return b.constant(np.asarray(value, dtype=np.float32), dtype=np.dtype(np.float32))


def _operand(b: Builder, node: Node, index: int) -> Value:
    """A constant operand's values bound the result, so they are structural: refit may not
    change them (and check(), which has no weight values, leaves the node to compile)."""
    value = node.value(index)
    return value if isinstance(value, Tensor) else b.const(node, index, "integer operand")


def integer_binary(b: Builder, node: Node) -> Tensor:
    """Add/Sub/Mul of integers with a provably exact and non-overflowing result."""
    if node.op not in _INTERVALS:
        raise Unsupported(f"integer {node.op}: ggml's kernels are float-only")
    x, y = _operand(b, node, 0), _operand(b, node, 1)
    bx, by = value_bounds(x), value_bounds(y)
    if bx is None or by is None:
        raise Unsupported(f"integer {node.op} on values of unknown range (ggml computes integers in F32)")
    low, high = _combine(node.op, bx, by)
    out_dtype = np.dtype(x.dtype)
    info = np.iinfo(out_dtype)
    if max(abs(low), abs(high)) >= EXACT_LIMIT or low < info.min or high > info.max:
        raise Unsupported(
            f"integer {node.op} may leave [{info.min}, {info.max}] or exceed 2**24 (values in [{low}, {high}])"
        )
    result = ops.binary(b, _INTERVALS[node.op], _as_float(b, x), _as_float(b, y))
    back = ops.cast(b, result, L.GGML_TYPE_I32, out_dtype)
    return ops.with_bounds(back, (low, high))
