"""converters/cast.py: Cast and CastLike between the dtypes ggml stores."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto

Check = Callable[..., Any]


@pytest.mark.parametrize(
    ("source", "to"),
    [
        (np.float32, TensorProto.FLOAT16),  # rounded through F16
        (np.float32, TensorProto.BOOL),
        (np.bool_, TensorProto.FLOAT),
        (np.bool_, TensorProto.INT32),
        (np.int32, TensorProto.FLOAT),
        (np.int64, TensorProto.INT32),
        (np.int8, TensorProto.INT64),  # widening: always fits
    ],
)
def test_cast(source: type, to: int, like_reference: Check, rng: np.random.Generator) -> None:
    x = (rng.standard_normal((3, 4)) * 4).astype(source)
    like_reference("Cast", [("x", x)], {"to": to}, atol=0.0)


def test_castlike_of_a_constant_folds(like_reference: Check, f32: Check) -> None:
    constant = ("c", np.arange(6, dtype=np.int32).reshape(2, 3), "const")
    like_reference("CastLike", [constant, ("like", f32(2, 3))], atol=0.0, opset=15)


def test_castlike_of_a_tensor(like_reference: Check, f32: Check) -> None:
    like_reference("CastLike", [("x", f32(2, 3)), ("like", np.zeros((1,), np.float16), "const")], atol=0.0, opset=15)


def test_cast_to_a_dtype_ggml_lacks_is_refused_by_check(refuses: Check, f32: Check) -> None:
    refuses("Cast", [("x", f32(2))], {"to": TensorProto.DOUBLE}, match="ggml has no such tensors")


def test_narrowing_float_to_int_cast_is_refused(refuses: Check, f32: Check) -> None:
    # float -> int truncates (converters/test_integer.py); into int8 it would have to wrap
    refuses("Cast", [("x", f32(2))], {"to": TensorProto.INT8}, match="not proven to fit")


def test_narrowing_int_cast_is_refused(refuses: Check) -> None:
    x = np.array([300, -1], np.int32)
    refuses("Cast", [("x", x)], {"to": TensorProto.UINT8}, match="not proven to fit")
