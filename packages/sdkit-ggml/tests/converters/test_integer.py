"""converters/integer.py: integer Add/Sub/Mul computed in F32 where a compile-time value range
proves the result exact; otherwise refused."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import sdkit
from sdkit.errors import InputError, UnsupportedModelError
from sdkit.model import Model
from sdkit.testing import compare_with_reference

from .conftest import node_model

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


# -- comparisons, Where, ArgMax and Cast on integers, against onnxruntime ----------------------
# Token ids fed as int64 graph inputs: compared in F32, exact within 2**24 (checked per run).
IDS = np.array([[49406, 320, 1125, 49407, 49407], [49406, 49407, 0, 16777216, 49407]], np.int64)
Like = Callable[..., dict[str, np.ndarray]]


@pytest.mark.parametrize("op", ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"])
def test_integer_comparisons_against_a_constant_and_an_input(op: str, like_reference: Like) -> None:
    eos = np.array(49407, np.int64)
    like_reference(op, [("ids", IDS), ("eos", eos, "const")], atol=0, oracle="onnxruntime")
    other = np.array([[49407, 0, 1125, -3, 49408], [1, 49407, 0, 16777215, -16777216]], np.int64)
    like_reference(op, [("ids", IDS), ("other", other)], atol=0, oracle="onnxruntime")


def test_int32_and_int8_comparisons(like_reference: Like) -> None:
    like_reference("Equal", [("a", IDS.astype(np.int32)), ("b", np.array([49407], np.int32), "const")], atol=0)
    small = np.array([-128, 0, 5, 127], np.int8)
    like_reference("Less", [("a", small), ("b", small[::-1].copy())], atol=0, oracle="onnxruntime")


def test_integer_where(like_reference: Like) -> None:
    cond = np.array([[True, False, True, False, True], [False, False, True, True, False]])
    fill = np.array(-1, np.int64)
    like_reference("Where", [("c", cond), ("ids", IDS), ("fill", fill, "const")], atol=0, oracle="onnxruntime")


def test_argmax_of_integer_ids(like_reference: Like) -> None:
    like_reference("ArgMax", [("ids", IDS)], {"axis": -1, "keepdims": 0}, atol=0, oracle="onnxruntime")


@pytest.mark.parametrize("to", [TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT32])
def test_casts_from_integers(to: int, like_reference: Like) -> None:
    like_reference("Cast", [("ids", IDS)], {"to": to}, atol=0, oracle="onnxruntime")


def test_cast_from_float_truncates_toward_zero(like_reference: Like) -> None:
    x = np.array([-2.7, -0.5, 0.0, 0.49, 1.5, 2.9, 49407.0, -1e6], np.float32)
    for to in (TensorProto.INT32, TensorProto.INT64):
        like_reference("Cast", [("x", x)], {"to": to}, atol=0, oracle="onnxruntime")


def test_clip_pooled_index_pattern(rng: np.random.Generator) -> None:
    # transformers' CLIPTextTransformer with a real eos_token_id: argmax((ids == eos).int())
    nodes = [
        helper.make_node("Cast", ["ids"], ["ids32"], to=TensorProto.INT32),
        helper.make_node("Equal", ["ids32", "eos"], ["is_eos"]),
        helper.make_node("Cast", ["is_eos"], ["as_int"], to=TensorProto.INT32),
        helper.make_node("ArgMax", ["as_int"], ["where"], axis=-1, keepdims=0),
        helper.make_node("Gather", ["table", "ids"], ["embedded"]),
    ]
    graph = helper.make_graph(
        nodes,
        "clip_pool",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 5])],
        [
            helper.make_tensor_value_info("where", TensorProto.INT64, [2]),
            helper.make_tensor_value_info("embedded", TensorProto.FLOAT, [2, 5, 3]),
        ],
        [
            numpy_helper.from_array(np.array(49407, np.int32), "eos"),
            numpy_helper.from_array(rng.standard_normal((49408, 3)).astype(np.float32), "table"),
        ],
    )
    model = Model.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10))
    ids = np.where(IDS > 49407, 7, IDS)
    compiled = sdkit.compile(model, backend="ggml")
    got = compiled.run({"ids": ids})
    ort = pytest.importorskip("onnxruntime")
    want = ort.InferenceSession(model.graph.to_onnx(model.weights).SerializeToString()).run(None, {"ids": ids})
    np.testing.assert_array_equal(got["where"], want[0])
    np.testing.assert_array_equal(got["embedded"], want[1])
    # the ids are range-checked before each run, and negatives are refused, not wrapped
    with pytest.raises(InputError, match="ids"):
        compiled.run({"ids": np.where(ids == 0, -1, ids)})


def test_integer_inputs_beyond_f32s_exact_range_are_refused_per_run() -> None:
    model = node_model("Equal", [("a", IDS), ("b", IDS)])
    compiled = sdkit.compile(model, backend="ggml")
    with pytest.raises(InputError, match="values must lie in"):
        compiled.run({"a": IDS + (1 << 24), "b": IDS})


def test_computed_integers_of_unknown_range_are_refused(refuses: Check) -> None:
    x = np.array([1.5, -2.0], np.float32)
    model_ops = [("x", x)]
    # Cast float -> int gives no interval: comparing it needs one
    nodes = [
        helper.make_node("Cast", ["x"], ["i"], to=TensorProto.INT64),
        helper.make_node("Equal", ["i", "k"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.BOOL, [2])],
        [numpy_helper.from_array(np.array(1, np.int64), "k")],
    )
    model = Model.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10))
    with pytest.raises(UnsupportedModelError, match="unknown range"):
        sdkit.compile(model, backend="ggml").run(dict(model_ops))


def test_constants_beyond_f32s_exact_range_are_refused(refuses: Check) -> None:
    big = np.array((1 << 24) + 1, np.int64)
    refuses("Equal", [("a", IDS), ("b", big, "const")], match=r"2\*\*24", by_check=False)
