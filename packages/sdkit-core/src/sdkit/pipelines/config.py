"""``PipelineConfig``: what a pipeline needs to know about its model besides the graphs.

One value object, whatever the model came from: today a diffusers/optimum ONNX folder's
``config.json`` files and ``scheduler_config.json`` (``sdkit.pipelines.loaders.diffusers_folder``);
tomorrow a registered model family's defaults for a user's single-file checkpoint (with the
prediction type from an A1111 ``.yaml`` or an option). The pipeline reads nothing else: the
checks that depend on the model (size multiple, latent shape) are made against it, once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sdkit.errors import ModelFormatError
from sdkit.families.clip_tokenizer import TokenizerSource

PREDICTION_TYPES = ("epsilon", "v_prediction", "flow")


@dataclass(frozen=True)
class PipelineConfig:
    """A pipeline's model configuration.

    name: the model's name (written as ``Model:`` in the PNG parameters).
    prediction_type: what the denoiser predicts: ``epsilon``, ``v_prediction`` (SD 2.x-768) or
        ``flow`` (a flow-matching velocity: SD3, Flux, Chroma).
    latent_channels: channels of the VAE latent (4 for SD 1.x/2.x/XL, 16 for SD3/Flux).
    vae_scaling_factor: latents are ``vae_output * scaling_factor`` (0.18215 for SD 1.x/2.x).
    vae_shift_factor: SD3's and Flux's VAEs also shift: latents are
        ``(vae_output - shift_factor) * scaling_factor`` (0 for SD 1.x/2.x/XL).
    patch_size: the denoiser's patch: a transformer cuts latents into ``patch x patch`` tokens
        (SD3 2; Flux packs 2x2 cells itself), so sizes are multiples of ``vae_scale_factor * patch``.
    vae_scale_factor: pixels per latent cell, ``2 ** (VAE blocks - 1)`` (8 for every SD VAE).
    sample_size: the denoiser's native latent size; the default image size is
        ``sample_size * vae_scale_factor`` (512 for SD 1.x, 768 for SD 2.x-768, 1024 for SDXL).
    inpainting: the denoiser is an inpainting model: its sample input is the latents, the mask
        and the masked image's latents (``2 * latent_channels + 1`` channels: 9 for SD and SDXL
        inpainting UNets); it runs only with an init image and a mask.
    scheduler_config: the diffusers ``scheduler_config.json`` dict the samplers take over with
        ``from_config`` semantics (None: Stable Diffusion 1.x's).
    tokenizers: text-encoder component -> tokenizer folder (``vocab.json`` + ``merges.txt`` or
        ``tokenizer.json``), or ``ShippedVocab`` (the CLIP vocabulary sdkit ships, with the
        family's padding token) for single-file checkpoints; SDXL adds ``text_encoder_2``.
    text_outputs: text-encoder component -> the outputs the pipeline reads (the others are pruned
        before compiling): first the hidden states the denoiser attends to (``last_hidden_state``
        for SD 1.x/2.x; SDXL's penultimate layer, ``hidden_states.{layers - 1}``), then, for
        SDXL's ``text_encoder_2``, the pooled projection (``text_embeds``).
    force_zeros_for_empty_prompt: SDXL: an empty negative prompt is all-zero embeddings (hidden
        states and pooled), not the encoded empty string (``model_index.json``; SDXL base: true).
    requires_aesthetics_score: SDXL refiner: the UNet's ``time_ids`` are original size, crop and
        an aesthetic score (5 values) instead of original size, crop and target size (6).
    fixed_size: ``(width, height)``, the size a denoiser graph exported with a fixed latent or
        token shape accepts, and so the default size instead of ``default_size`` (the tiny test
        folders; ``sdkit.pipelines.loaders.diffusers_folder``). None: the graph takes any size.
    fixed_text_tokens: a flow denoiser graph's fixed T5 token count (its ``txt_ids`` rows), the
        default ``max_sequence_length`` instead of the family's. None: any.
    denoiser_config: the denoiser's ``config.json`` where a pipeline reads more of it (flow
        transformers: ``joint_attention_dim`` for SD3 without T5, ``guidance_embeds`` for Flux dev).
    fp32_components: components compiled in fp32 whatever a pipeline-wide ``precision`` says,
        unless a per-component ``precision`` names them: SDXL's VAE overflows in fp16 (diffusers'
        ``force_upcast``), so an SDXL pipeline keeps ``vae_decoder`` and ``vae_encoder`` here.
    """

    name: str
    prediction_type: str = "epsilon"
    latent_channels: int = 4
    vae_scaling_factor: float = 0.18215
    vae_shift_factor: float = 0.0
    patch_size: int = 1
    vae_scale_factor: int = 8
    sample_size: int = 64
    inpainting: bool = False
    scheduler_config: Mapping[str, Any] | None = None
    tokenizers: Mapping[str, TokenizerSource] = field(default_factory=dict)
    text_outputs: Mapping[str, tuple[str, ...]] = field(
        default_factory=lambda: {"text_encoder": ("last_hidden_state",)}
    )
    force_zeros_for_empty_prompt: bool = False
    requires_aesthetics_score: bool = False
    fp32_components: tuple[str, ...] = ()
    denoiser_config: Mapping[str, Any] = field(default_factory=dict)
    fixed_size: tuple[int, int] | None = None
    fixed_text_tokens: int | None = None

    def __post_init__(self) -> None:
        problems = []
        if self.prediction_type not in PREDICTION_TYPES:
            problems.append(f"prediction_type {self.prediction_type!r} (supported: {', '.join(PREDICTION_TYPES)})")
        for what in ("latent_channels", "vae_scale_factor", "sample_size", "patch_size"):
            value = getattr(self, what)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                problems.append(f"{what} {value!r} (a positive integer)")
        scaling = self.vae_scaling_factor
        if isinstance(scaling, bool) or not isinstance(scaling, (int, float)) or not scaling > 0:
            problems.append(f"vae_scaling_factor {scaling!r} (a positive number)")
        if problems:
            raise ModelFormatError(f"{self.name}: invalid pipeline configuration: {'; '.join(problems)}")

    @property
    def default_size(self) -> int:
        """Width and height when a request gives none: the denoiser's native image size."""
        return self.sample_size * self.vae_scale_factor

    @property
    def size_multiple(self) -> int:
        """Width and height must be multiples of this: the VAE's factor times the denoiser's
        patch, and at least 8."""
        return max(8, self.vae_scale_factor * self.patch_size)

    def latent_shape(self, count: int, width: int, height: int) -> tuple[int, int, int, int]:
        """The latents of ``count`` images of ``width`` x ``height`` pixels."""
        factor = self.vae_scale_factor
        return (count, self.latent_channels, height // factor, width // factor)
