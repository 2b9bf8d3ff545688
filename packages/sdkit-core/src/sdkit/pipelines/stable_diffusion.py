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

from sdkit.errors import ModelFormatError
from sdkit.pipelines import vae
from sdkit.pipelines.base import GenerationPlan, Pipeline
from sdkit.pipelines.components import Component
from sdkit.pipelines.config import PipelineConfig
from sdkit.pipelines.denoise import DenoiseLoop, StepHook
from sdkit.pipelines.request import GenerationRequest
from sdkit.pipelines.rng import NoiseStream
from sdkit.pipelines.text_encoding import TextEncoder, encode_prompts, uses_emphasis
from sdkit.pipelines.tokenizer import ClipTokenizer


class StableDiffusionPipeline(Pipeline):
    """A loaded SD 1.x/2.x pipeline. Create with ``sdkit.load_pipeline``."""

    component_names: ClassVar[tuple[str, ...]] = ("text_encoder", "unet", "vae_decoder", "vae_encoder")
    prepared_components: ClassVar[tuple[str, ...]] = ("text_encoder", "unet", "vae_decoder")
    diffusers_pipeline: ClassVar[str] = "StableDiffusionPipeline"

    def __init__(self, config: PipelineConfig, components: dict[str, Component]) -> None:
        super().__init__(config, components)
        missing = [name for name in config.tokenizers if name not in components]
        if missing:
            raise ModelFormatError(f"{self.name}: a tokenizer is configured for {missing[0]}, which is missing")
        self.tokenizers = {name: ClipTokenizer(folder) for name, folder in config.tokenizers.items()}

    @property
    def tokenizer(self) -> ClipTokenizer:
        """The first text encoder's tokenizer."""
        return self.tokenizers["text_encoder"]

    def text_encoder(self, name: str) -> TextEncoder:
        """The text-encoder component ``name`` with its tokenizer and the outputs read."""
        outputs = tuple(self.config.text_outputs.get(name, ("last_hidden_state",)))
        return TextEncoder(self.components[name], self.tokenizers[name], outputs)

    # -- stages -----------------------------------------------------------------------------

    def encode_prompts(self, prompts: list[str], weighting: str = "none") -> np.ndarray:
        """Text embeddings ``[len(prompts), 77 * chunks, hidden]`` from the text encoder."""
        [embeddings], _ = encode_prompts([self.text_encoder("text_encoder")], [prompts], weighting)
        return embeddings.hidden

    def conditioning(self, plan: GenerationPlan) -> dict[str, np.ndarray]:
        """The UNet's per-request feeds: ``encoder_hidden_states`` as ``[uncond x N, cond x N]``
        under guidance, ``[cond x N]`` without."""
        request = plan.request
        prompts = [request.negative_prompt, request.prompt] if request.guidance_scale > 1.0 else [request.prompt]
        encoder = self.text_encoder("text_encoder")
        [embeddings], padded = encode_prompts([encoder], [prompts], request.prompt_weighting)
        note_prompt_weighting(plan, padded, *prompts)
        return {"encoder_hidden_states": np.repeat(embeddings.hidden, request.num_images, axis=0)}

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
        conditioning = self.conditioning(plan)  # the text encoder first, as diffusers
        latents = self.initial_latents(plan, noise)
        latents = self.denoise_loop(plan, noise, conditioning).run(latents)
        return self.deliver(plan, self.decode(latents))


def _initial_noise(noise: NoiseStream, shape: tuple[int, ...], latents: np.ndarray | None) -> np.ndarray:
    """The initial-noise draw, or the caller's ``latents`` in its place. The stream advances either
    way, so the per-step noise after it is the same with or without explicit latents."""
    drawn = noise.normal(shape)
    return drawn if latents is None else latents


def note_prompt_weighting(plan: GenerationPlan, padded: bool, *prompts: str) -> None:
    """The PNG labels A1111 writes for how the prompts were read: ``Emphasis: None`` when
    brackets were left as text, ``Pad conds: True`` when chunk counts were padded."""
    if plan.request.prompt_weighting == "none" and uses_emphasis(*prompts):
        plan.parameters["Emphasis"] = "None"
    if padded:
        plan.parameters["Pad conds"] = "True"
