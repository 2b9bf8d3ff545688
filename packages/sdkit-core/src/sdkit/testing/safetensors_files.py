"""Header-only ("sparse") safetensors files for tests: a real layout's key names and full-size
shapes with no data written. The file is extended to the size its header declares, a sparse hole
on the file systems tests run on, so a test can open a 12B-parameter checkpoint's header (family
detection, key maps, ``sdkit inspect``) with a few KB on disk. Nothing may read their data: it
reads back as zeros."""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sdkit.families.safetensors_reader import STORAGE


def write_header_only_safetensors(
    path: Path,
    shapes: Mapping[str, Sequence[int]],
    dtype: str = "BF16",
    dtypes: Mapping[str, str] | None = None,
) -> Path:
    """Write ``path``: one tensor per ``shapes`` entry, in that order, of ``dtypes[name]`` or else
    ``dtype`` (safetensors' names: ``BF16``, ``F16``, ``F32``, ``F8_E4M3``, ``I64``...); the header
    padded to 8 bytes with spaces, as the safetensors library writes it. Returns ``path``."""
    header: dict[str, Any] = {}
    offset = 0
    for name, shape in shapes.items():
        kind = (dtypes or {}).get(name, dtype)
        if kind not in STORAGE:
            raise ValueError(f"unknown safetensors dtype {kind!r} for {name!r}")
        size = STORAGE[kind].itemsize
        for dim in shape:
            size *= int(dim)
        header[name] = {"dtype": kind, "shape": [int(d) for d in shape], "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.truncate(8 + len(text) + offset)
    return path
