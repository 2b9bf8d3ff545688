"""converters/reduce.py: Softmax, LogSoftmax, Reduce* and ArgMax/ArgMin along ggml rows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from sdkit_ggml.converters.reduce import REDUCE_OPS

Check = Callable[..., Any]


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize(("axis", "opset"), [(-1, 13), (1, 13), (1, 11)])
def test_softmax(op: str, axis: int, opset: int, like_reference: Check, f32: Check) -> None:
    # opset 11 coerces to 2-D: every axis from ``axis`` on (onnx.reference gets it wrong)
    oracle = "onnxruntime" if opset < 13 else "onnx.reference"
    like_reference(op, [("x", f32(2, 3, 4))], {"axis": axis}, atol=1e-6, opset=opset, oracle=oracle)


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reductions(op: str, keepdims: int, like_reference: Check, rng: np.random.Generator) -> None:
    x = rng.uniform(0.5, 2.0, (2, 3, 4)).astype(np.float32)  # positive: ReduceLogSum's domain
    axes = ("axes", np.array([0, 2], np.int64), "const")
    like_reference(op, [("x", x), axes], {"keepdims": keepdims}, atol=1e-5, opset=18)


def test_reduce_all_axes_and_noop(like_reference: Check, f32: Check) -> None:
    like_reference("ReduceSum", [("x", f32(2, 3))], atol=1e-6, opset=18)
    like_reference("ReduceMean", [("x", f32(2, 3))], {"noop_with_empty_axes": 1}, atol=0.0, opset=18)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_argmax(op: str, like_reference: Check, rng: np.random.Generator) -> None:
    x = rng.permutation(24).reshape(2, 3, 4).astype(np.float32)  # no ties: ggml and ONNX pick alike
    got = like_reference(op, [("x", x)], {"axis": 1, "keepdims": 0}, atol=0.0)
    assert got["out0"].dtype == np.int64


@pytest.mark.parametrize("last", [0, 1])
@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_argmax_ties_pick_the_first_or_last_index(op: str, last: int, like_reference: Check) -> None:
    """ggml_argmax keeps the last maximum; ONNX's default is the first. CLIP's pooling is an
    ArgMax over ids padded with the end token, where ties are the rule."""
    x = np.array([[998, 5, 999, 999, 999], [3, 3, 1, 1, 3]], np.float32)
    like_reference(op, [("x", x)], {"axis": 1, "keepdims": 0, "select_last_index": last}, atol=0.0)


def test_reduction_refusals(refuses: Check, f32: Check) -> None:
    refuses("Softmax", [("x", np.array(1.0, np.float32))], match="Softmax of a scalar", strict=False)
