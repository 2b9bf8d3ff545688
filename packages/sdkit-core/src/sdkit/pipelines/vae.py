"""The VAE stages every latent-diffusion pipeline shares: image -> latents (img2img, inpainting)
and latents -> pixels. Tiled encode/decode for large images belongs here too."""

from __future__ import annotations

import numpy as np

from sdkit.errors import ModelFormatError
from sdkit.pipelines.components import Component
from sdkit.pipelines.config import PipelineConfig
from sdkit.pipelines.execution import run_main_input
from sdkit.pipelines.images import decoded_to_float
from sdkit.pipelines.rng import NoiseStream

ENCODER_OUTPUTS = ("latent_parameters", "latent_sample")
DECODER_OUTPUTS = ("sample",)


def encode(encoder: Component, image: np.ndarray, noise: NoiseStream, count: int, config: PipelineConfig) -> np.ndarray:
    """``[1, 3, H, W]`` pixels in [-1, 1] -> scaled latents for each of ``count`` images. A
    posterior (mean, logvar) is sampled with the first draw of each image's noise stream."""
    out = encoder.use(lambda compiled: run_main_input(compiled, "sample", image, ENCODER_OUTPUTS, encoder.name))
    out = np.repeat(np.asarray(out, dtype=np.float32), count, axis=0)
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


def decode(decoder: Component, latents: np.ndarray, config: PipelineConfig) -> np.ndarray:
    """Scaled latents -> ``[N, H, W, 3]`` float32 pixels in [0, 1] (``latents / scaling_factor +
    shift_factor`` into the decoder, as diffusers)."""
    unscaled = (latents / config.vae_scaling_factor).astype(np.float32)
    if config.vae_shift_factor:
        unscaled = (unscaled + np.float32(config.vae_shift_factor)).astype(np.float32)
    decoded = decoder.use(
        lambda compiled: run_main_input(compiled, "latent_sample", unscaled, DECODER_OUTPUTS, decoder.name)
    )
    return decoded_to_float(np.asarray(decoded, dtype=np.float32))
