"""The checkpoint pipeline loader: a user's ``.safetensors`` checkpoint (LDM/SGM or diffusers
keys, fp32/fp16/bf16, EMA keys or not) or a diffusers folder of safetensors weights
(``unet/diffusion_pytorch_model.safetensors``...), run on the shipped graphs of its family.

No ``.onnx`` is written and nothing is exported: the family's weightless graphs are filled with
the file's tensors by name, each read from the memory-mapped file and converted when a backend
asks for it (``sdkit.families``). Registered by core's plugin like the folder loader; ``sniff``
takes ``.safetensors`` files and diffusers folders holding ``unet/*.safetensors``.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from sdkit.errors import UnsupportedFamilyError
from sdkit.families.checkpoint import is_diffusers_folder
from sdkit.pipelines.base import Pipeline
from sdkit.pipelines.components import LoadSettings
from sdkit.pipelines.families import checkpoint_config, checkpoint_sources, open_checkpoint, pipeline_class
from sdkit.pipelines.loading import PipelineLoader


class CheckpointLoader(PipelineLoader):
    """``load_pipeline("model.safetensors")``: detect the family, map the weights, build its pipeline."""

    name: ClassVar[str] = "checkpoint"
    priority: ClassVar[int] = 30  # before the ONNX folder loader: a folder of safetensors is ours

    def sniff(self, path: Path) -> bool:
        path = Path(path)
        return (path.is_file() and path.suffix.lower() == ".safetensors") or is_diffusers_folder(path)

    def explain(self, path: Path) -> str:
        path = Path(path)
        if path.is_file():
            return f"{path.name} is not a .safetensors checkpoint"
        return ""

    def build(self, path: Path, settings: LoadSettings) -> Pipeline:
        mapped = open_checkpoint(path, settings.prediction)
        cls = pipeline_class(mapped.family, Path(path).name)
        if not (isinstance(cls, type) and issubclass(cls, Pipeline)):
            raise UnsupportedFamilyError(
                f"family {mapped.family.name!r}: {mapped.family.pipeline} is not a Pipeline class"
            )
        config = checkpoint_config(mapped)
        components = settings.components(cls.component_names, checkpoint_sources(mapped), config.text_outputs)
        return cls(config, components, mapped)
