"""A checked, memory-mapped ``.safetensors`` reader that converts one tensor at a time.

The format: 8 bytes little-endian header length N, N bytes of JSON (``{key: {"dtype", "shape",
"data_offsets": [begin, end]}, "__metadata__": {str: str}}``), then the tensor bytes, offsets
relative to the end of the header, every byte indexed exactly once. Every claim of the header is
checked before any tensor is read (a truncated file, offsets that disagree with shape x dtype,
overlaps or holes: one ``ModelFormatError`` each), and a PyTorch pickle renamed ``.safetensors``
is refused without being unpickled.

Tensors are read through ``mmap``: ``read(entry)`` copies one tensor out of the map, converted
to the dtype asked for (fp16 and bf16 to fp32; bf16 bit-wise, numpy has no bf16), and then drops
that tensor's file pages from this process (``madvise(MADV_DONTNEED)``), so reading a whole
checkpoint tensor by tensor keeps about one tensor resident, not the file. (Handing out views of
the map instead would save one copy per tensor but leave every page read resident: a backend
copying the weights would then hold the file twice, its copy and the map.) ``raw(entry)`` is the
view, for callers that want the stored bytes.
"""

from __future__ import annotations

import contextlib
import json
import math
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sdkit.errors import ModelFormatError
from sdkit.files import shape_problem, unique_keys
from sdkit.model import pickle_refusal

# safetensors dtype -> (storage dtype, whether numpy holds the values as they are)
STORAGE: dict[str, np.dtype[Any]] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # the upper half of a float32
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "U16": np.dtype("<u2"),
    "U32": np.dtype("<u4"),
    "U64": np.dtype("<u8"),
    "BOOL": np.dtype("?"),
    "F8_E4M3": np.dtype("u1"),
    "F8_E5M2": np.dtype("u1"),
}
FLOATS = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")


def _e4m3fn_values() -> np.ndarray:
    """The float32 value of each of the 256 ``float8_e4m3fn`` bytes (1 sign, 4 exponent bits
    biased by 7, 3 mantissa bits; exponent 0 is subnormal; ``S.1111.111`` is NaN, no infinities)."""
    byte = np.arange(256)
    sign = np.where(byte & 0x80, -1.0, 1.0)
    exponent, mantissa = (byte >> 3) & 0xF, byte & 0x7
    normal = (1.0 + mantissa / 8.0) * np.exp2(exponent - 7.0)
    values = sign * np.where(exponent == 0, mantissa / 8.0 * 2.0**-6, normal)
    values[(byte & 0x7F) == 0x7F] = np.nan
    return values.astype(np.float32)


# fp8 files (``flux1-dev-fp8``) are upcast through a 256-entry table: exact, one gather per tensor.
# E5M2 is the upper byte of a float16.
FP8_VALUES: dict[str, np.ndarray] = {
    "F8_E4M3": _e4m3fn_values(),
    "F8_E5M2": (np.arange(256, dtype=np.uint16) << 8).view(np.float16).astype(np.float32),
}
MAX_HEADER = 100_000_000  # the safetensors library's own limit
_PAGE = mmap.PAGESIZE


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of the file as its header describes it (offsets absolute in the file)."""

    key: str
    dtype: str  # the safetensors name: F32, F16, BF16, ...
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start

    @property
    def size(self) -> int:
        return math.prod(self.shape)


def _sniff_pickle(head: bytes, name: str) -> None:
    # torch.save writes a zip archive (PK..) since 1.6, a bare pickle (protocol 2+: 0x80) before.
    # A safetensors file may start with 0x80 too (a header length of 128 + 256k bytes): its
    # JSON header then opens at byte 8.
    if head.startswith(b"PK\x03\x04") or (head[:1] == b"\x80" and head[8:9] != b"{"):
        raise ModelFormatError(
            pickle_refusal(name, "this is a PyTorch pickle, not safetensors, and pickles are refused")
        )


def _entry(key: str, value: Any, base: int, name: str) -> TensorEntry:
    if not isinstance(value, dict):
        raise ModelFormatError(f"{name}: the header entry of {key!r} is not an object")
    dtype: Any = value.get("dtype")
    shape: Any = value.get("shape")
    offsets: Any = value.get("data_offsets")
    if dtype not in STORAGE:
        raise ModelFormatError(f"{name}: tensor {key!r} has an unknown dtype {dtype!r}")
    ints = isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
    pair = isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) and o >= 0 for o in offsets)
    if not ints or not pair or offsets[0] > offsets[1]:
        raise ModelFormatError(f"{name}: tensor {key!r} has a malformed shape {shape!r} or offsets {offsets!r}")
    problem = shape_problem(shape, STORAGE[dtype].itemsize)
    if problem:
        raise ModelFormatError(f"{name}: tensor {key!r} {problem}")
    entry = TensorEntry(key, dtype, tuple(shape), base + offsets[0], base + offsets[1])
    expected = entry.size * STORAGE[dtype].itemsize
    if entry.nbytes != expected:
        raise ModelFormatError(
            f"{name}: the header lies about tensor {key!r}: {dtype} {list(shape)} is {expected} bytes, "
            f"its offsets span {entry.nbytes}"
        )
    return entry


def _check_layout(entries: list[TensorEntry], base: int, size: int, name: str) -> None:
    """Every data byte indexed once: no overlap, no hole, and the file holds all of it."""
    position = base
    for entry in sorted(entries, key=lambda e: (e.start, e.end)):
        if entry.start < position:
            raise ModelFormatError(f"{name}: tensor {entry.key!r} overlaps another tensor's bytes (a corrupt header)")
        if entry.start > position:
            raise ModelFormatError(f"{name}: the header leaves bytes {position - base}..{entry.start - base} unindexed")
        position = entry.end
    if position > size:
        raise ModelFormatError(
            f"{name} is truncated: its header describes {position - base:,} bytes of tensor data, "
            f"the file holds {max(size - base, 0):,}"
        )
    if position < size:
        raise ModelFormatError(f"{name}: {size - position:,} bytes after the last tensor are not in the header")


class SafetensorsFile:
    """A ``.safetensors`` file: its checked header now, its tensors on demand."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        name = self.path.name
        try:
            size = self.path.stat().st_size
            with self.path.open("rb") as f:
                head = f.read(9)
                _sniff_pickle(head, name)
                head = head[:8]
                f.seek(8)
                if len(head) < 8:
                    raise ModelFormatError(f"{name} is not a safetensors file ({size} bytes)")
                (length,) = struct.unpack("<Q", head)
                if length > MAX_HEADER or 8 + length > size:
                    raise ModelFormatError(
                        f"{name} is not a safetensors file or is truncated "
                        f"(header length {length:,}, file {size:,} bytes)"
                    )
                text = f.read(length)
        except OSError as exc:
            raise ModelFormatError(f"{name} cannot be read: {exc}") from None
        self.size = size
        self.entries, self.metadata = self._parse(text, 8 + length, name)
        self._map: mmap.mmap | None = None

    def _parse(self, text: bytes, base: int, name: str) -> tuple[dict[str, TensorEntry], dict[str, str]]:
        try:
            header = json.loads(text.decode("utf-8"), object_pairs_hook=unique_keys)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # RecursionError: nested too deep
            detail = f": {exc}" if "twice" in str(exc) else ""
            raise ModelFormatError(f"{name} is not a safetensors file (its header is not JSON{detail})") from None
        if not isinstance(header, dict):
            raise ModelFormatError(f"{name} is not a safetensors file (its header is not a JSON object)")
        metadata = header.pop("__metadata__", None) or {}
        if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
            raise ModelFormatError(f"{name}: __metadata__ must map strings to strings")
        entries = {key: _entry(key, value, base, name) for key, value in header.items()}
        _check_layout(list(entries.values()), base, self.size, name)
        return entries, dict(metadata)

    def __repr__(self) -> str:
        return f"SafetensorsFile({self.path.name!r}, {len(self.entries)} tensors, {self.size / 1e6:.1f} MB)"

    def _mapped(self) -> mmap.mmap:
        if self._map is None:
            try:
                with self.path.open("rb") as f:
                    self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError) as exc:
                raise ModelFormatError(f"{self.path.name} cannot be mapped: {exc}") from None
            if len(self._map) != self.size:
                raise ModelFormatError(f"{self.path.name} changed size while open")
        return self._map

    def raw(self, entry: TensorEntry) -> np.ndarray:
        """The stored values as a read-only view of the map (bf16 as uint16)."""
        storage = STORAGE[entry.dtype]
        if entry.size == 0:
            return np.zeros(entry.shape, storage)
        view = np.frombuffer(self._mapped(), dtype=storage, count=entry.size, offset=entry.start)
        return view.reshape(entry.shape)

    def read(
        self, entry: TensorEntry, dtype: np.dtype[Any] | type = np.float32, rows: tuple[int, int] | None = None
    ) -> np.ndarray:
        """One tensor (or ``rows`` of its first axis) as a new array of ``dtype``; the tensor's
        pages are dropped from this process afterwards."""
        wanted = np.dtype(dtype)
        raw = self.raw(entry)
        if rows is not None:
            raw = raw[rows[0] : rows[1]]
        if entry.dtype == "BF16":
            if wanted.kind != "f":
                raise ModelFormatError(f"{self.path.name}: tensor {entry.key!r} is bf16, not convertible to {wanted}")
            result = (raw.astype(np.uint32) << 16).view(np.float32).astype(wanted, copy=False)
        elif entry.dtype in FP8_VALUES:
            if wanted.kind != "f":
                raise ModelFormatError(f"{self.path.name}: tensor {entry.key!r} is {entry.dtype}, not {wanted}")
            result = FP8_VALUES[entry.dtype][raw].astype(wanted, copy=False)
        elif raw.dtype == wanted:
            result = np.array(raw)
        else:
            if (wanted.kind == "f") != (entry.dtype in FLOATS):
                raise ModelFormatError(f"{self.path.name}: tensor {entry.key!r} is {entry.dtype}, not {wanted}")
            result = raw.astype(wanted)
        self.release(entry)
        return result

    def release(self, entry: TensorEntry) -> None:
        """Drop the tensor's pages from this process's resident set (they stay in the page
        cache; a later read maps them back). Best effort: a no-op where madvise is missing."""
        if self._map is None or entry.nbytes == 0 or not hasattr(mmap, "MADV_DONTNEED"):
            return
        start = entry.start - entry.start % _PAGE
        with contextlib.suppress(OSError, ValueError):
            self._map.madvise(mmap.MADV_DONTNEED, start, entry.end - start)

    def close(self) -> None:
        """Unmap the file (only once no view of it is alive; otherwise left to the GC)."""
        if self._map is not None:
            with contextlib.suppress(BufferError):
                self._map.close()
                self._map = None
