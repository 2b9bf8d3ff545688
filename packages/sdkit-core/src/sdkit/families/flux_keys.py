"""FLUX.1's original (Black Forest Labs) single-file layout, mapped onto diffusers' names.

``flux1-dev.safetensors`` / ``flux1-schnell.safetensors`` as BFL publishes them, and ComfyUI's
copies of them with every key under ``model.diffusion_model.``, store the transformer as BFL's
``flux`` package names it; the graphs use diffusers' ``FluxTransformer2DModel`` names. The
renaming, derived from the names alone (any block count) and the hidden size (for the fused
tensors' row slices):

- embedders: ``img_in`` -> ``x_embedder``, ``txt_in`` -> ``context_embedder``, ``time_in`` /
  ``vector_in`` / ``guidance_in`` (dev only) ``.in_layer|.out_layer`` ->
  ``time_text_embed.timestep_embedder|text_embedder|guidance_embedder.linear_1|linear_2``;
- double block N (``double_blocks.N`` -> ``transformer_blocks.N``): ``img_mod.lin`` /
  ``txt_mod.lin`` -> ``norm1.linear`` / ``norm1_context.linear``; the fused ``img_attn.qkv`` and
  ``txt_attn.qkv`` are split in three row blocks -> ``attn.to_q|to_k|to_v`` and
  ``attn.add_q_proj|add_k_proj|add_v_proj``; ``*_attn.norm.query_norm|key_norm.scale`` -> the
  RMS norms ``attn.norm_q|norm_k`` (image) and ``attn.norm_added_q|norm_added_k`` (text);
  ``img_attn.proj`` / ``txt_attn.proj`` -> ``attn.to_out.0`` / ``attn.to_add_out``; the MLPs
  ``img_mlp.0|2`` / ``txt_mlp.0|2`` -> ``ff.net.0.proj|ff.net.2`` / ``ff_context.net...``;
- single block N (``single_blocks.N`` -> ``single_transformer_blocks.N``): ``linear1`` is q, k,
  v and the MLP input fused on rows ``[h, h, h, 4h]`` -> ``attn.to_q|to_k|to_v`` and
  ``proj_mlp``; ``linear2`` -> ``proj_out``; ``modulation.lin`` -> ``norm.linear``;
  ``norm.query_norm|key_norm.scale`` -> ``attn.norm_q|norm_k``;
- ``final_layer.linear`` -> ``proj_out``; ``final_layer.adaLN_modulation.1`` -> ``norm_out.linear``
  with its two row halves swapped (BFL's modulation is (shift, scale), diffusers'
  ``AdaLayerNormContinuous`` reads (scale, shift)).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from sdkit.families.keymaps import TensorSource

COMFY_PREFIX = "model.diffusion_model."

_TOP = {
    "x_embedder": "img_in",
    "context_embedder": "txt_in",
    "proj_out": "final_layer.linear",
    "norm_out.linear": "final_layer.adaLN_modulation.1",
    "time_text_embed.timestep_embedder.linear_1": "time_in.in_layer",
    "time_text_embed.timestep_embedder.linear_2": "time_in.out_layer",
    "time_text_embed.text_embedder.linear_1": "vector_in.in_layer",
    "time_text_embed.text_embedder.linear_2": "vector_in.out_layer",
    "time_text_embed.guidance_embedder.linear_1": "guidance_in.in_layer",
    "time_text_embed.guidance_embedder.linear_2": "guidance_in.out_layer",
}
_DOUBLE = {
    "norm1.linear": "img_mod.lin",
    "norm1_context.linear": "txt_mod.lin",
    "attn.to_out.0": "img_attn.proj",
    "attn.to_add_out": "txt_attn.proj",
    "ff.net.0.proj": "img_mlp.0",
    "ff.net.2": "img_mlp.2",
    "ff_context.net.0.proj": "txt_mlp.0",
    "ff_context.net.2": "txt_mlp.2",
}
_DOUBLE_NORMS = {
    "attn.norm_q": "img_attn.norm.query_norm.scale",
    "attn.norm_k": "img_attn.norm.key_norm.scale",
    "attn.norm_added_q": "txt_attn.norm.query_norm.scale",
    "attn.norm_added_k": "txt_attn.norm.key_norm.scale",
}
_DOUBLE_QKV = {
    "attn.to_q": ("img_attn.qkv", 0),
    "attn.to_k": ("img_attn.qkv", 1),
    "attn.to_v": ("img_attn.qkv", 2),
    "attn.add_q_proj": ("txt_attn.qkv", 0),
    "attn.add_k_proj": ("txt_attn.qkv", 1),
    "attn.add_v_proj": ("txt_attn.qkv", 2),
}
_SINGLE = {"norm.linear": "modulation.lin", "proj_out": "linear2"}
_SINGLE_NORMS = {"attn.norm_q": "norm.query_norm.scale", "attn.norm_k": "norm.key_norm.scale"}
_SINGLE_FUSED = {"attn.to_q": 0, "attn.to_k": 1, "attn.to_v": 2, "proj_mlp": 3}
_BLOCK = re.compile(r"^(transformer_blocks|single_transformer_blocks)\.(\d+)\.(.+)\.(weight|bias)$")


@dataclass(frozen=True)
class BflFlux:
    """The BFL Flux transformer layout, with or without ComfyUI's ``model.diffusion_model.``
    prefix (both spellings are candidate keys). ``hidden``: the model width (3072 for FLUX.1;
    heads x head dim), which places the fused tensors' row slices."""

    hidden: int
    prefix: str = ""  # the keys own no namespace: unread ones are reported, none is skipped

    def bfl_name(self, name: str, shape: Sequence[int]) -> tuple[str, tuple[int, int] | None, bool] | None:
        """The BFL key (without prefix) of a diffusers name, its row slice and whether its row
        halves are swapped; None for a name this layout has no rule for."""
        module, _, param = name.rpartition(".")
        if module in _TOP:
            return f"{_TOP[module]}.{param}", None, module == "norm_out.linear"
        match = _BLOCK.match(name)
        if match is None:
            return None
        kind, index, module, param = match.groups()
        rows = shape[0] if shape else 0
        if kind == "transformer_blocks":
            block = f"double_blocks.{index}."
            if module in _DOUBLE:
                return f"{block}{_DOUBLE[module]}.{param}", None, False
            if module in _DOUBLE_NORMS and param == "weight":
                return block + _DOUBLE_NORMS[module], None, False
            if module in _DOUBLE_QKV:
                fused, part = _DOUBLE_QKV[module]
                return f"{block}{fused}.{param}", (part * rows, (part + 1) * rows), False
            return None
        block = f"single_blocks.{index}."
        if module in _SINGLE:
            return f"{block}{_SINGLE[module]}.{param}", None, False
        if module in _SINGLE_NORMS and param == "weight":
            return block + _SINGLE_NORMS[module], None, False
        if module in _SINGLE_FUSED:
            begin = _SINGLE_FUSED[module] * self.hidden
            return f"{block}linear1.{param}", (begin, begin + rows), False
        return None

    def source(self, name: str, shape: Sequence[int]) -> TensorSource | None:
        found = self.bfl_name(name, shape)
        if found is None:
            return None
        key, rows, swapped = found
        return TensorSource((key, COMFY_PREFIX + key), rows=rows, swap_halves=swapped)

    def ignored(self, key: str) -> bool:
        return False
