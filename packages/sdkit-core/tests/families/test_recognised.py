"""SD3 / SD 3.5 and Chroma files that match none of the registered families (here: headers with
the layouts' telltale keys but not the families' full probe sets) (``sdkit.families.recognised``):
named from their header, with what they hold, and refused by name with the reason, never "unknown".

The files are header-only (sparse) with the real layouts' key names and full-size shapes (SD 3.5
Large: 38 joint blocks of width 2432; SD3 Medium: 24 of 1536; Chroma: Flux's 19 + 38 blocks of
width 3072 with ``distilled_guidance_layer`` and no ``vector_in``/``guidance_in``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import sdkit
from sdkit.errors import UnsupportedFamilyError
from sdkit.families import Checkpoint, describe, detect
from sdkit.pipelines.loaders.families import registered_families
from sdkit.testing.cli_output import without_progress
from sdkit.testing.safetensors_files import write_header_only_safetensors


def sd3_shapes(depth: int, prefix: str, encoders: bool, mmdit_x: bool = False) -> dict[str, tuple[int, ...]]:
    h = 64 * depth
    shapes: dict[str, tuple[int, ...]] = {f"{prefix}x_embedder.proj.weight": (h, 16, 2, 2)}
    for i in range(depth):
        shapes[f"{prefix}joint_blocks.{i}.x_block.attn.qkv.weight"] = (3 * h, h)
        shapes[f"{prefix}joint_blocks.{i}.context_block.attn.qkv.weight"] = (3 * h, h)
        if mmdit_x and i < 13:
            shapes[f"{prefix}joint_blocks.{i}.x_block.attn2.qkv.weight"] = (3 * h, h)
    shapes[f"{prefix}final_layer.linear.weight"] = (64, h)
    if encoders:
        shapes["text_encoders.clip_l.transformer.text_model.final_layer_norm.weight"] = (768,)
        shapes["text_encoders.clip_g.transformer.text_model.final_layer_norm.weight"] = (1280,)
        shapes["text_encoders.t5xxl.transformer.encoder.final_layer_norm.weight"] = (4096,)
    return shapes


def chroma_shapes(prefix: str) -> dict[str, tuple[int, ...]]:
    h = 3072
    shapes: dict[str, tuple[int, ...]] = {f"{prefix}img_in.weight": (h, 64), f"{prefix}txt_in.weight": (h, 4096)}
    shapes[f"{prefix}distilled_guidance_layer.in_proj.weight"] = (5120, 64)
    shapes.update({f"{prefix}double_blocks.{i}.img_attn.qkv.weight": (3 * h, h) for i in range(19)})
    shapes.update({f"{prefix}single_blocks.{i}.linear1.weight": (7 * h, h) for i in range(38)})
    return shapes


CASES = [
    (
        "sd3.5_large.safetensors",
        sd3_shapes(38, "model.diffusion_model.", True),
        "SD 3.5 Large",
        "clip_l, clip_g, t5xxl",
    ),
    ("sd3_medium.safetensors", sd3_shapes(24, "model.diffusion_model.", False), "SD3 Medium", "none in the file"),
    ("sd3.5_medium.safetensors", sd3_shapes(24, "", False, mmdit_x=True), "SD 3.5 Medium", "none in the file"),
    ("chroma-unlocked-v37.safetensors", chroma_shapes(""), "Chroma", "T5-XXL only"),
    ("chroma_comfy.safetensors", chroma_shapes("model.diffusion_model."), "Chroma", "T5-XXL only"),
]


@pytest.mark.parametrize(("name", "shapes", "model", "encoders"), CASES)
def test_named_by_inspect_and_refused_by_name(
    tmp_path: Path, name: str, shapes: dict[str, tuple[int, ...]], model: str, encoders: str
) -> None:
    path = write_header_only_safetensors(tmp_path / name, shapes)
    checkpoint = Checkpoint.open(path)
    described = describe(checkpoint, registered_families())
    assert described.kind == "unsupported" and described.title.startswith(f"{model} checkpoint")
    assert encoders in dict(described.details)["text encoders"]
    with pytest.raises(UnsupportedFamilyError, match=rf"{name} is a {model} checkpoint: its \w+ matches no"):
        detect(checkpoint, registered_families())
    with pytest.raises(UnsupportedFamilyError, match="diffusers/optimum ONNX export folder"):
        sdkit.load_pipeline(path, backend="reference")


def test_the_command_line_says_so_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sdkit.cli.main import main

    shapes = sd3_shapes(38, "model.diffusion_model.", True)
    path = write_header_only_safetensors(tmp_path / "sd3.5_large.safetensors", shapes)
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "SD 3.5 Large checkpoint" in out and "38 joint blocks, width 2432" in out
    assert main(["generate", "a cat", "--model", str(path)]) == 1
    err = without_progress(capsys.readouterr().err)
    assert err.startswith("sdkit: error: sd3.5_large.safetensors is a SD 3.5 Large checkpoint") and err.count("\n") == 1
