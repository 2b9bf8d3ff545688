"""SD3 / SD 3.5's original (Stability AI) single-file layout, mapped onto diffusers' names.

Stability's files (``sd3_medium.safetensors``, ``sd3.5_large.safetensors``,
``sd3.5_medium.safetensors``, the ``_incl_clips`` / ``_incl_clips_t5xxlfp16`` ones) keep the MMDiT
under ``model.diffusion_model.`` in the names of Stability's ``mmdit`` module (ComfyUI's
transformer-only copies have no prefix: both spellings are candidate keys); the graphs use
diffusers' ``SD3Transformer2DModel`` names. The renaming, derived from the names and shapes alone
(any depth, width, MMDiT-X attention layers):

- embedders: ``x_embedder.proj`` -> ``pos_embed.proj``, ``pos_embed`` -> ``pos_embed.pos_embed``,
  ``t_embedder.mlp.0|2`` / ``y_embedder.mlp.0|2`` ->
  ``time_text_embed.timestep_embedder|text_embedder.linear_1|linear_2``; ``context_embedder`` kept;
- joint block N (``joint_blocks.N`` -> ``transformer_blocks.N``): the fused ``x_block.attn.qkv``
  and ``context_block.attn.qkv`` split in three row blocks -> ``attn.to_q|to_k|to_v`` and
  ``attn.add_q_proj|add_k_proj|add_v_proj``; SD 3.5's RMS norms ``x_block.attn.ln_q|ln_k`` /
  ``context_block.attn.ln_q|ln_k`` -> ``attn.norm_q|norm_k`` / ``attn.norm_added_q|norm_added_k``;
  ``x_block.attn.proj`` / ``context_block.attn.proj`` -> ``attn.to_out.0`` / ``attn.to_add_out``;
  SD 3.5 Medium's second image attention ``x_block.attn2.*`` -> ``attn2.*`` the same way;
  ``x_block.adaLN_modulation.1`` / ``context_block.adaLN_modulation.1`` -> ``norm1.linear`` /
  ``norm1_context.linear``; ``x_block.mlp.fc1|fc2`` / ``context_block.mlp.fc1|fc2`` ->
  ``ff.net.0.proj|ff.net.2`` / ``ff_context.net...``;
- the last block's context side is "pre-only": no projection out, no MLP, and its modulation is a
  continuous AdaLayerNorm of two halves (rows ``2 * width``, the six-part zero-norm elsewhere)
  stored (shift, scale) where diffusers reads (scale, shift): swapped, like ``final_layer``'s;
- ``final_layer.linear`` -> ``proj_out``; ``final_layer.adaLN_modulation.1`` -> ``norm_out.linear``
  with its two row halves swapped.

diffusers' ``convert_sd3_transformer_checkpoint_to_diffusers`` is the reference this was derived
from (``fixtures/families/make_sd3_chroma_single_file.py`` checks it on tiny files and
``sd3_chroma_full_size_check.py`` on full-size headers).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from sdkit.families.flux_keys import COMFY_PREFIX
from sdkit.families.keymaps import LdmClip, TensorSource

_TOP = {
    "pos_embed.proj": "x_embedder.proj",
    "context_embedder": "context_embedder",
    "proj_out": "final_layer.linear",
    "norm_out.linear": "final_layer.adaLN_modulation.1",
    "time_text_embed.timestep_embedder.linear_1": "t_embedder.mlp.0",
    "time_text_embed.timestep_embedder.linear_2": "t_embedder.mlp.2",
    "time_text_embed.text_embedder.linear_1": "y_embedder.mlp.0",
    "time_text_embed.text_embedder.linear_2": "y_embedder.mlp.2",
}
_BLOCK = {
    "norm1.linear": "x_block.adaLN_modulation.1",
    "norm1_context.linear": "context_block.adaLN_modulation.1",
    "attn.to_out.0": "x_block.attn.proj",
    "attn.to_add_out": "context_block.attn.proj",
    "attn2.to_out.0": "x_block.attn2.proj",
    "ff.net.0.proj": "x_block.mlp.fc1",
    "ff.net.2": "x_block.mlp.fc2",
    "ff_context.net.0.proj": "context_block.mlp.fc1",
    "ff_context.net.2": "context_block.mlp.fc2",
    "attn.norm_q": "x_block.attn.ln_q",
    "attn.norm_k": "x_block.attn.ln_k",
    "attn.norm_added_q": "context_block.attn.ln_q",
    "attn.norm_added_k": "context_block.attn.ln_k",
    "attn2.norm_q": "x_block.attn2.ln_q",
    "attn2.norm_k": "x_block.attn2.ln_k",
}
_QKV = {
    "attn.to_q": ("x_block.attn.qkv", 0),
    "attn.to_k": ("x_block.attn.qkv", 1),
    "attn.to_v": ("x_block.attn.qkv", 2),
    "attn.add_q_proj": ("context_block.attn.qkv", 0),
    "attn.add_k_proj": ("context_block.attn.qkv", 1),
    "attn.add_v_proj": ("context_block.attn.qkv", 2),
    "attn2.to_q": ("x_block.attn2.qkv", 0),
    "attn2.to_k": ("x_block.attn2.qkv", 1),
    "attn2.to_v": ("x_block.attn2.qkv", 2),
}
_BLOCK_NAME = re.compile(r"^transformer_blocks\.(\d+)\.(.+)\.(weight|bias)$")


@dataclass(frozen=True)
class SaiMmdit:
    """Stability's MMDiT layout, under ``model.diffusion_model.`` (Stability's all-in-one files)
    or without it (a transformer-only file): both are candidate keys. ``hidden``: the model width
    (64 x heads), which tells the last block's two-part context modulation from the others' six."""

    hidden: int
    prefix: str = ""  # both spellings are read; unread keys are reported, none is skipped

    def sai_name(self, name: str, shape: Sequence[int]) -> tuple[str, tuple[int, int] | None, bool] | None:
        """Stability's key (without prefix) of a diffusers name, its row slice and whether its row
        halves are swapped; None for a name this layout has no rule for."""
        if name == "pos_embed.pos_embed":
            return "pos_embed", None, False
        module, _, param = name.rpartition(".")
        if module in _TOP:
            return f"{_TOP[module]}.{param}", None, module == "norm_out.linear"
        match = _BLOCK_NAME.match(name)
        if match is None:
            return None
        index, module, param = match.groups()
        block = f"joint_blocks.{index}."
        if module in _BLOCK:
            pre_only = module == "norm1_context.linear" and bool(shape) and shape[0] == 2 * self.hidden
            return f"{block}{_BLOCK[module]}.{param}", None, pre_only
        if module in _QKV:
            fused, part = _QKV[module]
            rows = shape[0] if shape else 0
            return f"{block}{fused}.{param}", (part * rows, (part + 1) * rows), False
        return None

    def source(self, name: str, shape: Sequence[int]) -> TensorSource | None:
        found = self.sai_name(name, shape)
        if found is None:
            return None
        key, rows, swapped = found
        return TensorSource((COMFY_PREFIX + key, key), rows=rows, swap_halves=swapped)

    def ignored(self, key: str) -> bool:
        return False


@dataclass(frozen=True)
class Sd3ClipL(LdmClip):
    """SD3's CLIP-L (transformers' names) in ``text_encoders.clip_l.transformer.`` (or a
    ComfyUI/stable-diffusion.cpp ``clip_l.safetensors`` read there): SD3 pools it unprojected,
    as ComfyUI and diffusers' single-file loader (an identity ``text_projection``) do, so a
    ``text_projection`` the file carries is deliberately not read."""

    def ignored(self, key: str) -> bool:
        rest = key.removeprefix(self.prefix)
        return super().ignored(key) or rest in ("text_projection.weight", "logit_scale")
