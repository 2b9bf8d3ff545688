"""Seam measures for tiled VAE decodes (``sdkit.pipelines.stages.tiling``): where the blend zones begin
and end, and how large the steps between neighbouring pixel rows and columns are there, against
the same steps in the untiled image and elsewhere in the tiled one.

A seam is a line along which the image jumps: a whole row (or column) whose mean |step| to its
neighbour stands out. On a smooth gradient every line's step is small and about the same, so a
tile border that adds an edge shows at once as a ratio above 1. Shared by the TAEF2 gradient
test (``tests/pipelines/test_vae_tiling.py``) and ``benchmarks/vae_tiling.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sdkit.pipelines.stages.tiling import tile_starts


def gradient_image(height: int, width: int) -> np.ndarray:
    """A smooth test image, ``[1, 3, H, W]`` float32 in [0, 1]: red along x, green along y, blue
    a slow diagonal wave (no edges anywhere, so any edge in a decode is the decoder's)."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    y, x = y / max(height - 1, 1), x / max(width - 1, 1)
    blue = 0.5 + 0.3 * np.sin(np.pi * (x + y))
    return np.stack([0.1 + 0.8 * x, 0.1 + 0.8 * y, blue]).astype(np.float32)[None]


def blend_edges(size: int, tile: int, overlap: int, factor: int = 8) -> list[int]:
    """Pixel indices along one axis where a blend zone starts or ends (tiles of ``tile`` pixels
    overlapping by ``overlap``, laid out on the latent grid as ``tiled_decode`` does); with
    ``overlap=0``, the tile borders."""
    latent, lt = size // factor, tile // factor
    starts = tile_starts(latent, lt, overlap // factor)
    edges = {factor * s for s in starts[1:]} | {factor * (s + lt) for s in starts[:-1]}
    return sorted(e for e in edges if 0 < e < size)


def line_steps(image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean |step| between each pixel row and the one above it (index ``i``: rows ``i - 1``, ``i``;
    index 0 is 0) and likewise between columns. ``image``: ``[H, W, C]``."""
    rows = np.abs(np.diff(image, axis=0)).mean(axis=(1, 2))
    cols = np.abs(np.diff(image, axis=1)).mean(axis=(0, 2))
    return np.concatenate([[0.0], rows]), np.concatenate([[0.0], cols])


@dataclass(frozen=True)
class SeamReport:
    """``max_diff``/``mean_diff``: |tiled - untiled|; ``seam_ratio``: mean line step at the blend
    edges, tiled over untiled (1.0: the borders add nothing); ``edge_over_interior``: in the tiled
    image, the largest line step at a blend edge over the largest at any other line (below 1: no
    tile border stands out from the image's own steps)."""

    max_diff: float
    mean_diff: float
    seam_ratio: float
    edge_over_interior: float


def _interior(steps: np.ndarray, edges: list[int], margin: int) -> np.ndarray:
    """The line steps away from the blend edges and from the image's own border (where a VAE's
    zero padding makes edges of its own, tiled or not)."""
    keep = np.zeros(steps.shape, dtype=bool)
    keep[margin : len(steps) - margin + 1] = True
    keep[edges] = False
    return steps[keep]


def seam_report(
    tiled: np.ndarray, whole: np.ndarray, row_edges: list[int], col_edges: list[int], margin: int = 8
) -> SeamReport:
    """Compare a tiled decode with the untiled one (both ``[H, W, C]``) at the given edges; lines
    within ``margin`` pixels of the image border are left out of the interior."""
    if not row_edges and not col_edges:
        raise ValueError("no blend edges: the image fits in one tile")
    (t_rows, t_cols), (w_rows, w_cols) = line_steps(tiled), line_steps(whole)
    at_edges = np.concatenate([t_rows[row_edges], t_cols[col_edges]])
    untiled = np.concatenate([w_rows[row_edges], w_cols[col_edges]])
    interior = np.concatenate([_interior(t_rows, row_edges, margin), _interior(t_cols, col_edges, margin)])
    diff = np.abs(tiled.astype(np.float64) - whole)
    return SeamReport(
        max_diff=float(diff.max()),
        mean_diff=float(diff.mean()),
        seam_ratio=float(at_edges.mean() / untiled.mean()),
        edge_over_interior=float(at_edges.max() / interior.max()),
    )
