"""The diffusers/optimum ONNX folder as a pipeline: its ``PipelineConfig`` (from the folder's
``model_index.json``, ``config.json`` and ``scheduler_config.json`` files), its component sources
(the ``.onnx`` files) and the model loader that recognises such folders (``model_index.json``
inside): Stable Diffusion 1.x/2.x, SDXL base and refiner (``text_encoder_2``), SD3/3.5, FLUX.1
and Chroma (``model_index.json``'s class, or a ``text_encoder_3``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar

from sdkit.errors import ModelFormatError
from sdkit.pipelines.base import Pipeline
from sdkit.pipelines.chroma import ChromaPipeline
from sdkit.pipelines.components import LoadSettings
from sdkit.pipelines.config import PipelineConfig
from sdkit.pipelines.flux import FluxPipeline
from sdkit.pipelines.layout import PipelineLayout, is_pipeline_dir, latent_channels, read_layout
from sdkit.pipelines.loading import PipelineLoader
from sdkit.pipelines.sd3 import StableDiffusion3Pipeline
from sdkit.pipelines.sdxl import StableDiffusionXLPipeline
from sdkit.pipelines.sources import ModelSource, OnnxFileSource
from sdkit.pipelines.stable_diffusion import StableDiffusionPipeline

DEFAULT_SCALING_FACTOR = 0.18215  # SD 1.x/2.x; a VAE config.json names its own
# The released models' VAE factors (scaling, shift), where a folder's VAE config is silent.
FLOW_VAE_FACTORS = {"sd3": (1.5305, 0.0609), "flux": (0.3611, 0.1159), "chroma": (0.3611, 0.1159)}
PIPELINE_CLASSES: dict[str, type[Pipeline]] = {
    "sd": StableDiffusionPipeline,
    "sdxl": StableDiffusionXLPipeline,
    "sd3": StableDiffusion3Pipeline,
    "flux": FluxPipeline,
    "chroma": ChromaPipeline,
}


def folder_config(layout: PipelineLayout) -> PipelineConfig:
    """The configuration a diffusers folder describes (SD defaults where a file is silent)."""
    if layout.family in FLOW_VAE_FACTORS:
        return flow_config(layout)
    vae = layout.configs.get("vae_decoder") or layout.configs.get("vae_encoder") or {}
    unet = layout.configs.get("unet", {})
    blocks = vae.get("block_out_channels")
    # Pixels per latent cell: 2 ** (number of VAE blocks - 1); 8 for every SD VAE.
    scale_factor = 2 ** (len(blocks) - 1) if isinstance(blocks, list) and blocks else 8
    sample = unet.get("sample_size", 64)
    scheduler = layout.scheduler_config or None
    prediction = (scheduler or {}).get("prediction_type", "epsilon")
    latents = _int(latent_channels(layout.configs), "latent_channels", layout)
    config = PipelineConfig(
        name=layout.name,
        prediction_type=prediction,
        latent_channels=latents,
        vae_scaling_factor=_number(vae.get("scaling_factor", DEFAULT_SCALING_FACTOR), "scaling_factor", layout),
        vae_scale_factor=scale_factor,
        sample_size=_int(sample[0] if isinstance(sample, list) and sample else sample, "sample_size", layout),
        inpainting=unet.get("in_channels", latents) == 2 * latents + 1,
        scheduler_config=scheduler,
        tokenizers=dict(layout.tokenizer_dirs),
        text_outputs={"text_encoder": ("last_hidden_state",)},
    )
    return _xl_config(config, layout) if layout.xl else config


def flow_config(layout: PipelineLayout) -> PipelineConfig:
    """SD3's, Flux's or Chroma's configuration: 16-channel latents with a shifted VAE, the
    transformer's patch (SD3's config; Flux and Chroma pack 2x2), its config, and the outputs each
    text encoder gives: SD3's CLIPs their penultimate hidden states and ``text_embeds``, Flux's
    CLIP ``pooler_output``, T5 ``last_hidden_state``."""
    family = layout.family
    vae = layout.configs.get("vae_decoder") or layout.configs.get("vae_encoder") or {}
    transformer = layout.configs.get("transformer", {})
    blocks = vae.get("block_out_channels")
    scale_factor = 2 ** (len(blocks) - 1) if isinstance(blocks, list) and blocks else 8
    scaling, shift = FLOW_VAE_FACTORS[family]
    outputs: dict[str, tuple[str, ...]] = {}
    if family == "sd3":
        for encoder in ("text_encoder", "text_encoder_2"):
            outputs[encoder] = (_penultimate(layout, encoder), "text_embeds")
        outputs["text_encoder_3"] = ("last_hidden_state",)
    elif family == "flux":
        outputs = {"text_encoder": ("pooler_output",), "text_encoder_2": ("last_hidden_state",)}
    else:
        outputs = {"text_encoder": ("last_hidden_state",)}
    patch = transformer.get("patch_size", 2) if family == "sd3" else 2
    return PipelineConfig(
        name=layout.name,
        prediction_type="flow",
        latent_channels=_int(vae.get("latent_channels", 16), "latent_channels", layout),
        vae_scaling_factor=_number(vae.get("scaling_factor", scaling), "scaling_factor", layout),
        vae_shift_factor=_number(vae.get("shift_factor", shift), "shift_factor", layout),
        patch_size=_int(patch, "patch_size", layout),
        vae_scale_factor=scale_factor,
        sample_size=_int(transformer.get("sample_size", 128) if family == "sd3" else 128, "sample_size", layout),
        scheduler_config=layout.scheduler_config or None,
        tokenizers=dict(layout.tokenizer_dirs),
        text_outputs=outputs,
        fp32_components=("vae_decoder", "vae_encoder") if vae.get("force_upcast", True) is not False else (),
        denoiser_config=transformer,
    )


def _penultimate(layout: PipelineLayout, encoder: str) -> str:
    """``hidden_states.{layers - 1}``: the penultimate layer SDXL's and SD3's CLIPs give."""
    layers = layout.configs.get(encoder, {}).get("num_hidden_layers")
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 2:
        raise ModelFormatError(
            f"{layout.name}: {encoder}/config.json must give num_hidden_layers (an integer >= 2) "
            "to find the penultimate hidden states this model reads"
        )
    return f"hidden_states.{layers - 1}"


def _xl_config(config: PipelineConfig, layout: PipelineLayout) -> PipelineConfig:
    """SDXL's settings: penultimate hidden states of each text encoder (optimum exports every
    layer's as ``hidden_states.0..N``) and ``text_embeds`` of the second; the empty-negative and
    aesthetic-score switches of ``model_index.json`` (diffusers' defaults: true, false); the VAE
    kept in fp32 unless its config says ``force_upcast: false`` (e.g. madebyollin's fp16-fix VAE)."""
    outputs: dict[str, tuple[str, ...]] = {}
    for encoder in ("text_encoder", "text_encoder_2"):
        if encoder in layout.model_files:
            hidden = _penultimate(layout, encoder)
            outputs[encoder] = (hidden, "text_embeds") if encoder == "text_encoder_2" else (hidden,)
    vae = layout.configs.get("vae_decoder") or layout.configs.get("vae_encoder") or {}
    return dataclasses.replace(
        config,
        text_outputs=outputs,
        force_zeros_for_empty_prompt=_flag(layout, "force_zeros_for_empty_prompt", True),
        requires_aesthetics_score=_aesthetics(layout),
        fp32_components=("vae_decoder", "vae_encoder") if vae.get("force_upcast", True) is not False else (),
    )


def _flag(layout: PipelineLayout, key: str, default: bool) -> bool:
    value = layout.index.get(key, default)
    if not isinstance(value, bool):
        raise ModelFormatError(f"{layout.name}: {key} in model_index.json must be true or false, not {value!r}")
    return value


def _aesthetics(layout: PipelineLayout) -> bool:
    """``requires_aesthetics_score`` from model_index.json, checked against the UNet's time
    embedding width where the configs give it (5 time ids for a refiner, 6 for a base)."""
    unet, text = layout.configs.get("unet", {}), layout.configs.get("text_encoder_2", {})
    width, per_id, pooled = (
        unet.get("projection_class_embeddings_input_dim"),
        unet.get("addition_time_embed_dim"),
        text.get("projection_dim"),
    )
    ids = None
    if (
        isinstance(width, int)
        and isinstance(per_id, int)
        and isinstance(pooled, int)
        and min(width, per_id, pooled) > 0
    ):
        ids = (width - pooled) // per_id
    if "requires_aesthetics_score" not in layout.index and ids in (5, 6):
        return bool(ids == 5)
    flag = _flag(layout, "requires_aesthetics_score", False)
    if ids is not None and ids != (5 if flag else 6):
        raise ModelFormatError(
            f"{layout.name}: the UNet takes {ids} time ids but model_index.json says "
            f"requires_aesthetics_score={str(flag).lower()} ({5 if flag else 6} time ids)"
        )
    return flag


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

    def pipeline_class(self, path: Path) -> type[Pipeline]:
        return PIPELINE_CLASSES[read_layout(path).family]

    def build(self, path: Path, settings: LoadSettings) -> Pipeline:
        layout = read_layout(path)
        config = folder_config(layout)
        if settings.prediction is not None:
            config = dataclasses.replace(config, prediction_type=settings.prediction)
        cls = PIPELINE_CLASSES[layout.family]
        sources = {k: v for k, v in folder_sources(layout).items() if k in cls.component_names}
        components = settings.components(cls.component_names, sources, config.text_outputs, config.fp32_components)
        return cls(config, components)
