"""The diffusers/optimum ONNX folder layout of a Stable Diffusion 1.x/2.x pipeline.

```
model_index.json
text_encoder/model.onnx        input_ids -> last_hidden_state
unet/model.onnx                sample, timestep, encoder_hidden_states -> out_sample
vae_decoder/model.onnx         latent_sample -> sample
vae_encoder/model.onnx         sample -> latent_parameters (or latent_sample); img2img only
tokenizer/                     vocab.json + merges.txt (or tokenizer.json), tokenizer_config.json
scheduler/scheduler_config.json
```

Each ``<component>/config.json`` is optional; from it come the VAE's scaling factor and
downsampling factor and the UNet's default sample size (SD defaults otherwise): see
``sdkit.pipelines.diffusers_folder.folder_config``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sdkit.errors import ModelFormatError
from sdkit.model import refuse_unsafe_or_missing

REQUIRED = ("text_encoder", "unet", "vae_decoder")
OPTIONAL = ("vae_encoder",)
COMPONENTS = (*REQUIRED, *OPTIONAL)


def is_pipeline_dir(path: Path) -> bool:
    """The cheap sniff: a directory holding ``model_index.json``."""
    return path.is_dir() and (path / "model_index.json").is_file()


def read_json_object(path: Path, what: str = "file") -> dict[str, Any]:
    """A JSON file holding an object, or one ModelFormatError."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelFormatError(f"{what} {path} cannot be read: {exc}") from None
    if not isinstance(data, dict):
        raise ModelFormatError(f"{what} {path} does not hold a JSON object")
    return data


def read_optional_json_object(path: Path, what: str = "config") -> dict[str, Any]:
    """``read_json_object``, or an empty dict when the file is absent."""
    return read_json_object(path, what) if path.is_file() else {}


@dataclass(frozen=True)
class PipelineLayout:
    """What a pipeline folder holds, checked before anything is compiled."""

    root: Path
    index: dict[str, Any]
    model_files: dict[str, Path]
    tokenizer_dir: Path
    scheduler_config: dict[str, Any]
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.root.name

    @property
    def has_vae_encoder(self) -> bool:
        return "vae_encoder" in self.model_files


def read_layout(path: str | os.PathLike[str]) -> PipelineLayout:
    """Check ``path`` is a diffusers ONNX pipeline with every file it needs."""
    root = Path(path).expanduser()
    refuse_unsafe_or_missing(root, "pipeline")  # a .ckpt gets the same refusal as everywhere else
    if not root.is_dir():
        single_file = (
            "; single-file checkpoints are not supported yet: use the model's diffusers ONNX export"
            if root.suffix.lower() == ".safetensors"
            else ""
        )
        raise ModelFormatError(
            f"{root} is a file, not a pipeline folder (a diffusers/optimum ONNX folder with model_index.json, "
            f"unet/model.onnx, ...){single_file}"
        )
    if not (root / "model_index.json").is_file():
        raise ModelFormatError(f"{root} is not a diffusers ONNX pipeline: it has no model_index.json")
    index = read_json_object(root / "model_index.json", "pipeline index")
    class_name = str(index.get("_class_name", ""))
    if "XL" in class_name or "Flux" in class_name or "text_encoder_2" in index:
        raise ModelFormatError(
            f"{root.name}: {class_name or 'this pipeline'} is not an SD 1.x/2.x pipeline; only those are supported"
        )
    files: dict[str, Path] = {}
    for component in COMPONENTS:
        file = root / component / "model.onnx"
        if file.is_file():
            files[component] = file
        elif component in REQUIRED:
            raise ModelFormatError(f"{root.name}: missing model file {component}/model.onnx")
    tokenizer_dir = root / "tokenizer"
    if not tokenizer_dir.is_dir():
        raise ModelFormatError(f"{root.name}: missing tokenizer/ folder")
    scheduler_file = root / "scheduler" / "scheduler_config.json"
    scheduler_config = read_json_object(scheduler_file, "scheduler config") if scheduler_file.is_file() else {}
    configs = {c: read_optional_json_object(root / c / "config.json") for c in COMPONENTS}
    in_channels = configs["unet"].get("in_channels", 4)
    if in_channels != 4:
        raise ModelFormatError(
            f"{root.name}: the UNet takes {in_channels} input channels (an inpainting or depth model); "
            "only txt2img/img2img UNets (4 channels) are supported"
        )
    return PipelineLayout(root, index, files, tokenizer_dir, scheduler_config, configs)
