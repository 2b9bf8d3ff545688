"""The diffusers/optimum ONNX folder layout of a registered family's pipeline: which family a
folder is (``folder_family``: the one whose ``Family.folder`` claims its ``model_index.json``), and
the files that family's ``FolderSpec`` lists, checked (``read_layout``). The built-in folder
families: Stable Diffusion 1.x/2.x, SDXL, SD3, Flux and Chroma (the last three with
``transformer/`` instead of ``unet/``). SD's:

```
model_index.json
text_encoder/model.onnx        input_ids -> last_hidden_state (SDXL: + hidden_states.N); SDXL refiner: none
text_encoder_2/model.onnx      SDXL: input_ids -> text_embeds, hidden_states.N
unet/model.onnx                sample, timestep, encoder_hidden_states (SDXL: + text_embeds, time_ids) -> out_sample
vae_decoder/model.onnx         latent_sample -> sample
vae_encoder/model.onnx         sample -> latent_parameters (or latent_sample); img2img only
unet_controlnet/model.onnx     the UNet + down_block_additional_residual_0..N-1, mid_block_additional_residual;
                               ControlNet only (``sdkit.pipelines.features.controlnet``)
tokenizer/, tokenizer_2/       vocab.json + merges.txt (or tokenizer.json), tokenizer_config.json
scheduler/scheduler_config.json
```

Each ``<component>/config.json`` is optional; from it come the VAE's scaling factor and
downsampling factor, the UNet's default sample size and input channels and the text encoders'
layer count (the family's defaults otherwise): see ``sdkit.pipelines.loaders.diffusers_folder.folder_config``.
A UNet with ``2c + 1`` input channels for a VAE of ``c`` latent channels (9 for SD) is an inpainting
UNet. An SDXL folder is one whose ``model_index.json`` names an XL pipeline class or a
``text_encoder_2`` (``sdkit.families.builtin.SDXL_FOLDER``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sdkit.errors import ModelFormatError
from sdkit.families.family import Family, FolderSpec, listed
from sdkit.files import inside_model_folder, read_json_object, read_optional_json_object
from sdkit.model import refuse_unsafe_or_missing


def is_pipeline_dir(path: Path) -> bool:
    """The cheap sniff: a directory holding ``model_index.json``."""
    return path.is_dir() and (path / "model_index.json").is_file()


@dataclass(frozen=True)
class PipelineLayout:
    """What a pipeline folder holds, checked before anything is compiled, and the registered
    family it is a folder of (``Family.folder`` says how it looks)."""

    root: Path
    index: dict[str, Any]
    model_files: dict[str, Path]
    tokenizer_dirs: dict[str, Path]  # text-encoder component -> its tokenizer folder
    scheduler_config: dict[str, Any]
    configs: dict[str, dict[str, Any]]
    family: Family

    @property
    def name(self) -> str:
        return self.root.name

    @property
    def spec(self) -> FolderSpec:
        return _spec(self.family)


def folder_family(root: Path, index: dict[str, Any], families: Sequence[Family]) -> Family:
    """The family ``model_index.json`` names among ``families`` (highest priority first, as the
    registry lists them): the first claimant in ``FolderSpec.rank`` order; refused when its spec
    refuses the class name (a variant it does not run) or when no family reads folders."""
    readers = sorted((f for f in families if f.folder is not None), key=lambda f: -_spec(f).rank)
    family = next((f for f in readers if _spec(f).claims(index)), None)
    class_name = str(index.get("_class_name", ""))
    if family is None:
        raise ModelFormatError(
            f"{root.name}: no registered model family reads this folder (model_index.json's class "
            f"{class_name or '(none)'}); families with folders: {', '.join(f.name for f in readers) or 'none'}"
        )
    refused = [word for word in _spec(family).refused if word in class_name]
    if refused:
        raise ModelFormatError(
            f"{root.name}: {class_name} is not a supported pipeline (sdkit reads no {refused[0]!r} folder; "
            f"it reads these families' folders: {', '.join(f.name for f in readers)})"
        )
    return family


def _spec(family: Family) -> FolderSpec:
    assert family.folder is not None  # folder_family picks only families with one
    return family.folder


def read_layout(path: str | os.PathLike[str], families: Sequence[Family]) -> PipelineLayout:
    """Check ``path`` is a diffusers ONNX pipeline folder of one of ``families`` (the registered
    ones: ``sdkit.pipelines.loaders.diffusers_folder.read_folder``) with every file its spec needs."""
    root = Path(path).expanduser()
    refuse_unsafe_or_missing(root, "pipeline")  # a .ckpt gets the same refusal as everywhere else
    if not root.is_dir():
        single_file = (
            "; a .safetensors checkpoint loads through the checkpoint loader (sdkit.load_pipeline)"
            if root.suffix.lower() == ".safetensors"
            else ""
        )
        raise ModelFormatError(
            f"{root} is a file, not a pipeline folder (a diffusers/optimum ONNX folder with model_index.json, "
            f"unet/model.onnx, ...){single_file}"
        )
    if not (root / "model_index.json").is_file():
        raise ModelFormatError(f"{root} is not a diffusers ONNX pipeline: it has no model_index.json")
    inside_model_folder(root, "model_index.json", f"{root.name}: file")
    index = read_json_object(root / "model_index.json", "pipeline index")
    family = folder_family(root, index, families)
    spec = _spec(family)
    files: dict[str, Path] = {}
    for component in spec.components:
        file = root / component / "model.onnx"
        if file.is_file():
            files[component] = file
        elif component in spec.required or (component in spec.listed_required and listed(index, component)):
            raise ModelFormatError(f"{root.name}: missing model file {component}/model.onnx")
    tokenizer_dirs = {}
    for encoder, folder_name in spec.tokenizers.items():
        folder = root / folder_name
        if encoder not in files:
            continue
        if folder.is_dir():
            tokenizer_dirs[encoder] = folder
        elif encoder not in spec.shipped_vocab:
            raise ModelFormatError(f"{root.name}: missing {folder_name}/ folder")
    _check_contained(root, [*files.values(), *tokenizer_dirs.values()], spec.components)  # before reading them
    scheduler_file = root / "scheduler" / "scheduler_config.json"
    scheduler_config = read_json_object(scheduler_file, "scheduler config") if scheduler_file.is_file() else {}
    configs = {c: read_optional_json_object(root / c / "config.json") for c in spec.components}
    if "unet" in configs:
        _check_unet_channels(root.name, configs, family.latent_channels)
    return PipelineLayout(root, index, files, tokenizer_dirs, scheduler_config, configs, family)


def latent_channels(configs: dict[str, dict[str, Any]], default: int = 4) -> int:
    """The VAE's latent channels: its config's, else the UNet's input channels (``default``
    without one; ``(in - 1) / 2`` for an inpainting UNet's ``2 * default + 1``)."""
    vae = configs.get("vae_decoder") or configs.get("vae_encoder") or {}
    unet = configs.get("unet", {}).get("in_channels", default)
    value = vae.get("latent_channels", default if unet == 2 * default + 1 else unet)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelFormatError(
            f"latent_channels / in_channels in a config.json must be a positive integer, not {value!r}"
        )
    return value


def _check_unet_channels(name: str, configs: dict[str, dict[str, Any]], default: int) -> None:
    """A txt2img UNet (as many input channels as the latents) or an inpainting one (2c + 1); a
    ``unet_controlnet`` takes what the ``unet`` takes."""
    latent = latent_channels(configs, default)
    unet = configs["unet"].get("in_channels", latent)
    if unet not in (latent, 2 * latent + 1):
        raise ModelFormatError(
            f"{name}: the UNet takes {unet} input channels (a depth or instruct-pix2pix model?); only txt2img "
            f"UNets ({latent} channels) and inpainting UNets ({2 * latent + 1}) are supported"
        )
    controlled = configs.get("unet_controlnet", {}).get("in_channels", unet)
    if controlled != unet:
        raise ModelFormatError(f"{name}: unet_controlnet takes {controlled} input channels but unet takes {unet}")


def _check_contained(root: Path, paths: list[Path], components: tuple[str, ...]) -> None:
    """Every file sdkit reads from the folder stays inside it once symlinks are resolved (a
    folder unpacked from elsewhere must not make sdkit read ``~/.ssh``); links into a Hugging
    Face cache's ``blobs/`` are the one exception (``inside_model_folder``)."""
    read = [root / "model_index.json", root / "scheduler" / "scheduler_config.json"]
    read += [root / c / "config.json" for c in components]
    for path in paths:
        read += sorted(path.iterdir()) if path.is_dir() else [path]
    for path in read:
        if path.exists() or path.is_symlink():
            inside_model_folder(root, path.relative_to(root), f"{root.name}: file")
