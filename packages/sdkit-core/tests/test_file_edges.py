"""The edges of users' files (issue 30, items 10 and 11): JSON nested deeper than Python's stack
in a safetensors header or a folder's config, a header naming one tensor twice, a zero-byte tensor
whose shape no array can take, and a scheduler config whose sizes the memory budget must check.
Each is one ``SdkitError`` from every reader, before anything is allocated."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sdkit import limits
from sdkit.errors import ModelFormatError, ResourceLimitError
from sdkit.families.safetensors_reader import SafetensorsFile
from sdkit.files import check_safetensors_header, read_json_object
from sdkit.model import WeightSet
from sdkit.schedulers import create_scheduler

READERS: dict[str, Callable[[Path], Any]] = {
    "check_safetensors_header": check_safetensors_header,
    "WeightSet.load_safetensors": WeightSet.load_safetensors,
    "SafetensorsFile": SafetensorsFile,
}


def _safetensors(path: Path, header_text: str, data: bytes = b"") -> Path:
    raw = header_text.encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_deeply_nested_header_is_a_format_error(reader: str, tmp_path: Path) -> None:
    path = _safetensors(tmp_path / "deep.safetensors", '{"__metadata__": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(ModelFormatError, match=r"not JSON|not a safetensors file"):  # was RecursionError
        READERS[reader](path)


@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_tensor_named_twice_is_refused(reader: str, tmp_path: Path) -> None:
    entry = '{"dtype": "F32", "shape": [1], "data_offsets": [%d, %d]}'
    header = '{"w": ' + entry % (0, 4) + ', "w": ' + entry % (4, 8) + "}"
    path = _safetensors(tmp_path / "twice.safetensors", header, np.arange(2, dtype=np.float32).tobytes())
    with pytest.raises(ModelFormatError, match="'w' appears twice"):  # JSON kept the last, silently
        READERS[reader](path)


@pytest.mark.parametrize("reader", sorted(READERS))
@pytest.mark.parametrize("shape", [[0, 2**70], [0, 2**62, 4], [1] * 65])
def test_a_shape_no_array_can_take_is_refused(reader: str, shape: list[int], tmp_path: Path) -> None:
    header = json.dumps({"w": {"dtype": "F32", "shape": shape, "data_offsets": [0, 0]}})
    path = _safetensors(tmp_path / "huge.safetensors", header)
    with pytest.raises(ModelFormatError, match=r"no array can take|more than 64"):
        READERS[reader](path)


def test_a_deeply_nested_config_is_a_format_error(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(ModelFormatError, match=r"config .*config\.json cannot be read"):
        read_json_object(path, "config")


def test_scheduler_sizes_are_checked_against_the_budget() -> None:
    limits.set_memory_budget("1M")
    try:
        with pytest.raises(
            ResourceLimitError, match=r"the sampler's schedule \(100000 training timesteps\) needs 6\.4 MB"
        ):
            create_scheduler("euler", config={"num_train_timesteps": 100_000})
        create_scheduler("euler", config={"num_train_timesteps": 1000})  # 64 kB: fine
    finally:
        limits.set_memory_budget(None)
