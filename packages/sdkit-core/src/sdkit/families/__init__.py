"""Model families: the architectures sdkit ships weightless graphs for (``graphs/``), the CLIP
vocabulary, and how a user's single-file checkpoint fills those graphs.

- ``Family`` (``family``): graphs, key mappers per checkpoint layout, probes, defaults;
  ``sd_family`` (``stable_diffusion``) builds SD-like ones from diffusers configs; the built-in
  ones are in ``builtin`` and are registered through ``sdkit_register_model_families``.
- ``Checkpoint`` (``checkpoint``): a ``.safetensors`` file or a diffusers folder, headers checked,
  tensors read from a memory map one at a time (``safetensors_reader``).
- ``detect`` / ``load_checkpoint`` (``detection``): which family a file is, its weights as lazy
  ``WeightSet``s per component; ``describe`` (``inspect``): what any file is, for ``sdkit inspect``.

A family with a ``FolderSpec`` (``Family.folder``) also reads diffusers/optimum ONNX folders
(``sdkit.pipelines.loaders.diffusers_folder``): the built-in SD 1.x, SDXL, SD3, Flux and Chroma ones do, and
a plugin's family registered the same way loads from a single file and from a folder.

This package sits below ``sdkit.plugins`` and ``sdkit.pipelines``: it names pipeline classes by
reference and never imports them. See ``packages/sdkit-core/LAYERS.md`` (model families) and
``PIPELINES.md``.
"""

from __future__ import annotations

from sdkit.families.checkpoint import Checkpoint, CheckpointTensor, normalize_prediction
from sdkit.families.clip_tokenizer import ShippedClipTokenizer, ShippedVocab, TokenizerSource
from sdkit.families.detection import Detected, detect, load_checkpoint, map_detected
from sdkit.families.family import Family, FamilyComponent, FolderSpec, MappedCheckpoint, UnusedKeysWarning
from sdkit.families.inspect import FileDescription, describe
from sdkit.families.keymaps import KeyMapper, TensorSource
from sdkit.families.stable_diffusion import TextEncoderArch, sd_family

__all__ = [
    "Checkpoint",
    "CheckpointTensor",
    "Detected",
    "Family",
    "FamilyComponent",
    "FileDescription",
    "FolderSpec",
    "KeyMapper",
    "MappedCheckpoint",
    "ShippedClipTokenizer",
    "ShippedVocab",
    "TensorSource",
    "TextEncoderArch",
    "TokenizerSource",
    "UnusedKeysWarning",
    "describe",
    "detect",
    "load_checkpoint",
    "map_detected",
    "normalize_prediction",
    "sd_family",
]
