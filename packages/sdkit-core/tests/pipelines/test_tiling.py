"""Tiled decode/encode blending. Oracle: the untiled call of the same function (exact equality
where every tile computes what the whole does) and analytic properties of the blend."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from sdkit.errors import InputError
from sdkit.pipelines.stages.tiling import axis_weights, tile_starts, tiled_decode, tiled_encode, tiled_map


def nearest_up8(latent: np.ndarray) -> np.ndarray:
    """An elementwise 'decoder': a pointwise map, 4 -> 3 channels, nearest x8 upsampling."""
    rgb = np.stack([np.tanh(latent[:, 0] + latent[:, 1]), latent[:, 2] * 0.5, np.sin(latent[:, 3])], axis=1)
    return rgb.repeat(8, axis=2).repeat(8, axis=3).astype(np.float32)


def mean_pool8(image: np.ndarray) -> np.ndarray:
    """An elementwise 'encoder': 8x8 means, 3 -> 8 channels (like latent_parameters)."""
    n, c, h, w = image.shape
    pooled = image.reshape(n, c, h // 8, 8, w // 8, 8).mean(axis=(3, 5))
    return np.concatenate([pooled, pooled[:, :1] * 2, pooled**2, pooled[:, :2]], axis=1).astype(np.float32)


@pytest.mark.parametrize("ramp", ["linear", "cosine"])
@pytest.mark.parametrize(("shape", "tile", "overlap"), [((1, 4, 128, 128), 64, 16), ((2, 4, 40, 72), 24, 8)])
def test_tiled_decode_equals_untiled(shape: tuple[int, ...], tile: int, overlap: int, ramp: str) -> None:
    latent = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    whole = nearest_up8(latent)
    tiled = tiled_decode(latent, nearest_up8, tile=tile, overlap=overlap, ramp=ramp)
    assert tiled.dtype == np.float32 and tiled.shape == whole.shape
    assert np.array_equal(tiled, whole)


def test_tiled_encode_equals_untiled() -> None:
    image = np.random.default_rng(1).uniform(-1, 1, (1, 3, 200, 328)).astype(np.float32)
    assert np.array_equal(tiled_encode(image, mean_pool8, tile=96, overlap=32), mean_pool8(image))


def test_gradient_has_no_seam() -> None:
    """A linear ramp image decoded by a position-independent map keeps constant first differences
    across every tile border (a seam would show as a step)."""
    y, x = np.mgrid[0:128, 0:128].astype(np.float32)
    latent = np.stack([x / 127, y / 127, (x + y) / 254, np.zeros_like(x)])[None]

    def decode(tile: np.ndarray) -> np.ndarray:
        return np.repeat(np.repeat(2.0 * tile[:, :3] - 1.0, 8, axis=2), 8, axis=3)

    out = tiled_decode(latent, decode, tile=48, overlap=16)
    dx = np.diff(out[0, 0, 0, ::8])  # one sample per latent pixel along x
    assert np.allclose(dx, dx[0], atol=1e-6)
    assert np.array_equal(out, decode(latent).astype(np.float32))


def test_blend_weights_sum_to_one() -> None:
    from fractions import Fraction

    for kind in ("linear", "cosine"):
        starts = tile_starts(100, 32, 8)
        weights = axis_weights(starts, 32, 100, Fraction(8), kind)
        total = np.zeros(800)
        for start, w in zip(starts, weights, strict=True):
            total[start * 8 : start * 8 + len(w)] += w
        assert np.allclose(total, 1.0, atol=1e-12)


def test_blend_hides_tile_differences() -> None:
    """Tiles that disagree (a per-tile offset, like a per-tile GroupNorm) blend smoothly: neighbouring
    output pixels never jump by more than the offset spread divided by the ramp length."""
    calls: list[int] = []

    def decode(tile: np.ndarray) -> np.ndarray:
        calls.append(1)
        return np.repeat(np.repeat(tile[:, :3] * 0 + 0.1 * len(calls), 8, axis=2), 8, axis=3)

    out = tiled_decode(np.zeros((1, 4, 64, 64), np.float32), decode, tile=32, overlap=16)
    assert np.abs(np.diff(out, axis=3)).max() < 0.1 * 3 / (16 * 8) * 2


def test_tile_starts() -> None:
    assert tile_starts(64, 64, 16) == [0]
    assert tile_starts(30, 64, 16) == [0]
    assert tile_starts(128, 64, 16) == [0, 32, 64]
    starts = tile_starts(1000, 512, 64, align=8)
    assert starts[0] == 0 and starts[-1] == 488 and all(s % 8 == 0 for s in starts)
    assert all(b - a <= 512 - 64 for a, b in itertools.pairwise(starts))


def test_errors() -> None:
    latent = np.zeros((1, 4, 16, 16), np.float32)
    with pytest.raises(InputError):
        tiled_decode(latent, nearest_up8, tile=8, overlap=8)
    with pytest.raises(InputError):
        tiled_decode(latent, nearest_up8, ramp="square")
    with pytest.raises(InputError):
        tiled_decode(latent[0], nearest_up8)
    with pytest.raises(InputError):
        tiled_encode(np.zeros((1, 3, 64, 64), np.float32), mean_pool8, tile=60, overlap=8)
    with pytest.raises(InputError, match="whole pixels"):  # 3/8 of 20 rows
        tiled_map(np.zeros((1, 4, 20, 20), np.float32), lambda t: t[:, :, :3, :3], tile=8, overlap=2)
    calls: list[int] = []

    def changing(tile: np.ndarray) -> np.ndarray:  # returns another channel count on its second call
        calls.append(1)
        return np.zeros((1, 3 + len(calls), 8, 8), np.float32)

    with pytest.raises(InputError, match="returned"):
        tiled_map(np.zeros((1, 4, 20, 20), np.float32), changing, 8, 2)
