"""FLUX.1 dev and schnell (flow, packed latents, RoPE ids): txt2img, img2img, hires fix, VAE tiling, any backend.

diffusers' ``FluxPipeline`` (``fixtures/tiny_flow/README.md`` section 3 is the spec):

1. CLIP-L (``text_encoder``) gives the pooled ``pooler_output`` of the 77-token prompt, T5-XXL
   (``text_encoder_2``, ``max_sequence_length`` tokens, default 512, no attention mask) the
   ``encoder_hidden_states``. The negative prompt is not used (no classifier-free guidance).
2. Latents are drawn ``[N, 16, h, w]`` and packed 2x2 into ``[N, (h/2)(w/2), 64]`` tokens
   (``sdkit.pipelines.models.flux_latents``); ``img_ids`` are each token's (0, row, column), ``txt_ids``
   zeros.
3. ``euler_flow`` with diffusers' sigmas ``linspace(1, 1/n, n)`` and, for dev's dynamically shifted
   scheduler, ``mu`` of the token count; the transformer's ``timestep`` is t / 1000.
4. dev (a transformer with ``guidance_embeds``): ``guidance_scale`` is fed as the ``guidance``
   input (distilled guidance: one transformer call per step); schnell has none and ignores it.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from sdkit.errors import ModelFormatError
from sdkit.pipelines.config import PipelineConfig
from sdkit.pipelines.models.flow import TRANSFORMER_INPUTS, FlowPipeline
from sdkit.pipelines.models.flux_latents import image_ids, pack, text_ids, unpack
from sdkit.pipelines.request import GenerationPlan, GenerationRequest
from sdkit.pipelines.stages.components import Component
from sdkit.pipelines.stages.denoise import DenoiserInputs
from sdkit.pipelines.text.text_encoding import encode_prompts

PACKED_INPUTS = DenoiserInputs(
    sample=TRANSFORMER_INPUTS.sample,
    timestep=TRANSFORMER_INPUTS.timestep,
    outputs=TRANSFORMER_INPUTS.outputs,
    timestep_divisor=1000.0,
)


class PackedLatentsPipeline(FlowPipeline):
    """Flux's latent handling, shared with Chroma: 2x2 packing, position ids, t / 1000, sigmas."""

    uses_linear_sigmas: ClassVar[bool] = True
    denoiser_inputs: ClassVar[DenoiserInputs] = PACKED_INPUTS

    def to_denoiser(self, latents: np.ndarray) -> np.ndarray:
        return pack(latents)

    def from_denoiser(self, latents: np.ndarray, plan: GenerationPlan) -> np.ndarray:
        return unpack(latents, plan.latent_shape[-2], plan.latent_shape[-1])

    def position_ids(self, plan: GenerationPlan, text_tokens: int) -> dict[str, np.ndarray]:
        """``img_ids`` and ``txt_ids`` (not batched: one row per token)."""
        return {"img_ids": image_ids(plan.latent_shape[-2], plan.latent_shape[-1]), "txt_ids": text_ids(text_tokens)}


class FluxPipeline(PackedLatentsPipeline):
    """A loaded FLUX.1 dev or schnell pipeline. Create with ``sdkit.load_pipeline``."""

    prepared_components: ClassVar[tuple[str, ...]] = ("text_encoder", "text_encoder_2", "transformer", "vae_decoder")
    component_names: ClassVar[tuple[str, ...]] = (*prepared_components, "vae_encoder")  # the encoder: img2img
    t5_encoder: ClassVar[str] = "text_encoder_2"
    family_name: ClassVar[str] = "FLUX.1"

    def __init__(self, config: PipelineConfig, components: dict[str, Component]) -> None:
        super().__init__(config, components)
        if "text_encoder" not in self.clip_tokenizers:
            raise ModelFormatError(f"{self.name}: Flux needs text_encoder (CLIP) and its tokenizer")

    @property
    def guidance_embeds(self) -> bool:
        """FLUX.1 dev: the transformer takes the guidance scale as an input."""
        return bool(self.config.denoiser_config.get("guidance_embeds", False))

    def loop_guidance(self, request: GenerationRequest) -> float:
        return 1.0  # no classifier-free guidance: dev's guidance is an input, schnell has none

    def conditioning(self, plan: GenerationPlan) -> dict[str, np.ndarray]:
        """``pooled_projections``, ``encoder_hidden_states``, position ids, and dev's ``guidance``."""
        request = plan.request
        [clip], _ = encode_prompts([self.clip_encoder("text_encoder")], [[request.prompt]], "none")
        t5 = self.encode_t5(self.t5_tokens([request.prompt], request), masked=False)
        count = request.num_images
        feeds = {
            "encoder_hidden_states": np.repeat(t5, count, axis=0),
            "pooled_projections": np.repeat(clip.hidden.astype(np.float32), count, axis=0),
            **self.position_ids(plan, t5.shape[1]),
        }
        if self.guidance_embeds:
            feeds["guidance"] = np.full((count,), request.guidance_scale, dtype=np.float32)
        return feeds
