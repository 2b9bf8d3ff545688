"""The diffusers/optimum ONNX folder as a pipeline: its ``PipelineConfig`` (from the folder's
``config.json`` and ``scheduler_config.json`` files), its component sources (the ``.onnx``
files) and the model loader that recognises such folders (``model_index.json`` inside)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from sdkit.errors import ModelFormatError
from sdkit.pipelines.components import LoadSettings
from sdkit.pipelines.config import PipelineConfig
from sdkit.pipelines.layout import PipelineLayout, is_pipeline_dir, latent_channels, read_layout
from sdkit.pipelines.loading import PipelineLoader
from sdkit.pipelines.sources import ModelSource, OnnxFileSource
from sdkit.pipelines.stable_diffusion import StableDiffusionPipeline

DEFAULT_SCALING_FACTOR = 0.18215  # SD 1.x/2.x; a VAE config.json names its own


def folder_config(layout: PipelineLayout) -> PipelineConfig:
    """The configuration a diffusers folder describes (SD defaults where a file is silent)."""
    vae = layout.configs.get("vae_decoder") or layout.configs.get("vae_encoder") or {}
    unet = layout.configs.get("unet", {})
    blocks = vae.get("block_out_channels")
    # Pixels per latent cell: 2 ** (number of VAE blocks - 1); 8 for every SD VAE.
    scale_factor = 2 ** (len(blocks) - 1) if isinstance(blocks, list) and blocks else 8
    sample = unet.get("sample_size", 64)
    scheduler = layout.scheduler_config or None
    prediction = (scheduler or {}).get("prediction_type", "epsilon")
    latents = _int(latent_channels(layout.configs), "latent_channels", layout)
    return PipelineConfig(
        name=layout.name,
        prediction_type=prediction,
        latent_channels=latents,
        vae_scaling_factor=_number(vae.get("scaling_factor", DEFAULT_SCALING_FACTOR), "scaling_factor", layout),
        vae_scale_factor=scale_factor,
        sample_size=_int(sample if not isinstance(sample, list) else sample[0], "sample_size", layout),
        inpainting=unet.get("in_channels", latents) == 2 * latents + 1,
        scheduler_config=scheduler,
        tokenizers={"text_encoder": layout.tokenizer_dir},
        text_outputs={"text_encoder": ("last_hidden_state",)},
    )


def _int(value: Any, key: str, layout: PipelineLayout) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelFormatError(f"{layout.name}: {key} in a config.json must be an integer, not {value!r}")
    return value


def _number(value: Any, key: str, layout: PipelineLayout) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ModelFormatError(f"{layout.name}: {key} in a config.json must be a number, not {value!r}")
    return float(value)


def folder_sources(layout: PipelineLayout) -> dict[str, ModelSource]:
    """Each component's ``<component>/model.onnx``."""
    return {name: OnnxFileSource(file) for name, file in layout.model_files.items()}


class DiffusersOnnxLoader(PipelineLoader):
    """Model loader for pipeline folders (``model_index.json`` inside): returns a pipeline."""

    name: ClassVar[str] = "diffusers-onnx"
    priority: ClassVar[int] = 20

    def sniff(self, path: Path) -> bool:
        return is_pipeline_dir(Path(path))

    def explain(self, path: Path) -> str:
        try:
            read_layout(path)
        except ModelFormatError as exc:
            return str(exc)
        return ""

    def build(self, path: Path, settings: LoadSettings) -> StableDiffusionPipeline:
        layout = read_layout(path)
        config = folder_config(layout)
        names = StableDiffusionPipeline.component_names
        components = settings.components(names, folder_sources(layout), config.text_outputs)
        return StableDiffusionPipeline(config, components)
