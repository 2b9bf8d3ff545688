"""The shipped graphs' form on disk: gzip'd, within a byte budget, each decompressing to the
exact ONNX bytes the export recorded (``fixtures/families/VERSIONS.json``: ``file_bytes`` and
``onnx_sha256``, written by the export scripts from the serialized graph before compression)."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from sdkit.errors import ModelFormatError
from sdkit.families import shipped

# sdkit-core + [cpu] stays under 200 MB installed (README's size table, tests/test_install_lines.py);
# the graphs are 1.73 MB gzip'd (14 MB of ONNX). The budget leaves room for a few more graphs.
BUDGET_BYTES = 2_500_000


@pytest.fixture(scope="module")
def recorded(families_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((families_dir / "VERSIONS.json").read_text(encoding="utf-8"))["graphs"]
    return data


def test_the_graphs_folder_fits_its_byte_budget() -> None:
    files = [p for p in shipped.graphs_dir().iterdir() if p.is_file()]
    assert sorted(p.name for p in files if p.name.endswith(".onnx")) == []  # none shipped uncompressed
    assert {p.name for p in files if not p.name.endswith(".onnx.gz")} == {"README.md"}
    assert sum(p.stat().st_size for p in files) < BUDGET_BYTES


@pytest.mark.parametrize("name", shipped.names())
def test_each_graph_decompresses_to_the_exported_bytes(name: str, recorded: dict[str, Any]) -> None:
    data = shipped.graph_bytes(name)
    assert len(data) == recorded[name]["file_bytes"]
    assert hashlib.sha256(data).hexdigest() == recorded[name]["onnx_sha256"]
    # The committed file is the deterministic form graph_export.save_shipped writes.
    assert shipped.graph_path(name).read_bytes() == gzip.compress(data, compresslevel=9, mtime=0)
    assert shipped.load_graph(name).proto.SerializeToString() == data


def test_a_plain_onnx_folder_and_file_still_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``graphs_dir`` pointed at a folder of plain ``.onnx`` files (the benchmarks' ``--graphs``)."""
    data = shipped.graph_bytes("vae_decoder")
    (tmp_path / "vae_decoder.onnx").write_bytes(data)
    assert shipped.load_graph(tmp_path / "vae_decoder.onnx").proto.SerializeToString() == data
    monkeypatch.setattr(shipped, "graphs_dir", lambda: tmp_path)
    assert shipped.names() == ["vae_decoder"]
    assert shipped.load_graph("vae_decoder").proto.SerializeToString() == data


def test_a_damaged_graph_is_one_clear_error(tmp_path: Path) -> None:
    whole = shipped.graph_path("clip_l").read_bytes()
    (tmp_path / "cut.onnx.gz").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "noise.onnx.gz").write_bytes(b"not gzip at all")
    (tmp_path / "noise.onnx").write_bytes(b"\xff" * 64)
    for name in ("cut.onnx.gz", "noise.onnx.gz", "noise.onnx"):
        with pytest.raises(ModelFormatError, match=name.replace(".", r"\.")):
            shipped.load_graph(tmp_path / name)
    with pytest.raises(ModelFormatError, match="no shipped graph 'nope'"):
        shipped.load_graph("nope")
