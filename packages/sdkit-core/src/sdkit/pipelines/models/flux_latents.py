"""Flux's and Chroma's latent packing and RoPE position ids (diffusers' ``FluxPipeline._pack_latents``,
``_unpack_latents`` and ``_prepare_latent_image_ids``).

The transformer reads 2x2 cells of the 16-channel latent as one token of 64 values:
``[N, C, h, w] -> [N, (h/2) * (w/2), C * 4]``, tokens in row-major order of the half-size grid,
each token's values ordered channel, row-in-cell, column-in-cell. Its rotary position ids are
``(0, row, column)`` per image token and zeros per text token (Flux.1 has no text positions).
"""

from __future__ import annotations

import numpy as np

from sdkit.errors import InputError


def pack(latents: np.ndarray) -> np.ndarray:
    """``[N, C, h, w]`` -> ``[N, (h/2) * (w/2), 4C]`` (h and w even)."""
    n, c, h, w = latents.shape
    if h % 2 or w % 2:
        raise InputError(f"packed latents need an even height and width, got {h} x {w}")
    cells = latents.reshape(n, c, h // 2, 2, w // 2, 2).transpose(0, 2, 4, 1, 3, 5)
    return np.ascontiguousarray(cells.reshape(n, (h // 2) * (w // 2), c * 4))


def unpack(tokens: np.ndarray, height: int, width: int) -> np.ndarray:
    """The inverse of ``pack`` for latents of ``height`` x ``width`` cells."""
    n, count, values = tokens.shape
    if count != (height // 2) * (width // 2) or values % 4:
        raise InputError(f"{count} tokens of {values} values do not pack a {height} x {width} latent")
    cells = tokens.reshape(n, height // 2, width // 2, values // 4, 2, 2).transpose(0, 3, 1, 4, 2, 5)
    return np.ascontiguousarray(cells.reshape(n, values // 4, height, width))


def image_ids(height: int, width: int) -> np.ndarray:
    """``[(h/2) * (w/2), 3]`` float32: ``(0, row, column)`` of each packed token."""
    ids = np.zeros((height // 2, width // 2, 3), dtype=np.float32)
    ids[..., 1] = np.arange(height // 2, dtype=np.float32)[:, None]
    ids[..., 2] = np.arange(width // 2, dtype=np.float32)[None, :]
    return ids.reshape(-1, 3)


def text_ids(tokens: int) -> np.ndarray:
    """``[tokens, 3]`` float32 zeros: Flux's text tokens carry no position."""
    return np.zeros((tokens, 3), dtype=np.float32)
