"""SwinIR upscaler files: configuration read from keys and shapes, held to spandrel's own detection
(``fixtures/upscalers/swinir_goldens.json``: spandrel loaded each case's state dict as SwinIR with
the scale and tags recorded there) and to the shipped graphs' parameter manifests; files that are
not SwinIR, or a SwinIR sdkit does not run, refused clearly.

The numbers (sdkit's backends vs spandrel's outputs) are in ``tests/pipelines/test_swinir_upscaler.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sdkit.errors import ModelFormatError
from sdkit.families import upscalers
from sdkit.families.upscalers import SwinIRConfig, UpscalerFile, canonical_names, detect_config, find_graph

from .test_upscalers import GOLDENS as ESRGAN_GOLDENS
from .test_upscalers import header_only

FIXTURES = Path(__file__).resolve().parents[4] / "fixtures" / "upscalers"
GOLDENS: dict[str, Any] = json.loads((FIXTURES / "swinir_goldens.json").read_text())["cases"]
MANIFEST: dict[str, dict[str, list[int]]] = json.loads(
    (FIXTURES.parent / "families" / "manifest.json").read_text(encoding="utf-8")
)
SHIPPED = [
    "swinir_nc_e180_d6x6_h6x6_w8_m2_1conv_x2",
    "swinir_nc_e180_d6x6_h6x6_w8_m2_1conv_x4",
    "swinir_nc_e240_d6x9_h8x9_w8_m2_3conv_x4",
    "swinir_ps_e180_d6x6_h6x6_w8_m2_1conv_x2",
    "swinir_ps_e180_d6x6_h6x6_w8_m2_1conv_x3",
    "swinir_ps_e180_d6x6_h6x6_w8_m2_1conv_x4",
    "swinir_ps_e180_d6x6_h6x6_w8_m2_1conv_x8",
    "swinir_psd_e60_d6x4_h6x4_w8_m2_1conv_x2",
    "swinir_psd_e60_d6x4_h6x4_w8_m2_1conv_x3",
    "swinir_psd_e60_d6x4_h6x4_w8_m2_1conv_x4",
]


def config_of(entries: list[tuple[str, list[int]]]) -> SwinIRConfig:
    arch, layout, names = canonical_names([k for k, _ in entries])
    assert (arch, layout) == ("swinir", "swinir")
    config = detect_config({names[k]: tuple(s) for k, s in entries})
    assert isinstance(config, SwinIRConfig)
    return config


@pytest.mark.parametrize("case", sorted(GOLDENS))
def test_detection_agrees_with_spandrel(case: str, tmp_path: Path) -> None:
    """Every case, tiny and full size: the configuration it was built with, spandrel's scale and
    size tag; the graph's every initializer filled with its shape, the buffers left out (header-only
    files: no weights read)."""
    facts = GOLDENS[case]
    spec = facts["spec"]
    file = UpscalerFile(header_only(tmp_path / f"{case}.safetensors", facts["entries"]))
    config = file.config
    assert isinstance(config, SwinIRConfig) and facts["spandrel"]["architecture"] == "SwinIR"
    assert config.scale == facts["spandrel"]["scale"]
    assert f"s{config.img_size}w{config.window_size}" in facts["spandrel"]["tags"]
    assert f"{config.embed_dim}dim" in facts["spandrel"]["tags"] and config.resi_connection in facts["spandrel"]["tags"]
    built = (
        spec["embed_dim"],
        tuple(spec["depths"]),
        tuple(spec["num_heads"]),
        spec["window_size"],
        spec["mlp_ratio"],
        spec["upsampler"],
        spec["scale"],
        spec["resi_connection"],
        spec["img_size"],
    )
    assert built == (
        config.embed_dim,
        config.depths,
        config.num_heads,
        config.window_size,
        config.mlp_ratio,
        config.upsampler,
        config.net_scale,
        config.resi_connection,
        config.img_size,
    )
    graph = find_graph(config, [FIXTURES / "tiny"])
    specs = {t.name: [int(d) for d in t.dims] for t in graph.proto.graph.initializer}
    weights = {k: list(s) for k, s in facts["entries"] if not k.endswith(upscalers.SWINIR_BUFFERS)}
    assert weights == specs
    file.close()


@pytest.mark.parametrize("name", SHIPPED)
def test_each_shipped_graph_is_what_its_parameters_detect_as(name: str) -> None:
    """The export's parameter manifest (every initializer and shape of the graph), with the
    buffers every SwinIR file carries, detects as the configuration the graph is named for."""
    params = MANIFEST[name]
    config = config_of([*params.items(), *_buffers(params, window=8, img_size=64)])
    assert config.graph_name == name and config.multiple_of == 8
    assert [n for n in upscalers.upscaler_graph_names() if n.startswith("swinir_")] == SHIPPED


def _buffers(params: dict[str, list[int]], window: int, img_size: int) -> list[tuple[str, list[int]]]:
    """The relative_position_index of every block and the attn_mask of the shifted ones."""
    out = []
    n = window * window
    for key in params:
        if key.endswith(".attn.relative_position_bias_table"):
            block = key.removesuffix(".attn.relative_position_bias_table")
            out.append((f"{block}.attn.relative_position_index", [n, n]))
            if int(block.rpartition(".")[2]) % 2:
                out.append((f"{block}.attn_mask", [(img_size // window) ** 2, n, n]))
    return out


def test_a1111_swinir_4x_is_the_large_real_world_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A1111's "SwinIR 4x" is 003_realSR_BSRGAN_DFOWMFC_s64w8_SwinIR-L_x4_GAN saved as
    ``SwinIR_4x.pth``; converted, ``SwinIR_4x.safetensors`` answers to that name, its shapes
    detect as SwinIR-L (embed 240, 9 x 6 blocks of 8 heads, window 8, nearest+conv, 3conv) and
    ``sdkit inspect`` names it with its shipped graph."""
    from sdkit.families import Checkpoint, describe

    params = MANIFEST["swinir_nc_e240_d6x9_h8x9_w8_m2_3conv_x4"]
    entries = [*params.items(), *_buffers(params, window=8, img_size=64)]
    path = header_only(tmp_path / "SwinIR_4x.safetensors", entries)
    monkeypatch.setenv(upscalers.UPSCALER_DIR_ENV, str(tmp_path))
    assert upscalers.find_upscaler("SwinIR 4x") == path
    assert "SwinIR 4x" in upscalers.available_upscalers()
    config = UpscalerFile(path).config
    assert config.describe() == (
        "SwinIR 4x (embed_dim=240, depths=6x9, heads=8x9, window=8, mlp_ratio=2, nearest+conv, 3conv)"
    )
    found = describe(Checkpoint.open(path), [])
    assert found.kind == "upscaler" and found.title.startswith("4x upscaler")
    assert dict(found.details)["graph"] == "swinir_nc_e240_d6x9_h8x9_w8_m2_3conv_x4"
    assert dict(found.details)["layout"] == "SwinIR"


def test_not_swinir_and_unsupported_swinir_are_one_clear_error(tmp_path: Path) -> None:
    """Negative controls: the ESRGAN and Compact cases still detect as themselves; a SwinIR
    state dict without its relative_position_index (what spandrel's detection also requires) is
    not an upscaler sdkit reads; a pixel-unshuffled input, a grey model, a window as large as the
    training size and an unshipped configuration are each refused, naming why."""
    for case in ("esrgan_x4_realesrgan", "compact_x4"):
        arch, _, _ = canonical_names([k for k, _ in ESRGAN_GOLDENS[case]["entries"]])
        assert arch == ESRGAN_GOLDENS[case]["arch"]
    entries: list[tuple[str, list[int]]] = [(k, list(s)) for k, s in GOLDENS["swinir_ps_x2"]["entries"]]
    no_index = [(k, s) for k, s in entries if not k.endswith("relative_position_index")]
    with pytest.raises(ModelFormatError, match="not an upscaler file"):
        UpscalerFile(header_only(tmp_path / "no_index.safetensors", no_index))
    unshuffled = [("conv_first.1.weight" if k == "conv_first.weight" else k, s) for k, s in entries]
    with pytest.raises(ModelFormatError, match="pixel-unshuffled"):
        canonical_names([k for k, _ in unshuffled])
    grey = [(k, [s[0], 1, *s[2:]] if k == "conv_first.weight" else s) for k, s in entries]
    with pytest.raises(ModelFormatError, match="only RGB"):
        UpscalerFile(header_only(tmp_path / "grey.safetensors", grey))
    small = [(k, [1, *s[1:]] if k.endswith("attn_mask") else s) for k, s in entries]  # training size 4 = window
    with pytest.raises(ModelFormatError, match="training size"):
        UpscalerFile(header_only(tmp_path / "small.safetensors", small))
    file = UpscalerFile(header_only(tmp_path / "tiny.safetensors", entries))
    with pytest.raises(ModelFormatError, match=r"SwinIR 2x \(embed_dim=16.*export_swinir_graphs"):
        find_graph(file.config)
    file.close()


@pytest.mark.parametrize(
    ("key", "shape"),
    [
        ("conv_first.weight", [0, 3, 3, 3]),  # embed 0: the MLP ratio divides by it
        ("layers.0.residual_group.blocks.0.attn.relative_position_index", [0, 0]),  # window 0
        ("layers.0.residual_group.blocks.0.attn.relative_position_index", [15]),  # not a square
        ("layers.0.residual_group.blocks.1.attn_mask", []),  # a scalar mask
        ("upsample.0.weight", [256, 0, 3, 3]),  # pixelshuffle scale from a zero width
    ],
)
def test_odd_shapes_are_a_model_format_error(key: str, shape: list[int], tmp_path: Path) -> None:
    """Hostile headers: one ModelFormatError each, never a ZeroDivisionError or IndexError."""
    entries = [(k, shape if k == key else list(s)) for k, s in GOLDENS["swinir_ps_x2"]["entries"]]
    with pytest.raises(ModelFormatError):
        UpscalerFile(header_only(tmp_path / "odd.safetensors", entries)).close()


def test_relative_position_index_is_spandrels() -> None:
    """sdkit's index (the graph's constant, the loader's check) equals the buffer spandrel's
    module built, committed with the goldens."""
    key = "layers.0.residual_group.blocks.0.attn.relative_position_index"
    with np.load(FIXTURES / "swinir_goldens.npz") as data:
        want = data[f"swinir_nc_x4.buffer.{key}"]
    assert np.array_equal(upscalers.relative_position_index(4), want)
