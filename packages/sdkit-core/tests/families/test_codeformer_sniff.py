"""CodeFormer files recognised from keys and shapes as spandrel_extra_arches recognises them.

Oracle for the keys and shapes: the state dicts of spandrel_extra_arches' CodeFormer at v0.1.0's
configuration and at the tiny test configuration, recorded by ``fixtures/faces/codeformer/make_goldens.py``
(v0.1.0's through spandrel's own ``ModelLoader``, which detected it as ``CodeFormer``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sdkit.errors import ModelFormatError
from sdkit.families.codeformer import V010, CodeFormerConfig, sniff

FIXTURES = Path(__file__).resolve().parents[4] / "fixtures" / "faces" / "codeformer"
CASES: dict[str, Any] = json.loads((FIXTURES / "goldens.json").read_text())["cases"]


def shapes(case: str, prefix: str = "") -> dict[str, tuple[int, ...]]:
    return {prefix + k: tuple(s) for k, s in CASES[case]["entries"]}


@pytest.mark.parametrize("prefix", ["", "params_ema.", "params.", "module."])
def test_v010_and_the_tiny_configuration_are_read_from_shapes(prefix: str) -> None:
    assert CASES["full_v010"]["spandrel"] == "CodeFormer"
    assert sniff(shapes("full_v010", prefix)) == V010
    assert V010.graph_name == CASES["full_v010"]["graph"]
    tiny = sniff(shapes("tiny", prefix))
    assert tiny == CodeFormerConfig(64, 32, (1, 1, 1, 1, 2, 2), 64, 2, 64, (4, 8, 16, 32))
    assert tiny.graph_name == CASES["tiny"]["graph"]


def test_spandrel_reads_fewer_fused_levels_from_the_keys() -> None:
    """spandrel's loader takes ``connect_list`` from the fuse blocks present: so does sniff."""
    fewer = {k: v for k, v in shapes("full_v010").items() if not k.startswith("fuse_convs_dict.32.")}
    config = sniff(fewer)
    assert config is not None and config.connect == (64, 128, 256)


def _esrgan() -> dict[str, tuple[int, ...]]:
    return {"model.0.weight": (64, 3, 3, 3), "model.1.sub.0.RDB1.conv1.0.weight": (32, 64, 3, 3)}


def _gfpgan() -> dict[str, tuple[int, ...]]:
    return {
        "conv_body_first.weight": (32, 3, 1, 1),
        "conv_body_down.0.conv1.weight": (32, 32, 3, 3),
        "stylegan_decoder.style_mlp.1.weight": (512, 512),
        "final_linear.weight": (8192, 8192),
    }


def _vqgan_only() -> dict[str, tuple[int, ...]]:
    """CodeFormer's stage-one VQGAN (vqgan_code1024.pth): encoder, codebook, generator, no transformer."""
    return {k: v for k, v in shapes("full_v010").items() if k.split(".")[0] in ("encoder", "quantize", "generator")}


def _sd() -> dict[str, tuple[int, ...]]:
    return {
        "model.diffusion_model.input_blocks.0.0.weight": (320, 4, 3, 3),
        "first_stage_model.encoder.conv_in.weight": (128, 3, 3, 3),
    }


def _mixed_prefix() -> dict[str, tuple[int, ...]]:
    """Every key under the wrapper but the first: not one module's state dict, nothing stripped."""
    base = shapes("full_v010")
    return {("params_ema." + k if i else k): v for i, (k, v) in enumerate(base.items())}


def _missing_one(key: str) -> Any:
    return lambda: {k: v for k, v in shapes("full_v010").items() if k != key}


@pytest.mark.parametrize(
    "make",
    [
        dict,
        _esrgan,
        _gfpgan,
        _vqgan_only,
        _sd,
        _mixed_prefix,
        _missing_one("position_emb"),
        _missing_one("idx_pred_layer.1.weight"),
    ],
)
def test_foreign_files_are_not_codeformer(make: Any) -> None:
    assert sniff(make()) is None


@pytest.mark.parametrize(
    ("key", "shape", "match"),
    [
        ("position_emb", (255, 512), "square grid"),
        ("position_emb", (256, 500), "8 heads"),
        ("encoder.blocks.0.weight", (64, 4, 3, 3), "only RGB"),
        ("quantize.embedding.weight", (1024, 128), "codebook"),
        ("encoder.blocks.4.conv1.weight", (100, 64, 3, 3), "multiple of nf"),
        ("position_emb", (256,), "2 dimensions"),
        ("fuse_convs_dict.48.scale.0.weight", (256, 256, 3, 3), "not resolutions"),
    ],
)
def test_codeformer_keys_with_impossible_shapes_are_model_format_errors(
    key: str, shape: tuple[int, ...], match: str
) -> None:
    broken = {**shapes("full_v010"), key: shape}
    with pytest.raises(ModelFormatError, match=match):
        sniff(broken)
    missing = {k: v for k, v in shapes("full_v010").items() if k != "encoder.blocks.1.conv1.weight"}
    with pytest.raises(ModelFormatError, match="missing or odd"):
        sniff(missing)
