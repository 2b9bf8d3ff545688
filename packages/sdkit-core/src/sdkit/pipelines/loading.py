"""``sdkit.load_pipeline`` and the model loader that recognises pipeline folders."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from sdkit.device import Device
from sdkit.errors import OptionError
from sdkit.pipelines.components import COMPONENT_NAMES, MEMORY_POLICIES, Component, per_component
from sdkit.pipelines.layout import is_pipeline_dir, read_layout
from sdkit.pipelines.stable_diffusion import StableDiffusionPipeline
from sdkit.pipelines.tokenizer import ClipTokenizer

# What the pipeline reads from each component (optimum's output names).
READ_OUTPUTS = {"text_encoder": ("last_hidden_state",), "unet": (), "vae_decoder": (), "vae_encoder": ()}


def load_pipeline(
    path: str | os.PathLike[str],
    backend: str | Mapping[str, str] = "auto",
    device: str | Device | Mapping[str, str | Device | None] | None = None,
    memory: str = "keep",
    **options: Any,
) -> StableDiffusionPipeline:
    """Load a diffusers/optimum ONNX Stable Diffusion 1.x/2.x pipeline folder.

    ``backend`` and ``device`` apply to every component, or per component as a mapping, e.g.
    ``backend={"unet": "ggml", "default": "auto"}`` (components: ``text_encoder``, ``unet``,
    ``vae_decoder``, ``vae_encoder``). ``memory="keep"`` compiles the text encoder, UNet and VAE
    decoder now and keeps them resident; ``"offload"`` loads, compiles, runs and releases each one
    when it is needed. ``options`` (precision, threads, cache, ...) go to every ``sdkit.compile``.
    """
    if memory not in MEMORY_POLICIES:
        raise OptionError(f"unknown memory policy {memory!r}; choose one of {', '.join(MEMORY_POLICIES)}")
    layout = read_layout(path)
    backends = per_component(backend, COMPONENT_NAMES, "backend", "auto")
    devices = per_component(device, COMPONENT_NAMES, "device", None)
    tokenizer = ClipTokenizer(layout.tokenizer_dir)
    components = {
        name: Component(name, file, backends[name], devices[name], options, memory, READ_OUTPUTS[name])  # type: ignore[arg-type]
        for name, file in layout.model_files.items()
    }
    pipeline = StableDiffusionPipeline(layout, components, tokenizer)
    if memory == "keep":
        try:
            for name in ("text_encoder", "unet", "vae_decoder"):
                components[name].prepare()
        except BaseException:
            pipeline.close()  # release what compiled before the failure
            raise
    return pipeline


class DiffusersOnnxLoader:
    """Model loader for pipeline folders (``model_index.json`` inside): returns a pipeline."""

    name: ClassVar[str] = "diffusers-onnx"
    priority: ClassVar[int] = 20

    def sniff(self, path: Path) -> bool:
        return is_pipeline_dir(Path(path))

    def load(self, path: Path, **kwargs: Any) -> StableDiffusionPipeline:
        return load_pipeline(path, **kwargs)
