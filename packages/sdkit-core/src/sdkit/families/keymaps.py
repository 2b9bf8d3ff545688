"""Key maps: where each initializer of a shipped graph is found in a checkpoint.

The graphs name their initializers as the diffusers/transformers modules do
(``down_blocks.1.attentions.0.proj_in.weight``, ``text_model.encoder.layers.0.mlp.fc1.weight``).
A checkpoint layout is a *renaming* of those names, which each class below derives from the
architecture's numbers (layers per block, which blocks have attention, block count, hidden size),
never from a hand-written table, so the same code maps a tiny test UNet and the real one:

- ``Prefixed``: the diffusers layout, ``<component folder>.<graph name>`` (one file, or a folder
  of per-component files read under those prefixes);
- ``LdmUNet``, ``LdmVae``, ``LdmClip``, ``OpenClip``: the LDM/SGM single-file layout
  (``model.diffusion_model.*``, ``first_stage_model.*``, ``cond_stage_model.transformer.*``,
  ``cond_stage_model.model.*``, ``conditioner.embedders.N.*``). The facts they encode are in
  ``fixtures/families/README.md`` ("Checkpoint key facts").

A mapper answers ``source(name, shape)`` with a ``TensorSource`` (the checkpoint key, and the
slice/transpose/reshape that turns the stored tensor into the graph's), and ``ignored(key)`` for
keys of its namespace it deliberately skips (buffers, the layer SD 2.x drops). LoRA and VAE files
use the same mappers (a LoRA module's weight is the graph name its ``source`` gives back).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class TensorSource:
    """Where one graph initializer comes from.

    keys: candidate checkpoint keys, the first present is read (older spellings after it).
    rows: a ``[begin, end)`` slice of the first axis (OpenCLIP's fused ``in_proj`` q/k/v).
    transpose: the stored matrix is the transpose of the graph's (OpenCLIP ``text_projection``).
    reshape: same values, the graph's shape (an LDM 1x1 conv ``[C, C, 1, 1]`` for a Linear ``[C, C]``).
    swap_halves: the two halves of the first axis are stored in the other order (Flux's final
    modulation: BFL's (shift, scale) is diffusers' (scale, shift)).
    """

    keys: tuple[str, ...]
    rows: tuple[int, int] | None = None
    transpose: bool = False
    reshape: bool = False
    swap_halves: bool = False

    @property
    def key(self) -> str:
        return self.keys[0]

    def stored_shape_fits(self, stored: Sequence[int], target: Sequence[int]) -> bool:
        """Whether a stored tensor of shape ``stored`` becomes one of shape ``target``."""
        shape = list(stored)
        if self.rows is not None:
            begin, end = self.rows
            if not shape or shape[0] < end:
                return False
            shape[0] = end - begin
        if self.transpose:
            shape = shape[::-1]
        if self.reshape:
            return _numel(shape) == _numel(target) and [d for d in shape if d != 1] == [d for d in target if d != 1]
        return shape == list(target)


def _numel(shape: Sequence[int]) -> int:
    total = 1
    for d in shape:
        total *= d
    return total


class KeyMapper(Protocol):
    """One component's renaming for one checkpoint layout."""

    @property
    def prefix(self) -> str:
        """The checkpoint namespace the component reads, e.g. ``model.diffusion_model.``."""
        ...

    def source(self, name: str, shape: Sequence[int]) -> TensorSource | None:
        """Where graph initializer ``name`` (of ``shape``) is stored; None if this map has no rule."""
        ...

    def ignored(self, key: str) -> bool:
        """Whether ``key`` (in ``prefix``) is deliberately not read (a buffer, a dropped layer)."""
        ...


# --- diffusers layout -------------------------------------------------------------------------

# diffusers < 0.14 named the VAE's mid-block attention differently; the SD 1.5 repository's VAE
# still does, and diffusers renames them on load.
_OLD_VAE_ATTENTION = {"to_q": "query", "to_k": "key", "to_v": "value", "to_out.0": "proj_attn"}
_OLD_VAE = re.compile(r"^(.*\.attentions\.\d+\.)(to_q|to_k|to_v|to_out\.0)(\.(?:weight|bias))$")


@dataclass(frozen=True)
class Prefixed:
    """The diffusers layout: ``prefix + graph name`` (``unet.conv_in.weight``). For text encoders
    the ``text_model.`` part is optional (transformers >= 5.6 saves CLIP without it); for VAEs the
    pre-0.14 attention names (``query``, ``key``, ``value``, ``proj_attn``) are accepted too."""

    prefix: str

    def source(self, name: str, shape: Sequence[int]) -> TensorSource:
        keys = [self.prefix + name]
        if name.startswith("text_model."):
            keys.append(self.prefix + name.removeprefix("text_model."))
        old = _OLD_VAE.match(name)
        if old:
            keys.append(f"{self.prefix}{old.group(1)}{_OLD_VAE_ATTENTION[old.group(2)]}{old.group(3)}")
        return TensorSource(tuple(keys))

    def ignored(self, key: str) -> bool:
        return key.endswith("embeddings.position_ids")


# --- LDM / SGM layout -------------------------------------------------------------------------

_RESNET = {
    "norm1": "in_layers.0",
    "conv1": "in_layers.2",
    "time_emb_proj": "emb_layers.1",
    "norm2": "out_layers.0",
    "conv2": "out_layers.3",
    "conv_shortcut": "skip_connection",
}
_UNET_TOP = {
    "conv_in": "input_blocks.0.0",
    "time_embedding.linear_1": "time_embed.0",
    "time_embedding.linear_2": "time_embed.2",
    "add_embedding.linear_1": "label_emb.0.0",
    "add_embedding.linear_2": "label_emb.0.2",
    "conv_norm_out": "out.0",
    "conv_out": "out.2",
}
_PART = re.compile(r"^(resnets|attentions)\.(\d+)\.(.+)$")


def _resnet(module: str) -> str:
    layer, dot, tail = module.partition(".")
    return f"{_RESNET.get(layer, layer)}{dot}{tail}"


@dataclass(frozen=True)
class LdmUNet:
    """The LDM UNet (``model.diffusion_model.``) from diffusers' ``UNet2DConditionModel`` names.

    layers_per_block: L; a down block has L resnets, an up block L + 1.
    up_attention: per up block, whether it has attentions (its upsampler then sits at index 2 of
    its last output block, else at 1).
    """

    layers_per_block: int
    up_attention: tuple[bool, ...]
    prefix: str = "model.diffusion_model."

    def ldm_name(self, name: str) -> str | None:
        """The LDM name (without prefix) of a diffusers UNet parameter name."""
        module, _, param = name.rpartition(".")
        for diffusers, ldm in _UNET_TOP.items():
            if module == diffusers:
                return f"{ldm}.{param}"
        path = self._block_path(module)
        return f"{path}.{param}" if path else None

    def _block_path(self, module: str) -> str | None:
        step = self.layers_per_block + 1
        match = re.match(r"^(down_blocks|up_blocks)\.(\d+)\.(.+)$", module)
        if match:
            kind, block, rest = match.group(1), int(match.group(2)), match.group(3)
            if rest == "downsamplers.0.conv" and kind == "down_blocks":
                return f"input_blocks.{(block + 1) * step}.0.op"
            if rest == "upsamplers.0.conv" and kind == "up_blocks":
                index = 2 if self.up_attention[block] else 1
                return f"output_blocks.{block * step + self.layers_per_block}.{index}.conv"
            part = _PART.match(rest)
            if part is None:
                return None
            layer, inner = int(part.group(2)), part.group(3)
            slot = "0" if part.group(1) == "resnets" else "1"
            inner = _resnet(inner) if part.group(1) == "resnets" else inner
            if kind == "down_blocks":
                return f"input_blocks.{1 + block * step + layer}.{slot}.{inner}"
            return f"output_blocks.{block * step + layer}.{slot}.{inner}"
        match = re.match(r"^mid_block\.(resnets|attentions)\.(\d+)\.(.+)$", module)
        if match:
            kind, index, inner = match.group(1), int(match.group(2)), match.group(3)
            if kind == "resnets":
                return f"middle_block.{2 * index}.{_resnet(inner)}"
            return f"middle_block.1.{inner}"
        return None

    def source(self, name: str, shape: Sequence[int]) -> TensorSource | None:
        ldm = self.ldm_name(name)
        return TensorSource((self.prefix + ldm,)) if ldm else None

    def ignored(self, key: str) -> bool:
        return False


_VAE_RESNET = {"conv_shortcut": "nin_shortcut"}
_VAE_ATTENTION = {"group_norm": "norm", "to_q": "q", "to_k": "k", "to_v": "v", "to_out.0": "proj_out"}


@dataclass(frozen=True)
class LdmVae:
    """The LDM VAE (``first_stage_model.``; a standalone VAE file has no prefix) from diffusers'
    ``AutoencoderKL`` names. ``blocks``: the number of down (= up) blocks; the decoder's up
    blocks are numbered in reverse in LDM. The mid-block attention's q/k/v/proj_out are 1x1
    convs there, Linear layers in the graph."""

    blocks: int
    prefix: str = "first_stage_model."

    def ldm_name(self, name: str) -> tuple[str, bool] | None:
        """The LDM name (without prefix) and whether the tensor is a 1x1 conv to reshape."""
        module, _, param = name.rpartition(".")
        if module in ("quant_conv", "post_quant_conv"):
            return name, False
        side, _, rest = module.partition(".")
        if side not in ("encoder", "decoder"):
            return None
        renamed = {"conv_norm_out": "norm_out"}.get(rest, rest)
        match = re.match(
            r"^(down_blocks|up_blocks)\.(\d+)\.(resnets\.(\d+)|downsamplers\.0|upsamplers\.0)\.?(.*)$", rest
        )
        if match:
            block = int(match.group(2))
            kind = "down" if match.group(1) == "down_blocks" else "up"
            index = block if kind == "down" else self.blocks - 1 - block
            if match.group(4) is not None:
                inner = match.group(5)
                layer, _, tail = inner.partition(".")
                renamed = f"{kind}.{index}.block.{match.group(4)}.{_VAE_RESNET.get(layer, layer)}"
                renamed += f".{tail}" if tail else ""
            else:
                renamed = f"{kind}.{index}.{'downsample' if kind == 'down' else 'upsample'}.{match.group(5)}"
        elif rest.startswith("mid_block.resnets."):
            number, _, inner = rest.removeprefix("mid_block.resnets.").partition(".")
            layer, _, tail = inner.partition(".")
            renamed = f"mid.block_{int(number) + 1}.{_VAE_RESNET.get(layer, layer)}" + (f".{tail}" if tail else "")
        elif rest.startswith("mid_block.attentions.0."):
            inner = rest.removeprefix("mid_block.attentions.0.")
            if inner not in _VAE_ATTENTION:
                return None
            return f"{side}.mid.attn_1.{_VAE_ATTENTION[inner]}.{param}", inner != "group_norm"
        return f"{side}.{renamed}.{param}", False

    def source(self, name: str, shape: Sequence[int]) -> TensorSource | None:
        found = self.ldm_name(name)
        if found is None:
            return None
        ldm, conv = found
        return TensorSource((self.prefix + ldm,), reshape=conv and len(shape) == 2)

    def ignored(self, key: str) -> bool:
        return False


@dataclass(frozen=True)
class LdmClip:
    """CLIP-L as the LDM wrapper stores it: ``<prefix>text_model.*`` (SD 1.x
    ``cond_stage_model.transformer.``, SDXL ``conditioner.embedders.0.transformer.``). Files
    saved with transformers < 4.20 lack the ``text_model.`` part (A1111 renames them on load)."""

    prefix: str = "cond_stage_model.transformer."

    def source(self, name: str, shape: Sequence[int]) -> TensorSource:
        return TensorSource((self.prefix + name, self.prefix + name.removeprefix("text_model.")))

    def ignored(self, key: str) -> bool:
        return key.endswith("embeddings.position_ids")


_OPENCLIP_LAYER = {
    "layer_norm1": "ln_1",
    "layer_norm2": "ln_2",
    "mlp.fc1": "mlp.c_fc",
    "mlp.fc2": "mlp.c_proj",
    "self_attn.out_proj": "attn.out_proj",
}
_QKV = {"q_proj": 0, "k_proj": 1, "v_proj": 2}


@dataclass(frozen=True)
class OpenClip:
    """OpenCLIP's text tower as LDM/SGM files store it (``cond_stage_model.model.`` SD 2.x,
    ``conditioner.embedders.1.model.`` SDXL, ``conditioner.embedders.0.model.`` the refiner),
    mapped to the graph's transformers ``CLIPTextModel`` names.

    layers: the graph's encoder layers; the file's later ones are skipped (SD 2.x reads the
    penultimate layer: its graph has 23 of the file's 24). q/k/v are row slices of the fused
    ``in_proj``; ``text_projection`` is stored transposed ``[H, P]``; ``projection``: whether the
    graph reads it (SDXL's bigG does, SD 2.x's does not).
    """

    layers: int
    projection: bool = False
    prefix: str = "cond_stage_model.model."

    def source(self, name: str, shape: Sequence[int]) -> TensorSource | None:
        p = self.prefix
        simple = {
            "text_model.embeddings.token_embedding.weight": "token_embedding.weight",
            "text_model.embeddings.position_embedding.weight": "positional_embedding",
            "text_model.final_layer_norm.weight": "ln_final.weight",
            "text_model.final_layer_norm.bias": "ln_final.bias",
        }
        if name in simple:
            return TensorSource((p + simple[name],))
        if name == "text_projection.weight":
            return TensorSource((p + "text_projection",), transpose=True)
        match = re.match(r"^text_model\.encoder\.layers\.(\d+)\.(.+)\.(weight|bias)$", name)
        if match is None:
            return None
        layer, module, param = match.groups()
        block = f"{p}transformer.resblocks.{layer}."
        attention = module.removeprefix("self_attn.")
        if attention in _QKV:
            rows = shape[0]
            index = _QKV[attention]
            return TensorSource((f"{block}attn.in_proj_{param}",), rows=(index * rows, (index + 1) * rows))
        if module in _OPENCLIP_LAYER:
            return TensorSource((f"{block}{_OPENCLIP_LAYER[module]}.{param}",))
        return None

    def ignored(self, key: str) -> bool:
        rest = key.removeprefix(self.prefix)
        if rest in ("logit_scale", "attn_mask") or (rest == "text_projection" and not self.projection):
            return True
        match = re.match(r"^transformer\.resblocks\.(\d+)\.", rest)
        return bool(match and int(match.group(1)) >= self.layers)
