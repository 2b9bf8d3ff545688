"""Stable Diffusion 3 / 3.5 (MMDiT, flow matching): txt2img, img2img, hires fix, VAE tiling, on any backend.

diffusers' ``StableDiffusion3Pipeline`` (``fixtures/tiny_flow/README.md`` section 3 is the spec):

1. CLIP-L (``text_encoder``) and OpenCLIP bigG (``text_encoder_2``) read each prompt as 77 tokens;
   each gives its penultimate hidden states and its projected pooled ``text_embeds``. The two
   hidden states are concatenated on features and zero-padded to T5's width; T5
   (``text_encoder_3``, ``max_sequence_length`` tokens, default 256, no attention mask) follows
   them on the token axis: ``encoder_hidden_states`` ``[P, 77 + L, dim]``. Pooled:
   ``pooled_projections`` ``[P, 768 + 1280]``. Without ``text_encoder_3`` T5's part is zeros of
   the transformer's ``joint_attention_dim``, as diffusers.
2. Classifier-free guidance when ``guidance_scale > 1``: one transformer batch ``[negative,
   positive]`` (an empty negative prompt is the encoded empty string).
3. ``euler_flow`` with the config's shift (3.0); the transformer's ``timestep`` is the
   scheduler's (sigma * 1000); latents are decoded as ``latents / scaling + shift``.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from sdkit.errors import ModelFormatError
from sdkit.pipelines.config import PipelineConfig
from sdkit.pipelines.models.flow import FlowPipeline
from sdkit.pipelines.request import GenerationPlan
from sdkit.pipelines.stages.components import Component
from sdkit.pipelines.text.text_encoding import encode_prompts

CLIP_ENCODERS = ("text_encoder", "text_encoder_2")


class StableDiffusion3Pipeline(FlowPipeline):
    """A loaded SD3 / SD3.5 pipeline. Create with ``sdkit.load_pipeline``."""

    prepared_components: ClassVar[tuple[str, ...]] = (*CLIP_ENCODERS, "text_encoder_3", "transformer", "vae_decoder")
    component_names: ClassVar[tuple[str, ...]] = (*prepared_components, "vae_encoder")  # the encoder: img2img
    t5_encoder: ClassVar[str] = "text_encoder_3"
    family_name: ClassVar[str] = "SD3"
    default_max_sequence_length: ClassVar[int] = 256

    def __init__(self, config: PipelineConfig, components: dict[str, Component]) -> None:
        super().__init__(config, components)
        for name in CLIP_ENCODERS:
            if name not in components or name not in self.clip_tokenizers:
                raise ModelFormatError(f"{self.name}: SD3 needs {name} and its tokenizer")
            if len(config.text_outputs.get(name, ())) != 2:
                raise ModelFormatError(
                    f"{self.name}: text_outputs[{name!r}] must name the hidden states and text_embeds"
                )

    def conditioning(self, plan: GenerationPlan) -> dict[str, np.ndarray]:
        """``encoder_hidden_states`` and ``pooled_projections``, batched ``[negative x N,
        positive x N]`` under guidance, ``[positive x N]`` without."""
        request = plan.request
        prompts = [request.negative_prompt, request.prompt] if request.guidance_scale > 1.0 else [request.prompt]
        encoders = [self.clip_encoder(name) for name in CLIP_ENCODERS]
        clip_l, clip_g = encode_prompts(encoders, [prompts, prompts], "none")[0]
        assert clip_l.pooled is not None  # two outputs each (checked in __init__)
        assert clip_g.pooled is not None
        clip = np.concatenate([clip_l.hidden, clip_g.hidden], axis=-1)
        pooled = np.concatenate([clip_l.pooled, clip_g.pooled], axis=-1)
        t5 = self.t5_hidden(prompts, plan)
        if t5.shape[-1] < clip.shape[-1]:
            raise ModelFormatError(
                f"{self.name}: T5's width {t5.shape[-1]} is below the CLIP encoders' {clip.shape[-1]}"
            )
        clip = np.pad(clip, ((0, 0), (0, 0), (0, t5.shape[-1] - clip.shape[-1])))
        hidden = np.concatenate([clip, t5], axis=1).astype(np.float32)
        count = request.num_images
        return {
            "encoder_hidden_states": np.repeat(hidden, count, axis=0),
            "pooled_projections": np.repeat(pooled.astype(np.float32), count, axis=0),
        }

    def t5_hidden(self, prompts: list[str], plan: GenerationPlan) -> np.ndarray:
        """T5's hidden states, or diffusers' zeros when the folder has no ``text_encoder_3``."""
        length = self.sequence_length(plan.request)
        if self.t5_encoder in self.components:
            return self.encode_t5(self.t5_tokens(prompts, plan.request), masked=False)
        width = self.config.denoiser_config.get("joint_attention_dim", 4096)
        return np.zeros((len(prompts), length, int(width)), dtype=np.float32)
