"""``sdkit.load_pipeline``: the pipeline loaders registered through
``sdkit_register_model_loaders`` decide what a path is; ``PipelineLoader`` is their base.

Core's loaders: the single-file checkpoint (``sdkit.pipelines.loaders.single_file``: a ``.safetensors``
file or a diffusers safetensors folder on a registered family's shipped graphs) and the
diffusers/optimum ONNX folder (``sdkit.pipelines.loaders.diffusers_folder``). Another format plugs in the
same way: a ``PipelineLoader`` subclass whose ``sniff`` recognises its files and whose ``build``
returns a pipeline from a ``PipelineConfig`` and component sources.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from sdkit.device import Device
from sdkit.errors import ModelFormatError, OptionError
from sdkit.families import gguf_reader
from sdkit.known_backends import pipeline_engine, plugin_problem, unavailable
from sdkit.loaders import loaders_by_priority
from sdkit.model import refuse_unsafe_or_missing
from sdkit.pipelines.loaders.engine_timings import (
    SDKIT,
    EngineChoice,
    engine_loaders,
    measured_engine,
    own_loader_reads,
)
from sdkit.pipelines.models.base import Pipeline
from sdkit.pipelines.stages.components import LoadSettings, per_component
from sdkit.plugins import get_plugins


def load_pipeline(
    path: str | os.PathLike[str],
    backend: str | Mapping[str, str] = "auto",
    device: str | Device | Mapping[str, str | Device | None] | None = None,
    memory: str = "keep",
    prediction: str | None = None,
    **options: Any,
) -> Pipeline:
    """Load a pipeline with the first registered pipeline loader that recognises ``path``: a
    single-file ``.safetensors`` checkpoint of a registered model family (SD 1.x/2.x, SD 1.x
    inpainting, SDXL base and refiner, FLUX.1 dev/schnell, SD3 / SD 3.5, Chroma; SDXL inpainting
    files are recognised and refused until its graph is shipped; a transformer-only file takes
    its other components as ``clip_l=``, ``clip_g=``, ``t5xxl=``, ``vae=`` paths), a diffusers
    folder of safetensors weights, or a diffusers/optimum ONNX folder of a family that reads
    folders (SD 1.x/2.x, SDXL, SD3, Flux, Chroma; a plugin's family alike:
    ``sdkit.families.FolderSpec``).

    A pipeline engine's name as ``backend`` (``"sdcpp"``: stable-diffusion.cpp, sdkit-sdcpp) hands
    the file to that engine's loader, which runs the whole pipeline; its loader also claims the
    files only it reads (``.gguf``) under ``"auto"``, and a single file sdkit's own pipelines read
    too where ``sdkit tune`` measured the engine faster per whole image on it, here
    (``engine_timings``; ``pipeline.engine_choice`` says why). Unmeasured, ``"auto"`` keeps sdkit's.

    ``backend`` and ``device`` apply to every component, or per component as a mapping, e.g.
    ``backend={"unet": "ggml", "default": "auto"}`` (components: ``text_encoder``, ``unet``,
    ``vae_decoder``, ``vae_encoder``; SDXL adds ``text_encoder_2``; SD3, Flux and Chroma have a
    ``transformer`` for the UNet, and their T5 is ``text_encoder_3``, ``text_encoder_2`` and
    ``text_encoder``). ``memory="keep"`` compiles the text encoder(s), denoiser and VAE decoder
    now and keeps them resident; ``"offload"`` loads, compiles, runs and releases each one when
    it is needed. ``prediction`` (``"v"`` or
    ``"epsilon"``) says what the model predicts where its files do not (a checkpoint without its
    A1111 ``.yaml``), or overrides them. ``options`` (precision, threads, cache, ...) go to every
    ``sdkit.compile``; ``precision`` may be a per-component mapping too, and the VAE of SDXL and
    the flow families stays fp32 unless that mapping names it. ``tune=True`` chooses each ``auto``
    component's backend by measurement at the shapes it runs at (its first run per shape measures,
    or reads the timings a tune stored; see ``sdkit.compile``).

    ``controlnets=`` (a folder, a list of folders or ``{name: folder}``) loads ControlNets with the
    pipeline, as ``pipe.set_controlnets``; a per-component ``backend``/``device`` mapping names
    them all ``"controlnet"``. ``prepare=False`` compiles nothing now (each component compiles
    when first used): ``pipe.plan(request)`` can then check a request against the model before
    anything compiles, as ``sdkit generate`` does, and ``pipe.prepare()`` compiles.
    """
    path = Path(path).expanduser()
    refuse_unsafe_or_missing(path, "pipeline")
    if prediction is not None:
        options["prediction"] = prediction
    engine = engine_loader(backend)
    if engine is not None:  # backend="sdcpp": that engine's loader, whatever the file
        if not engine.accepts(path):
            raise ModelFormatError(engine.explain(path) or f"{engine.engine} does not read {path.name}")
        chosen: Pipeline = engine.load(path, backend=backend, device=device, memory=memory, **options)
        return chosen
    reason = ""
    if backend == "auto":  # a single file an engine also reads: sdkit's pipeline unless measured slower
        loader, choice = measured_choice(path, device, options)
        if loader is not None and choice is not None:
            found: Pipeline = loader.load(path, backend=loader.engine, device=device, memory=memory, **options)
            found.engine_choice = choice.reason
            return found
        reason = choice.reason if choice is not None else ""
    return load_with_loaders(path, backend, device, memory, options, reason)


def load_with_loaders(
    path: Path, backend: Any, device: Any, memory: str, options: dict[str, Any], reason: str = ""
) -> Pipeline:
    """The first pipeline loader that sniffs ``path`` (sdkit's own pipelines for the files core
    reads), without asking the stored whole-image timings."""
    loaders = loaders_by_priority("pipeline")
    for loader in loaders:
        if loader.sniff(path):
            pipeline: Pipeline = loader.load(path, backend=backend, device=device, memory=memory, **options)
            pipeline.engine_choice = reason or pipeline.engine_choice
            return pipeline
    if path.is_file() and gguf_reader.is_gguf(path):  # no loader took it: the engine that reads GGUF is missing
        return _no_gguf_engine(path)
    reasons = [(loader.name, loader.explain(path)) for loader in loaders if hasattr(loader, "explain")]
    reasons = [(name, why) for name, why in reasons if why]
    if len(reasons) == 1:  # one format: its own words (e.g. "it has no model_index.json")
        raise ModelFormatError(reasons[0][1])
    listed = "; ".join(f"{name}: {why}" for name, why in reasons) or ", ".join(loader.name for loader in loaders)
    raise ModelFormatError(f"no pipeline loader recognises {path} ({listed or 'none is registered'})")


def measured_choice(path: Path, device: Any, options: dict[str, Any]) -> tuple[Any | None, EngineChoice | None]:
    """The engine's loader and why, when stored whole-image timings (``sdkit tune``,
    ``engine_timings``) measured it faster than sdkit's own pipeline on this file, here;
    ``(None, why)`` when they measured sdkit's faster; ``(None, None)`` without any: no engine
    reads the file, or none was measured (an engine is never chosen unmeasured)."""
    if not own_loader_reads(path):
        return None, None  # a folder, or a file only an engine reads (.gguf): that engine's already
    choice = measured_engine(path, device, options)  # None at once where no tune measured a file
    if choice is None or choice.engine == SDKIT:
        return None, choice
    loader = next((found for found in engine_loaders(path) if found.engine == choice.engine), None)
    return loader, choice


def _no_gguf_engine(path: Path) -> Pipeline:
    """A GGUF file with no pipeline loader for it: the plugin that runs GGUF files is missing."""
    known = pipeline_engine("sdcpp")
    assert known is not None
    plugins = get_plugins()
    problem = plugin_problem(known, plugins.failures, plugins.disabled)
    error = unavailable(known, problem)
    raise type(error)(
        known.name,
        f"{path.name} is a GGUF file, which sdkit runs on {known.runs_on}; " + error.reason,
        error.install_hint,
    )


def engine_loader(backend: object) -> Any | None:
    """The pipeline loader of the engine ``backend`` names (``"sdcpp"``: a loader registered with
    ``engine = "sdcpp"``), None for any other backend; a first-party engine whose plugin is not
    loaded is a ``BackendUnavailableError`` with the command that installs it."""
    if not isinstance(backend, str):
        return None
    wanted = backend.strip().lower()
    for loader in loaders_by_priority("pipeline"):
        if getattr(loader, "engine", "") == wanted:
            return loader
    known = pipeline_engine(wanted)
    if known is None:
        return None
    plugins = get_plugins()
    raise unavailable(known, plugin_problem(known, plugins.failures, plugins.disabled))


def pipeline_class_for(path: str | os.PathLike[str], backend: object = "auto") -> type[Pipeline] | None:
    """The pipeline class ``load_pipeline(path, backend=backend)`` would make, without loading any
    model (None when the path's loader cannot tell, or no loader takes it, a missing path included:
    ``load_pipeline`` then says why)."""
    path = Path(path).expanduser()
    engine = engine_loader(backend)
    if engine is not None:
        return engine.pipeline_class(path) if engine.accepts(path) else None
    for loader in loaders_by_priority("pipeline"):
        if loader.sniff(path):
            found = getattr(loader, "pipeline_class", None)
            result: type[Pipeline] | None = found(path) if callable(found) else None
            return result
    return None


class PipelineLoader(ABC):
    """Base of the loaders ``load_pipeline`` dispatches to (``kind = "pipeline"``).

    Subclasses set ``name`` and ``priority`` and implement ``sniff`` (cheap: a suffix, a file in
    a folder, a header) and ``build``; ``explain`` says why a path is not theirs. ``load`` checks
    the settings, builds, and compiles the resident components under ``memory="keep"``.
    """

    name: ClassVar[str]
    priority: ClassVar[int] = 0
    kind: ClassVar[str] = "pipeline"
    # An engine that runs whole pipelines (stable-diffusion.cpp): ``load_pipeline(path,
    # backend=engine)`` uses this loader for every path it ``accepts``, and
    # ``sdkit.pipeline_engines()`` lists it from its ``probe()``, ``devices()`` and ``description``.
    # "" for the others.
    engine: ClassVar[str] = ""
    takes_component_files: ClassVar[bool] = False  # clip_l=, t5xxl=, vae= (a Flux transformer file's)

    @abstractmethod
    def sniff(self, path: Path) -> bool:
        """Whether ``path`` is this loader's format."""

    def accepts(self, path: Path) -> bool:
        """Whether an engine's loader reads ``path`` when the user names the engine (by default,
        what it ``sniff``s)."""
        return self.sniff(path)

    def explain(self, path: Path) -> str:
        """Why ``path`` is not this loader's format (shown when no loader takes it)."""
        return ""

    def pipeline_class(self, path: Path) -> type[Pipeline] | None:
        """The pipeline class ``build`` would return for ``path``, found cheaply (config files,
        a header; no model loaded), or None when it cannot tell. The CLI uses it to check a
        request against the model (SDXL-only options, a refiner) before loading anything."""
        return None

    @abstractmethod
    def build(self, path: Path, settings: LoadSettings) -> Pipeline:
        """The pipeline for ``path``, with components made by ``settings.components(...)``."""

    def load(self, path: Path, controlnets: Any = None, prepare: bool = True, **kwargs: Any) -> Pipeline:
        """``sdkit.load_model`` and ``load_pipeline`` call this: ``kwargs`` are ``load_pipeline``'s."""
        settings = LoadSettings.create(**kwargs)
        if settings.files and not self.takes_component_files:
            given = ", ".join(f"{name}=" for name in settings.files)
            raise OptionError(f"{Path(path).name}: {given} is for a single-file model that lacks those components")
        pipeline = self.build(Path(path), settings)
        if controlnets:
            attach_controlnets(pipeline, controlnets, settings)
        if prepare and settings.memory == "keep":
            pipeline.prepare()
        return pipeline


def attach_controlnets(pipeline: Pipeline, controlnets: Any, settings: LoadSettings) -> None:
    """``pipeline.set_controlnets`` with the backend and device the settings give "controlnet"."""
    attach = getattr(pipeline, "set_controlnets", None)
    if attach is None:
        raise OptionError(f"{type(pipeline).__name__} takes no ControlNets")
    names = tuple(dict.fromkeys((*type(pipeline).component_names, "controlnet")))
    backend = per_component(settings.backend, names, "backend", "auto")["controlnet"]
    device = per_component(settings.device, names, "device", None)["controlnet"]
    attach(controlnets, backend=backend, device=device, memory=settings.memory, **settings.options)
