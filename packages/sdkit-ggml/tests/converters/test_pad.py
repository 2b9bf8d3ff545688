"""converters/pad.py: Pad in constant, edge, reflect and wrap modes, negative pads, axes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

Check = Callable[..., Any]


def i64(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "wrap"])
def test_pad_modes(mode: str, like_reference: Check, f32: Check) -> None:
    pads = ("p", i64(0, 1, 2, 0, 2, 1), "const")
    value = ("v", np.array(1.5, np.float32), "const") if mode == "constant" else None
    like_reference("Pad", [("x", f32(2, 3, 4)), pads, value], {"mode": mode}, atol=0.0, opset=19)


def test_negative_pads_crop(like_reference: Check, f32: Check) -> None:
    # onnx.reference's Pad refuses negative pads: onnxruntime is the oracle
    like_reference("Pad", [("x", f32(4, 5)), ("p", i64(-1, 1, 0, -2), "const")], atol=0.0, oracle="onnxruntime")


def test_pad_with_axes(like_reference: Check, f32: Check) -> None:
    operands = [("x", f32(2, 3, 4)), ("p", i64(1, 2), "const"), None, ("a", i64(-1), "const")]
    like_reference("Pad", operands, atol=0.0, opset=19)


def test_pad_before_opset_11_takes_attributes(like_reference: Check, f32: Check) -> None:
    like_reference("Pad", [("x", f32(2, 3))], {"pads": [1, 0, 0, 2], "value": 0.5}, atol=0.0, opset=2)


def test_pad_refusals(refuses: Check, f32: Check) -> None:
    refuses("Pad", [("x", f32(2, 3)), ("p", i64(0, 3, 0, 0), "const")], {"mode": "reflect"}, match="reflect by 3")
    refuses("Pad", [("x", f32(2, 3)), ("p", i64(1, 1), "const")], match="2 pads for a rank-2 input", strict=False)
