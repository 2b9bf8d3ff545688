"""A registered model family as a pipeline: a user's checkpoint detected among the registered
families and mapped (``open_checkpoint``), its ``PipelineConfig`` (the family's defaults, the
prediction type detection settled on, and a diffusers folder's own config files where it has
them: ``checkpoint_config``), its component sources (``checkpoint_sources``: the family's
weightless graphs with the lazily mapped weights) and its pipeline class (``pipeline_class``,
resolved from the family's ``"module:attr"`` reference).

``sdkit.pipelines.loaders.single_file.CheckpointLoader`` builds pipelines with these and binds
``open_for_pipeline`` to them, with which ``Pipeline.set_checkpoint`` swaps a loaded pipeline's
weights for another file's. This module sits above the pipeline classes (it names them) and below
the loaders, in the layer ``.importlinter`` reserves for it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sdkit.errors import UnsupportedFamilyError
from sdkit.families import Checkpoint, Detected, Family, MappedCheckpoint, detect, map_detected, shipped
from sdkit.families.clip_tokenizer import TokenizerSource
from sdkit.files import read_optional_json_object
from sdkit.pipelines.config import PipelineConfig
from sdkit.pipelines.features.lora_embeddings_vae import base_sources
from sdkit.pipelines.models.base import OpenedCheckpoint
from sdkit.pipelines.stages.sources import ModelSource
from sdkit.plugins import get_plugins
from sdkit.plugins.registries import import_object


def registered_families() -> list[Family]:
    """Every family registered through ``sdkit_register_model_families``, highest priority first."""
    return get_plugins().families.families()


def detect_checkpoint(checkpoint: Checkpoint, prediction: str | None = None) -> Detected:
    """``checkpoint``'s family among the registered ones (``sdkit.families.detect``)."""
    return detect(checkpoint, registered_families(), prediction)


def open_checkpoint(
    path: str | os.PathLike[str] | Checkpoint,
    prediction: str | None = None,
    files: Mapping[str, str] | None = None,
    detected: Detected | None = None,
) -> MappedCheckpoint:
    """``path`` (a ``.safetensors`` file or a diffusers folder) detected among the registered
    families and mapped: a lazy ``WeightSet`` per component, checked complete. ``files``: the
    components a family takes from their own files (Flux's ``clip_l``, ``t5xxl``, ``vae``). A
    family whose graphs sdkit does not ship is refused before any mapping (``require_graphs``).
    ``detected``: the caller's own ``detect`` of this checkpoint, its family already checked
    runnable (``pipeline_class``), so the header is not read for the family again."""
    checkpoint = path if isinstance(path, Checkpoint) else Checkpoint.open(path)
    if detected is None:
        detected = detect_checkpoint(checkpoint, prediction)
        require_graphs(detected.family, checkpoint.path.name)
    return map_detected(checkpoint, detected, files)


def require_graphs(family: Family, what: str | Path = "this checkpoint") -> None:
    """``UnsupportedFamilyError`` when a component of ``family`` names a shipped graph that is not
    shipped (SDXL inpainting's 9-channel UNet today): its files are recognised, not runnable."""
    available = set(shipped.names())
    for component, spec in family.components.items():
        graph = str(spec.graph)
        if not graph.endswith(".onnx") and graph not in available:
            raise UnsupportedFamilyError(
                f"{what} is a {family.label} checkpoint (family {family.name!r}); sdkit does not ship the "
                f"{component} graph it runs on ({graph}) yet, so it cannot run from this file: use a "
                "diffusers/optimum ONNX export folder of the model"
            )


def checkpoint_config(mapped: MappedCheckpoint, name: str | None = None) -> PipelineConfig:
    """What the pipeline needs to know besides the graphs: the family's defaults with the
    detected prediction type; a diffusers folder's scheduler, tokenizer and VAE/UNet configs
    replace the family's where present (so a folder gives the image diffusers gives for it)."""
    family = mapped.family
    scheduler = dict(family.scheduler_config) if family.scheduler_config is not None else None
    tokenizers: dict[str, TokenizerSource] = dict(family.tokenizers)
    scaling, sample_size = family.vae_scaling_factor, family.sample_size
    if mapped.checkpoint.is_folder:
        folder = mapped.checkpoint.path
        scheduler = read_optional_json_object(folder / "scheduler" / "scheduler_config.json") or scheduler
        for component in tokenizers:
            own = folder / component.replace("text_encoder", "tokenizer")
            if own.is_dir():
                tokenizers[component] = own
        scaling = read_optional_json_object(folder / "vae" / "config.json").get("scaling_factor", scaling)
        sample_size = read_optional_json_object(folder / "unet" / "config.json").get("sample_size", sample_size)
    return PipelineConfig(
        name=name or mapped.checkpoint.name,
        prediction_type=mapped.prediction_type,
        latent_channels=family.latent_channels,
        vae_scaling_factor=scaling,
        vae_scale_factor=family.vae_scale_factor,
        sample_size=sample_size,
        scheduler_config=scheduler,
        tokenizers=tokenizers,
        text_outputs=dict(family.text_outputs),
        force_zeros_for_empty_prompt=family.force_zeros_for_empty_prompt,
        requires_aesthetics_score=family.requires_aesthetics_score,
        fp32_components=family.fp32_components,
        inpainting=family.inpainting,
        **dict(family.config),
    )


def checkpoint_sources(mapped: MappedCheckpoint) -> dict[str, ModelSource]:
    """Each component's source: the family's weightless graph and the checkpoint's weights."""
    return base_sources(mapped)


def open_for_pipeline(
    path: str | os.PathLike[str] | Checkpoint,
    prediction: str | None = None,
    files: Mapping[str, str] | None = None,
    detected: Detected | None = None,
) -> OpenedCheckpoint:
    """``path`` opened for a pipeline: mapped, with its config and component sources
    (``detected`` as in ``open_checkpoint``)."""
    mapped = open_checkpoint(path, prediction, files, detected)
    return OpenedCheckpoint(mapped, checkpoint_config(mapped), checkpoint_sources(mapped))


def pipeline_class(family: Family, what: str | Path = "this checkpoint") -> type[Any]:
    """The family's pipeline class, or ``UnsupportedFamilyError`` saying what is missing (the
    class, then a graph: ``require_graphs``)."""
    cls = import_pipeline_class(family, what)
    require_graphs(family, what)
    return cls


def import_pipeline_class(family: Family, what: str | Path = "this checkpoint") -> type[Any]:
    """The class the family's ``pipeline`` reference names, or ``UnsupportedFamilyError`` (a
    folder of the family needs no shipped graph: the folder loader asks this alone)."""
    try:
        cls: type[Any] = import_object(family.pipeline)
    except (ImportError, AttributeError, ValueError) as exc:
        why = f"{type(exc).__name__}: {exc}"
        raise UnsupportedFamilyError(
            f"{what} is a {family.label} model (family {family.name!r}); its files are recognised, but its "
            f"pipeline {family.pipeline} is not available ({why})"
        ) from None
    return cls
