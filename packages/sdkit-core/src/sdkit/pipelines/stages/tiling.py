"""Tiled VAE decode and encode: run a component on overlapping tiles and blend them seam-free.

A VAE decoder's activations at 1024 px and above take more memory than the rest of the pipeline
together. Decoding the latent in overlapping tiles bounds that memory by the tile size:

1. Tile starts along each axis (``tile_starts``): one tile when the axis fits, else
   ``n = ceil((size - overlap) / (tile - overlap))`` tiles whose starts are spread evenly from 0 to
   ``size - tile`` (rounded down to a multiple of ``align``), so neighbours overlap by at least
   ``overlap`` and the last tile ends on the edge.
2. Each tile goes through ``fn`` (``decode_tile(latent_tile) -> pixels``, or an encoder), which
   may scale the spatial size by a fixed ratio (8 for an SD VAE decoder, 1/8 for its encoder).
3. Blend weights, separable per axis, in output pixels: 1 inside a tile, a ramp across each
   overlap it shares with a neighbour (``linear``: ``t``; ``cosine``: ``(1 - cos(pi t)) / 2``,
   ``t = (p + 0.5) / overlap``) rising on its leading side and falling (``1 - ramp``) on its
   trailing side, so two neighbours' weights sum to exactly 1 across their overlap.
4. Output = ``sum(w_i * tile_i) / sum(w_i)``, accumulated in float64 and cast back to float32.

Where every tile computes the same values as the whole (an elementwise or nearest-upsampling
"decoder"), the result equals the untiled one exactly (the float64 weighted mean of equal values
rounds back to them); the tests check that, and that a gradient shows no seam. A real VAE decoder
differs near tile borders: convolutions see less context and GroupNorm normalises each tile with
its own statistics, which is why the overlap ramps blend rather than cut.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

import numpy as np
from numpy.typing import NDArray

from sdkit.errors import InputError
from sdkit.pipelines.stages.phases import report

RAMPS = ("linear", "cosine")
F32 = NDArray[np.float32]


def tile_starts(size: int, tile: int, overlap: int, align: int = 1) -> list[int]:
    """Start offsets of tiles of ``tile`` covering ``size`` with at least ``overlap`` shared."""
    if tile < 1 or overlap < 0 or overlap >= tile or align < 1:
        raise InputError(f"tiles need 0 <= overlap < tile and align >= 1, got tile={tile}, overlap={overlap}")
    if tile % align or overlap % align:
        raise InputError(f"tile ({tile}) and overlap ({overlap}) must be multiples of {align}")
    if size <= tile:
        return [0]
    count = math.ceil((size - overlap) / (tile - overlap))
    last = size - tile
    starts = [(last * i // (count - 1)) // align * align for i in range(count)]
    starts[-1] = last  # the last tile ends on the edge, even where that breaks the alignment
    return starts


def _ramp(length: int, kind: str) -> NDArray[np.float64]:
    t = (np.arange(length, dtype=np.float64) + 0.5) / length
    return t if kind == "linear" else 0.5 - 0.5 * np.cos(np.pi * t)


def axis_weights(starts: list[int], tile: int, size: int, scale: Fraction, kind: str) -> list[NDArray[np.float64]]:
    """Per-tile blend weights along one axis, in output units."""
    weights = []
    for i, start in enumerate(starts):
        length = min(tile, size - start)
        w = np.ones(int(length * scale), dtype=np.float64)
        if i > 0:  # shared with the previous tile: ramp up
            shared = int((starts[i - 1] + min(tile, size - starts[i - 1]) - start) * scale)
            w[:shared] = _ramp(shared, kind)
        if i + 1 < len(starts):  # shared with the next tile: ramp down
            shared = int((start + length - starts[i + 1]) * scale)
            w[len(w) - shared :] = 1.0 - _ramp(shared, kind)
        weights.append(w)
    return weights


def _scale(in_size: int, out_size: int, what: str) -> Fraction:
    if out_size <= 0:
        raise InputError(f"the tile function returned an empty {what}")
    return Fraction(out_size, in_size)


def tiled_map(
    array: F32,
    fn: Callable[[F32], F32],
    tile: int,
    overlap: int,
    *,
    ramp: str = "linear",
    align: int = 1,
    component: str = "vae",
) -> F32:
    """``fn`` over overlapping spatial tiles of ``array`` ([N, C, H, W]), blended (module docstring).
    ``tile`` and ``overlap`` are in input units; ``fn`` must scale height and width by one fixed ratio;
    ``component`` names the model in the progress reports."""
    if ramp not in RAMPS:
        raise InputError(f"unknown blend ramp {ramp!r}; use one of {', '.join(RAMPS)}")
    x = np.asarray(array, dtype=np.float32)
    if x.ndim != 4:
        raise InputError(f"tiled input must be [N, C, H, W], got shape {list(x.shape)}")
    height, width = x.shape[2:]
    ys, xs = tile_starts(height, tile, overlap, align), tile_starts(width, tile, overlap, align)
    out: NDArray[np.float64] | None = None
    total: NDArray[np.float64] | None = None
    done = 0
    for y in ys:
        for x0 in xs:
            part = np.asarray(fn(x[:, :, y : y + tile, x0 : x0 + tile]), dtype=np.float64)
            done += 1
            report("tile", component, index=done, total=len(ys) * len(xs))
            th, tw = min(tile, height - y), min(tile, width - x0)
            if out is None:
                sy, sx = _scale(th, part.shape[2], "height"), _scale(tw, part.shape[3], "width")
                if height * sy != int(height * sy) or width * sx != int(width * sx):
                    raise InputError(f"the tile function's scale {sy}x{sx} does not give whole pixels")
                wy_all = axis_weights(ys, tile, height, sy, ramp)
                wx_all = axis_weights(xs, tile, width, sx, ramp)
                out = np.zeros((part.shape[0], part.shape[1], int(height * sy), int(width * sx)))
                total = np.zeros((1, 1, *out.shape[2:]))
            assert total is not None
            oy, ox = int(y * sy), int(x0 * sx)
            if part.shape[2:] != (int(th * sy), int(tw * sx)) or part.shape[:2] != out.shape[:2]:
                raise InputError(f"the tile function returned {list(part.shape)} for a {th}x{tw} tile")
            w = np.outer(wy_all[ys.index(y)], wx_all[xs.index(x0)])[None, None]
            out[:, :, oy : oy + part.shape[2], ox : ox + part.shape[3]] += part * w
            total[:, :, oy : oy + part.shape[2], ox : ox + part.shape[3]] += w
    assert out is not None
    assert total is not None
    return np.asarray(out / total, dtype=np.float32)


def tiled_decode(
    latents: F32, decode_tile: Callable[[F32], F32], tile: int = 64, overlap: int = 16, ramp: str = "linear"
) -> F32:
    """A VAE decode in tiles of ``tile`` latent pixels overlapping by ``overlap`` (64/16 latents =
    512/128 image pixels for an SD VAE)."""
    return tiled_map(latents, decode_tile, tile, overlap, ramp=ramp)


def tiled_encode(
    image: F32,
    encode_tile: Callable[[F32], F32],
    tile: int = 512,
    overlap: int = 64,
    ramp: str = "linear",
    factor: int = 8,
) -> F32:
    """A VAE encode (``encode_tile`` returns the posterior's parameters or latents) in tiles of
    ``tile`` image pixels overlapping by ``overlap``, both multiples of the VAE's ``factor``."""
    return tiled_map(image, encode_tile, tile, overlap, ramp=ramp, align=factor)
