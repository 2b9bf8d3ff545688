"""Inpainting mask helpers. Oracles: diffusers' recorded mask latents (``fixtures/tiny_xl``), OpenCV
(``cv2.GaussianBlur``, which A1111's mask blur calls) where installed, and A1111's documented
crop-region examples worked by hand."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from sdkit.errors import InputError
from sdkit.pipelines.imaging.masks import binarize_mask, blur_mask, crop_region, expand_crop_region, latent_mask
from sdkit.testing.goldens import GoldenSet

TINY_XL = Path(__file__).resolve().parents[4] / "fixtures" / "tiny_xl"


def test_binarize_threshold() -> None:
    mask = np.array([[0, 127, 128, 255]], np.uint8)
    assert binarize_mask(mask).tolist() == [[0.0, 0.0, 1.0, 1.0]]


@pytest.mark.skipif(not (TINY_XL / "golden.npz").is_file(), reason="fixtures/tiny_xl missing")
def test_latent_mask_matches_diffusers() -> None:
    goldens = GoldenSet(TINY_XL)
    for case in goldens.meta["cases"]:
        key = f"{case['key']}/mask_latents"
        if goldens.meta["array_refs"].get(key, key) not in goldens.npz():
            continue
        ours = latent_mask(binarize_mask(goldens.array("mask_image")), case["height"] // 2, case["width"] // 2)
        assert np.array_equal(ours, goldens.array(key)[0, 0]), case["key"]


def test_latent_mask_picks_top_left_of_each_block() -> None:
    mask = np.arange(64, dtype=np.float32).reshape(8, 8)
    assert latent_mask(mask, 2, 2).tolist() == [[0.0, 4.0], [32.0, 36.0]]


@pytest.mark.skipif(importlib.util.find_spec("cv2") is None, reason="OpenCV not installed")
@pytest.mark.parametrize("blur", [0.5, 1.0, 4.0, 7.5, 12.0])
def test_blur_matches_opencv(blur: float) -> None:
    import cv2

    rng = np.random.default_rng(3)
    mask = (rng.uniform(0, 1, (40, 56)) > 0.7).astype(np.uint8) * 255
    mask[:20] = rng.integers(0, 256, (20, 56), dtype=np.uint8)  # grey levels too
    size = 2 * int(2.5 * blur + 0.5) + 1
    expected = cv2.GaussianBlur(mask, (size, 1), blur)
    expected = cv2.GaussianBlur(expected, (1, size), blur)
    assert np.array_equal(blur_mask(mask, blur), expected)  # bit for bit


def test_blur_keeps_flat_masks_and_blurs_edges() -> None:
    flat = np.full((9, 9), 255, np.uint8)
    assert np.array_equal(blur_mask(flat, 4), flat)
    edge = np.zeros((9, 30), np.uint8)
    edge[:, 15:] = 255
    row = blur_mask(edge, 3, 0)[4]
    assert row[0] == 0 and row[-1] == 255 and np.all(np.diff(row.astype(int)) >= 0) and 0 < row[15] < 255
    assert np.array_equal(blur_mask(edge, 0), edge)


def test_crop_region() -> None:
    mask = np.zeros((512, 512), np.uint8)
    mask[50:82, 100:228] = 255
    assert crop_region(mask) == (100, 50, 228, 82)
    assert crop_region(mask, padding=60) == (40, 0, 288, 142)
    assert crop_region(np.zeros((4, 4), np.uint8)) is None
    # A1111's docstring example: a 128x32 region processed at 512x512 becomes 128x128
    assert expand_crop_region((100, 50, 228, 82), 512, 512, 512, 512) == (100, 2, 228, 130)
    # near the bottom edge the expanded region is shifted back inside the image
    assert expand_crop_region((100, 480, 228, 512), 512, 512, 512, 512) == (100, 384, 228, 512)
    # a tall region widens; at the left edge it shifts right
    assert expand_crop_region((0, 0, 10, 100), 512, 512, 512, 512) == (0, 0, 100, 100)
    with pytest.raises(InputError):
        expand_crop_region((5, 5, 5, 9), 512, 512, 512, 512)
