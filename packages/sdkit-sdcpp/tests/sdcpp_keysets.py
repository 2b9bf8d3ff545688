"""Header-only safetensors files with each family's tensor names, as the files people download
have them (the denoiser alone, or a whole checkpoint): the header is real, the data a sparse hole
of the right length, so a 14B model's key set costs a few KB on disk."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

Shapes = dict[str, tuple[int, ...]]


def header_only(path: Path, shapes: Shapes) -> Path:
    """A safetensors file declaring ``shapes`` (F16) whose data is a sparse hole."""
    header: dict[str, object] = {}
    offset = 0
    for name, shape in shapes.items():
        size = math.prod(shape) * 2
        header[name] = {"dtype": "F16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with path.open("wb") as stream:
        stream.write(struct.pack("<Q", len(text)) + text)
        stream.truncate(8 + len(text) + offset)
    return path


def _wan(dim: int, channels: int, *more: str) -> Shapes:
    shapes: Shapes = {
        "model.diffusion_model.patch_embedding.weight": (dim, channels, 1, 2, 2),
        "model.diffusion_model.blocks.0.self_attn.q.weight": (dim, dim),
        "model.diffusion_model.blocks.0.cross_attn.norm_k.weight": (dim,),
    }
    shapes.update({f"model.diffusion_model.{name}": (dim, 8) for name in more})
    return shapes


FLUX_BLOCKS: Shapes = {
    "double_blocks.0.img_attn.qkv.weight": (9216, 3072),
    "single_blocks.0.linear1.weight": (21504, 3072),
}
# family (as sdkit names it) -> the denoiser-only file's tensor names and shapes
DENOISERS: dict[str, Shapes] = {
    "FLUX.1": {**FLUX_BLOCKS, "img_in.weight": (3072, 64)},
    "FLUX.1 Fill": {**FLUX_BLOCKS, "img_in.weight": (3072, 384)},
    "Chroma": {**FLUX_BLOCKS, "img_in.weight": (3072, 64), "distilled_guidance_layer.in_proj.weight": (5120, 64)},
    "FLUX.2": {**FLUX_BLOCKS, "double_stream_modulation_img.lin.weight": (18432, 3072)},
    "SD3": {"joint_blocks.0.x_block.attn.qkv.weight": (4608, 1536), "x_embedder.proj.weight": (1536, 16, 2, 2)},
    "Qwen-Image": {"transformer_blocks.0.img_mod.1.weight": (18432, 3072), "img_in.weight": (3072, 64)},
    "Z-Image": {
        "noise_refiner.0.attention.qkv.weight": (11520, 3840),
        "context_refiner.0.attention.qkv.weight": (11520, 3840),
    },
    "Wan2.x T2V 1.3B": _wan(1536, 16),
    "Wan2.x T2V 14B": _wan(5120, 16),
    "Wan2.1 I2V 14B": _wan(5120, 36, "img_emb.proj.1.weight"),
    "Wan2.1 VACE 1.3B": _wan(1536, 16, "vace_blocks.0.before_proj.weight"),
    "Wan2.2 I2V 14B": _wan(5120, 36),
    "Wan2.2 TI2V 5B": _wan(3072, 48),
}
# the keys a whole checkpoint adds beside its denoiser (SD3.5's single files hold its VAE and encoders)
WHOLE_EXTRA: Shapes = {
    "first_stage_model.decoder.conv_in.weight": (512, 16, 3, 3),
    "text_encoders.clip_l.transformer.text_model.final_layer_norm.weight": (768,),
}
