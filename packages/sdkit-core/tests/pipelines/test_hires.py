"""Hires fix arithmetic. Oracles: A1111's formulas (``modules/processing.py``) and torch's
``interpolate`` index/weight rules, both worked by hand on small cases."""

from __future__ import annotations

import numpy as np
import pytest

from sdkit.errors import InputError
from sdkit.pipelines.imaging.hires_plan import hires_plan, latent_upscale, truncate_latents


def test_plan_scale() -> None:
    plan = hires_plan(512, 768, 20, hr_scale=1.5, denoising_strength=0.7)
    assert (plan.width, plan.height, plan.steps, plan.schedule_steps) == (768, 1152, 20, 28)
    assert plan.final_size == (768, 1152)
    plan = hires_plan(512, 512, 30, hr_scale=2.0, hr_second_pass_steps=10, denoising_strength=1.0)
    assert (plan.width, plan.steps, plan.schedule_steps) == (1024, 10, 10)  # min(1.0, 0.999): int(10.01)


def test_plan_resize() -> None:
    assert hires_plan(512, 768, 20, hr_resize_x=1024).final_size == (1024, 1536)
    assert hires_plan(512, 768, 20, hr_resize_y=1024).final_size == (682, 1024)
    # both: cover 1024x1024 keeping 2:3, then cut (1536 - 1024) / 8 = 64 latent rows, centred
    plan = hires_plan(512, 768, 20, hr_resize_x=1024, hr_resize_y=1024)
    assert (plan.width, plan.height, plan.truncate_x, plan.truncate_y) == (1024, 1536, 0, 64)
    assert plan.final_size == (1024, 1024)
    latents = np.arange(192 * 128, dtype=np.float32).reshape(1, 1, 192, 128)
    cut = truncate_latents(latents, plan)
    assert cut.shape == (1, 1, 128, 128) and cut[0, 0, 0, 0] == latents[0, 0, 32, 0]


def test_bilinear_matches_torch_semantics() -> None:
    x = np.array([[[[0.0, 1.0]]]], np.float32)
    # torch: source = (i + 0.5) * 2/4 - 0.5, clamped at 0 -> 0, 0.25, 0.75, 1.25 (clamped to the last)
    assert latent_upscale(x, 1, 4).tolist() == [[[[0.0, 0.25, 0.75, 1.0]]]]
    y = np.arange(9, dtype=np.float32).reshape(1, 1, 3, 3)
    assert np.array_equal(latent_upscale(y, 3, 3), y)  # same size: unchanged
    up = latent_upscale(y, 6, 6)
    assert up[0, 0, 1, 1] == pytest.approx(0.75 * (0.75 * 0 + 0.25 * 1) + 0.25 * (0.75 * 3 + 0.25 * 4))


def test_nearest_modes() -> None:
    x = np.arange(3, dtype=np.float32).reshape(1, 1, 1, 3)
    assert latent_upscale(x, 1, 5, "nearest")[0, 0, 0].tolist() == [0, 0, 1, 1, 2]  # floor(i * 3/5)
    assert latent_upscale(x, 1, 5, "nearest-exact")[0, 0, 0].tolist() == [0, 0, 1, 2, 2]  # floor((i + .5) * 3/5)


def test_errors() -> None:
    with pytest.raises(InputError):
        hires_plan(512, 512, 20, denoising_strength=0.0)
    with pytest.raises(InputError):
        hires_plan(512, 512, 20, hr_scale=0.5)
    with pytest.raises(InputError):
        latent_upscale(np.zeros((1, 4, 8, 8), np.float32), 16, 16, mode="bicubic")
