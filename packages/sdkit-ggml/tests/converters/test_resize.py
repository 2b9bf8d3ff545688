"""converters/resize.py: Resize and Upsample, nearest and bilinear, on ggml_interpolate; a
mapping ggml cannot reproduce exactly is refused."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

Check = Callable[..., Any]


def scales(*values: float) -> tuple[str, np.ndarray, str]:
    return ("scales", np.array(values, np.float32), "const")


@pytest.mark.parametrize(
    "attributes",
    [
        {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
        {"mode": "linear"},
        {"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"},
        {"mode": "linear", "coordinate_transformation_mode": "align_corners"},
    ],
)
def test_upsample_by_two(attributes: dict[str, Any], like_reference: Check, f32: Check) -> None:
    # bilinear weights are computed in float32 in both: within a few ulps
    like_reference("Resize", [("x", f32(1, 2, 3, 4)), None, scales(1, 1, 2, 2)], attributes, atol=1e-6, opset=19)


def test_resize_to_sizes(like_reference: Check, f32: Check) -> None:
    sizes = ("sizes", np.array([1, 2, 6, 8], np.int64), "const")
    like_reference("Resize", [("x", f32(1, 2, 3, 4)), None, None, sizes], {"mode": "linear"}, atol=1e-6, opset=19)


def test_legacy_upsample_repeats_pixels(like_reference: Check, f32: Check) -> None:
    # Upsample's nearest is floor(i / scale): ggml's nearest exactly, for any integer scale
    like_reference("Upsample", [("x", f32(1, 1, 2, 3)), scales(1, 1, 2, 3)], atol=0.0, opset=9)


def test_static_refusals(refuses: Check, f32: Check) -> None:
    x = ("x", f32(1, 1, 2, 2))
    refuses("Resize", [x, None, scales(1, 1, 2, 2)], {"mode": "cubic"}, match="cubic", opset=19)
    refuses("Resize", [x, None, scales(1, 1, 2, 2)], {"mode": "linear", "antialias": 1}, match="antialias", opset=19)
    # Upsample maps coordinates asymmetrically, which ggml's bilinear does not
    refuses("Upsample", [x, scales(1, 1, 2, 2)], {"mode": "linear"}, match="asymmetric", opset=9)


def test_shape_dependent_refusals(refuses: Check, f32: Check) -> None:
    x = ("x", f32(1, 1, 4, 4))
    # half_pixel nearest downsampling picks other pixels than ggml's floor(i * in / out)
    refuses("Resize", [x, None, scales(1, 1, 0.75, 0.75)], {"mode": "nearest"}, match="picks other pixels", opset=19)
    refuses("Resize", [x, None, scales(1, 1, 0.5, 0.5)], {"mode": "linear"}, match="downsampling", opset=19)
