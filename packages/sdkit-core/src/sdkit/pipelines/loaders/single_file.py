"""The checkpoint pipeline loader: a user's ``.safetensors`` checkpoint (LDM/SGM or diffusers
keys, fp32/fp16/bf16, EMA keys or not) or a diffusers folder of safetensors weights
(``unet/diffusion_pytorch_model.safetensors``...), run on the shipped graphs of its family.

No ``.onnx`` is written and nothing is exported: the family's weightless graphs are filled with
the file's tensors by name, each read from the memory-mapped file and converted when a backend
asks for it (``sdkit.families``). Registered by core's plugin like the folder loader; ``sniff``
takes ``.safetensors`` files and diffusers folders holding ``unet/*.safetensors``.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any, ClassVar

from sdkit.errors import SdkitError, UnsupportedFamilyError
from sdkit.families import Checkpoint, Family
from sdkit.families.checkpoint import is_diffusers_folder
from sdkit.pipelines.loaders.families import detect_checkpoint, open_for_pipeline, pipeline_class
from sdkit.pipelines.loaders.loading import PipelineLoader
from sdkit.pipelines.models.base import Pipeline
from sdkit.pipelines.stages.components import LoadSettings


class CheckpointLoader(PipelineLoader):
    """``load_pipeline("model.safetensors")``: detect the family, map the weights, build its pipeline."""

    name: ClassVar[str] = "checkpoint"
    priority: ClassVar[int] = 30  # before the ONNX folder loader: a folder of safetensors is ours
    takes_component_files: ClassVar[bool] = True

    def sniff(self, path: Path) -> bool:
        path = Path(path)
        return (path.is_file() and path.suffix.lower() == ".safetensors") or is_diffusers_folder(path)

    def explain(self, path: Path) -> str:
        path = Path(path)
        if path.is_file():
            return f"{path.name} is not a .safetensors checkpoint"
        return ""

    def pipeline_class(self, path: Path) -> type[Pipeline] | None:
        """The detected family's pipeline class, from the file's header alone (None when the
        file is not one: ``load_pipeline`` then says why)."""
        try:
            family = detect_checkpoint(Checkpoint.open(path)).family
            return _pipeline_class(family, Path(path).name)
        except SdkitError:
            return None

    def build(self, path: Path, settings: LoadSettings) -> Pipeline:
        # The family is read from the header once; its pipeline class is resolved first (a file
        # whose pipeline is missing is refused for that, before its graphs are looked for: both
        # in ``pipeline_class``), and the mapping takes the same detection.
        checkpoint = Checkpoint.open(path)
        found = detect_checkpoint(checkpoint, settings.prediction)
        cls = _pipeline_class(found.family, Path(path).name)
        opener = partial(open_for_pipeline, files=settings.files) if settings.files else open_for_pipeline
        opened = opener(checkpoint, settings.prediction, detected=found)
        config = opened.config
        make = partial(
            settings.components, cls.component_names, outputs=config.text_outputs, fp32=config.fp32_components
        )
        pipeline = cls(config, make(opened.sources))
        pipeline.bind_checkpoint(opened.mapped, opener, make)  # set_checkpoint keeps the component files
        return pipeline


def _pipeline_class(family: Family, what: str) -> type[Pipeline]:
    cls: Any = pipeline_class(family, what)
    if not (isinstance(cls, type) and issubclass(cls, Pipeline)):
        raise UnsupportedFamilyError(f"family {family.name!r}: {family.pipeline} is not a Pipeline class")
    return cls
