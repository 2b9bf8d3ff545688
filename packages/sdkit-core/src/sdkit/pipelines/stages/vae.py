"""The VAE stages every latent-diffusion pipeline shares: image -> latents (img2img, inpainting)
and latents -> pixels, whole or in tiles.

Tiling (``tile``: the tile's side in image pixels, ``None``: whole) runs the component on
overlapping tiles and blends them (``sdkit.pipelines.stages.tiling``): the overlap is a quarter of the
tile (diffusers' ``tile_overlap_factor``), rounded down to the VAE's factor. The memory a VAE
decoder needs grows with the pixels it makes at once, so tiles bound it by the tile size; every
tile has the same shape, so a backend compiles one shape. Under ``memory="offload"`` the
component is compiled once for all the tiles (``Component.use`` around the whole loop).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from sdkit.errors import InputError, ModelFormatError
from sdkit.pipelines.config import PipelineConfig
from sdkit.pipelines.imaging.images import decoded_to_float
from sdkit.pipelines.stages.components import Component
from sdkit.pipelines.stages.execution import check_finite, run_main_input
from sdkit.pipelines.stages.rng import NoiseStream
from sdkit.pipelines.stages.tiling import tiled_decode, tiled_encode

if TYPE_CHECKING:
    from sdkit.backend import CompiledModel

ENCODER_OUTPUTS = ("latent_parameters", "latent_sample")
DECODER_OUTPUTS = ("sample",)
WEIGHTS_HINT = "its weights may hold NaN or inf, or values that overflow"
OVERLAP_FRACTION = 4  # overlap = tile / 4, as diffusers' AutoencoderKL tiling


def tile_overlap(tile: int, factor: int) -> int:
    """The overlap in image pixels for tiles of ``tile`` pixels: a quarter, a multiple of ``factor``."""
    if tile % factor or tile < 2 * factor:
        raise InputError(f"the VAE tile size must be a multiple of {factor} and at least {2 * factor}, got {tile}")
    return max(tile // OVERLAP_FRACTION // factor, 1) * factor


def encode(
    encoder: Component,
    image: np.ndarray,
    noise: NoiseStream,
    count: int,
    config: PipelineConfig,
    tile: int | None = None,
) -> np.ndarray:
    """``[1, 3, H, W]`` pixels in [-1, 1] -> scaled latents for each of ``count`` images. A
    posterior (mean, logvar) is sampled with the first draw of each image's noise stream; with
    ``tile`` the posterior's parameters are blended from tiles."""
    factor = config.vae_scale_factor

    def run(compiled: CompiledModel) -> np.ndarray:
        def one(pixels: np.ndarray) -> np.ndarray:
            out = run_main_input(compiled, "sample", pixels, ENCODER_OUTPUTS, encoder.name)
            return np.asarray(out, dtype=np.float32)

        if tile is None:
            return one(image)
        return tiled_encode(image, one, tile, tile_overlap(tile, factor), factor=factor)

    out = np.repeat(encoder.use(run), count, axis=0)
    check_finite(out, f"the {encoder.name}'s output", WEIGHTS_HINT)
    channels = config.latent_channels
    if out.shape[1] == 2 * channels:  # posterior parameters: sample with our own noise
        mean, logvar = out[:, :channels], np.clip(out[:, channels:], -30.0, 20.0)
        out = mean + np.exp(0.5 * logvar) * noise.normal(mean.shape)
    elif out.shape[1] != channels:
        raise ModelFormatError(
            f"the {encoder.name} returns {out.shape[1]} channels; expected {channels} or {2 * channels}"
        )
    shifted = out - np.float32(config.vae_shift_factor) if config.vae_shift_factor else out
    scaled: np.ndarray = (shifted * np.float32(config.vae_scaling_factor)).astype(np.float32)
    return scaled


def decode(decoder: Component, latents: np.ndarray, config: PipelineConfig, tile: int | None = None) -> np.ndarray:
    """Scaled latents -> ``[N, H, W, 3]`` float32 pixels in [0, 1]; with ``tile``, in tiles of
    ``tile`` pixels (``tile / factor`` latents) blended seam-free. ``latents / scaling_factor +
    shift_factor`` go into the decoder, as diffusers."""
    unscaled = (latents / config.vae_scaling_factor).astype(np.float32)
    if config.vae_shift_factor:
        unscaled = (unscaled + np.float32(config.vae_shift_factor)).astype(np.float32)
    factor = config.vae_scale_factor

    def run(compiled: CompiledModel) -> np.ndarray:
        def one(part: np.ndarray) -> np.ndarray:
            out = run_main_input(compiled, "latent_sample", part, DECODER_OUTPUTS, decoder.name)
            return np.asarray(out, dtype=np.float32)

        if tile is None:
            return one(unscaled)
        return tiled_decode(unscaled, one, tile // factor, tile_overlap(tile, factor) // factor)

    check_finite(unscaled, f"the {decoder.name}'s input (the final latents, unscaled)")
    decoded = decoder.use(run)
    check_finite(decoded, f"the {decoder.name}'s output", WEIGHTS_HINT)
    return decoded_to_float(decoded)
