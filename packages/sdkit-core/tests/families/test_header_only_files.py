"""``sdkit.testing.safetensors_files``: header-only files read back by the safetensors library
(the oracle: names, dtypes, shapes and offsets as it parses them) and by sdkit's reader."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors import safe_open

from sdkit.families import Checkpoint
from sdkit.testing.safetensors_files import write_header_only_safetensors


def test_the_safetensors_library_reads_the_header(tmp_path: Path) -> None:
    shapes = {"a.weight": (3072, 3072), "a.bias": (3072,), "b.scale": (7,)}
    path = write_header_only_safetensors(tmp_path / "x.safetensors", shapes, "BF16", {"a.weight": "F8_E4M3"})
    with path.open("rb") as f:
        header = 8 + int.from_bytes(f.read(8), "little")
    assert header % 8 == 0
    assert path.stat().st_size == header + 3072 * 3072 + 2 * 3072 + 2 * 7  # F8: 1 byte, BF16: 2
    with safe_open(str(path), "numpy") as f:
        names = list(f.keys())
        assert names == sorted(shapes)
        assert {k: tuple(f.get_slice(k).get_shape()) for k in names} == shapes
        assert {k: f.get_slice(k).get_dtype() for k in names} == {
            "a.weight": "F8_E4M3",
            "a.bias": "BF16",
            "b.scale": "BF16",
        }
    checkpoint = Checkpoint.open(path)
    try:
        assert checkpoint.shapes() == shapes
    finally:
        checkpoint.close()


def test_an_unknown_dtype_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown safetensors dtype 'BF8'"):
        write_header_only_safetensors(tmp_path / "x.safetensors", {"w": (2,)}, "BF8")
