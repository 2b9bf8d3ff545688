"""``SdcppPipeline``: a whole stable-diffusion.cpp pipeline behind sdkit's ``Pipeline`` API.

It takes the same ``GenerationRequest`` as sdkit's own pipelines and answers the same way (PIL
images with A1111 parameters, or ``[N, H, W, 3]`` arrays), but sd.cpp runs every stage itself, so
it replaces the generation template (``run``) rather than filling its stages: ``plan`` checks the
request (features, fields sd.cpp lacks, sampler names), ``run`` maps it (``request_map``) and calls
``generate_image`` once. LoRAs, embeddings and a VAE file go to sd.cpp as files, not merged
weights (``set_loras``, ``load_embedding``, ``set_vae``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, cast

import numpy as np

from sdkit.errors import InputError, ModelFormatError, OptionError
from sdkit.limits import check_generation
from sdkit.pipelines import FlowRequest, GenerationPlan, GenerationRequest, Pipeline, PipelineConfig
from sdkit.pipelines.features.controlnet import named_paths
from sdkit.pipelines.features.feature import Feature, refuse_undeclared
from sdkit.pipelines.imaging.images import GenerationParameters, init_image_size, open_init_image
from sdkit.pipelines.request import as_float
from sdkit.pipelines.stages.rng import seed_list
from sdkit_sdcpp import binding
from sdkit_sdcpp.context import Context
from sdkit_sdcpp.names import to_sdcpp
from sdkit_sdcpp.request_map import generate_kwargs, photomaker_kwargs, refuse_unsupported_fields

if TYPE_CHECKING:
    from sdkit.pipelines.features.lora_embeddings_vae import LoraSpec
    from sdkit.pipelines.stages.components import WeightSwap

# Adapter files sd.cpp reads (pickles, .pt/.ckpt, are refused as everywhere in sdkit).
ADAPTER_SUFFIXES = (".safetensors", ".gguf")
# The families whose native size is 1024 (the others: 512), as ``gguf_reader.family_of`` names them.
LARGE_FAMILIES = ("SDXL", "SD3", "FLUX", "Chroma", "Qwen-Image", "Z-Image")
# Flow-matching families: their requests are ``FlowRequest``s (Euler by default, as sdkit's own).
FLOW_FAMILIES = ("SD3", "FLUX", "Chroma", "Qwen-Image", "Z-Image", "Wan")
SEED_LIMIT = 1 << 63  # sd.cpp's seed is an int64 (and negative means "draw one")


def adapter_file(path: str | os.PathLike[str], what: str) -> Path:
    """``path`` checked to be a ``.safetensors`` or ``.gguf`` file sd.cpp can be handed."""
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise InputError(f"{what}: no such file: {path}")
    if file.suffix.lower() not in ADAPTER_SUFFIXES:
        raise InputError(f"{what}: {file.name}: stable-diffusion.cpp is given .safetensors or .gguf files only")
    if ":" in str(file) or ">" in str(file):  # sd.cpp's prompt tags cannot carry them
        raise InputError(f"{what}: {file}: a path with ':' or '>' cannot be passed to stable-diffusion.cpp")
    return file


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")


@dataclass(frozen=True, eq=False)
class SdcppRequest(GenerationRequest):
    """``GenerationRequest`` plus PhotoMaker's fields (SDXL with ``photo_maker=FILE`` loaded):
    ``photomaker_images`` (the person's ID images: PIL images, arrays or paths, or one folder of
    them), ``photomaker_style_strength`` (sd.cpp's ``pm_style_strength``, a percentage of the steps;
    None: its 20) and ``photomaker_id_embeddings`` (PhotoMaker v2's ID embedding file, sd.cpp's
    ``pm_id_embed_path``). The prompt names the class word followed by the trigger ``img``."""

    photomaker_images: tuple[Any, ...] = ()
    photomaker_style_strength: float | None = None
    photomaker_id_embeddings: str | None = None

    @classmethod
    def checked(cls, values: dict[str, Any]) -> dict[str, Any]:
        out = super().checked(values)
        given = values.get("photomaker_images") or ()
        if isinstance(given, (str, os.PathLike)) and Path(given).is_dir():
            given = sorted(p for p in Path(given).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
            if not given:
                raise InputError(f"photomaker_images: {values['photomaker_images']} holds no image files")
        elif not isinstance(given, (list, tuple)):
            given = (given,)
        out["photomaker_images"] = tuple(open_init_image(image, "PhotoMaker ID image") for image in given)
        strength = values.get("photomaker_style_strength")
        if strength is not None:
            out["photomaker_style_strength"] = as_float(strength, "photomaker_style_strength")
        embeddings = values.get("photomaker_id_embeddings")
        if embeddings is not None:
            out["photomaker_id_embeddings"] = str(adapter_file(embeddings, "photomaker_id_embeddings"))
        return out


class SdcppPipeline(Pipeline):
    """A model run by stable-diffusion.cpp. Create one with ``sdkit.load_pipeline(path,
    backend="sdcpp")`` (a ``.gguf`` file needs no ``backend``)."""

    request_class: ClassVar[type[GenerationRequest]] = SdcppRequest
    features: ClassVar[frozenset[Feature]] = frozenset(
        {
            Feature.IMG2IMG, Feature.MASK, Feature.HIRES, Feature.VAE_TILING, Feature.PROMPT_WEIGHTING, Feature.LORA,
            Feature.CONTROLNET,
        }
    )  # fmt: skip
    family_name: ClassVar[str] = "stable-diffusion.cpp"

    def __init__(self, config: PipelineConfig, context: Context, family: str) -> None:
        super().__init__(config, {})
        self.context = context
        self.family = family  # as the file's tensor names say (sdkit.families.gguf_reader)
        self.loras: list[tuple[Path, float]] = []
        self.controlnet: str | None = None  # the loaded ControlNet's name (its file's stem)

    # -- lifecycle --------------------------------------------------------------------------

    def prepare(self) -> None:
        """Create the sd.cpp context (load the model files) now rather than at the first run."""
        self.context.model()

    def close(self) -> None:
        self.context.release()

    def backends(self) -> dict[str, str | None]:
        device = binding.build_info().gpu_kind or "cpu"
        return {"pipeline": f"sdcpp ({device})" if self.context.loaded else None}

    # -- adapters: files handed to sd.cpp ---------------------------------------------------

    def set_loras(self, loras: Sequence[LoraSpec]) -> dict[str, WeightSwap]:
        """LoRA files with strengths, applied by sd.cpp at each generation (no reload)."""
        chosen = []
        for path, strength in loras:
            value = float(strength)
            if not np.isfinite(value):
                raise InputError(f"LoRA strength must be a finite number, got {strength!r} for {path}")
            chosen.append((adapter_file(path, "LoRA"), value))
        if chosen:
            refuse_undeclared({Feature.LORA}, self.features, self.family_name)
        self.loras = chosen
        return {}

    def load_embedding(self, path: str | os.PathLike[str], name: str | None = None) -> dict[str, WeightSwap]:
        """A textual-inversion embedding; sd.cpp triggers it by its file's stem (so ``name``, if
        given, must be that). The context loads again at the next generation."""
        file = adapter_file(path, "embedding")
        if name is not None and name != file.stem:
            raise InputError(
                f"embedding name {name!r}: stable-diffusion.cpp names an embedding by its file ({file.stem})"
            )
        kept = tuple(p for p in self.context.files.embeddings if p.stem != file.stem)
        self.context.with_files(embeddings=(*kept, file))
        return {"pipeline": "recompile"}

    def unload_embeddings(self, names: Sequence[str] | None = None) -> dict[str, WeightSwap]:
        loaded = [p.stem for p in self.context.files.embeddings]
        wanted = loaded if names is None else [str(n) for n in ([names] if isinstance(names, str) else names)]
        missing = [n for n in wanted if n not in loaded]
        if missing:
            raise InputError(f"no embedding {missing[0]!r} is loaded (loaded: {', '.join(loaded) or 'none'})")
        self.context.with_files(embeddings=tuple(p for p in self.context.files.embeddings if p.stem not in wanted))
        return {"pipeline": "recompile"}

    def set_vae(self, path: str | os.PathLike[str] | None) -> dict[str, WeightSwap]:
        """A standalone VAE file instead of the model's (None: the model's again); the context
        loads again at the next generation."""
        vae = None if path is None else adapter_file(path, "VAE")
        self.context.with_files(vae=vae)
        return {"pipeline": "recompile"}

    def set_controlnets(
        self, controlnets: Any, backend: str | None = None, device: Any = None, memory: str | None = None, **_: Any
    ) -> None:
        """One ControlNet file (``.safetensors``/``.gguf``), or ``{name: file}`` with one entry;
        None or ``[]``: none. sd.cpp loads it with the model (the context loads again at the next
        generation) and runs it on the model's device: a second one, or another backend, is refused."""
        named = named_paths(controlnets) if controlnets else {}
        if len(named) > 1:
            raise OptionError(
                f"controlnets: stable-diffusion.cpp loads one ControlNet with the model, not {len(named)} "
                f"({', '.join(named)})"
            )
        if backend not in (None, "auto", "sdcpp"):
            raise OptionError(f"controlnet backend {backend!r}: stable-diffusion.cpp runs the ControlNet itself")
        if not named:
            self.controlnet = None
            self.context.with_files(control_net=None)
            return
        [(name, path)] = named.items()
        file = adapter_file(path, "ControlNet")
        self.controlnet = Path(name).stem if Path(name).suffix.lower() in ADAPTER_SUFFIXES else name
        self.context.with_files(control_net=file)

    def set_checkpoint(self, path: str | os.PathLike[str], prediction: str | None = None) -> dict[str, WeightSwap]:
        raise ModelFormatError(f"{self.name}: load {Path(path).name} with sdkit.load_pipeline(..., backend='sdcpp')")

    # -- generation -------------------------------------------------------------------------

    def plan(self, request: GenerationRequest) -> GenerationPlan:
        """Every check that needs no model: features, the fields sd.cpp cannot honour, the sampler
        and schedule names, the size (img2img: the init image's, rounded down to a multiple of 8)."""
        self.refuse_unsupported(request)
        refuse_unsupported_fields(request)
        photomaker_kwargs(request, self.context.files.photo_maker is not None)
        to_sdcpp(request.sampler, request.schedule)
        width, height = request.width, request.height
        if request.init_image is not None:
            width, height = init_image_size(request.init_image, width, height)
        width = self.config.default_size if width is None else width
        height = self.config.default_size if height is None else height
        if not 0 <= request.seed < SEED_LIMIT - request.num_images:
            raise InputError(f"seed: stable-diffusion.cpp takes seeds from 0 to 2**63 - 1, not {request.seed}")
        seeds = seed_list(request.seed, request.num_images)
        shape = (request.num_images, self.config.latent_channels, height // 8, width // 8)
        # sdkit's memory budget, before sd.cpp allocates (it aborts the process when it cannot)
        check_generation(request.num_images, width, height, shape, request.init_image is not None)
        return GenerationPlan(request, width, height, shape, seeds, cast("Any", None))

    def run(self, request: GenerationRequest) -> Any:
        """One ``generate_image`` call for the checked request."""
        plan = self.plan(self.accept(request))
        kwargs = generate_kwargs(plan.request, plan.width, plan.height, self.loras, self.family, self.controlnet)
        kwargs.update(photomaker_kwargs(plan.request, self.context.files.photo_maker is not None))
        images = self.context.generate(kwargs, plan.request.callback)
        if len(images) != len(plan.seeds):
            raise ModelFormatError(f"stable-diffusion.cpp returned {len(images)} images for {len(plan.seeds)}")
        rgb = [image.convert("RGB") for image in images]
        if plan.request.output_type == "np":
            return np.stack([np.asarray(image, np.float32) / 255.0 for image in rgb])
        for seed, image in zip(plan.seeds, rgb, strict=True):
            params = self.parameters(plan, seed)
            image.info["parameters"] = params.a1111_text()
            image.info["sdkit_parameters"] = params
        return rgb

    def parameters(self, plan: GenerationPlan, seed: int) -> GenerationParameters:
        """A1111's fields, with the engine and the LoRAs (A1111's ``Lora hashes`` is by name)."""
        plan.parameters.setdefault("Engine", "stable-diffusion.cpp")
        if self.loras:
            plan.parameters.setdefault("Lora", ", ".join(f"{p.stem}: {w:g}" for p, w in self.loras))
        if plan.request.enable_hr:
            plan.parameters.setdefault("Hires upscaler", plan.request.hr_upscaler)
        params = super().parameters(plan, seed)
        if plan.request.init_image is not None:  # the base class reads it from the plan's VAE input
            params = dataclasses.replace(params, strength=float(plan.request.strength))
        return params


@dataclass(frozen=True, eq=False)
class SdcppFlowRequest(FlowRequest):
    """``FlowRequest`` plus ``reference_images``: images a FLUX.1 Kontext, FLUX.2 or Qwen-Image edit
    model reads besides the prompt (sd.cpp's ``ref_images``; PIL images, HxWx3 arrays or paths).
    Another family refuses them naming the field (``request_map.reference_kwargs``)."""

    reference_images: tuple[Any, ...] = ()

    @classmethod
    def checked(cls, values: dict[str, Any]) -> dict[str, Any]:
        out = super().checked(values)
        given = values.get("reference_images") or ()
        if not isinstance(given, (list, tuple)):
            given = (given,)
        out["reference_images"] = tuple(open_init_image(image, "reference image") for image in given)
        return out


class SdcppFlowPipeline(SdcppPipeline):
    """A flow-matching model (FLUX.1, SD3, Chroma, Qwen-Image, Z-Image, Wan) run by
    stable-diffusion.cpp: its requests default to Euler, as sdkit's own flow pipelines, and take
    ``reference_images`` (``SdcppFlowRequest``)."""

    request_class: ClassVar[type[GenerationRequest]] = SdcppFlowRequest
