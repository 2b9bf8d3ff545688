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
TEXT_ENCODER_FILES = ("clip_l", "clip_g", "t5xxl", "llm")
# Tensor-name prefixes of a whole checkpoint's VAE and text encoders (SD/SDXL/SD3/FLUX.1 checkpoints).
WHOLE_PREFIXES = ("first_stage_model.", "cond_stage_model.", "conditioner.", "text_encoders.", "vae.")
# The component files each family takes (sd.cpp's --clip_l, --clip_g, --t5xxl, --llm, --clip_vision,
# --high-noise-diffusion-model; every family takes --vae), most specific prefix first ...
TAKES: dict[str, tuple[str, ...]] = {
    "SD3": ("clip_l", "clip_g", "t5xxl"),
    "FLUX.2": ("llm",),
    "FLUX.1": ("clip_l", "t5xxl"),
    "Chroma": ("t5xxl",),
    "Qwen-Image": ("llm",),
    "Z-Image": ("llm",),
    "Wan2.1": ("t5xxl", "clip_vision"),
    "Wan2.2 TI2V": ("t5xxl",),  # umT5 as --t5xxl, as sd.cpp's CLI takes it
    "Wan": ("t5xxl", "high_noise_diffusion_model"),  # Wan2.2 (and T2V, the same layout in 2.1)
}
# ... and the ones a denoiser-only file of the family cannot run without (besides the VAE).
FAMILY_FILES: dict[str, tuple[str, ...]] = {
    "SD3": ("clip_l", "clip_g", "t5xxl"),
    "FLUX.2": ("llm",),
    "FLUX.1": ("clip_l", "t5xxl"),
    "Chroma": ("t5xxl",),
    "Qwen-Image": ("llm",),
    "Z-Image": ("llm",),
    "Wan2.1 I2V": ("t5xxl", "clip_vision"),
    "Wan": ("t5xxl",),
}


def file_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's name and shape, from the file's header only (checked complete: a truncated
    file never reaches sd.cpp's loader). A ``.gguf`` name is read as GGUF whatever its first
    bytes, so a damaged one is refused as GGUF, not as a safetensors file."""
    if gguf.is_gguf(path) or path.suffix.lower() == ".gguf":
        header = gguf.read_header(path)
        header.check_complete()
        return {tensor.name: tuple(tensor.shape) for tensor in header.tensors}
    from sdkit.families.safetensors_reader import SafetensorsFile

    entries = SafetensorsFile(path).entries
    return {name: tuple(entry.shape) for name, entry in entries.items()}


def file_family(path: Path) -> str:
    """The family the file's tensor names say (``gguf.family_of``)."""
    return gguf.family_of(file_shapes(path))


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
        from sdkit_sdcpp.video import pipeline_class

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
        from sdkit_sdcpp.video import pipeline_class

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
        shapes = file_shapes(path)
        context = Context(model_files(path, settings.files, shapes), ContextSettings.from_options(
            dict(settings.options), settings.memory, environment
        ))  # fmt: skip
        family = gguf.family_of(shapes)
        config = PipelineConfig(name=path.stem, sample_size=native_size(family) // 8)
        return pipeline_class(family)(config, context, family)


def whole_checkpoint(names: Any) -> bool:
    """Whether the tensor names hold a VAE or a text encoder beside the denoiser (a checkpoint,
    sd.cpp's ``model_path``), rather than the denoiser alone (``diffusion_model_path``)."""
    return any(name.startswith(WHOLE_PREFIXES) for name in names)


def _matching(table: dict[str, tuple[str, ...]], family: str) -> tuple[str, ...]:
    """The entry of the first prefix of ``family`` in ``table`` (none: ``()``)."""
    return next((files for prefix, files in table.items() if family.startswith(prefix)), ())


def _needed(family: str) -> tuple[str, ...]:
    """The component files a denoiser-only file of ``family`` needs (sd.cpp cannot load without them)."""
    return _matching(FAMILY_FILES, family)


def check_component_files(name: str, family: str, whole: bool, given: dict[str, Path]) -> None:
    """A given file the family does not take, or one a denoiser-only file needs and lacks, is a
    ``ModelFormatError`` naming the keyword (and the CLI's flag)."""
    takes = (*_matching(TAKES, family), "vae", *(("photo_maker",) if family.startswith("SDXL") else ()))
    for key in given:
        if key not in takes:
            raise ModelFormatError(
                f"{key}= (--{_flag(key)}): {name} is a {family} file; it takes {', '.join(f'{t}=' for t in takes)}"
            )
    needed = (*_needed(family), "vae") if _needed(family) and not whole else ()
    if key_missing := [key for key in needed if key not in given]:
        key = key_missing[0]
        raise ModelFormatError(
            f"{key}= (--{_flag(key)}): {name} holds only the {family} denoiser; stable-diffusion.cpp needs its "
            f"{', '.join(f'{k}=' for k in (*_needed(family), 'vae'))} files too"
        )


def _flag(key: str) -> str:
    return key.replace("_", "-") if key in ("high_noise_diffusion_model", "photo_maker") else key


def model_files(path: Path, files: Any, shapes: dict[str, tuple[int, ...]] | None = None) -> ModelFiles:
    """A whole checkpoint (``model_path``), or a denoiser-only file (``diffusion_model_path``: a
    transformer family's file whose tensor names hold no VAE or text encoder, or any file given
    with text encoder files) with the
    component files its family needs (``check_component_files``)."""
    given = {name: Path(value).expanduser() for name, value in dict(files).items()}
    for name, file in given.items():
        if not file.is_file():
            raise ModelFormatError(f"{name}: no such file: {file}")
    shapes = file_shapes(path) if shapes is None else shapes
    family = gguf.family_of(shapes)
    # a UNet family's file (SD 1.x/2.x, SDXL) is sd.cpp's model_path unless text encoders are given
    whole = (whole_checkpoint(shapes) or not _needed(family)) and not any(name in given for name in TEXT_ENCODER_FILES)
    check_component_files(path.name, family, whole, given)
    return ModelFiles(
        model=path if whole else None,
        diffusion_model=None if whole else path,
        clip_l=given.get("clip_l"),
        clip_g=given.get("clip_g"),
        t5xxl=given.get("t5xxl"),
        vae=given.get("vae"),
        llm=given.get("llm"),
        clip_vision=given.get("clip_vision"),
        high_noise_diffusion_model=given.get("high_noise_diffusion_model"),
        photo_maker=given.get("photo_maker"),
    )
