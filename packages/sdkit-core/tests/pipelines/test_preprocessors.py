"""ControlNet preprocessors. Oracles: the formulas of A1111's ControlNet extension worked on small
images by hand, and OpenCV itself (the library the extension calls) where installed."""

from __future__ import annotations

import builtins
import importlib.util
import re
from typing import Any

import numpy as np
import pytest

from sdkit.errors import InputError, MissingDependencyError
from sdkit.pipelines.imaging import controlnet_preprocessors
from sdkit.pipelines.imaging.controlnet_preprocessors import invert, preprocess, threshold, tile_resample

HAS_CV2 = importlib.util.find_spec("cv2") is not None


def square(size: int = 32) -> np.ndarray:
    img = np.zeros((size, size, 3), np.uint8)
    img[8:24, 8:24] = 200
    return img


def test_invert_and_threshold() -> None:
    img = np.array([[0, 127, 128, 255]], np.uint8)
    assert invert(img).tolist() == [[[255] * 3, [128] * 3, [127] * 3, [0] * 3]]
    assert threshold(img).tolist() == [[[0] * 3, [0] * 3, [255] * 3, [255] * 3]]
    assert threshold(img, level=0)[0, 1, 0] == 255
    rgba = np.zeros((2, 2, 4), np.uint8)
    assert invert(rgba).shape == (2, 2, 3)


def test_tile_resample_is_area_averaging() -> None:
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (24, 36, 3), dtype=np.uint8)
    assert np.array_equal(tile_resample(img, 1.05), img)  # below 1.1: unchanged, as the extension
    out = tile_resample(img, 2.0)
    means = img.reshape(12, 2, 18, 2, 3).astype(np.float64).mean(axis=(1, 3))
    assert out.shape == (12, 18, 3)
    assert np.abs(out.astype(np.float64) - means).max() <= 0.5  # the 2x2 mean, rounded
    if HAS_CV2:
        import cv2

        for factor in (2.0, 3.0, 1.5, 2.5):  # fractional factors: partial pixel coverage
            h, w = int(24 / factor), int(36 / factor)
            ref = cv2.resize(img, (w, h), interpolation=cv2.INTER_AREA)
            assert np.abs(tile_resample(img, factor).astype(int) - ref.astype(int)).max() <= 1


@pytest.mark.skipif(not HAS_CV2, reason=f"OpenCV not installed ({controlnet_preprocessors.INSTALL_HINT})")
def test_canny_draws_the_square() -> None:
    edges = preprocess("canny", square(), low_threshold=100, high_threshold=200)
    assert edges.shape == (32, 32, 3) and set(np.unique(edges)) <= {0, 255}
    assert np.array_equal(edges[..., 0], edges[..., 2])
    ys, xs = np.nonzero(edges[..., 0])
    assert ys.min() >= 6 and ys.max() <= 25 and xs.min() >= 6 and xs.max() <= 25  # on the border
    assert edges[16, 16, 0] == 0 and edges[0, 0, 0] == 0  # not inside, not in the background
    assert not preprocess("canny", np.full((16, 16, 3), 90, np.uint8)).any()  # flat: no edge


@pytest.mark.skipif(not HAS_CV2, reason=f"OpenCV not installed ({controlnet_preprocessors.INSTALL_HINT})")
def test_blur_and_xdog() -> None:
    blurred = preprocess("blur_gaussian", square(), sigma=2.0)
    assert blurred[16, 16, 0] > blurred[8, 8, 0] > blurred[0, 0, 0]
    strokes = preprocess("scribble_xdog", square())
    assert set(np.unique(strokes)) <= {0, 255} and strokes[..., 0].any()


def test_missing_opencv_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_cv2(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "cv2":
            raise ImportError("No module named 'cv2'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_cv2)
    with pytest.raises(MissingDependencyError, match=re.escape(controlnet_preprocessors.INSTALL_HINT)):
        controlnet_preprocessors.canny(square())


def test_bad_input() -> None:
    with pytest.raises(InputError, match="unknown ControlNet preprocessor"):
        preprocess("depth", square())
    with pytest.raises(InputError, match="uint8"):
        invert(np.zeros((4, 4, 3), np.float32))
    with pytest.raises(InputError, match=r"\[H, W"):
        invert(np.zeros((4, 4, 2), np.uint8))
    with pytest.raises(InputError, match="bad parameters"):
        preprocess("invert", square(), strength=2)
    with pytest.raises(InputError):
        threshold(square(), level=300)
    with pytest.raises(InputError):
        tile_resample(square(4), 10.0)
