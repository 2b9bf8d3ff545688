"""The checked, memory-mapped safetensors reader: every lie of a header is one clear error, and
tensors convert one at a time. Oracles: the ``safetensors`` library writes the files and reads
them back; ``ml_dtypes`` (installed with onnx) decodes bf16 independently of the bit shift."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from sdkit.errors import ModelFormatError
from sdkit.families.safetensors_reader import SafetensorsFile

RNG = np.random.default_rng(0)


def _write_raw(path: Path, header: dict[str, object], data: bytes) -> Path:
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


def _bf16_file(path: Path, values: np.ndarray) -> Path:
    bits = values.astype(ml_dtypes.bfloat16).view(np.uint16)
    header = {"w": {"dtype": "BF16", "shape": list(values.shape), "data_offsets": [0, bits.nbytes]}}
    return _write_raw(path, header, bits.tobytes())


def test_reads_what_safetensors_writes(tmp_path: Path) -> None:
    arrays = {
        "a": RNG.standard_normal((3, 4)).astype(np.float32),
        "b": RNG.standard_normal((5,)).astype(np.float16),
        "i": np.arange(6, dtype=np.int64).reshape(2, 3),
        "empty": np.zeros((0, 4), np.float32),
    }
    save_file(arrays, str(tmp_path / "x.safetensors"), metadata={"format": "pt"})
    file = SafetensorsFile(tmp_path / "x.safetensors")
    assert file.metadata == {"format": "pt"}
    assert {k: e.shape for k, e in file.entries.items()} == {k: v.shape for k, v in arrays.items()}
    copy = file.read(file.entries["a"])
    np.testing.assert_array_equal(copy, arrays["a"])
    assert copy.flags.owndata and copy.flags.writeable  # a copy: the map's pages are dropped after
    view = file.raw(file.entries["a"])
    assert not view.flags.writeable and not view.flags.owndata
    converted = file.read(file.entries["b"])
    assert converted.dtype == np.float32 and converted.flags.owndata
    np.testing.assert_array_equal(converted, arrays["b"].astype(np.float32))
    np.testing.assert_array_equal(file.read(file.entries["i"], np.int64), arrays["i"])
    assert file.read(file.entries["empty"]).shape == (0, 4)
    np.testing.assert_array_equal(file.read(file.entries["b"], rows=(1, 3)), arrays["b"][1:3].astype(np.float32))
    file.release(file.entries["a"])  # the pages leave the process; the view still reads right
    np.testing.assert_array_equal(view, arrays["a"])


def test_bf16_converts_bit_exactly(tmp_path: Path) -> None:
    values = np.concatenate([RNG.standard_normal(1000).astype(np.float32) * 100, [0.0, -0.0, np.inf, 1e-40]])
    file = SafetensorsFile(_bf16_file(tmp_path / "b.safetensors", values.astype(np.float32)))
    got = file.read(file.entries["w"])
    expected = values.astype(ml_dtypes.bfloat16).astype(np.float32)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))


def _valid(tmp_path: Path) -> Path:
    save_file({"a": np.ones((4, 4), np.float16), "b": np.ones(4, np.float32)}, str(tmp_path / "ok.safetensors"))
    return tmp_path / "ok.safetensors"


def test_truncated_file(tmp_path: Path) -> None:
    data = _valid(tmp_path).read_bytes()
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(data[:-10])
    with pytest.raises(ModelFormatError, match=r"cut.safetensors is truncated: its header describes 48 bytes"):
        SafetensorsFile(cut)
    cut.write_bytes(data[:20])  # inside the header
    with pytest.raises(ModelFormatError, match="not a safetensors file or is truncated"):
        SafetensorsFile(cut)


def test_header_lying_about_sizes(tmp_path: Path) -> None:
    header = {"w": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 32]}}
    with pytest.raises(ModelFormatError, match=r"the header lies about tensor 'w': F32 \[4, 4\] is 64 bytes"):
        SafetensorsFile(_write_raw(tmp_path / "lie.safetensors", header, bytes(32)))


@pytest.mark.parametrize(
    ("offsets", "data", "message"),
    [
        ([[0, 16], [8, 24]], 24, "overlaps"),
        ([[0, 16], [24, 40]], 40, "unindexed"),
        ([[0, 16], [16, 32]], 40, "8 bytes after the last tensor"),
    ],
)
def test_overlaps_holes_and_trailing_bytes(tmp_path: Path, offsets: list[list[int]], data: int, message: str) -> None:
    header = {f"t{i}": {"dtype": "F32", "shape": [4], "data_offsets": o} for i, o in enumerate(offsets)}
    with pytest.raises(ModelFormatError, match=message):
        SafetensorsFile(_write_raw(tmp_path / "bad.safetensors", header, bytes(data)))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"PK\x03\x04" + bytes(100), "is a PyTorch pickle, not safetensors"),
        (b"\x80\x02}q\x00" + bytes(100), "is a PyTorch pickle, not safetensors"),
        (b"\x05\x00\x00\x00\x00\x00\x00\x00[1,2]", "not a JSON object"),
        (b"\x05\x00\x00\x00\x00\x00\x00\x00\xff\xfe{}}", "not JSON"),
        (b"abc", "not a safetensors file"),
    ],
)
def test_not_safetensors(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(content)
    with pytest.raises(ModelFormatError, match=message) as caught:
        SafetensorsFile(path)
    assert "\n" not in str(caught.value)


def test_pickle_message_names_a_safe_converter(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(ModelFormatError, match=r"weights_only=True.*save_file"):
        SafetensorsFile(path)


def test_bad_entries(tmp_path: Path) -> None:
    for entry, message in (
        ({"dtype": "F99", "shape": [1], "data_offsets": [0, 4]}, "unknown dtype"),
        ({"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}, "malformed shape"),
        ({"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}, "malformed shape"),
        ([1, 2], "not an object"),
    ):
        with pytest.raises(ModelFormatError, match=message):
            SafetensorsFile(_write_raw(tmp_path / "e.safetensors", {"w": entry}, bytes(4)))
