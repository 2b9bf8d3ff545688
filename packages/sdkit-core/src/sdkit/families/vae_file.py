"""A standalone VAE file (civitai's ``vae-ft-mse-840000-ema-pruned.safetensors``, SDXL's
``sdxl_vae.safetensors``, a diffusers ``diffusion_pytorch_model.safetensors``) mapped onto a
family's VAE graphs.

The keys are the checkpoint's VAE keys without the ``first_stage_model.`` prefix (LDM), or the
graph names (diffusers), with or without a ``vae.`` / ``first_stage_model.`` prefix: the
family's own VAE key maps with their prefix changed, so every rule of the checkpoint map (the
reversed decoder blocks, the 1x1-conv attention weights) applies. The decoder must be complete;
the encoder is taken when the file has it all (some VAE files are decoder-only: ``VaeFile.absent``
names the first encoder key it lacks, and a pipeline given it has no encoder, as ComfyUI's
VAEEncode and A1111's img2img take both halves from the one VAE file).
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from sdkit.errors import ModelFormatError
from sdkit.families.checkpoint import Checkpoint
from sdkit.families.family import LDM_EXTRA_KEYS, SHOWN, Family, UnusedKeysWarning, initializer_specs
from sdkit.families.keymaps import KeyMapper
from sdkit.model import LazyArray, WeightSet

VAE_COMPONENTS = ("vae_decoder", "vae_encoder")
PREFIXES = ("", "first_stage_model.", "vae.")


def _with_prefix(mapper: KeyMapper, prefix: str) -> KeyMapper:
    """The same key map under another prefix (the key mappers are frozen dataclasses)."""
    fields = getattr(mapper, "__dataclass_fields__", {})
    if "prefix" not in fields:
        return mapper
    changed: KeyMapper = dataclasses.replace(cast("Any", mapper), prefix=prefix)
    return changed


@dataclass(frozen=True)
class VaeFile:
    """A VAE file mapped onto a family: the lazy weights of ``vae_decoder`` and, when the file
    has all of it, ``vae_encoder``; ``absent``: a VAE component the family has and the file does
    not fill -> the first key of it the file lacks (``encoder.conv_in.weight``)."""

    path: Path
    weights: dict[str, WeightSet]
    absent: dict[str, str] = field(default_factory=dict)


def _map(checkpoint: Checkpoint, mapper: KeyMapper, component: str, family: Family) -> tuple[WeightSet, set[str]] | str:
    """The component's weights from ``checkpoint`` through ``mapper`` (and the keys read), or
    the first key missing or mis-shaped."""
    entries: dict[str, LazyArray] = {}
    used: set[str] = set()
    for name, (shape, dtype) in initializer_specs(family.components[component].load_graph()).items():
        source = mapper.source(name, shape)
        key = checkpoint.find(source) if source else None
        if source is None or key is None or not source.stored_shape_fits(checkpoint.entry(key).shape, shape):
            return source.key if source is not None else name
        entries[name] = checkpoint.tensor(key, source, shape, dtype)
        used.add(key)
    return WeightSet(entries), used


def vae_weights(path: str | os.PathLike[str], family: Family) -> dict[str, WeightSet]:
    """``vae_decoder`` (and ``vae_encoder`` when the file has it) weights from a VAE file, lazy."""
    return open_vae(path, family).weights


def open_vae(path: str | os.PathLike[str], family: Family) -> VaeFile:
    """A VAE file mapped onto ``family``'s VAE graphs (the decoder complete, else one
    ``ModelFormatError``; the encoder when the file has all of it, else named in ``absent``)."""
    checkpoint = Checkpoint.open(path)
    name = checkpoint.path.name
    if "vae_decoder" not in family.components:
        raise ModelFormatError(f"{family.label} has no VAE decoder to replace")
    for layout in family.components["vae_decoder"].layouts:
        for prefix in PREFIXES:
            found: dict[str, WeightSet] = {}
            absent: dict[str, str] = {}
            used: set[str] = set()
            for component in VAE_COMPONENTS:
                if component not in family.components or layout not in family.components[component].layouts:
                    continue
                mapper = _with_prefix(family.mapper(component, layout), prefix)
                mapped = _map(checkpoint, mapper, component, family)
                if isinstance(mapped, str):
                    absent[component] = mapped
                else:
                    found[component], keys = mapped
                    used |= keys
            if "vae_decoder" in found:
                _warn_unused(checkpoint, used)
                return VaeFile(checkpoint.path, found, absent)
    raise ModelFormatError(
        f"{name} is not a VAE for {family.label}: its keys ({', '.join(checkpoint.keys()[:3])}...) or shapes "
        "do not fill the VAE decoder (LDM keys like decoder.up.0.block.0.conv1.weight, or diffusers keys "
        "like decoder.up_blocks.0.resnets.0.conv1.weight, were expected)"
    )


def _warn_unused(checkpoint: Checkpoint, used: set[str]) -> None:
    # VAE training files carry the discriminator and loss weights ("loss.*"), and EMA copies.
    unused = [
        k for k in checkpoint if k not in used and k not in LDM_EXTRA_KEYS and not k.startswith(("loss.", "model_ema."))
    ]
    unused = [k for k in unused if not k.startswith(("encoder.", "quant_conv.", "vae.encoder.", "vae.quant_conv."))]
    if unused:
        more = f" and {len(unused) - SHOWN} more" if len(unused) > SHOWN else ""
        warnings.warn(
            f"{checkpoint.path.name}: {len(unused)} tensor(s) no VAE weight reads: {', '.join(unused[:SHOWN])}{more}",
            UnusedKeysWarning,
            stacklevel=3,
        )
