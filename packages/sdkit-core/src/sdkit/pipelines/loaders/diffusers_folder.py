"""The diffusers/optimum ONNX folder as a pipeline: its ``PipelineConfig`` (from the folder's
``model_index.json``, ``config.json`` and ``scheduler_config.json`` files, the family's defaults
where they are silent), its component sources (the ``.onnx`` files) and the model loader that
recognises such folders (``model_index.json`` inside).

Which family a folder is, and so its pipeline class, components, tokenizer folders and text
outputs, is asked of the registered families (``sdkit_register_model_families``): the first
whose ``Family.folder`` claims the folder's ``model_index.json`` (``sdkit.pipelines.loaders.layout``). The
built-in ones read Stable Diffusion 1.x/2.x, SDXL base and refiner, SD3/3.5, FLUX.1 and Chroma
folders; a plugin's family with a ``FolderSpec`` loads from a folder the same way.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any, ClassVar

from sdkit.errors import ModelFormatError, UnsupportedFamilyError
from sdkit.families.family import PENULTIMATE
from sdkit.pipelines.config import PipelineConfig
from sdkit.pipelines.loaders.families import import_pipeline_class, registered_families
from sdkit.pipelines.loaders.graph_inputs import static_input_dims
from sdkit.pipelines.loaders.layout import PipelineLayout, is_pipeline_dir, latent_channels, read_layout
from sdkit.pipelines.loaders.loading import PipelineLoader
from sdkit.pipelines.models.base import Pipeline
from sdkit.pipelines.stages.components import LoadSettings
from sdkit.pipelines.stages.sources import ModelSource, OnnxFileSource

_CONFIG_DEFAULTS = {f.name: f.default for f in dataclasses.fields(PipelineConfig)}


def read_folder(path: str | os.PathLike[str]) -> PipelineLayout:
    """``path`` checked as a diffusers ONNX folder of a registered family (``read_layout``)."""
    return read_layout(path, registered_families())


def folder_config(layout: PipelineLayout) -> PipelineConfig:
    """The configuration a diffusers folder describes: the VAE's factors and latent channels, the
    denoiser's sample size (and what else ``FolderSpec.denoiser_keys`` names), the scheduler's
    prediction type, the text encoders' outputs, SDXL's switches; the family's defaults where a
    file is silent."""
    family, spec = layout.family, layout.spec
    vae = layout.configs.get("vae_decoder") or layout.configs.get("vae_encoder") or {}
    denoiser = layout.configs.get(spec.denoiser, {})
    blocks = vae.get("block_out_channels")
    # Pixels per latent cell: 2 ** (number of VAE blocks - 1); 8 for every SD and flow VAE.
    scale_factor = 2 ** (len(blocks) - 1) if isinstance(blocks, list) and blocks else family.vae_scale_factor
    scheduler = layout.scheduler_config or None
    # A flow family predicts a velocity whatever the scheduler says; SD's folders name theirs.
    prediction = family.prediction_type
    if prediction != "flow":
        prediction = (scheduler or {}).get("prediction_type", prediction)
    latents = _int(latent_channels(layout.configs, family.latent_channels), "latent_channels", layout)
    fields: dict[str, Any] = {k: v for k, v in family.config.items() if k != "denoiser_config"}
    fields["sample_size"] = family.sample_size
    for key in spec.denoiser_keys:  # integer fields: sample_size, patch_size
        value = denoiser.get(key, fields.get(key, _CONFIG_DEFAULTS.get(key)))
        fields[key] = _int(value[0] if isinstance(value, list) and value else value, key, layout)
    if "vae_shift_factor" in fields:  # SD's pipelines read no shift (diffusers' neither)
        fields["vae_shift_factor"] = _number(
            vae.get("shift_factor", fields["vae_shift_factor"]), "shift_factor", layout
        )
    config = PipelineConfig(
        name=layout.name,
        prediction_type=prediction,
        latent_channels=latents,
        vae_scaling_factor=_number(vae.get("scaling_factor", family.vae_scaling_factor), "scaling_factor", layout),
        vae_scale_factor=scale_factor,
        inpainting=denoiser.get("in_channels", latents) == 2 * latents + 1,
        scheduler_config=scheduler,
        tokenizers=dict(layout.tokenizer_dirs),
        text_outputs=_text_outputs(layout),
        fp32_components=family.fp32_components if vae.get("force_upcast", True) is not False else (),
        force_zeros_for_empty_prompt=family.force_zeros_for_empty_prompt,
        requires_aesthetics_score=family.requires_aesthetics_score,
        denoiser_config=denoiser,
        **fields,
    )
    config = dataclasses.replace(config, **fixed_geometry(layout, config))
    return _xl_config(config, layout) if spec.time_ids else config


def fixed_geometry(layout: PipelineLayout, config: PipelineConfig) -> dict[str, Any]:
    """``fixed_size`` and ``fixed_text_tokens`` where the denoiser's graph fixes its input shapes
    (read from its graph inputs, not its weights): a UNet/SD3 latent ``[B, C, h, w]`` gives
    ``(w, h)`` cells; a Flux/Chroma token sequence ``[B, tokens, C]`` gives the most nearly square
    grid of ``patch x patch``-cell tokens (the wider side across) whose pixel sizes are multiples
    of ``size_multiple``; ``txt_ids`` rows give the T5 token count."""
    path = layout.model_files.get(layout.spec.denoiser)
    if path is None:
        return {}
    try:
        dims = static_input_dims(path)
    except ModelFormatError:  # no fixed shapes known; loading the component names the broken file
        return {}
    latent = dims.get("hidden_states", dims.get("sample"))
    fixed: dict[str, Any] = {}
    cell, multiple = config.vae_scale_factor, config.size_multiple
    if latent is not None and len(latent) == 4 and latent[2] and latent[3]:
        fixed["fixed_size"] = (latent[3] * cell, latent[2] * cell)
    elif latent is not None and len(latent) == 3 and latent[1]:
        tokens, side = latent[1], cell * config.patch_size
        for rows in range(math.isqrt(tokens), 0, -1):
            width, height = tokens // rows * side, rows * side
            if tokens % rows == 0 and width % multiple == 0 and height % multiple == 0:
                fixed["fixed_size"] = (width, height)
                break
    text = dims.get("txt_ids")
    if text is not None and text and text[0]:
        fixed["fixed_text_tokens"] = text[0]
    return fixed


def _text_outputs(layout: PipelineLayout) -> dict[str, tuple[str, ...]]:
    """The outputs the pipeline reads of each text encoder the folder has (``FolderSpec.text_outputs``),
    ``PENULTIMATE`` read from the encoder's config."""
    outputs: dict[str, tuple[str, ...]] = {}
    for encoder, names in layout.spec.text_outputs.items():
        if encoder in layout.model_files:
            outputs[encoder] = tuple(_penultimate(layout, encoder) if n == PENULTIMATE else n for n in names)
    return outputs


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
    """SDXL's switches of ``model_index.json``: the empty-negative and aesthetic-score flags
    (diffusers' defaults: true, false)."""
    return dataclasses.replace(
        config,
        force_zeros_for_empty_prompt=_flag(layout, "force_zeros_for_empty_prompt", True),
        requires_aesthetics_score=_aesthetics(layout),
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


def folder_pipeline_class(layout: PipelineLayout) -> type[Pipeline]:
    """The pipeline class of the folder's family (its ``"module:attr"`` reference)."""
    cls: Any = import_pipeline_class(layout.family, layout.name)
    if not (isinstance(cls, type) and issubclass(cls, Pipeline)):
        raise UnsupportedFamilyError(f"family {layout.family.name!r}: {layout.family.pipeline} is not a Pipeline class")
    return cls


class DiffusersOnnxLoader(PipelineLoader):
    """Model loader for pipeline folders (``model_index.json`` inside): returns a pipeline."""

    name: ClassVar[str] = "diffusers-onnx"
    priority: ClassVar[int] = 20

    def sniff(self, path: Path) -> bool:
        return is_pipeline_dir(Path(path))

    def explain(self, path: Path) -> str:
        try:
            read_folder(path)
        except ModelFormatError as exc:
            return str(exc)
        return ""

    def pipeline_class(self, path: Path) -> type[Pipeline]:
        return folder_pipeline_class(read_folder(path))

    def build(self, path: Path, settings: LoadSettings) -> Pipeline:
        layout = read_folder(path)
        cls = folder_pipeline_class(layout)
        config = folder_config(layout)
        if settings.prediction is not None:
            config = dataclasses.replace(config, prediction_type=settings.prediction)
        sources = {k: v for k, v in folder_sources(layout).items() if k in cls.component_names}
        components = settings.components(cls.component_names, sources, config.text_outputs, config.fp32_components)
        return cls(config, components)
