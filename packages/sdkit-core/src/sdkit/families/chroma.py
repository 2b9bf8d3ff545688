"""Chroma single files as a family (``chroma_family``): lodestones' Chroma transformer file plus
T5-XXL and VAE files.

Chroma (``chroma-unlocked-v*.safetensors``, ``Chroma1-HD.safetensors``, ComfyUI's copies under
``model.diffusion_model.``) is FLUX.1 schnell with its per-block modulation and its CLIP /
timestep / guidance embedders replaced by one "distilled guidance layer" (an MLP approximator that
makes every block's modulation from the timestep), T5 as its only text encoder and real
classifier-free guidance. Its keys are BFL's ``flux`` names (``sdkit.families.flux_keys``) plus

- ``distilled_guidance_layer.in_proj|out_proj`` (kept), ``distilled_guidance_layer.layers.N.in_layer|
  out_layer`` -> ``...layers.N.linear_1|linear_2``, ``distilled_guidance_layer.norms.N.scale`` ->
  ``...norms.N.weight`` (RMS norms);

and no ``time_in``, ``vector_in``, ``guidance_in``, ``*_mod.lin``, ``modulation.lin`` or
``final_layer.adaLN_modulation``. diffusers' ``convert_chroma_transformer_checkpoint_to_diffusers``
is the reference. T5-XXL and the VAE (Flux's ``ae.safetensors``) come from their own files, as
ComfyUI and stable-diffusion.cpp (``--t5xxl``, ``--vae``) take them; the VAE file gives the
decoder and img2img's encoder (``flux.flow_vae_components``: optional, a decoder-only file runs
txt2img only).

The published numbers (diffusers' ``ChromaTransformer2DModel`` config of lodestones/Chroma1-HD):
Flux's width 3072 (24 heads of 128), 64 input channels, T5-XXL context 4096, 19 double and 38
single blocks; the approximator: 64 input channels (timestep, guidance and modulation-index
embeddings, 16 + 16 + 32), width 5120, 5 layers; Flux's VAE and scheduler.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sdkit.families.family import Family, FamilyComponent, FolderSpec
from sdkit.families.flux import (
    FLOW_VARIANTS,
    FLUX_DEV_SCHEDULER,
    FLUX_LAYOUT,
    FluxGraphs,
    T5File,
    flow_vae_components,
)
from sdkit.families.flux_keys import COMFY_PREFIX, BflFlux
from sdkit.families.keymaps import TensorSource

# The full-size family's pipeline: the folder pipeline, as the tiny test family's (its graphs ship:
# chroma_transformer, t5xxl_encoder, flux_vae_decoder, flux_vae_encoder).
CHROMA_SINGLE_FILE_PIPELINE = "sdkit.pipelines.models.chroma:ChromaPipeline"
_APPROXIMATOR = re.compile(r"^distilled_guidance_layer\.(layers|norms)\.(\d+)\.(.+)$")
_LAYER = {"linear_1": "in_layer", "linear_2": "out_layer"}


@dataclass(frozen=True)
class ChromaArch:
    """The numbers of a Chroma transformer that its key layout and probes depend on."""

    hidden: int = 3072
    in_channels: int = 64
    context_dim: int = 4096  # T5-XXL
    approximator_channels: int = 64
    approximator_hidden: int = 5120
    approximator_layers: int = 5
    double_blocks: int = 19
    single_blocks: int = 38
    mlp_ratio: int = 4

    def probes(self) -> dict[str, tuple[int, ...]]:
        """Graph initializers and shapes a file of this architecture has."""
        h, a = self.hidden, self.approximator_hidden
        return {
            "x_embedder.weight": (h, self.in_channels),
            "context_embedder.weight": (h, self.context_dim),
            "distilled_guidance_layer.in_proj.weight": (a, self.approximator_channels),
            f"distilled_guidance_layer.layers.{self.approximator_layers - 1}.linear_1.weight": (a, a),
            "distilled_guidance_layer.out_proj.weight": (h, a),
            f"transformer_blocks.{self.double_blocks - 1}.attn.to_q.weight": (h, h),
            f"single_transformer_blocks.{self.single_blocks - 1}.proj_mlp.weight": (self.mlp_ratio * h, h),
        }


@dataclass(frozen=True)
class BflChroma:
    """Chroma's layout: BFL's Flux names (``BflFlux``) plus the approximator's, with or without
    ComfyUI's ``model.diffusion_model.`` prefix."""

    hidden: int
    prefix: str = ""  # the keys own no namespace: unread ones are reported, none is skipped

    def source(self, name: str, shape: Sequence[int]) -> TensorSource | None:
        if name.startswith("distilled_guidance_layer."):
            key = _approximator_key(name)
            return TensorSource((key, COMFY_PREFIX + key)) if key else None
        return BflFlux(self.hidden).source(name, shape)

    def ignored(self, key: str) -> bool:
        return False


def _approximator_key(name: str) -> str | None:
    module, _, param = name.rpartition(".")
    if module in ("distilled_guidance_layer.in_proj", "distilled_guidance_layer.out_proj"):
        return name
    match = _APPROXIMATOR.match(name)
    if match is None:
        return None
    kind, index, rest = match.groups()
    if kind == "norms":
        return f"distilled_guidance_layer.norms.{index}.scale" if rest == "weight" else None
    layer, _, param = rest.partition(".")
    return f"distilled_guidance_layer.layers.{index}.{_LAYER[layer]}.{param}" if layer in _LAYER else None


COMPONENT_FILES = {
    "t5xxl": "T5-XXL text encoder, e.g. t5xxl_fp16.safetensors",
    "vae": "the Flux VAE, e.g. BFL's ae.safetensors",
}


def chroma_family(
    name: str,
    label: str,
    graphs: FluxGraphs,
    arch: ChromaArch,
    pipeline: str = CHROMA_SINGLE_FILE_PIPELINE,
    folder: FolderSpec | None = None,
) -> Family:
    """A Chroma family: the transformer from a Chroma file, T5 and the VAE from their own files
    (``Family.files``; ``graphs.clip`` is unused), Flux's scheduler and VAE numbers."""
    components = {
        "text_encoder": FamilyComponent(graphs.t5, {FLUX_LAYOUT: T5File()}),
        "transformer": FamilyComponent(graphs.transformer, {FLUX_LAYOUT: BflChroma(arch.hidden)}, probes=arch.probes()),
        **flow_vae_components(graphs.vae_decoder, graphs.vae_encoder, graphs.vae_blocks, FLUX_LAYOUT, "vae."),
    }
    config: dict[str, Any] = {"vae_shift_factor": 0.1159, "patch_size": 2}
    return Family(
        name=name,
        label=label,
        pipeline=pipeline,
        components=components,
        prediction_type="flow",
        scheduler_config=FLUX_DEV_SCHEDULER,  # lodestones/Chroma1-HD scheduler_config.json: FLUX.1-dev's
        tokenizers={},
        text_outputs={"text_encoder": ("last_hidden_state",)},
        sample_size=128,
        latent_channels=16,
        vae_scaling_factor=0.3611,
        vae_scale_factor=2 ** (graphs.vae_blocks - 1),
        fp32_components=("vae_decoder", "vae_encoder"),
        files=COMPONENT_FILES,
        config=config,
        folder=folder,
    )


# Chroma's diffusers ONNX folders: T5 its one text encoder (its tokenizer folder optional).
CHROMA_FOLDER = FolderSpec(
    required=("text_encoder", "transformer", "vae_decoder"),
    optional=("vae_encoder",),
    tokenizers={"text_encoder": "tokenizer"},
    text_outputs={"text_encoder": ("last_hidden_state",)},
    class_names=("Chroma",),
    rank=30,
    refused=FLOW_VARIANTS,
    shipped_vocab=("text_encoder",),
    denoiser="transformer",
    denoiser_keys=(),
)
CHROMA = chroma_family("chroma", "Chroma", FluxGraphs("chroma_transformer"), ChromaArch(), folder=CHROMA_FOLDER)
