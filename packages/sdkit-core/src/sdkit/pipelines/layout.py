"""The diffusers/optimum ONNX folder layout of a Stable Diffusion 1.x/2.x, SDXL, SD3, Flux or
Chroma pipeline (the last three: ``FLOW_FAMILIES``; ``transformer/`` instead of ``unet/``).

```
model_index.json
text_encoder/model.onnx        input_ids -> last_hidden_state (SDXL: + hidden_states.N); SDXL refiner: none
text_encoder_2/model.onnx      SDXL: input_ids -> text_embeds, hidden_states.N
unet/model.onnx                sample, timestep, encoder_hidden_states (SDXL: + text_embeds, time_ids) -> out_sample
vae_decoder/model.onnx         latent_sample -> sample
vae_encoder/model.onnx         sample -> latent_parameters (or latent_sample); img2img only
unet_controlnet/model.onnx     the UNet + down_block_additional_residual_0..N-1, mid_block_additional_residual;
                               ControlNet only (``sdkit.pipelines.controlnet``)
tokenizer/, tokenizer_2/       vocab.json + merges.txt (or tokenizer.json), tokenizer_config.json
scheduler/scheduler_config.json
```

Each ``<component>/config.json`` is optional; from it come the VAE's scaling factor and
downsampling factor, the UNet's default sample size and input channels and the text encoders'
layer count (SD defaults otherwise): see ``sdkit.pipelines.diffusers_folder.folder_config``. A UNet
with ``2c + 1`` input channels for a VAE of ``c`` latent channels (9 for SD) is an inpainting UNet.
An SDXL folder is one whose ``model_index.json`` names an XL pipeline class or a ``text_encoder_2``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sdkit.errors import ModelFormatError
from sdkit.files import inside_model_folder
from sdkit.model import refuse_unsafe_or_missing

REQUIRED = ("text_encoder", "unet", "vae_decoder")
OPTIONAL = ("vae_encoder", "unet_controlnet")
COMPONENTS = (*REQUIRED, *OPTIONAL)
XL_REQUIRED = ("text_encoder_2", "unet", "vae_decoder")
XL_OPTIONAL = ("text_encoder", "vae_encoder", "unet_controlnet")  # a refiner has no text_encoder
XL_COMPONENTS = ("text_encoder", "text_encoder_2", "unet", "vae_decoder", "vae_encoder", "unet_controlnet")
TOKENIZERS = {"text_encoder": "tokenizer", "text_encoder_2": "tokenizer_2"}

# Flow-matching families (issue 12): required components, optional ones, and the tokenizer folder
# of each text encoder: CLIP's are required, T5's optional (sdkit ships T5's vocabulary).
FLOW_FAMILIES: dict[str, tuple[tuple[str, ...], tuple[str, ...], dict[str, str]]] = {
    "sd3": (
        ("text_encoder", "text_encoder_2", "transformer", "vae_decoder"),
        ("text_encoder_3", "vae_encoder"),
        {"text_encoder": "tokenizer", "text_encoder_2": "tokenizer_2", "text_encoder_3": "tokenizer_3"},
    ),
    "flux": (
        ("text_encoder", "text_encoder_2", "transformer", "vae_decoder"),
        ("vae_encoder",),
        {"text_encoder": "tokenizer", "text_encoder_2": "tokenizer_2"},
    ),
    "chroma": (("text_encoder", "transformer", "vae_decoder"), ("vae_encoder",), {"text_encoder": "tokenizer"}),
}
T5_ENCODERS = {"sd3": "text_encoder_3", "flux": "text_encoder_2", "chroma": "text_encoder"}


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
    tokenizer_dirs: dict[str, Path]  # text-encoder component -> its tokenizer folder
    scheduler_config: dict[str, Any]
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    xl: bool = False  # an SDXL base or refiner
    family: str = "sd"  # sd, sdxl, or a flow family: sd3, flux, chroma

    @property
    def name(self) -> str:
        return self.root.name

    @property
    def tokenizer_dir(self) -> Path:
        """The first text encoder's tokenizer folder."""
        return next(iter(self.tokenizer_dirs.values()))

    @property
    def has_vae_encoder(self) -> bool:
        return "vae_encoder" in self.model_files


def is_xl(index: dict[str, Any]) -> bool:
    """Whether a ``model_index.json`` describes an SDXL pipeline (base or refiner)."""
    entry = index.get("text_encoder_2")
    return "XL" in str(index.get("_class_name", "")) or (isinstance(entry, list) and entry[:1] != [None])


def flow_family(index: dict[str, Any]) -> str | None:
    """The flow-matching family a ``model_index.json`` names (``sd3``, ``flux``, ``chroma``), or None."""
    class_name = str(index.get("_class_name", ""))
    if class_name.startswith("StableDiffusion3") or _listed(index, "text_encoder_3"):
        return "sd3"
    if class_name.startswith("Chroma"):
        return "chroma"
    if class_name.startswith("Flux"):
        return "flux"
    return None


def _refuse_other_families(root: Path, index: dict[str, Any]) -> None:
    class_name = str(index.get("_class_name", ""))
    flow_variant = class_name.startswith(("Flux", "StableDiffusion3", "Chroma")) and any(
        word in class_name for word in ("Control", "Inpaint", "Img2Img")
    )  # SD and SDXL inpainting/ControlNet folders are supported; the flow models' are not yet
    if flow_variant or any(word in class_name for word in ("Kandinsky", "Cascade", "Kontext", "Fill")):
        raise ModelFormatError(
            f"{root.name}: {class_name} is not a supported pipeline (SD 1.x/2.x and SDXL, with inpainting "
            "and ControlNet, and SD3, Flux.1 and Chroma txt2img are)"
        )


def _listed(index: dict[str, Any], component: str) -> bool:
    """Whether ``model_index.json`` names ``component`` with a class (``[null, null]`` does not)."""
    entry = index.get(component)
    return isinstance(entry, list) and bool(entry) and entry[0] is not None


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
    inside_model_folder(root, "model_index.json", f"{root.name}: file")
    index = read_json_object(root / "model_index.json", "pipeline index")
    _refuse_other_families(root, index)
    family = flow_family(index)
    if family is not None:
        return _read_flow_layout(root, index, family)
    xl = is_xl(index)
    required, components = (XL_REQUIRED, XL_COMPONENTS) if xl else (REQUIRED, COMPONENTS)
    files: dict[str, Path] = {}
    for component in components:
        file = root / component / "model.onnx"
        if file.is_file():
            files[component] = file
        elif component in required or (xl and component == "text_encoder" and _listed(index, component)):
            raise ModelFormatError(f"{root.name}: missing model file {component}/model.onnx")
    tokenizer_dirs = {}
    for encoder in (c for c in TOKENIZERS if c in files):
        folder = root / TOKENIZERS[encoder]
        if not folder.is_dir():
            raise ModelFormatError(f"{root.name}: missing {TOKENIZERS[encoder]}/ folder")
        tokenizer_dirs[encoder] = folder
    _check_contained(root, [*files.values(), *tokenizer_dirs.values()], components)  # before reading them
    scheduler_file = root / "scheduler" / "scheduler_config.json"
    scheduler_config = read_json_object(scheduler_file, "scheduler config") if scheduler_file.is_file() else {}
    configs = {c: read_optional_json_object(root / c / "config.json") for c in components}
    _check_unet_channels(root.name, configs)
    return PipelineLayout(root, index, files, tokenizer_dirs, scheduler_config, configs, xl, "sdxl" if xl else "sd")


def latent_channels(configs: dict[str, dict[str, Any]]) -> int:
    """The VAE's latent channels: its config's, else the UNet's input channels (4 unless said;
    ``(in - 1) / 2`` for a 9-channel inpainting UNet)."""
    vae = configs.get("vae_decoder") or configs.get("vae_encoder") or {}
    unet = configs.get("unet", {}).get("in_channels", 4)
    value = vae.get("latent_channels", 4 if unet == 9 else unet)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelFormatError(
            f"latent_channels / in_channels in a config.json must be a positive integer, not {value!r}"
        )
    return value


def _check_unet_channels(name: str, configs: dict[str, dict[str, Any]]) -> None:
    """A txt2img UNet (as many input channels as the latents) or an inpainting one (2c + 1); a
    ``unet_controlnet`` takes what the ``unet`` takes."""
    latent = latent_channels(configs)
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


def _read_flow_layout(root: Path, index: dict[str, Any], family: str) -> PipelineLayout:
    """An SD3, Flux or Chroma folder: its transformer, text encoders and VAE; a CLIP tokenizer
    folder per CLIP encoder (T5's folder is optional: sdkit ships T5's vocabulary)."""
    required, optional, tokenizers = FLOW_FAMILIES[family]
    files: dict[str, Path] = {}
    for component in (*required, *optional):
        file = root / component / "model.onnx"
        if file.is_file():
            files[component] = file
        elif component in required:
            raise ModelFormatError(f"{root.name}: missing model file {component}/model.onnx")
    tokenizer_dirs = {}
    for encoder, folder_name in tokenizers.items():
        folder = root / folder_name
        if encoder not in files:
            continue
        if folder.is_dir():
            tokenizer_dirs[encoder] = folder
        elif encoder != T5_ENCODERS[family]:
            raise ModelFormatError(f"{root.name}: missing {folder_name}/ folder")
    _check_contained(root, [*files.values(), *tokenizer_dirs.values()], (*required, *optional))
    scheduler_file = root / "scheduler" / "scheduler_config.json"
    scheduler_config = read_json_object(scheduler_file, "scheduler config") if scheduler_file.is_file() else {}
    configs = {c: read_optional_json_object(root / c / "config.json") for c in (*required, *optional)}
    return PipelineLayout(root, index, files, tokenizer_dirs, scheduler_config, configs, False, family)
