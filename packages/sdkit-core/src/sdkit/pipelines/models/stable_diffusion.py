"""Stable Diffusion 1.x/2.x, txt2img, img2img, inpainting and ControlNet, on any backend.

The stages are diffusers' ``StableDiffusionPipeline`` / ``StableDiffusionImg2ImgPipeline``: CLIP
text embeddings for the prompt and the negative prompt, the shared ``DenoiseLoop`` (classifier-free
guidance ``uncond + scale * (cond - uncond)`` when ``guidance_scale > 1``, a scheduler from
``sdkit.schedulers`` stepping the latents), the VAE decoding ``latents / scaling_factor``. Every
model runs through ``sdkit.compile`` on the backend chosen for its component; random numbers come
from ``sdkit.pipelines.stages.rng`` (documented, backend-independent).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

import numpy as np

from sdkit.device import Device
from sdkit.errors import InputError, ModelFormatError
from sdkit.pipelines.config import PipelineConfig
from sdkit.pipelines.control_units import ControlUnit
from sdkit.pipelines.features.controlnet import (
    ActiveControl,
    ControlNet,
    ControlNetHook,
    control_image,
    load_controlnet,
    named_paths,
)
from sdkit.pipelines.features.feature import Feature
from sdkit.pipelines.features.hires_fix import HiresStage, counting, hires_stage, second_pass_request
from sdkit.pipelines.features.hires_fix import parameters as hires_parameters
from sdkit.pipelines.features.inpainting import MaskPlan, inpainting_latents, paste_back, plan_mask
from sdkit.pipelines.models.base import Pipeline, vae_tile
from sdkit.pipelines.request import GenerationPlan, GenerationRequest
from sdkit.pipelines.stages import vae
from sdkit.pipelines.stages.components import Component, MemoryPolicy
from sdkit.pipelines.stages.denoise import DenoiseLoop, StepHook
from sdkit.pipelines.stages.rng import NoiseStream
from sdkit.pipelines.text.clip_skip import OUTPUT as CLIP_SKIP
from sdkit.pipelines.text.clip_skip import clip_skip_edit, note_clip_skip
from sdkit.pipelines.text.clip_tokenizer import ClipTokenizerBase, make_tokenizer
from sdkit.pipelines.text.text_encoding import TextEncoder, encode_prompts, uses_emphasis

NO_CONTROLNET_UNET = "ControlNet needs unet_controlnet/model.onnx (the UNet with the ControlNet residual inputs)"


@dataclass
class DiffusionPlan(GenerationPlan):
    """A plan with inpainting and ControlNet: the prepared mask, the units bound to their loaded
    ControlNets, and the hooks the stages add to the loop as they run."""

    mask: MaskPlan | None = None
    controls: list[ActiveControl] = field(default_factory=list)
    hooks: list[StepHook] = field(default_factory=list)
    hires: HiresStage | None = None


class StableDiffusionPipeline(Pipeline):
    """A loaded SD 1.x/2.x pipeline. Create with ``sdkit.load_pipeline``."""

    # "controlnet" names every ControlNet in a per-component backend/device mapping.
    component_names: ClassVar[tuple[str, ...]] = (
        "text_encoder",
        "unet",
        "vae_decoder",
        "vae_encoder",
        "unet_controlnet",
        "controlnet",
    )
    prepared_components: ClassVar[tuple[str, ...]] = ("text_encoder", "unet", "vae_decoder")
    diffusers_pipeline: ClassVar[str] = "StableDiffusionPipeline"
    features: ClassVar[frozenset[Feature]] = frozenset(
        {
            Feature.IMG2IMG,
            Feature.MASK,
            Feature.CONTROLNET,
            Feature.HIRES,
            Feature.VAE_TILING,
            Feature.PROMPT_WEIGHTING,
            Feature.LORA,
            Feature.CLIP_SKIP,
        }
    )
    family_name: ClassVar[str] = "SD 1.x/2.x"
    # The UNet's added conditioning a ControlNet must share (diffusers' addition_embed_type).
    controlnet_addition: ClassVar[str | None] = None

    def __init__(self, config: PipelineConfig, components: dict[str, Component]) -> None:
        super().__init__(config, components)
        self.tokenizers = self._tokenizers(config)
        self.controlnets: dict[str, ControlNet] = {}

    def _tokenizers(self, config: PipelineConfig) -> dict[str, ClipTokenizerBase]:
        missing = [name for name in config.tokenizers if name not in self.components]
        if missing:
            raise ModelFormatError(f"{self.name}: a tokenizer is configured for {missing[0]}, which is missing")
        return {name: make_tokenizer(source) for name, source in config.tokenizers.items()}

    def reset_tokenizers(self) -> None:
        """Fresh tokenizers from the config, without any embedding's tokens (``unload_embeddings``)."""
        self.tokenizers = self._tokenizers(self.config)

    def set_config(self, config: PipelineConfig) -> None:
        if config.tokenizers != self.config.tokenizers:  # another checkpoint's (a folder's own)
            self.tokenizers = self._tokenizers(config)
        super().set_config(config)

    @property
    def tokenizer(self) -> ClipTokenizerBase:
        """The first text encoder's tokenizer."""
        return next(iter(self.tokenizers.values()))

    def text_encoder(self, name: str, clip_skip: int = 1) -> TextEncoder:
        """The text-encoder component ``name`` with its tokenizer and the outputs read; with
        ``clip_skip`` > 1 its graph gains the skipped layers' output (``text.clip_skip``), which
        compiles it again (and again when the request goes back to 1)."""
        outputs = tuple(self.config.text_outputs.get(name, ("last_hidden_state",)))
        component = self.components[name]
        if clip_skip > 1:
            component.set_edit(f"clip_skip={clip_skip}", clip_skip_edit(outputs[0], clip_skip), (outputs[0], CLIP_SKIP))
            outputs = (CLIP_SKIP, *outputs[1:])
        else:
            component.set_edit(None, None)
        return TextEncoder(component, self.tokenizers[name], outputs)

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
        encoder = self.text_encoder("text_encoder", request.clip_skip)
        [embeddings], padded = encode_prompts([encoder], [prompts], request.prompt_weighting)
        note_prompt_weighting(plan, padded, *prompts)
        note_clip_skip(plan)
        return {"encoder_hidden_states": np.repeat(embeddings.hidden, request.num_images, axis=0)}

    def initial_latents(self, plan: GenerationPlan, noise: NoiseStream) -> np.ndarray:
        """txt2img: the first noise draw times ``init_noise_sigma``; img2img: the encoded image
        noised to the first timestep (see ``sdkit.pipelines.stages.rng`` for the draw order);
        inpainting: ``sdkit.pipelines.features.inpainting.inpainting_latents`` (its hook joins the plan's)."""
        request, scheduler = plan.request, plan.scheduler
        if isinstance(plan, DiffusionPlan) and plan.mask is not None:
            encoder = self.components[self.image_encoder]
            start, hook = inpainting_latents(
                request, plan.mask, scheduler, encoder, noise, self.config, plan.latent_shape
            )
            plan.hooks.append(hook)
            return start
        if plan.image is None:
            start = _initial_noise(noise, plan.latent_shape, request.latents)
            latents: np.ndarray = (start * np.float32(scheduler.init_noise_sigma)).astype(np.float32)
            return latents
        encoder = self.components[self.image_encoder]
        encoded = vae.encode(encoder, plan.image, noise, request.num_images, self.config, vae_tile(request))
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
        """The shared loop on the UNet, for ``plan``, with the plan's hooks (inpainting, ControlNet
        on ``unet_controlnet``) and the ``hooks`` a subclass adds."""
        request = plan.request
        denoiser = "unet"
        if isinstance(plan, DiffusionPlan):
            if plan.controls:
                hooks = (ControlNetHook(plan.controls), *hooks)
                denoiser = "unet_controlnet"
            hooks = (*plan.hooks, *hooks)
        return DenoiseLoop(
            denoiser=self.components[denoiser],
            scheduler=plan.scheduler,
            guidance_scale=float(request.guidance_scale),
            conditioning=conditioning,
            noise=noise.normal,
            hooks=hooks,
            callback=request.callback,
        )

    # -- planning: inpainting and ControlNet ------------------------------------------------

    def plan(self, request: GenerationRequest) -> DiffusionPlan:
        """``Pipeline.plan`` plus the mask (crop, blur, latent mask) and the ControlNet units."""
        base = super().plan(request)
        plan = DiffusionPlan(**vars(base))
        if plan.request.mask is not None:
            plan.mask = plan_mask(plan.request, plan.width, plan.height, self.config)
            plan.image = plan.mask.image
        elif self.config.inpainting:
            raise InputError(
                f"{self.name} is an inpainting model (its UNet takes a mask): give an init_image and a mask "
                "(sdkit generate: --init-image and --mask)"
            )
        plan.controls = self.plan_controls(plan)
        if request.enable_hr:
            plan.hires = self.plan_hires(plan)
        return plan

    def plan_hires(self, plan: DiffusionPlan) -> HiresStage:
        """The hires fix's second pass (``sdkit.pipelines.features.hires_fix``), planned like any request."""
        request = plan.request
        if getattr(request, "refiner", None) is not None:
            raise InputError("hires fix and a refiner together are not supported: choose one")
        factor = self.config.vae_scale_factor
        sized = request.replace(width=plan.width, height=plan.height)
        second_request, numbers = second_pass_request(sized, factor)
        stage = hires_stage(self.plan(second_request), numbers, request.hr_upscaler, factor)
        if stage.kind == "image" and self.image_encoder not in self.components:
            # it encodes the upscaled image again: the folder's model.onnx or the VAE file's encoder
            raise self._no_image_encoder(f"the hires fix's {request.hr_upscaler} upscaler (a Latent one does not)")
        plan.parameters.update(hires_parameters(request))
        return stage

    def plan_controls(self, plan: DiffusionPlan) -> list[ActiveControl]:
        units = plan.request.control
        if not units:
            return []
        if "unet_controlnet" not in self.components:
            raise ModelFormatError(f"{self.name}: {NO_CONTROLNET_UNET}")
        region = plan.mask.region if plan.mask is not None else None
        count = plan.request.num_images
        return [
            ActiveControl(
                self._controlnet_for(unit),
                control_image(unit, count, plan.width, plan.height, region),
                unit.scale,
                unit.start,
                unit.end,
            )
            for unit in units
        ]

    def _controlnet_for(self, unit: ControlUnit) -> ControlNet:
        loaded = ", ".join(self.controlnets) or "none"
        if unit.model is None and len(self.controlnets) == 1:
            return next(iter(self.controlnets.values()))
        if unit.model is None or unit.model not in self.controlnets:
            wanted = "a ControlNet unit names no model" if unit.model is None else f"no ControlNet {unit.model!r}"
            raise InputError(
                f"{wanted} (loaded: {loaded}); load them with sdkit.load_pipeline(..., controlnets=...) "
                "or pipe.set_controlnets(...)"
            )
        return self.controlnets[unit.model]

    def set_controlnets(
        self,
        controlnets: Any,
        backend: str | None = None,
        device: str | Device | None = None,
        memory: str | None = None,
        **options: Any,
    ) -> None:
        """Load the ControlNets a request's units name, replacing those loaded before (None or
        ``[]``: none). ``controlnets``: a folder, a list of folders (named by their folder name)
        or ``{name: folder}``. Each is a component ``controlnet:<name>`` compiled with ``backend``,
        ``device``, ``memory`` and ``options``, by default the UNet's; under ``memory="keep"``
        it (and ``unet_controlnet``) compiles with the pipeline (now, if the pipeline is compiled)."""
        named = named_paths(controlnets) if controlnets else {}
        if named and "unet_controlnet" not in self.components:
            raise ModelFormatError(f"{self.name}: {NO_CONTROLNET_UNET}")
        unet = self.components["unet"]

        def component(name: str, source: Any) -> Component:
            chosen = options or unet.options
            return Component(
                name,
                source,
                backend or unet.backend,
                unet.device if device is None else device,
                chosen,
                cast("MemoryPolicy", memory or unet.policy),  # Component checks it
            )

        loaded = {name: load_controlnet(name, path, component) for name, path in named.items()}
        for net in loaded.values():
            self._check_controlnet(net)
        for old in self.controlnets.values():
            old.component.release()
            self.components.pop(old.component.name, None)
        self.controlnets = loaded
        for net in loaded.values():
            self.components[net.component.name] = net.component
        if self.components["unet"].compiled is not None:  # a prepared pipeline: these too
            self.prepare_controlnets()

    def prepare(self) -> None:
        """``Pipeline.prepare``, and the ControlNets with ``unet_controlnet`` when some are loaded."""
        super().prepare()
        self.prepare_controlnets()

    def prepare_controlnets(self) -> None:
        if not self.controlnets:
            return
        try:
            for part in [*(net.component for net in self.controlnets.values()), self.components["unet_controlnet"]]:
                part.prepare()  # compiles under memory="keep" only
        except BaseException:
            self.close()
            raise

    def _check_controlnet(self, net: ControlNet) -> None:
        """What its config.json says against this pipeline, before anything compiles."""
        if net.conditioning_factor != self.config.vae_scale_factor:
            raise ModelFormatError(
                f"ControlNet {net.name!r} reduces control images {net.conditioning_factor}x, but this "
                f"pipeline's latents are {self.config.vae_scale_factor}x smaller than its images: its "
                "conditioning does not fit this model"
            )
        addition = net.config.get("addition_embed_type")
        if addition != self.controlnet_addition:
            family = (
                "an SDXL" if addition == "text_time" else "an SD 1.x/2.x" if addition is None else f"a {addition!r}"
            )
            raise ModelFormatError(f"ControlNet {net.name!r} is {family} ControlNet; {self.name} is another family")

    # -- the template's last stages ---------------------------------------------------------

    def finish(self, plan: GenerationPlan, loop: DenoiseLoop, latents: np.ndarray, noise: NoiseStream) -> np.ndarray:
        """``loop`` run on ``latents``, then decoded, or the hires fix's second pass: pixels."""
        stage = plan.hires if isinstance(plan, DiffusionPlan) else None
        if stage is None:
            return super().finish(plan, loop, latents, noise)
        first = len(plan.scheduler.timesteps)
        loop.callback = counting(plan.request.callback, 0, first + len(stage.plan.scheduler.timesteps))
        return self.hires_pass(stage, loop.run(latents), noise, first)

    def postprocess(self, plan: GenerationPlan, pixels: np.ndarray) -> np.ndarray:
        """``Pipeline.postprocess`` (face restoration), then A1111's paste-back of an inpainting
        result (when asked): A1111 restores faces before its overlay."""
        pixels = super().postprocess(plan, pixels)
        if isinstance(plan, DiffusionPlan) and plan.mask is not None and plan.mask.paste is not None:
            pixels = paste_back(pixels, plan.mask.paste)
        return pixels


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
