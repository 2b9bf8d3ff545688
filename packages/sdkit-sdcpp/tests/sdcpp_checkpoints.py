"""Full-architecture SD 1.5 and SDXL single files with seeded random fp16 weights, written at test
time (stable-diffusion.cpp infers the architecture from tensor names and shapes, and its layer
widths are fixed: a narrow test model does not load).

The tensor names and shapes come from the repo's fixtures, not from this plugin:
``fixtures/families/manifest.json`` (each shipped graph's state-dict names and shapes, exported
from diffusers' modules) turned into the LDM/SGM single-file layout by
``fixtures/families/ldm_writer.py`` (the writer diffusers' own single-file loader checked). Values:
one seeded standard-normal block, each tensor a slice of it at an offset its name gives, scaled by
``1/sqrt(fan_in)`` (norm scales 1 + noise, biases small), so activations stay finite in fp16.
Written streaming: an SD 1.5 file is 2.1 GB, SDXL's 6.9 GB.
"""

from __future__ import annotations

import json
import struct
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
FAMILIES = ROOT / "fixtures" / "families"
BLOCK = 1 << 23  # 8M values: the seeded block every tensor is cut from


def _fixtures() -> tuple[object, object, dict[str, dict[str, list[int]]]]:
    sys.path.insert(0, str(FAMILIES))
    try:
        import configs
        import ldm_writer
    finally:
        sys.path.remove(str(FAMILIES))
    manifest = json.loads((FAMILIES / "manifest.json").read_text(encoding="utf-8"))
    return configs, ldm_writer, manifest


def _placeholders(shapes: dict[str, list[int]]) -> dict[str, np.ndarray]:
    """Stride-0 arrays with the shapes: the converters rename and reshape them for free."""
    zero = np.zeros((), np.float16)
    return {name: np.broadcast_to(zero, tuple(shape)) for name, shape in shapes.items()}


def ldm_shapes(family: str) -> dict[str, tuple[int, ...]]:
    """LDM/SGM key -> shape of a full-size ``sd15`` or ``sdxl`` single file (int64 buffers aside)."""
    configs, writer, manifest = _fixtures()
    vae = {**manifest["vae_encoder"], **manifest["vae_decoder"]}
    rng = np.random.default_rng(0)
    if family == "sd15":
        state = {
            **writer.unet_to_ldm(_placeholders(manifest["sd1_unet"]), configs.SD1_UNET),  # type: ignore[attr-defined]
            **writer.vae_to_ldm(_placeholders(vae), configs.VAE),  # type: ignore[attr-defined]
            **writer.clip_to_ldm(_placeholders(manifest["clip_l"]), "cond_stage_model.transformer."),  # type: ignore[attr-defined]
        }
    elif family == "sdxl":
        state = {
            **writer.unet_to_ldm(_placeholders(manifest["sdxl_unet"]), configs.SDXL_UNET),  # type: ignore[attr-defined]
            **writer.vae_to_ldm(_placeholders(vae), configs.VAE),  # type: ignore[attr-defined]
            **writer.clip_to_ldm(_placeholders(manifest["clip_l"]), "conditioner.embedders.0.transformer."),  # type: ignore[attr-defined]
            **writer.openclip_to_ldm(_placeholders(manifest["openclip_bigg"]), "conditioner.embedders.1.model.", rng),  # type: ignore[attr-defined]
        }
    else:
        raise ValueError(family)
    return {name: tuple(value.shape) for name, value in state.items()}


def _values(name: str, shape: tuple[int, ...], block: np.ndarray) -> np.ndarray:
    count = int(np.prod(shape, dtype=np.int64))
    start = zlib.crc32(name.encode()) % BLOCK
    index = (start + np.arange(count, dtype=np.int64)) % BLOCK if count > BLOCK - start else None
    raw = block[index] if index is not None else block[start : start + count]
    if len(shape) >= 2:
        scale = 1.0 / np.sqrt(float(np.prod(shape[1:])))
        values = raw * scale
    elif name.endswith("weight") and any(part in name for part in ("norm", "ln_1", "ln_2", "ln_final")):
        values = 1.0 + raw * 0.02
    else:
        values = raw * 0.02
    return values.reshape(shape).astype(np.float16)


def _tensors(shapes: dict[str, tuple[int, ...]], seed: int) -> Iterator[tuple[str, str, tuple[int, ...], int]]:
    for name in sorted(shapes):
        shape = shapes[name]
        if name.endswith("position_ids"):
            yield name, "I64", shape, int(np.prod(shape)) * 8
        elif name.endswith("logit_scale"):
            yield name, "F32", shape, 4
        else:
            yield name, "F16", shape, int(np.prod(shape, dtype=np.int64)) * 2


def controlnet_shapes() -> dict[str, tuple[int, ...]]:
    """An SD 1.5 ControlNet in the original (lllyasviel) layout stable-diffusion.cpp reads: the
    UNet's time embedding, input blocks and middle block under ``control_model.``, the hint
    encoder (3 -> 16 -> 32 -> 96 -> 256 -> 320 channels), a 1x1 zero conv per input block and
    the middle block's."""
    unet = "model.diffusion_model."
    shapes = {
        "control_model." + name[len(unet) :]: shape
        for name, shape in ldm_shapes("sd15").items()
        if name.startswith(tuple(unet + part for part in ("time_embed.", "input_blocks.", "middle_block.")))
    }
    hint = [(16, 3), (16, 16), (32, 16), (32, 32), (96, 32), (96, 96), (256, 96), (320, 256)]
    for index, (out, inp) in enumerate(hint):
        shapes[f"control_model.input_hint_block.{index * 2}.weight"] = (out, inp, 3, 3)
        shapes[f"control_model.input_hint_block.{index * 2}.bias"] = (out,)
    widths = [320, 320, 320, 320, 640, 640, 640, 1280, 1280, 1280, 1280, 1280]
    for index, width in enumerate(widths):
        shapes[f"control_model.zero_convs.{index}.0.weight"] = (width, width, 1, 1)
        shapes[f"control_model.zero_convs.{index}.0.bias"] = (width,)
    shapes["control_model.middle_block_out.0.weight"] = (1280, 1280, 1, 1)
    shapes["control_model.middle_block_out.0.bias"] = (1280,)
    return shapes


def write_checkpoint(path: Path, family: str, seed: int = 0) -> Path:
    """Write the full-size ``family`` (``sd15``, ``sdxl``, ``sd15_controlnet``) file to ``path``."""
    shapes = controlnet_shapes() if family == "sd15_controlnet" else ldm_shapes(family)
    header: dict[str, object] = {"__metadata__": {"format": "pt", "sdkit_test": f"{family} seed {seed}"}}
    offset = 0
    entries = list(_tensors(shapes, seed))
    for name, dtype, shape, size in entries:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    block = np.random.default_rng(seed).standard_normal(BLOCK, dtype=np.float32)
    with path.open("wb") as out:
        out.write(struct.pack("<Q", len(text)) + text)
        for name, dtype, shape, _ in entries:
            if dtype == "I64":
                out.write(np.arange(shape[-1], dtype=np.int64).reshape(shape).tobytes())
            elif dtype == "F32":
                out.write(np.asarray(np.log(1 / 0.07), np.float32).tobytes())
            else:
                out.write(_values(name, shape, block).tobytes())
    return path


def cached_checkpoint(request: Any, family: str) -> Path:
    """``family``'s random file, written once per checkout into pytest's cache folder."""
    folder = request.config.cache.mkdir("sdkit-sdcpp")
    path = folder / f"{family}-random-fp16.safetensors"
    if not path.is_file():
        partial = path.with_suffix(".partial")
        write_checkpoint(partial, family)
        partial.rename(path)
    return Path(path)


def write_lora(path: Path) -> Path:
    """A kohya LoRA on two attention projections of the first down block (rank 4)."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(5)
    tensors = {}
    for target in ("attn1_to_q", "attn2_to_v"):
        key = f"lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_{target}"
        width = 320 if target == "attn1_to_q" else 768
        tensors[f"{key}.lora_up.weight"] = (rng.standard_normal((320, 4)) * 0.5).astype(np.float16)
        tensors[f"{key}.lora_down.weight"] = (rng.standard_normal((4, width)) * 0.5).astype(np.float16)
        tensors[f"{key}.alpha"] = np.array(4.0, np.float16)
    save_file(tensors, str(path))
    return path
