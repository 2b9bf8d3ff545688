"""converters/shape.py: Reshape, Flatten, (Un)Squeeze, Transpose, Expand, Tile, ConstantOfShape
and Range. Layout only: results are exact."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import sdkit
from sdkit.model import Model

Check = Callable[..., Any]


def i64(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


@pytest.mark.parametrize("target", [(4, 6), (-1, 3), (0, 2, 3, 2), (24,)])
def test_reshape(target: tuple[int, ...], like_reference: Check, f32: Check) -> None:
    like_reference("Reshape", [("x", f32(2, 3, 4)), ("shape", i64(*target), "const")], atol=0.0)


def test_reshape_with_the_target_as_an_input_specialises_on_its_value(like_reference: Check, f32: Check) -> None:
    like_reference("Reshape", [("x", f32(2, 3, 4)), ("shape", i64(6, 4))], atol=0.0)


def test_reshape_refusals(refuses: Check, f32: Check) -> None:
    # invalid models (ONNX inference rejects them): still one clear error
    refuses("Reshape", [("x", f32(2, 3)), ("shape", i64(-1, -1), "const")], match="more than one -1", strict=False)
    refuses("Reshape", [("x", f32(2, 3)), ("shape", i64(4, 2), "const")], match="has 6 elements", strict=False)


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_flatten(axis: int, like_reference: Check, f32: Check) -> None:
    like_reference("Flatten", [("x", f32(2, 3, 4))], {"axis": axis}, atol=0.0)


def test_squeeze_and_unsqueeze(like_reference: Check, f32: Check) -> None:
    like_reference("Squeeze", [("x", f32(1, 3, 1, 4)), ("axes", i64(0, -2), "const")], atol=0.0)
    like_reference("Squeeze", [("x", f32(1, 3, 1, 4))], atol=0.0)
    like_reference("Unsqueeze", [("x", f32(3, 4)), ("axes", i64(0, 3), "const")], atol=0.0)
    like_reference("Unsqueeze", [("x", f32(3, 4))], {"axes": [1]}, atol=0.0, opset=11)


def test_squeeze_of_a_dim_other_than_1_is_refused(refuses: Check, f32: Check) -> None:
    refuses("Squeeze", [("x", f32(2, 3)), ("axes", i64(0), "const")], match="not all are 1", strict=False)


@pytest.mark.parametrize("perm", [None, [0, 2, 1], [2, 0, 1, 3], [1, 0, 3, 2]])
def test_transpose(perm: list[int] | None, like_reference: Check, f32: Check) -> None:
    x = f32(2, 3, 4) if perm is None or len(perm) == 3 else f32(2, 3, 4, 5)
    like_reference("Transpose", [("x", x)], {"perm": perm} if perm else {}, atol=0.0)


@pytest.mark.parametrize(
    ("shape", "perm"),
    [
        ((2, 3, 2, 3, 2), [4, 3, 2, 1, 0]),  # no two axes stay neighbours: four 4-d permutes
        ((2, 2, 3, 2, 2, 5), [0, 5, 1, 3, 2, 4]),  # SD3's unpatchify einsum "nhwpqc->nchpwq"
        ((1, 4, 3, 1, 2, 2, 3), [6, 2, 0, 5, 1, 4, 3]),  # rank 7 with size-1 axes
    ],
)
def test_transpose_above_rank_4_goes_in_rank_4_steps(
    shape: tuple[int, ...], perm: list[int], like_reference: Check, f32: Check
) -> None:
    like_reference("Transpose", [("x", f32(*shape))], {"perm": perm}, atol=0.0)


def test_expand_and_tile(like_reference: Check, f32: Check) -> None:
    like_reference("Expand", [("x", f32(3, 1)), ("shape", i64(2, 3, 4), "const")], atol=0.0)
    like_reference("Tile", [("x", f32(2, 3)), ("repeats", i64(2, 1), "const")], atol=0.0)


def test_tile_refusal(refuses: Check, f32: Check) -> None:
    refuses("Tile", [("x", f32(2, 3)), ("repeats", i64(0, 1), "const")], match="each must be >= 1")


def test_shape_producers_specialise_on_input_values(like_reference: Check) -> None:
    like_reference("ConstantOfShape", [("shape", i64(2, 3))], atol=0.0)
    scalars = [np.array(v, np.float32) for v in (1.0, 4.0, 0.5)]
    like_reference("Range", [("start", scalars[0]), ("limit", scalars[1]), ("delta", scalars[2])], atol=0.0)


@pytest.mark.parametrize(
    ("shape", "perm"),
    [
        ((2, 3, 4, 5, 6), (0, 2, 1, 3, 4)),  # a channel shuffle's transpose: H and W stay together
        ((1, 2, 3, 4, 5), (0, 3, 4, 2, 1)),  # a size-1 axis dropped, two axes merged
        ((2, 3, 1, 4, 5), (4, 0, 2, 1, 3)),
    ],
)
def test_rank5_transpose_folds_to_rank4(
    shape: tuple[int, ...], perm: tuple[int, ...], like_reference: Check, f32: Check
) -> None:
    like_reference("Transpose", [("x", f32(*shape))], {"perm": perm}, atol=0.0, oracle="onnxruntime")


def test_channel_shuffle_against_onnxruntime(f32: Check) -> None:
    """ShuffleNet's channel shuffle: Reshape to [N, g, C/g, H, W], swap g and C/g, Reshape back."""
    ort = pytest.importorskip("onnxruntime")
    x = f32(2, 12, 5, 7)
    nodes = [
        helper.make_node("Reshape", ["x", "split"], ["grouped"]),
        helper.make_node("Transpose", ["grouped"], ["shuffled"], perm=[0, 2, 1, 3, 4]),
        helper.make_node("Reshape", ["shuffled", "merge"], ["y"]),
    ]
    inits = [numpy_helper.from_array(i64(2, 3, 4, 5, 7), "split"), numpy_helper.from_array(i64(2, 12, 5, 7), "merge")]
    graph = helper.make_graph(
        nodes,
        "shuffle",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, x.shape)],
        initializer=inits,
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    want = ort.InferenceSession(proto.SerializeToString()).run(None, {"x": x})[0]
    got = sdkit.compile(Model.from_proto(proto), backend="ggml").run({"x": x})["y"]
    np.testing.assert_array_equal(got, want)
