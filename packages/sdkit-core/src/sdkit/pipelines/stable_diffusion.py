"""Stable Diffusion 1.x/2.x, txt2img and img2img, on any backend.

The stages are diffusers' ``StableDiffusionPipeline`` / ``StableDiffusionImg2ImgPipeline``: CLIP
text embeddings for the prompt and the negative prompt, the shared ``DenoiseLoop`` (classifier-free
guidance ``uncond + scale * (cond - uncond)`` when ``guidance_scale > 1``, a scheduler from
``sdkit.schedulers`` stepping the latents), the VAE decoding ``latents / scaling_factor``. Every
model runs through ``sdkit.compile`` on the backend chosen for its component; random numbers come
from ``sdkit.pipelines.rng`` (documented, backend-independent).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from sdkit.families import MappedCheckpoint
from sdkit.pipelines import vae
from sdkit.pipelines.base import GenerationPlan, Pipeline
from sdkit.pipelines.components import Component
from sdkit.pipelines.config import PipelineConfig
from sdkit.pipelines.denoise import DenoiseLoop, StepHook
from sdkit.pipelines.execution import run_main_input
from sdkit.pipelines.request import GenerationRequest
from sdkit.pipelines.rng import NoiseStream
from sdkit.pipelines.tokenizer import make_tokenizer


class StableDiffusionPipeline(Pipeline):
    """A loaded SD 1.x/2.x pipeline. Create with ``sdkit.load_pipeline``."""

    component_names: ClassVar[tuple[str, ...]] = ("text_encoder", "unet", "vae_decoder", "vae_encoder")
    prepared_components: ClassVar[tuple[str, ...]] = ("text_encoder", "unet", "vae_decoder")

    def __init__(
        self, config: PipelineConfig, components: dict[str, Component], checkpoint: MappedCheckpoint | None = None
    ) -> None:
        super().__init__(config, components, checkpoint)
        self.tokenizer = make_tokenizer(config.tokenizers["text_encoder"])

    def set_config(self, config: PipelineConfig) -> None:
        if config.tokenizers.get("text_encoder") != self.config.tokenizers.get("text_encoder"):
            self.tokenizer = make_tokenizer(config.tokenizers["text_encoder"])
        super().set_config(config)

    # -- stages -----------------------------------------------------------------------------

    def encode_prompts(self, prompts: list[str]) -> np.ndarray:
        """Text embeddings ``[len(prompts), 77, hidden]`` from the text encoder."""
        ids = self.tokenizer(prompts)
        outputs = self.config.text_outputs.get("text_encoder", ("last_hidden_state",))
        hidden = self.components["text_encoder"].use(
            lambda compiled: run_main_input(compiled, "input_ids", ids, outputs, "text_encoder")
        )
        return np.asarray(hidden, dtype=np.float32)

    def conditioning(self, request: GenerationRequest) -> dict[str, np.ndarray]:
        """The UNet's per-request feeds: ``encoder_hidden_states`` as ``[uncond x N, cond x N]``
        under guidance, ``[cond x N]`` without."""
        if request.guidance_scale > 1.0:
            embeddings = self.encode_prompts([request.negative_prompt, request.prompt])
        else:
            embeddings = self.encode_prompts([request.prompt])
        return {"encoder_hidden_states": np.repeat(embeddings, request.num_images, axis=0)}

    def initial_latents(self, plan: GenerationPlan, noise: NoiseStream) -> np.ndarray:
        """txt2img: the first noise draw times ``init_noise_sigma``; img2img: the encoded image
        noised to the first timestep (see ``sdkit.pipelines.rng`` for the draw order)."""
        request, scheduler = plan.request, plan.scheduler
        if plan.image is None:
            start = _initial_noise(noise, plan.latent_shape, request.latents)
            latents: np.ndarray = (start * np.float32(scheduler.init_noise_sigma)).astype(np.float32)
            return latents
        encoded = vae.encode(self.components[self.image_encoder], plan.image, noise, request.num_images, self.config)
        start = _initial_noise(noise, plan.latent_shape, request.latents)
        first = np.asarray(scheduler.timesteps).reshape(-1)[:1]
        return np.asarray(scheduler.add_noise(encoded, start, first), dtype=np.float32)

    def denoise_loop(
        self,
        plan: GenerationPlan,
        noise: NoiseStream,
        conditioning: dict[str, np.ndarray],
        hooks: tuple[StepHook, ...] = (),
    ) -> DenoiseLoop:
        """The shared loop on the UNet, for ``plan``; ``hooks`` are what a subclass adds."""
        request = plan.request
        return DenoiseLoop(
            denoiser=self.components["unet"],
            scheduler=plan.scheduler,
            guidance_scale=float(request.guidance_scale),
            conditioning=conditioning,
            noise=noise.normal,
            hooks=hooks,
            callback=request.callback,
        )

    def decode(self, latents: np.ndarray) -> np.ndarray:
        """Latents -> ``[N, H, W, 3]`` float32 pixels in [0, 1]."""
        return vae.decode(self.components["vae_decoder"], latents, self.config)

    # -- the public call --------------------------------------------------------------------

    def run(self, request: GenerationRequest) -> Any:
        """Generate ``request.num_images`` images (txt2img, or img2img with an init image)."""
        plan = self.plan(self.accept(request))
        noise = NoiseStream(plan.seeds)
        conditioning = self.conditioning(plan.request)  # the text encoder first, as diffusers
        latents = self.initial_latents(plan, noise)
        latents = self.denoise_loop(plan, noise, conditioning).run(latents)
        return self.deliver(plan, self.decode(latents))


def _initial_noise(noise: NoiseStream, shape: tuple[int, ...], latents: np.ndarray | None) -> np.ndarray:
    """The initial-noise draw, or the caller's ``latents`` in its place. The stream advances either
    way, so the per-step noise after it is the same with or without explicit latents."""
    drawn = noise.normal(shape)
    return drawn if latents is None else latents
