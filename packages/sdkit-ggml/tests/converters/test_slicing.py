"""converters/slicing.py: Concat, Split, Slice and Gather (constant and runtime indices)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import sdkit
from sdkit.errors import InputError

Check = Callable[..., Any]


def i64(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(axis: int, like_reference: Check, f32: Check) -> None:
    a = f32(2, 3, 4)
    b_shape = list(a.shape)
    b_shape[axis] = 2
    like_reference("Concat", [("a", a), ("b", f32(*b_shape)), ("c", f32(*b_shape), "const")], {"axis": axis}, atol=0)


def test_split(like_reference: Check, f32: Check) -> None:
    like_reference("Split", [("x", f32(2, 6)), ("split", i64(1, 2, 3), "const")], {"axis": 1}, atol=0.0, outputs=3)
    like_reference("Split", [("x", f32(6, 2))], atol=0.0, outputs=2)  # equal parts


def test_split_and_concat_above_rank_4(like_reference: Check, f32: Check) -> None:
    """Flux's RoPE: unbind the last axis of [B, L, heads, D/2, 2], stack the halves back."""
    like_reference("Split", [("x", f32(2, 3, 2, 4, 2))], {"axis": -1}, atol=0.0, outputs=2)
    like_reference("Split", [("x", f32(2, 3, 4, 2, 2))], {"axis": 2}, atol=0.0, outputs=2)
    like_reference("Concat", [("a", f32(2, 3, 2, 4, 1)), ("b", f32(2, 3, 2, 4, 1))], {"axis": -1}, atol=0)
    like_reference("Concat", [("a", f32(1, 2, 3, 2, 2, 2)), ("b", f32(1, 2, 1, 2, 2, 2))], {"axis": 2}, atol=0)


def test_split_sizes_must_add_up(refuses: Check, f32: Check) -> None:
    x, sizes = ("x", f32(2, 6)), ("split", i64(1, 2), "const")
    refuses("Split", [x, sizes], {"axis": 1}, match="do not add up", outputs=2, strict=False)


@pytest.mark.parametrize(
    ("starts", "ends", "axes", "steps"),
    [
        ((1,), (3,), (0,), (1,)),
        ((0, 1), (2, 100), (1, 2), (1, 2)),
        ((-3,), (-1,), (-1,), (1,)),
        ((1,), (4,), (2,), (2,)),
    ],
)
def test_slice(starts: Any, ends: Any, axes: Any, steps: Any, like_reference: Check, f32: Check) -> None:
    operands = [("x", f32(3, 4, 5))] + [
        (name, i64(*values), "const")
        for name, values in zip(("s", "e", "a", "k"), (starts, ends, axes, steps), strict=True)
    ]
    like_reference("Slice", operands, atol=0.0)


def test_slice_refusals(refuses: Check, f32: Check) -> None:
    backwards = [("x", f32(4)), ("s", i64(3), "const"), ("e", i64(0), "const"), ("a", i64(0), "const")]
    refuses("Slice", [*backwards, ("k", i64(-1), "const")], match="negative or zero step")
    empty = [("x", f32(4)), ("s", i64(3), "const"), ("e", i64(1), "const")]
    refuses("Slice", empty, match="empty tensor")


def test_gather_with_constant_indices(like_reference: Check, f32: Check) -> None:
    like_reference("Gather", [("x", f32(5, 3)), ("i", i64(4, 0, 2), "const")], atol=0.0)
    like_reference(
        "Gather", [("x", f32(2, 5, 3)), ("i", np.array([[1, 2], [3, -1]], np.int64), "const")], {"axis": 1}, atol=0
    )


def test_gather_with_runtime_indices_range_checks_them(one_node_graph: Check, f32: Check) -> None:
    table = f32(10, 4)
    model = one_node_graph("Gather", [("table", table, "const"), ("ids", np.zeros(3, np.int64))])
    compiled = sdkit.compile(model, backend="ggml")
    np.testing.assert_array_equal(compiled.run({"ids": np.array([1, 9, 0])})["out0"], table[[1, 9, 0]])
    with pytest.raises(InputError, match="indices must lie in"):
        compiled.run({"ids": np.array([1, 10, 0])})


def test_gather_with_constant_indices_out_of_range_is_refused(refuses: Check, f32: Check) -> None:
    refuses("Gather", [("x", f32(5, 3)), ("i", i64(5), "const")], match="out of range")


def test_gather_with_runtime_negative_indices_counts_from_the_end(one_node_graph: Check, f32: Check) -> None:
    """Issue 15 finding 6: valid negative indices (ONNX: counted from the end) were refused."""
    table = f32(10, 4)
    model = one_node_graph("Gather", [("table", table, "const"), ("ids", np.zeros(4, np.int64))])
    compiled = sdkit.compile(model, backend="ggml")
    ids = np.array([-1, -10, 3, 0])
    np.testing.assert_array_equal(compiled.run({"ids": ids})["out0"], table[ids])
    with pytest.raises(InputError, match=r"indices must lie in \[-10, 10\)"):
        compiled.run({"ids": np.array([-11, 0, 0, 0])})
