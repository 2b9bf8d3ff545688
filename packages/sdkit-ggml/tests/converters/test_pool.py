"""converters/pool.py: MaxPool and AveragePool (1-D, 2-D; padding, ceil_mode,
count_include_pad) and the global pools."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

Check = Callable[..., Any]


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize(
    "attributes",
    [
        {"kernel_shape": [2, 2]},
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
        {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1},
        {"kernel_shape": [2, 2], "auto_pad": "SAME_UPPER"},
    ],
)
def test_pool2d(op: str, attributes: dict[str, Any], like_reference: Check, f32: Check) -> None:
    like_reference(op, [("x", f32(1, 2, 7, 6))], attributes, atol=1e-6)


def test_average_pool_counting_the_padding(like_reference: Check, f32: Check) -> None:
    attributes = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}
    like_reference("AveragePool", [("x", f32(1, 2, 7, 6))], attributes, atol=1e-6)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_pool1d(op: str, like_reference: Check, f32: Check) -> None:
    like_reference(op, [("x", f32(2, 3, 9))], {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}, atol=1e-6)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pools(op: str, like_reference: Check, f32: Check) -> None:
    like_reference(op, [("x", f32(2, 3, 4, 5))], atol=1e-6)


def test_pool_refusals(refuses: Check, f32: Check) -> None:
    x = f32(1, 1, 6, 6)
    refuses("MaxPool", [("x", x)], {"kernel_shape": [2, 2], "dilations": [2, 2]}, match="dilated pooling")
    refuses("MaxPool", [("x", f32(1, 1, 4, 4, 4))], {"kernel_shape": [2, 2, 2]}, match="only 1-D and 2-D")
    refuses("MaxPool", [("x", x)], {"kernel_shape": [2, 2]}, match="Indices output", outputs=2)
    refuses("AveragePool", [("x", x)], {"kernel_shape": [7, 7]}, match="larger than the input")
