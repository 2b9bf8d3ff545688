"""Stable Diffusion XL, base and refiner, txt2img and img2img, on any backend.

The stages are diffusers' ``StableDiffusionXLPipeline`` / ``StableDiffusionXLImg2ImgPipeline``
(``fixtures/tiny_xl/README.md`` section 3 is the step-by-step spec the goldens check):

1. Prompts: each text encoder reads its own text (``text_encoder`` CLIP-L: ``prompt``;
   ``text_encoder_2`` OpenCLIP bigG: ``prompt_2``, defaulting to ``prompt``; a refiner, which
   has only ``text_encoder_2``, reads ``prompt``, as diffusers pairs prompts with the encoders
   it has). Hidden states are each encoder's penultimate layer (``PipelineConfig.text_outputs``),
   concatenated on the feature axis; the pooled ``text_embeds`` come from ``text_encoder_2``.
   With ``force_zeros_for_empty_prompt`` (SDXL base) an empty negative prompt (and empty
   ``negative_prompt_2``) is zeros, hidden and pooled, as diffusers' ``negative_prompt=None``
   and A1111's empty negative prompt.
2. ``time_ids``: ``time_ids`` below (original size, crop, target size, or the refiner's
   aesthetic score), one row for the negative and one for the positive prompt.
3. The shared ``DenoiseLoop`` with ``encoder_hidden_states``, ``text_embeds`` and ``time_ids``
   batched ``[negative x N, positive x N]``; img2img as Stable Diffusion's.
4. Refiner (``XLRequest.refiner``): the base stops at ``refiner_switch_at`` (diffusers'
   ``denoising_end``) and the refiner continues from its own schedule's first timestep below the
   same cutoff (``denoising_start``: no VAE encode, no noise added, no ``init_noise_sigma``; one
   step more for a second-order sampler that would stop between its two evaluations), with its
   own prompt encoding and ``time_ids``, the same noise stream, and decodes with its own VAE.

The VAE runs in fp32 whatever ``precision`` says for the other components (the SDXL VAE overflows
in fp16; ``PipelineConfig.fp32_components``) unless a per-component ``precision`` names it.
Nothing here knows where the model came from: a ``PipelineConfig`` and components build it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import numpy as np

from sdkit.errors import InputError, ModelFormatError
from sdkit.pipelines.config import PipelineConfig
from sdkit.pipelines.features.feature import Feature
from sdkit.pipelines.models.base import vae_tile
from sdkit.pipelines.models.sdxl_request import XLRequest
from sdkit.pipelines.models.stable_diffusion import DiffusionPlan, StableDiffusionPipeline, note_prompt_weighting
from sdkit.pipelines.request import GenerationPlan, GenerationRequest
from sdkit.pipelines.stages.components import Component
from sdkit.pipelines.stages.denoise import DenoiseLoop, StepCallback
from sdkit.pipelines.stages.rng import NoiseStream
from sdkit.pipelines.text.clip_skip import note_clip_skip
from sdkit.pipelines.text.text_encoding import encode_prompts

TEXT_ENCODERS = ("text_encoder", "text_encoder_2")


def time_ids(request: XLRequest, height: int, width: int, *, img2img: bool, aesthetic: bool) -> np.ndarray:
    """SDXL's ``[negative, positive]`` micro-conditioning rows, float32 [2, 6] (refiner [2, 5]).

    Sizes default to the image's ``(height, width)``; crops to ``(0, 0)``. As diffusers:
    - txt2img (``StableDiffusionXLPipeline``): positive ``original + crop + target``; the negative
      row is ``negative_original + negative_crop + negative_target`` when both negative sizes are
      given, else the positive row;
    - img2img / refiner stage (``StableDiffusionXLImg2ImgPipeline``): negative sizes default to the
      positive ones, and the negative row takes the *positive* crop;
    - ``aesthetic`` (a refiner's ``requires_aesthetics_score``): ``original + crop + score``, the
      negative row ``negative_original + negative_crop + negative_score``.
    """
    size = (height, width)
    original, target = request.original_size or size, request.target_size or size
    crop = request.crops_coords_top_left
    negative_original = request.negative_original_size
    negative_target = request.negative_target_size
    negative_crop = request.negative_crops_coords_top_left
    positive: tuple[float, ...]
    negative: tuple[float, ...]
    if aesthetic:
        positive = (*original, *crop, request.aesthetic_score)
        negative = (*(negative_original or original), *negative_crop, request.negative_aesthetic_score)
    elif img2img:
        positive = (*original, *crop, *target)
        negative = (*(negative_original or original), *crop, *(negative_target or target))
    else:
        positive = (*original, *crop, *target)
        negative = positive
        if negative_original is not None and negative_target is not None:
            negative = (*negative_original, *negative_crop, *negative_target)
    return np.asarray([negative, positive], dtype=np.float32)


@dataclass
class RefinerStage:
    """The second stage of a request: the refiner pipeline, its plan (scheduler started where
    the base stops) and how many steps the base runs first."""

    pipeline: StableDiffusionXLPipeline
    plan: GenerationPlan
    base_steps: int


@dataclass
class XLPlan(DiffusionPlan):
    """A ``DiffusionPlan`` (mask, ControlNets) with the refiner stage, when the request has one."""

    refiner: RefinerStage | None = None


def discrete_cutoff(fraction: float, scheduler: Any) -> int:
    """diffusers' ``discrete_timestep_cutoff``: ``round(T - fraction * T)`` of the training steps."""
    total = int(scheduler.config.num_train_timesteps)
    return round(total - fraction * total)


class StableDiffusionXLPipeline(StableDiffusionPipeline):
    """A loaded SDXL base or refiner pipeline. Create with ``sdkit.load_pipeline``."""

    request_class: ClassVar[type[GenerationRequest]] = XLRequest
    component_names: ClassVar[tuple[str, ...]] = (
        *TEXT_ENCODERS,
        "unet",
        "vae_decoder",
        "vae_encoder",
        "unet_controlnet",
        "controlnet",
    )
    prepared_components: ClassVar[tuple[str, ...]] = (*TEXT_ENCODERS, "unet", "vae_decoder")
    diffusers_pipeline: ClassVar[str] = "StableDiffusionXLPipeline"
    features: ClassVar[frozenset[Feature]] = StableDiffusionPipeline.features | {Feature.REFINER}
    family_name: ClassVar[str] = "SDXL"
    controlnet_addition: ClassVar[str | None] = "text_time"  # its ControlNets take text_embeds, time_ids

    def __init__(self, config: PipelineConfig, components: dict[str, Component]) -> None:
        super().__init__(config, components)
        self.text_encoder_names = tuple(name for name in TEXT_ENCODERS if name in components)
        if "text_encoder_2" not in components:
            raise ModelFormatError(f"{self.name}: an SDXL pipeline needs text_encoder_2 (OpenCLIP bigG)")
        for name in self.text_encoder_names:
            if name not in self.tokenizers:
                raise ModelFormatError(f"{self.name}: no tokenizer is configured for {name}")
            outputs = config.text_outputs.get(name, ())
            if len(outputs) != (2 if name == "text_encoder_2" else 1):
                raise ModelFormatError(
                    f"{self.name}: text_outputs[{name!r}] must name the hidden states"
                    f"{' and the pooled text_embeds' if name == 'text_encoder_2' else ''}, got {outputs!r}"
                )

    @property
    def is_refiner(self) -> bool:
        """A refiner model: aesthetic-score ``time_ids`` (and usually ``text_encoder_2`` only)."""
        return self.config.requires_aesthetics_score

    # -- stages -----------------------------------------------------------------------------

    def conditioning(self, plan: GenerationPlan, second_stage: bool = False) -> dict[str, np.ndarray]:
        """The UNet's per-request feeds ``encoder_hidden_states``, ``text_embeds``, ``time_ids``,
        batched ``[negative x N, positive x N]`` under guidance, ``[positive x N]`` without.
        ``second_stage``: this pipeline refines another's latents (img2img ``time_ids`` rules)."""
        request = plan.request
        assert isinstance(request, XLRequest)
        guided = request.guidance_scale > 1.0
        positive = (request.prompt, request.prompt_2 or request.prompt)
        negative = (request.negative_prompt, request.negative_prompt_2 or request.negative_prompt)
        texts = [[neg, pos] if guided else [pos] for neg, pos in zip(negative, positive, strict=True)]
        encoders = [self.text_encoder(name, request.clip_skip) for name in self.text_encoder_names]
        # diffusers pairs [prompt, prompt_2] with the encoders present: a refiner reads `prompt`.
        embeddings, padded = encode_prompts(encoders, texts[: len(encoders)], request.prompt_weighting)
        note_prompt_weighting(plan, padded, *positive, *negative)
        note_clip_skip(plan)
        hidden = np.concatenate([e.hidden for e in embeddings], axis=-1)
        pooled = embeddings[-1].pooled
        assert pooled is not None  # text_encoder_2 reads two outputs (checked in __init__)
        if guided and self.config.force_zeros_for_empty_prompt and not any(negative):
            window = encoders[0].tokenizer.model_max_length  # A1111 zeros the first chunk only
            hidden[0, :window] = 0.0
            pooled[0] = 0.0
        img2img = second_stage or plan.image is not None or self.is_refiner
        ids = time_ids(request, plan.height, plan.width, img2img=img2img, aesthetic=self.is_refiner)
        ids = ids if guided else ids[1:]
        count = request.num_images
        return {
            "encoder_hidden_states": np.repeat(hidden, count, axis=0),
            "text_embeds": np.repeat(pooled, count, axis=0),
            "time_ids": np.repeat(ids, count, axis=0),
        }

    # -- the refiner --------------------------------------------------------------------------

    def plan(self, request: GenerationRequest) -> XLPlan:
        """``Pipeline.plan``, and the refiner stage when the request has one (checked here, before
        anything runs: the refiner's kind, latents, and a split that leaves both stages a step)."""
        plan = super().plan(request)
        xl_plan = XLPlan(**{f.name: getattr(plan, f.name) for f in fields(DiffusionPlan)})
        assert isinstance(request, XLRequest)
        if request.refiner is not None:
            xl_plan.refiner = self.plan_refiner(xl_plan, request.refiner)
            xl_plan.parameters["Refiner"] = request.refiner.name
            xl_plan.parameters["Refiner switch at"] = f"{request.refiner_switch_at:g}"
        return xl_plan

    def make_scheduler(self, request: GenerationRequest) -> Any:
        """As every pipeline's, but A1111's "Align Your Steps" takes the SDXL table (as A1111 does)."""
        if request.schedule == "align_your_steps":
            request = request.replace(schedule="align_your_steps_sdxl")
        return super().make_scheduler(request)

    def plan_refiner(self, plan: GenerationPlan, refiner: Any) -> RefinerStage:
        request = plan.request
        assert isinstance(request, XLRequest)
        if not isinstance(refiner, StableDiffusionXLPipeline):
            raise InputError(f"the refiner must be an SDXL pipeline; {getattr(refiner, 'name', refiner)!r} is not")
        mine, theirs = self.config, refiner.config
        if (mine.latent_channels, mine.vae_scale_factor) != (theirs.latent_channels, theirs.vae_scale_factor):
            raise ModelFormatError(f"the refiner {refiner.name}'s latents do not match {self.name}'s")
        switch = request.refiner_switch_at
        base_timesteps = np.asarray(plan.scheduler.timesteps, dtype=np.float64).reshape(-1)
        base_steps = int(np.count_nonzero(base_timesteps >= discrete_cutoff(switch, plan.scheduler)))
        scheduler = refiner.make_scheduler(request)
        scheduler.set_timesteps(request.steps)
        timesteps = np.asarray(scheduler.timesteps, dtype=np.float64).reshape(-1)
        steps = int(np.count_nonzero(timesteps < discrete_cutoff(switch, scheduler)))
        if scheduler.order == 2 and steps % 2 == 0:  # end after a whole second-order step
            steps += 1
        if base_steps == 0 or steps == 0:
            stage = "base" if base_steps == 0 else "refiner"
            raise InputError(f"refiner_switch_at {switch:g} with {request.steps} steps leaves no step for the {stage}")
        scheduler.set_begin_index(len(timesteps) - min(steps, len(timesteps)))
        stage_plan = GenerationPlan(request, plan.width, plan.height, plan.latent_shape, plan.seeds, scheduler)
        return RefinerStage(refiner, stage_plan, base_steps)

    def refine(
        self, plan: GenerationPlan, latents: np.ndarray, noise: NoiseStream, callback: StepCallback | None
    ) -> np.ndarray:
        """The second stage: this pipeline denoises ``latents`` from ``plan``'s first timestep
        (the latents as they are) and decodes them: ``[N, H, W, 3]`` pixels."""
        conditioning = self.conditioning(plan, second_stage=True)
        loop = self.denoise_loop(plan, noise, conditioning)
        loop.callback = callback
        return self.decode(loop.run(latents), vae_tile(plan.request))

    # -- the template's last stages ---------------------------------------------------------

    def finish(self, plan: GenerationPlan, loop: DenoiseLoop, latents: np.ndarray, noise: NoiseStream) -> np.ndarray:
        """``StableDiffusionPipeline.finish``, or with a refiner: the base runs its part of the
        schedule, then the refiner denoises and decodes the rest: pixels."""
        stage = plan.refiner if isinstance(plan, XLPlan) else None
        if stage is None:
            return super().finish(plan, loop, latents, noise)
        total = stage.base_steps + len(stage.plan.scheduler.timesteps)
        loop.stop_after = stage.base_steps
        loop.callback = _counting(plan.request.callback, 0, total)
        latents = loop.run(latents)
        callback = _counting(plan.request.callback, stage.base_steps, total)
        return stage.pipeline.refine(stage.plan, latents, noise, callback)


def _counting(callback: StepCallback | None, offset: int, total: int) -> StepCallback | None:
    """``callback`` numbering the steps of both stages as one run of ``total``."""
    if callback is None:
        return None
    target: Callable[[int, int, np.ndarray], None] = callback
    return lambda index, _count, latents: target(offset + index, total, latents)
