"""Upscaler files: architecture, key layout and configuration detected from keys and shapes, held
to spandrel's own detection (``fixtures/upscalers/goldens.json``: spandrel loaded each case's
keys as the architecture and scale recorded there), and refused clearly when they are not one.

The numbers (sdkit's backends vs spandrel's outputs) are in ``tests/pipelines/test_upscaler.py``.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sdkit.errors import ModelFormatError
from sdkit.families import upscalers
from sdkit.families.upscalers import UpscalerConfig, UpscalerFile, canonical_names, find_graph

FIXTURES = Path(__file__).resolve().parents[4] / "fixtures" / "upscalers"
GOLDENS: dict[str, Any] = json.loads((FIXTURES / "goldens.json").read_text())["cases"]


def header_only(path: Path, entries: list[tuple[str, list[int]]], dtype: str = "F16") -> Path:
    """A safetensors file with the header of ``entries`` and zero-filled (sparse) data."""
    offset, header = 0, {}
    for key, shape in entries:
        size = int(np.prod(shape)) * 2
        header[key] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.truncate(8 + len(text) + offset)
    return path


@pytest.mark.parametrize("case", sorted(GOLDENS))
def test_detection_agrees_with_spandrel(case: str, tmp_path: Path) -> None:
    """Every layout (old ESRGAN, Real-ESRGAN, BSRGAN, Compact), tiny and full size: the same
    architecture and scale spandrel detected, nf/nb/num_conv as built, and the graph's every
    initializer filled with its shape (header-only files: no weights read)."""
    facts = GOLDENS[case]
    file = UpscalerFile(header_only(tmp_path / f"{case}.safetensors", facts["entries"]))
    config = file.config
    assert file.layout == facts["layout"]
    assert {"esrgan": "ESRGAN", "compact": "Compact"}[config.arch] == facts["spandrel"]["architecture"]
    assert config.scale == facts["spandrel"]["scale"]
    assert (config.nf, config.depth, config.net_scale, config.shuffle) == (
        facts["nf"],
        facts["depth"],
        facts["net_scale"],
        facts["shuffle"],
    )
    folders = [FIXTURES / "tiny"]
    graph = find_graph(config, folders)
    specs = {t.name: [int(d) for d in t.dims] for t in graph.proto.graph.initializer}
    assert {file.names[k]: list(e.shape) for k, e in file.file.entries.items()} == specs
    file.close()


def test_the_shipped_graphs_cover_the_a1111_models() -> None:
    names = upscalers.upscaler_graph_names()
    assert [n for n in names if not n.startswith("swinir_")] == [  # SwinIR's: test_swinir_detection.py
        "compact_nf64_nc16_x4",
        "compact_nf64_nc32_x4",
        "esrgan_nf32_nb12_x4",
        "esrgan_nf64_nb23_x1",
        "esrgan_nf64_nb23_x2",
        "esrgan_nf64_nb23_x4",
        "esrgan_nf64_nb23_x4_unshuffle2",
        "esrgan_nf64_nb23_x8",
        "esrgan_nf64_nb6_x4",
    ]
    x2plus = UpscalerConfig("esrgan", 64, 23, 4, 2)
    assert x2plus.scale == 2 and x2plus.graph_name == "esrgan_nf64_nb23_x4_unshuffle2"
    graph = find_graph(x2plus)
    assert [i.name for i in graph.inputs] == ["image"] and tuple(graph.inputs[0].shape[2:]) == ("height", "width")


def test_training_wrapper_prefixes_are_dropped() -> None:
    keys = [f"params_ema.{k}" for k, _ in GOLDENS["compact_x4"]["entries"]]
    arch, layout, names = canonical_names(keys)
    assert (arch, layout) == ("compact", "compact")
    assert names["params_ema.body.0.weight"] == "body.0.weight"


def test_pickles_are_refused_unread_with_the_conversion(tmp_path: Path) -> None:
    path = tmp_path / "RealESRGAN_x4plus.pth"
    path.write_bytes(b"\x80\x02 never read")
    with pytest.raises(ModelFormatError, match=r"params_ema.*RealESRGAN_x4plus\.safetensors"):
        UpscalerFile(path)
    renamed = tmp_path / "renamed.safetensors"
    renamed.write_bytes(b"PK\x03\x04 a zip")
    with pytest.raises(ModelFormatError, match="pickle"):
        UpscalerFile(renamed)


def test_unknown_files_and_configurations_are_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ModelFormatError, match="not an upscaler file"):
        UpscalerFile(header_only(tmp_path / "unet.safetensors", [("conv_in.weight", [4, 4, 3, 3])]))
    with pytest.raises(ModelFormatError, match="not found"):
        UpscalerFile(tmp_path / "missing.safetensors")
    # an ESRGAN file of a width no graph is shipped for: named, with the export command
    entries = [(k, s) for k, s in GOLDENS["esrgan_x4_old"]["entries"]]
    file = UpscalerFile(header_only(tmp_path / "tiny.safetensors", entries))
    with pytest.raises(ModelFormatError, match=r"ESRGAN 4x \(RRDBNet nf=8, nb=1\).*export_upscaler_graphs"):
        find_graph(file.config)
    file.close()
    grey = [
        ("body.0.weight", [8, 1, 3, 3]),
        ("body.1.weight", [8]),
        ("body.2.weight", [16, 8, 3, 3]),
        ("body.2.bias", [16]),
    ]
    with pytest.raises(ModelFormatError, match="only RGB"):
        UpscalerFile(header_only(tmp_path / "grey.safetensors", grey))


def test_names_resolve_as_a1111_names_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for stem in ("RealESRGAN_x4plus", "realesr-general-x4v3", "4x-UltraSharp"):
        (tmp_path / f"{stem}.safetensors").write_bytes(b"")
    monkeypatch.setenv(upscalers.UPSCALER_DIR_ENV, str(tmp_path))
    found = upscalers.available_upscalers()
    assert sorted(found) == ["4x-UltraSharp", "R-ESRGAN 4x+", "R-ESRGAN General 4xV3"]
    assert upscalers.find_upscaler("r-esrgan 4x+") == tmp_path / "RealESRGAN_x4plus.safetensors"
    assert upscalers.find_upscaler("4x-UltraSharp") == tmp_path / "4x-UltraSharp.safetensors"
    assert upscalers.find_upscaler("R-ESRGAN 2x+") is None


def test_inspect_names_an_upscaler(tmp_path: Path) -> None:
    from sdkit.families import Checkpoint, describe

    path = header_only(tmp_path / "RealESRGAN_x2plus.safetensors", GOLDENS["full_x2plus"]["entries"])
    found = describe(Checkpoint.open(path), [])
    assert found.kind == "upscaler" and found.title.startswith("2x upscaler")
    assert dict(found.details)["graph"] == "esrgan_nf64_nb23_x4_unshuffle2"
    tiny = describe(Checkpoint.open(header_only(tmp_path / "t.safetensors", GOLDENS["compact_x2"]["entries"])), [])
    assert "not shipped" in dict(tiny.details)["graph"]
