"""ControlNet units as requests hold them: the three spellings, A1111's API keys, checks that name
the bad value, and the preprocessor run when the unit is made."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from sdkit.errors import InputError
from sdkit.pipelines import GenerationRequest
from sdkit.pipelines.control_units import ControlUnit, control_units

IMAGE = (np.arange(32 * 48 * 3) % 251).astype(np.uint8).reshape(32, 48, 3)


def test_tuple_dict_and_dataclass_are_the_same_unit() -> None:
    units = control_units(
        [
            (IMAGE, "canny", 0.5, 0.1, 0.9, "invert"),
            {"image": IMAGE, "model": "canny", "scale": 0.5, "start": 0.1, "end": 0.9, "preprocessor": "invert"},
            {
                "input_image": IMAGE,
                "model": "canny",
                "weight": 0.5,
                "guidance_start": 0.1,
                "guidance_end": 0.9,
                "module": "invert",
            },
            ControlUnit(IMAGE, "canny", 0.5, 0.1, 0.9, "invert"),
        ]
    )
    for unit in units:
        assert (unit.model, unit.scale, unit.start, unit.end, unit.preprocessor) == ("canny", 0.5, 0.1, 0.9, "invert")
        np.testing.assert_array_equal(unit.hint, 255 - IMAGE)  # invert ran once, when the unit was made
        assert isinstance(unit.image, Image.Image)
        assert unit.size == (48, 32)


def test_defaults_and_paths(tmp_path: Path) -> None:
    path = tmp_path / "hint.png"
    Image.fromarray(IMAGE).save(path)
    [unit] = control_units([(str(path),)])
    assert (unit.model, unit.scale, unit.start, unit.end, unit.preprocessor) == (None, 1.0, 0.0, 1.0, None)
    np.testing.assert_array_equal(unit.hint, IMAGE)
    [single] = control_units({"image": path, "model": "depth", "preprocessor": "none"})  # one unit, not a list
    assert single.preprocessor is None


def test_canny_preprocessor_with_parameters() -> None:
    cv2 = pytest.importorskip("cv2")
    [unit] = control_units(
        [{"image": IMAGE, "model": "c", "module": "canny", "preprocessor_params": {"low_threshold": 20}}]
    )
    edges = cv2.Canny(IMAGE, 20, 200)  # the oracle: OpenCV itself
    np.testing.assert_array_equal(unit.hint, np.repeat(edges[..., None], 3, axis=2))


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ((IMAGE, "a", 1.0, 0.6, 0.4), "start < end"),
        ((IMAGE, "a", 1.0, -0.1), "start < end"),
        ((IMAGE, "a", -1.0), "scale must be >= 0"),
        ((IMAGE, "a", "x"), "scale must be a number"),
        ((IMAGE, "a", float("nan")), "finite"),
        ((IMAGE, "a", True), "must be a number"),
        ((IMAGE, 3), "model must be a ControlNet's name"),
        ((IMAGE, "a", 1, 0, 1, "cany"), "unknown ControlNet preprocessor 'cany'"),
        ((IMAGE, "a", 1, 0, 1, "threshold", "x"), "a tuple"),
        (("/no/such.png", "a"), "ControlNet image not found"),
        ((np.zeros((4, 4), np.float32), "a"), "ControlNet image array must be uint8"),
        ({"image": IMAGE, "strength": 1}, "unknown ControlNet unit key 'strength'"),
        ({"image": IMAGE, "preprocessor_params": {"level": 3}}, "without a preprocessor"),
        ({"image": IMAGE, "module": "threshold", "preprocessor_params": {"bogus": 3}}, "bad parameters"),
        (42, "a ControlNet unit is"),
    ],
)
def test_bad_units_are_named(value: Any, match: str) -> None:
    with pytest.raises(InputError, match=match):
        control_units([value])


def test_the_request_field() -> None:
    request = GenerationRequest.create("x", control=[(IMAGE, "a", 0.7)])
    [unit] = request.control
    assert unit.scale == 0.7
    again = request.replace(steps=3)  # replace() checks again without re-running preprocessors
    assert again.control[0] is unit
    with pytest.raises(InputError, match="wrap a single tuple unit in a list"):
        GenerationRequest.create("x", control=(IMAGE, "a"))
    with pytest.raises(InputError, match="control must be a list"):
        GenerationRequest.create("x", control="edges.png")
