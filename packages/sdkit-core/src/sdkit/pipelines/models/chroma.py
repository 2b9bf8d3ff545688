"""Chroma (Flux-derived, T5 only, real CFG): txt2img, img2img, hires fix, VAE tiling, on any backend.

diffusers' ``ChromaPipeline`` (``fixtures/tiny_flow/README.md`` section 3 is the spec): Flux's
packed latents, position ids, sigmas, ``mu`` and t / 1000, with

1. one text encoder, T5 (``text_encoder``, ``max_sequence_length`` tokens, default 512), run with
   the tokenizer's attention mask;
2. the transformer's ``attention_mask``: the text mask extended by one token (the first padding
   token is attended, ``arange(L) <= real tokens``), then ones for every image token, float32;
3. classifier-free guidance when ``guidance_scale > 1``: ``[negative, positive]`` (an empty
   negative prompt is the encoded empty string), ``neg + scale * (pos - neg)``. diffusers makes two
   transformer calls; sdkit's batch of 2 is the same computation (and runs as two calls on a
   transformer exported with batch 1).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from sdkit.pipelines.models.flux import PackedLatentsPipeline
from sdkit.pipelines.request import GenerationPlan


def transformer_mask(tokenizer_mask: np.ndarray, image_tokens: int) -> np.ndarray:
    """``[P, L + image_tokens]`` float32: text tokens up to and including the first padding one,
    then every image token."""
    length = tokenizer_mask.shape[1]
    real = tokenizer_mask.sum(axis=1, keepdims=True)
    text = (np.arange(length)[None, :] <= real).astype(np.float32)
    return np.concatenate([text, np.ones((text.shape[0], image_tokens), dtype=np.float32)], axis=1)


class ChromaPipeline(PackedLatentsPipeline):
    """A loaded Chroma pipeline. Create with ``sdkit.load_pipeline``."""

    prepared_components: ClassVar[tuple[str, ...]] = ("text_encoder", "transformer", "vae_decoder")
    component_names: ClassVar[tuple[str, ...]] = (*prepared_components, "vae_encoder")  # the encoder: img2img
    t5_encoder: ClassVar[str] = "text_encoder"
    family_name: ClassVar[str] = "Chroma"

    def conditioning(self, plan: GenerationPlan) -> dict[str, np.ndarray]:
        """``encoder_hidden_states`` and ``attention_mask`` batched ``[negative x N, positive x N]``
        under guidance, ``[positive x N]`` without; the position ids."""
        request = plan.request
        prompts = [request.negative_prompt, request.prompt] if request.guidance_scale > 1.0 else [request.prompt]
        tokens = self.t5_tokens(prompts, request)
        hidden = self.encode_t5(tokens, masked=True)
        mask = transformer_mask(tokens.attention_mask, self.image_tokens(plan.latent_shape))
        count = request.num_images
        return {
            "encoder_hidden_states": np.repeat(hidden, count, axis=0),
            "attention_mask": np.repeat(mask, count, axis=0),
            **self.position_ids(plan, hidden.shape[1]),
        }
