"""What every pipeline shares: its config and components, the generation template with its
request -> plan step (the model-dependent checks and the feature check, once), and the delivery
of images with their PNG parameters.

``Pipeline.run`` is the one template every pipeline fills (SD 1.x/2.x, SDXL, inpainting, SD3,
Flux, Chroma)::

    plan = self.plan(self.accept(request))          # plan: checks, size, scheduler, features
    conditioning = self.conditioning(plan)           # encode: the prompts
    latents = self.initial_latents(plan, noise)      # encode: noise, or the init image noised
    loop = self.denoise_loop(plan, noise, conditioning)   # denoise, with the plan's hooks
    pixels = self.finish(plan, loop, latents, noise) # denoise and decode (+ a second stage)
    return self.deliver(plan, pixels)                # PIL images with A1111 parameters, or arrays

A pipeline class sets ``component_names``, declares its ``features`` (``sdkit.pipelines.features.feature``)
and its ``family_name``, and implements the stages; it never re-implements ``run``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from sdkit.errors import InputError, ModelFormatError, OptionError
from sdkit.families import Family, MappedCheckpoint
from sdkit.limits import check_generation
from sdkit.pipelines.config import PipelineConfig
from sdkit.pipelines.features.feature import Feature, refuse_undeclared, requested_features
from sdkit.pipelines.features.hires_fix import HiresStage, counting, upscale_latents
from sdkit.pipelines.features.lora_embeddings_vae import AdapterMethods, Adapters, LoraSpec
from sdkit.pipelines.imaging.images import GenerationParameters, float_to_pil, init_image_array, init_image_size
from sdkit.pipelines.request import GenerationPlan, GenerationRequest
from sdkit.pipelines.stages import vae
from sdkit.pipelines.stages.denoise import StepCallback
from sdkit.pipelines.stages.faces import FaceModels, check_fidelity, load_face_models, restore_faces_with
from sdkit.pipelines.stages.rng import NoiseStream, seed_list
from sdkit.pipelines.stages.sources import ModelSource
from sdkit.plugins import get_plugins
from sdkit.schedulers import pipeline_config_fixups

if TYPE_CHECKING:
    from PIL import Image

    from sdkit.pipelines.stages.components import Component, WeightSwap
    from sdkit.pipelines.stages.denoise import DenoiseLoop
    from sdkit.schedulers import Scheduler


@dataclass(frozen=True)
class OpenedCheckpoint:
    """A checkpoint opened for a pipeline (``sdkit.pipelines.loaders.families.open_for_pipeline``): its
    family and lazily mapped weights, the ``PipelineConfig`` it gives and each component's source."""

    mapped: MappedCheckpoint
    config: PipelineConfig
    sources: dict[str, ModelSource]


# path, prediction -> the opened checkpoint. The single-file loader hands its opener to the
# pipelines it builds (``Pipeline.bind_checkpoint``): the families sit above the pipeline classes.
CheckpointOpener = Callable[[str | os.PathLike[str], str | None], OpenedCheckpoint]
# sources -> their components, made with the pipeline's load settings (backend, device, memory).
ComponentMaker = Callable[[dict[str, ModelSource]], "dict[str, Component]"]


def same_graphs(a: Family, b: Family) -> bool:
    """Whether two families run the same component graphs (SD 2.x 512 and 768-v do)."""
    return {n: str(c.graph) for n, c in a.components.items()} == {n: str(c.graph) for n, c in b.components.items()}


class Pipeline(AdapterMethods):
    """Base of every pipeline. Create one with ``sdkit.load_pipeline``."""

    request_class: ClassVar[type[GenerationRequest]] = GenerationRequest
    component_names: ClassVar[tuple[str, ...]] = ()  # every component it may have
    prepared_components: ClassVar[tuple[str, ...]] = ()  # compiled at load under memory="keep"
    image_encoder: ClassVar[str] = "vae_encoder"  # the component img2img needs
    # The diffusers pipeline whose scheduler-config fix-ups apply (sdkit.schedulers.PIPELINE_FIXUPS).
    diffusers_pipeline: ClassVar[str] = ""
    # What it can do beyond txt2img (sdkit.pipelines.features.feature): a request asking for anything
    # else is refused by plan() with an UnsupportedFeatureError naming the feature and `family_name`.
    features: ClassVar[frozenset[Feature]] = frozenset()
    family_name: ClassVar[str] = "this"  # the family's name in errors ("SD3 pipelines do not support ...")

    def __init__(self, config: PipelineConfig, components: dict[str, Component]) -> None:
        self.config = config
        self.components = components
        # A single-file pipeline's checkpoint: its family, layout and lazily mapped weights per
        # component (family.key_map(component, layout) gives LoRA and VAE files their names).
        self.checkpoint: MappedCheckpoint | None = None
        self._open_checkpoint: CheckpointOpener | None = None
        self._make_components: ComponentMaker | None = None
        self.adapters = Adapters()  # LoRAs, embeddings, VAE file (set_loras, load_embedding, set_vae)
        # Why backend="auto" gave this engine (sdkit's own or stable-diffusion.cpp) where a tune
        # measured both per whole image (sdkit.pipelines.loaders.engine_timings); "" otherwise.
        self.engine_choice = ""

    def bind_checkpoint(
        self, mapped: MappedCheckpoint, opener: CheckpointOpener, make_components: ComponentMaker | None = None
    ) -> None:
        """Record the checkpoint this pipeline runs, how to open another and how to make the
        components it may add (``set_checkpoint``: an optional component the first file lacked)."""
        self.checkpoint = mapped
        self._open_checkpoint = opener
        self._make_components = make_components

    def set_config(self, config: PipelineConfig) -> None:
        """Replace the model configuration (a subclass refreshes what it derives from it)."""
        self.config = config

    def set_checkpoint(self, path: str | os.PathLike[str], prediction: str | None = None) -> dict[str, WeightSwap]:
        """Use the weights of another checkpoint of this pipeline's family (a file or a diffusers
        folder), keeping the compiled components: each is refit in place where its backend can
        (``"refit"``), else released and compiled with the new weights on its next use
        (``"recompile"``). The LoRAs, embeddings and VAE file chosen stay, merged on the new weights.
        ``prediction`` as in ``load_pipeline``. Only for pipelines loaded from a checkpoint."""
        if self.checkpoint is None or self._open_checkpoint is None:
            raise ModelFormatError(
                f"{self.name} was not loaded from a checkpoint file; load {Path(path).name} with sdkit.load_pipeline"
            )
        opened = self._open_checkpoint(path, prediction)
        mapped, current = opened.mapped, self.checkpoint.family
        if not same_graphs(current, mapped.family):
            raise ModelFormatError(
                f"{Path(path).name} is a {mapped.family.label} checkpoint, this pipeline runs {current.label}: "
                "load it with sdkit.load_pipeline"
            )
        self.sync_optional_components(mapped, opened.sources)
        swaps = {
            name: self.components[name].set_source(source)
            for name, source in opened.sources.items()
            if name in self.components
        }
        self.set_config(opened.config)
        self.checkpoint = mapped
        if self.adapters.active:
            self.adapters.refresh(mapped)
            swaps.update(self.apply_adapters())
        return swaps

    @property
    def name(self) -> str:
        return self.config.name

    def backends(self) -> dict[str, str | None]:
        """The backend each component ran on (None until it first ran)."""
        return {name: c.backend_name for name, c in self.components.items()}

    def prepare(self) -> None:
        """Compile the components ``memory="keep"`` keeps resident from the start."""
        try:
            for name in self.prepared_components:
                if name in self.components:
                    self.components[name].prepare()
        except BaseException:
            self.close()  # release what compiled before the failure
            raise

    def close(self) -> None:
        for component in self.components.values():
            component.release()

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- requests ---------------------------------------------------------------------------

    def generate(self, prompt: str | GenerationRequest, **kwargs: Any) -> Any:
        """``generate("a castle", steps=25, ...)`` (keywords: ``GenerationRequest``'s fields) or
        ``generate(request)``. Returns PIL images with ``info["parameters"]``, or an array."""
        if isinstance(prompt, GenerationRequest):
            if kwargs:
                raise OptionError("pass either a GenerationRequest or keyword options, not both")
            return self.run(prompt)
        return self.run(self.request_class.create(prompt, **kwargs))

    def __call__(self, prompt: str | GenerationRequest, **kwargs: Any) -> list[Image.Image]:
        result: list[Image.Image] = self.generate(prompt, **kwargs)
        return result

    # -- the generation template ------------------------------------------------------------

    def run(self, request: GenerationRequest) -> Any:
        """Generate what a checked request asks for: plan (refusing undeclared features), encode
        the prompts, the initial latents, denoise with the plan's hooks, decode, deliver. The
        random draws are in this order for every family (``sdkit.pipelines.stages.rng``)."""
        plan = self.plan(self.accept(request))
        noise = NoiseStream(plan.seeds)
        conditioning = self.conditioning(plan)  # the text encoders first, as diffusers
        latents = self.initial_latents(plan, noise)
        loop = self.denoise_loop(plan, noise, conditioning)
        return self.deliver(plan, self.finish(plan, loop, latents, noise))

    def conditioning(self, plan: GenerationPlan) -> dict[str, np.ndarray]:
        """Encode: the denoiser's per-request feeds (the prompts' embeddings)."""
        raise NotImplementedError(f"{type(self).__name__} does not encode prompts")

    def initial_latents(self, plan: GenerationPlan, noise: NoiseStream) -> np.ndarray:
        """Encode: the latents the loop starts from (noise, or the init image noised), as the
        denoiser reads them."""
        raise NotImplementedError(f"{type(self).__name__} makes no latents")

    def denoise_loop(
        self, plan: GenerationPlan, noise: NoiseStream, conditioning: dict[str, np.ndarray]
    ) -> DenoiseLoop:
        """Denoise: the shared ``DenoiseLoop`` on the family's denoiser, with the plan's hooks."""
        raise NotImplementedError(f"{type(self).__name__} has no denoiser")

    def finish(self, plan: GenerationPlan, loop: DenoiseLoop, latents: np.ndarray, noise: NoiseStream) -> np.ndarray:
        """``loop`` run on ``latents``, then decoded: ``[N, H, W, 3]`` pixels. A pipeline with a
        second stage (the hires fix, a refiner) extends it."""
        return self.decode_latents(plan, loop.run(latents))

    def decode_latents(self, plan: GenerationPlan, latents: np.ndarray) -> np.ndarray:
        """The loop's final latents (as the denoiser reads them) -> pixels, tiled when asked."""
        return self.decode(latents, vae_tile(plan.request))

    def to_denoiser(self, latents: np.ndarray) -> np.ndarray:
        """``[N, C, h, w]`` latents as the denoiser reads them (Flux packs them)."""
        return latents

    def _callback(self, plan: GenerationPlan) -> StepCallback | None:
        """The request's step callback as the loop calls it (the flow pipelines unpack)."""
        return plan.request.callback

    def hires_pass(self, stage: HiresStage, latents: np.ndarray, noise: NoiseStream, offset: int) -> np.ndarray:
        """The hires fix's second pass from the first pass's final ``[N, C, h, w]`` latents:
        upscale, noise to the tail's first timestep or sigma (the next draw), denoise at the
        target size with the prompts encoded again (``conditioning``: Chroma's mask and Flux's
        position ids take the new size), decode: ``[N, H, W, 3]`` pixels."""
        second, tile = stage.plan, vae_tile(stage.plan.request)
        encoder = self.components.get(self.image_encoder)

        def encode(images: np.ndarray) -> np.ndarray:
            assert encoder is not None  # plan_hires checked it for image upscalers
            return vae.encode(encoder, images, noise, 1, self.config, tile)

        decoder = self.components["vae_decoder"]  # an upscaler model runs where the VAE does
        upscaled = upscale_latents(
            stage, latents, lambda x: self.decode(x, tile), encode, (decoder.backend, decoder.device)
        )
        start = noise.normal(upscaled.shape)
        first = np.asarray(second.scheduler.timesteps).reshape(-1)[:1]
        noised = np.asarray(second.scheduler.add_noise(upscaled, start, first), dtype=np.float32)
        loop = self.denoise_loop(second, noise, self.conditioning(second))
        loop.callback = counting(self._callback(second), offset, offset + len(second.scheduler.timesteps))
        return self.decode_latents(second, loop.run(self.to_denoiser(noised)))

    def decode(self, latents: np.ndarray, tile: int | None = None) -> np.ndarray:
        """``[N, C, h, w]`` latents -> ``[N, H, W, 3]`` float32 pixels in [0, 1] (in tiles of
        ``tile`` pixels when given)."""
        return vae.decode(self.components["vae_decoder"], latents, self.config, tile)

    # -- features ---------------------------------------------------------------------------

    @classmethod
    def refuse_unsupported(cls, request: GenerationRequest) -> None:
        """An ``UnsupportedFeatureError`` when ``request`` asks for a feature this class does not
        declare (the CLI calls it before loading the model; ``plan`` before anything runs)."""
        refuse_undeclared(requested_features(request), cls.features, cls.family_name)

    def set_loras(self, loras: Sequence[LoraSpec]) -> dict[str, WeightSwap]:
        """``AdapterMethods.set_loras``; LoRAs on a family that does not declare ``Feature.LORA``
        are refused by name (``[]``, none, is always accepted)."""
        loras = list(loras)
        if loras:  # none: back to the base weights, which every pipeline can do
            refuse_undeclared({Feature.LORA}, self.features, self.family_name)
        return super().set_loras(loras)

    def accept(self, request: GenerationRequest) -> GenerationRequest:
        """``request`` as this pipeline's request class (a base request is re-created as it). A
        feature this class does not declare is refused first (an SDXL request's refiner handed to
        a pipeline without refiners names the feature, not the field)."""
        self.refuse_unsupported(request)
        known = self.request_class.field_names()
        foreign = [f for f in dataclasses.fields(request) if f.init and f.name not in known]
        for f in foreign:  # e.g. prompt_2 handed to an SD 1.x pipeline: refused, not ignored
            if getattr(request, f.name) != f.default:
                raise OptionError(f"{f.name} is not an option of {self.name} ({type(self).__name__})")
        if isinstance(request, self.request_class):
            return request
        return self.request_class.create(**{n: getattr(request, n) for n in request.field_names() if n in known})

    def _no_image_encoder(self, use: str = "img2img") -> ModelFormatError:
        """``use`` (img2img, an image hires upscaler) without ``image_encoder``: a folder lacks its
        model.onnx, a single file's VAE its encoder weights (an optional component left out:
        ``MappedCheckpoint.absent``), the VAE file ``set_vae`` set is decoder-only, or the family
        reads none."""
        need = f"{self.name}: {use} needs a VAE encoder ({self.image_encoder})"
        if self.checkpoint is None:
            return ModelFormatError(f"{need}: {self.image_encoder}/model.onnx, which this pipeline lacks")
        label = self.checkpoint.family.label
        key = self.absent_components(self.checkpoint).get(self.image_encoder)
        if key is None:
            return ModelFormatError(f"{need}, which {label} single files do not load")
        vae = self.adapters.vae_file
        if vae is not None:
            return ModelFormatError(
                f"{need}, and the VAE file set with set_vae, {vae.path.name}, is decoder-only (no {key}): "
                "set a VAE file with its encoder (or set_vae(None): the checkpoint's VAE); txt2img runs without it"
            )
        flag = " (--vae)" if "vae" in self.checkpoint.family.files else ""
        return ModelFormatError(
            f"{need}, and the {label} VAE it was loaded with is decoder-only (no {key}): "
            f"give a VAE file with its encoder{flag}; txt2img runs without it"
        )

    def plan(self, request: GenerationRequest) -> GenerationPlan:
        """The checks that need the model, made once: size, img2img support, latents shape, and
        the scheduler (whose ``set_timesteps`` refuses a strength that leaves no step). First of
        all, a feature this pipeline does not declare is refused."""
        self.refuse_unsupported(request)
        config = self.config
        if request.vae_tiling:  # a tile size this VAE cannot tile with fails now, not after denoising
            vae.tile_overlap(request.vae_tile_size, config.vae_scale_factor)
        image = None
        width, height = request.width, request.height
        if request.init_image is not None:
            if self.image_encoder not in self.components:
                raise self._no_image_encoder()
            width, height = init_image_size(request.init_image, width, height)
        width = self._checked_size(width, "width")
        height = self._checked_size(height, "height")
        shape = config.latent_shape(request.num_images, width, height)
        check_generation(request.num_images, width, height, shape, request.init_image is not None)
        if request.init_image is not None:
            image = init_image_array(request.init_image, width, height)
        latents = request.latents
        if latents is not None and (latents.shape != shape or latents.dtype != np.float32):
            raise InputError(f"latents must be float32 {list(shape)}, got {latents.dtype}{list(latents.shape)}")
        scheduler = self.make_scheduler(request)
        self.start_schedule(scheduler, request.steps, request.strength if image is not None else 1.0, shape)
        seeds = seed_list(request.seed, request.num_images)
        plan = GenerationPlan(request, width, height, shape, seeds, scheduler, image)
        if request.restore_faces is not None:  # loaded (and a wrong file refused) before denoising
            models = self.face_models(request)
            check_fidelity(models.restorer, request.codeformer_weight)
            plan.parameters["Face restoration"] = models.name
        return plan

    def face_models(self, request: GenerationRequest) -> FaceModels:
        """The request's face restorer with its detector and parser, where the VAE decoder runs."""
        decoder = self.components.get("vae_decoder")
        backend, device = (decoder.backend, decoder.device) if decoder is not None else ("auto", None)
        return load_face_models(request.restore_faces or "", backend=backend, device=device)

    def start_schedule(self, scheduler: Scheduler, steps: int, strength: float, latent_shape: tuple[int, ...]) -> None:
        """Set the scheduler's timesteps for a request (flow models also pass the shift ``mu``
        of the image size and their own sigmas)."""
        scheduler.set_timesteps(steps, strength=strength)

    def make_scheduler(self, request: GenerationRequest) -> Scheduler:
        """The request's sampler (already canonical), configured from the model's config."""
        cls = get_plugins().schedulers.get(request.sampler)
        if cls is None:  # the plugin set changed since the request was made
            raise OptionError(f"sampler {request.sampler!r} is no longer registered")
        config = self.config.scheduler_config
        if self.diffusers_pipeline:  # what diffusers' pipeline constructor does to the config
            config = pipeline_config_fixups(config, cls, self.diffusers_pipeline)
        scheduler: Scheduler = cls(
            schedule=request.schedule,
            config=config,
            prediction_type=self.config.prediction_type,
            **request.sampler_options,
        )
        return scheduler

    def _checked_size(self, value: int | None, what: str) -> int:
        if value is None:  # the size a fixed-shape graph takes, else the model's native one
            fixed = self.config.fixed_size
            return self.config.default_size if fixed is None else fixed[0 if what == "width" else 1]
        multiple = self.config.size_multiple
        if value % multiple:
            raise InputError(f"{what} must be a multiple of {multiple}, got {value}")
        return value

    # -- results ----------------------------------------------------------------------------

    def deliver(self, plan: GenerationPlan, pixels: np.ndarray) -> Any:
        """``[N, H, W, 3]`` pixels as the request's output type; PIL images carry their A1111
        ``parameters`` text and the ``GenerationParameters`` (``info["sdkit_parameters"]``)."""
        request = plan.request
        pixels = self.postprocess(plan, pixels)
        if request.output_type == "np":
            return pixels
        images = float_to_pil(pixels)
        for seed, image in zip(plan.seeds, images, strict=True):
            params = self.parameters(plan, seed)
            image.info["parameters"] = params.a1111_text()
            image.info["sdkit_parameters"] = params
        return images

    def postprocess(self, plan: GenerationPlan, pixels: np.ndarray) -> np.ndarray:
        """What A1111 does to the decoded pixels before they become the PNG: face restoration
        (an inpainting pipeline then pastes the result back, as A1111's overlay comes after it)."""
        return self.restore_faces(plan, pixels)

    def restore_faces(self, plan: GenerationPlan, pixels: np.ndarray) -> np.ndarray:
        """The request's face restoration on ``[N, H, W, 3]`` pixels (as 8-bit images, as A1111)."""
        request = plan.request
        if request.restore_faces is None:
            return pixels
        models = self.face_models(request)
        images = [restore_faces_with(image, models, request.codeformer_weight)[0] for image in float_to_pil(pixels)]
        return np.stack([np.asarray(image, dtype=np.float32) / np.float32(255) for image in images])

    def parameters(self, plan: GenerationPlan, seed: int) -> GenerationParameters:
        """What one image of ``plan`` was made with (a family with more settings adds them)."""
        request = plan.request
        return GenerationParameters(
            request.prompt,
            request.negative_prompt,
            request.steps,
            request.sampler,
            request.schedule,
            float(request.guidance_scale),
            seed,
            plan.width,
            plan.height,
            self.name,
            float(request.strength) if plan.image is not None else None,
            tuple(plan.parameters.items()),
        )


def vae_tile(request: GenerationRequest) -> int | None:
    """The VAE tile size in pixels when the request asks for tiling, else None."""
    return request.vae_tile_size if request.vae_tiling else None
