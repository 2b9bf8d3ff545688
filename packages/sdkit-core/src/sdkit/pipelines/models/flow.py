"""What the flow-matching pipelines (SD3/3.5, Flux.1, Chroma) share, on any backend.

Unlike the UNet pipelines they denoise with a transformer that predicts a velocity, integrated by
``euler_flow`` (diffusers' FlowMatchEulerDiscreteScheduler; ``sdkit.schedulers.flow_match``):

- the scheduler is the request's sampler's flow variant ("Euler" -> ``euler_flow``), its
  timesteps set with the shift ``mu`` of the image's token count when the model shifts by
  resolution (``use_dynamic_shifting``) and, for Flux and Chroma, diffusers' unshifted sigmas
  ``linspace(1, 1/steps, steps)`` (schedules normal, karras, exponential; the others are
  ComfyUI's tables and take none);
- the initial latents are the first noise draw itself (no ``init_noise_sigma``);
- T5 reads each prompt as ``max_sequence_length`` tokens (``sdkit.pipelines.text.t5_tokenizer``);
- the VAE shifts as well as scales (``PipelineConfig.vae_shift_factor``).

They fill ``Pipeline.run``'s template: plan, conditioning (the family's text encoders), initial
latents, the shared ``DenoiseLoop`` on the transformer, decode, deliver. A family sets its
components, T5 encoder, default T5 length and how it packs latents (``to_denoiser`` /
``from_denoiser``). They declare img2img and VAE tiling (``features``; tiles as the SD
pipelines', ``sdkit.pipelines.stages.vae``): a mask, ControlNet units, the hires fix, A1111 prompt
weighting and LoRAs are refused by the plan with an ``UnsupportedFeatureError`` naming the
feature and the family.

img2img (``init_image``, ``strength``) is diffusers' ``StableDiffusion3Img2ImgPipeline``,
``FluxImg2ImgPipeline`` and ``ChromaImg2ImgPipeline``: the full schedule is set (same sigmas and
``mu`` as txt2img), then its first ``int(steps - steps * strength)`` steps are dropped; the image
is encoded by ``vae_encoder`` (its posterior sampled with the first draw, then ``(z - shift) *
scaling``) and noised to the first kept sigma with the second draw, ``sigma * noise + (1 - sigma)
* z`` (``scale_noise``), before Flux/Chroma pack it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from sdkit.errors import ModelFormatError
from sdkit.pipelines.config import PipelineConfig
from sdkit.pipelines.features.feature import Feature
from sdkit.pipelines.features.hires_fix import HiresStage, counting, hires_stage, second_pass_request
from sdkit.pipelines.features.hires_fix import parameters as hires_parameters
from sdkit.pipelines.models.base import Pipeline, vae_tile
from sdkit.pipelines.models.flow_request import FlowRequest
from sdkit.pipelines.request import GenerationPlan, GenerationRequest
from sdkit.pipelines.stages import vae
from sdkit.pipelines.stages.components import Component
from sdkit.pipelines.stages.denoise import DenoiseLoop, DenoiserInputs, StepCallback
from sdkit.pipelines.stages.execution import input_info, output_named
from sdkit.pipelines.stages.rng import NoiseStream
from sdkit.pipelines.text.clip_tokenizer import make_tokenizer
from sdkit.pipelines.text.t5_tokenizer import T5Tokenizer, T5Tokens
from sdkit.pipelines.text.text_encoding import TextEncoder
from sdkit.schedulers import Scheduler, scheduler_class
from sdkit.schedulers.flow_match import FlowMatchEuler, linear_sigmas

# optimum's names for a diffusers transformer export (SD3Transformer2DModel, FluxTransformer2DModel).
TRANSFORMER_INPUTS = DenoiserInputs(sample="hidden_states", timestep="timestep", outputs=("out_hidden_states",))
LINEAR_SIGMA_SCHEDULES = ("normal", "karras", "exponential")


@dataclass
class FlowPlan(GenerationPlan):
    """A flow model's plan, with the hires fix's second pass when the request asks for one."""

    hires: HiresStage | None = None


class FlowPipeline(Pipeline):
    """Base of the SD3, Flux and Chroma pipelines. Create one with ``sdkit.load_pipeline``."""

    request_class: ClassVar[type[GenerationRequest]] = FlowRequest
    image_encoder: ClassVar[str] = "vae_encoder"
    t5_encoder: ClassVar[str] = "text_encoder"  # the component that is T5
    default_max_sequence_length: ClassVar[int] = 512
    uses_linear_sigmas: ClassVar[bool] = False  # Flux and Chroma pass linspace(1, 1/n, n)
    denoiser_inputs: ClassVar[DenoiserInputs] = TRANSFORMER_INPUTS
    features: ClassVar[frozenset[Feature]] = frozenset({Feature.IMG2IMG, Feature.VAE_TILING, Feature.HIRES})

    def __init__(self, config: PipelineConfig, components: dict[str, Component]) -> None:
        super().__init__(config, components)
        if config.prediction_type != "flow":
            raise ModelFormatError(f"{self.name}: a {type(self).__name__} needs prediction_type 'flow'")
        missing = [name for name in config.tokenizers if name not in components]
        if missing:
            raise ModelFormatError(f"{self.name}: a tokenizer is configured for {missing[0]}, which is missing")
        t5_folder = config.tokenizers.get(self.t5_encoder)
        if t5_folder is not None and not isinstance(t5_folder, (str, Path)):
            raise ModelFormatError(f"{self.name}: the T5 tokenizer must be a folder, not {t5_folder!r}")
        self.t5 = T5Tokenizer(t5_folder)
        self.clip_tokenizers = {
            name: make_tokenizer(source) for name, source in config.tokenizers.items() if name != self.t5_encoder
        }

    # -- planning ---------------------------------------------------------------------------

    def plan(self, request: GenerationRequest) -> FlowPlan:
        """``Pipeline.plan``, and the hires fix's second pass when the request asks for one."""
        plan = FlowPlan(**vars(super().plan(request)))
        if request.enable_hr:
            plan.hires = self.plan_hires(plan)
        return plan

    def plan_hires(self, plan: FlowPlan) -> HiresStage:
        """The hires fix's second pass (``sdkit.pipelines.features.hires_fix``), planned like any request at
        the larger size; its schedule is the family's (shift ``mu`` of the larger size's tokens,
        Flux's and Chroma's sigmas) over ``schedule_steps``, of which it runs the tail."""
        request = plan.request
        factor = self.config.vae_scale_factor
        sized = request.replace(width=plan.width, height=plan.height)
        second_request, numbers = second_pass_request(sized, factor)
        stage = hires_stage(self.plan(second_request), numbers, request.hr_upscaler, factor, self.start_schedule)
        if stage.kind == "image" and self.image_encoder not in self.components:
            raise self._no_image_encoder(f"the hires fix's {request.hr_upscaler} upscaler (a Latent one does not)")
        plan.parameters.update(hires_parameters(request))
        return stage

    def make_scheduler(self, request: GenerationRequest) -> Scheduler:
        """The request's sampler's flow variant ("Euler" -> ``euler_flow``), from the model's config."""
        cls = scheduler_class(request.sampler, prediction_type="flow")
        scheduler: Scheduler = cls(
            schedule=request.schedule,
            config=self.config.scheduler_config,
            prediction_type="flow",
            **request.sampler_options,
        )
        return scheduler

    def image_tokens(self, latent_shape: tuple[int, ...]) -> int:
        """The transformer's image sequence length (patches of ``patch_size`` latent cells)."""
        patch = self.config.patch_size
        return (latent_shape[-2] // patch) * (latent_shape[-1] // patch)

    def start_schedule(self, scheduler: Scheduler, steps: int, strength: float, latent_shape: tuple[int, ...]) -> None:
        if not isinstance(scheduler, FlowMatchEuler):
            scheduler.set_timesteps(steps, strength=strength)
            return
        mu = scheduler.mu_for(self.image_tokens(latent_shape)) if scheduler.uses_dynamic_shifting else None
        linear = self.uses_linear_sigmas and scheduler.schedule in LINEAR_SIGMA_SCHEDULES
        scheduler.set_timesteps(steps, strength, sigmas=linear_sigmas(steps) if linear else None, mu=mu)

    def sequence_length(self, request: GenerationRequest) -> int:
        """T5 tokens per prompt: the request's ``max_sequence_length``, else what a fixed-shape
        transformer graph takes, else the family's default."""
        length = getattr(request, "max_sequence_length", None)
        if length is None:
            return self.config.fixed_text_tokens or self.default_max_sequence_length
        return int(length)

    # -- text encoders ----------------------------------------------------------------------

    def clip_encoder(self, name: str) -> TextEncoder:
        """A CLIP text encoder with its tokenizer and the outputs the pipeline reads."""
        outputs = tuple(self.config.text_outputs.get(name, ("last_hidden_state",)))
        return TextEncoder(self.components[name], self.clip_tokenizers[name], outputs)

    def t5_tokens(self, prompts: list[str], request: GenerationRequest) -> T5Tokens:
        return self.t5(prompts, self.sequence_length(request))

    def encode_t5(self, tokens: T5Tokens, masked: bool) -> np.ndarray:
        """T5's last hidden states ``[P, L, dim]``. ``masked``: the tokenizer's attention mask is
        fed (Chroma); else all ones, what SD3's and Flux's pipelines (no mask) compute."""
        component = self.components[self.t5_encoder]
        mask = tokens.attention_mask if masked else np.ones_like(tokens.attention_mask)

        def run(compiled: Any) -> np.ndarray:
            feeds = {"input_ids": tokens.input_ids}
            if input_info(compiled, "attention_mask") is not None:
                feeds["attention_mask"] = mask
            elif masked:
                raise ModelFormatError(
                    f"the {component.name} model has no attention_mask input, which this model needs"
                )
            typed = {k: v.astype(info.dtype) for k, v in feeds.items() if (info := input_info(compiled, k)) is not None}
            return np.asarray(output_named(compiled.run(typed), ("last_hidden_state",), component.name))

        return np.asarray(component.use(run), dtype=np.float32)

    # -- latents ----------------------------------------------------------------------------

    def initial_latents(self, plan: GenerationPlan, noise: NoiseStream) -> np.ndarray:
        """txt2img: the first noise draw (the request's ``latents`` in its place; the stream
        advances either way). img2img: the encoded init image (posterior sampled with the first
        draw) noised to the first kept sigma with the next (or the request's ``latents``), as
        diffusers' ``scale_noise``. ``[N, C, h, w]``, then as the denoiser takes them."""
        request = plan.request
        encoded = None
        if plan.image is not None:
            encoder = self.components[self.image_encoder]
            encoded = vae.encode(encoder, plan.image, noise, request.num_images, self.config, vae_tile(request))
        drawn = noise.normal(plan.latent_shape)
        latents = np.asarray(drawn if request.latents is None else request.latents, dtype=np.float32)
        if encoded is not None:
            first = np.asarray(plan.scheduler.timesteps).reshape(-1)[:1]
            latents = np.asarray(plan.scheduler.add_noise(encoded, latents, first), dtype=np.float32)
        return self.to_denoiser(latents)

    def from_denoiser(self, latents: np.ndarray, plan: GenerationPlan) -> np.ndarray:
        """The inverse of ``to_denoiser``: ``[N, C, h, w]``."""
        return latents

    def loop_guidance(self, request: GenerationRequest) -> float:
        """The classifier-free guidance scale the loop applies (Flux's is an input instead)."""
        return float(request.guidance_scale)

    def denoise_loop(
        self, plan: GenerationPlan, noise: NoiseStream, conditioning: dict[str, np.ndarray]
    ) -> DenoiseLoop:
        """The shared loop on the transformer (``noise``: for a sampler that draws per step;
        Euler flow draws none)."""
        return DenoiseLoop(
            denoiser=self.components["transformer"],
            scheduler=plan.scheduler,
            guidance_scale=self.loop_guidance(plan.request),
            conditioning=conditioning,
            noise=noise.normal,
            callback=self._callback(plan),
            inputs=self.denoiser_inputs,
        )

    def _callback(self, plan: GenerationPlan) -> StepCallback | None:
        """The request's callback, handed ``[N, C, h, w]`` latents whatever the denoiser reads."""
        callback = plan.request.callback
        if callback is None:
            return None
        target: StepCallback = callback
        return lambda index, total, latents: target(index, total, self.from_denoiser(latents, plan))

    def finish(self, plan: GenerationPlan, loop: DenoiseLoop, latents: np.ndarray, noise: NoiseStream) -> np.ndarray:
        """``loop`` run on ``latents`` and decoded, or the hires fix's second pass: pixels."""
        stage = plan.hires if isinstance(plan, FlowPlan) else None
        if stage is None:
            return super().finish(plan, loop, latents, noise)
        first = len(plan.scheduler.timesteps)
        loop.callback = counting(self._callback(plan), 0, first + len(stage.plan.scheduler.timesteps))
        return self.hires_pass(stage, self.from_denoiser(loop.run(latents), plan), noise, first)

    def decode_latents(self, plan: GenerationPlan, latents: np.ndarray) -> np.ndarray:
        """The transformer's final latents, unpacked, decoded (in tiles when asked): ``[N, H, W, 3]`` pixels."""
        return self.decode(self.from_denoiser(latents, plan), vae_tile(plan.request))
