"""converters/integer.py: integer Add/Sub/Mul computed in F32 where a compile-time value range
proves the result exact; otherwise refused."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import sdkit
from sdkit.model import Model
from sdkit.testing import compare_with_reference

Check = Callable[..., Any]


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul"])
def test_index_arithmetic_on_a_bounded_argmax(op: str, rng: np.random.Generator) -> None:
    # CLIP's pooled output: ArgMax(ids) + row offsets, a range known at compile time
    nodes = [
        helper.make_node("ArgMax", ["x"], ["i"], axis=1, keepdims=0),
        helper.make_node(op, ["i", "offsets"], ["y"]),
    ]
    offsets = numpy_helper.from_array(np.array([0, 7, -3], np.int64), "offsets")
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [3])],
        [offsets],
    )
    model = Model.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10))
    feeds = {"x": rng.permutation(15).reshape(3, 5).astype(np.float32)}  # no ties
    got = sdkit.compile(model, backend="ggml").run(feeds)
    assert got["y"].dtype == np.int64
    assert compare_with_reference(got, model, feeds) == {"y": 0.0}


def test_unbounded_integer_inputs_are_refused_by_check(refuses: Check) -> None:
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    refuses("Add", [("a", x), ("b", x)], match="unknown range", by_check=True)


def test_results_that_may_leave_their_dtype_are_refused(refuses: Check) -> None:
    x = np.array([1, 2], np.int16)  # int16 inputs: bounded by their dtype, the product is not
    refuses("Mul", [("a", x), ("b", x)], match="may leave", by_check=True)


def test_integer_division_is_refused(refuses: Check) -> None:
    x = np.array([4, 9], np.int8)
    refuses("Div", [("a", x), ("b", np.array([2, 3], np.int8), "const")], match="float-only", by_check=True)
