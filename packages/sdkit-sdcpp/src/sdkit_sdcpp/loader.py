"""The pipeline loader sdkit-sdcpp registers: ``.gguf`` files with any backend but a graph backend
named, and ``.safetensors`` / ``.gguf`` single files when the user names ``backend="sdcpp"``.

It is an engine (``engine = "sdcpp"``): ``load_pipeline(path, backend="sdcpp")`` comes here for
every file it ``accepts``, and ``sdkit backends`` lists it from ``probe`` and ``devices``. Importing
this module imports no binding: ``sniff`` reads four bytes, ``probe`` imports the binding.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from sdkit.backend import Availability
from sdkit.device import Device
from sdkit.errors import BackendUnavailableError, ModelFormatError, OptionError
from sdkit.families import gguf_reader as gguf
from sdkit.pipelines import Pipeline, PipelineConfig, PipelineLoader
from sdkit.pipelines.stages.components import LoadSettings
from sdkit_sdcpp import binding
from sdkit_sdcpp.context import Context
from sdkit_sdcpp.engine import ContextSettings, ModelFiles

SINGLE_FILES = (".gguf", ".safetensors", ".sft")
# Component files load_pipeline takes (clip_l=, ...): they make ``path`` a transformer-only file.
TEXT_ENCODER_FILES = ("clip_l", "clip_g", "t5xxl")


def file_family(path: Path) -> str:
    """The family the file's tensor names say (``gguf.family_of``), from its header only (checked
    complete: a truncated file never reaches sd.cpp's loader). A ``.gguf`` name is read as GGUF
    whatever its first bytes, so a damaged one is refused as GGUF, not as a safetensors file."""
    if gguf.is_gguf(path) or path.suffix.lower() == ".gguf":
        header = gguf.read_header(path)
        header.check_complete()
        return header.family
    from sdkit.families.safetensors_reader import SafetensorsFile

    entries = SafetensorsFile(path).entries
    return gguf.family_of({name: tuple(entry.shape) for name, entry in entries.items()})


def native_size(family: str) -> int:
    from sdkit_sdcpp.pipeline import LARGE_FAMILIES

    return 1024 if family.startswith(LARGE_FAMILIES) else 512


class SdcppLoader(PipelineLoader):
    """stable-diffusion.cpp's pipelines (``SdcppPipeline``)."""

    name: ClassVar[str] = "sdcpp"
    engine: ClassVar[str] = "sdcpp"
    priority: ClassVar[int] = 30
    takes_component_files: ClassVar[bool] = True
    description: ClassVar[str] = "stable-diffusion.cpp: whole pipelines from .gguf (quantized) and single files"

    def sniff(self, path: Path) -> bool:
        return path.is_file() and path.suffix.lower() == ".gguf" and gguf.is_gguf(path)

    def accepts(self, path: Path) -> bool:
        return path.is_file() and path.suffix.lower() in SINGLE_FILES

    def explain(self, path: Path) -> str:
        if path.is_dir():
            return f"{path.name} is a folder: stable-diffusion.cpp reads single files (.gguf, .safetensors)"
        if path.suffix.lower() == ".gguf":
            return f"{path.name} has no GGUF header"
        return f"{path.name}: stable-diffusion.cpp is given .gguf or .safetensors files"

    def pipeline_class(self, path: Path) -> type[Pipeline] | None:
        from sdkit_sdcpp.pipeline import pipeline_class

        try:
            return pipeline_class(file_family(path))
        except ModelFormatError:  # not a file it can read: load_pipeline says why
            return None

    def probe(self) -> Availability:
        try:
            info = binding.build_info()
        except BackendUnavailableError as exc:
            return Availability(False, exc.reason, exc.install_hint)
        built = "+".join(info.backends)
        return Availability(True, f"stable-diffusion.cpp built for {built}", version=info.version)

    def devices(self) -> list[Device]:
        return binding.devices()

    def build(self, path: Path, settings: LoadSettings) -> Pipeline:
        from sdkit_sdcpp.pipeline import pipeline_class

        backend = settings.backend
        if backend not in ("auto", "sdcpp"):
            raise OptionError(
                f"{path.name} runs on stable-diffusion.cpp (backend='sdcpp' or 'auto'), not on {backend!r}: "
                "sdkit's graph backends do not read GGUF files"
            )
        if settings.prediction is not None:
            raise OptionError("prediction: stable-diffusion.cpp reads the prediction type from the file")
        device = settings.device
        if device is not None and not isinstance(device, (str, Device)):
            raise OptionError("device: stable-diffusion.cpp runs the whole pipeline on one device, not per component")
        environment = binding.check_device(device)  # the binding is imported here: a clear error if missing
        context = Context(model_files(path, settings.files), ContextSettings.from_options(
            dict(settings.options), settings.memory, environment
        ))  # fmt: skip
        family = file_family(path)
        config = PipelineConfig(name=path.stem, sample_size=native_size(family) // 8)
        return pipeline_class(family)(config, context, family)


def model_files(path: Path, files: Any) -> ModelFiles:
    """A whole checkpoint, or with a text encoder file given, a transformer-only file."""
    given = {name: Path(value).expanduser() for name, value in dict(files).items()}
    for name, file in given.items():
        if not file.is_file():
            raise ModelFormatError(f"{name}: no such file: {file}")
    standalone = any(name in given for name in TEXT_ENCODER_FILES)
    return ModelFiles(
        model=None if standalone else path,
        diffusion_model=path if standalone else None,
        clip_l=given.get("clip_l"),
        clip_g=given.get("clip_g"),
        t5xxl=given.get("t5xxl"),
        vae=given.get("vae"),
    )
