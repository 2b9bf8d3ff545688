"""An ONNX file's graph inputs and their static dims, read without parsing the graph or its
weights: the protobuf fields are walked (``ModelProto.graph`` is field 7, ``GraphProto.input``
field 11) and only the inputs' ``ValueInfoProto`` messages are decoded, so a model with
gigabytes of embedded weights costs a scan of its field headers, not a copy.

A folder's default image size comes from here when its denoiser's graph was exported with a
fixed input shape (``sdkit.pipelines.loaders.diffusers_folder``).
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator

from sdkit.errors import ModelFormatError

_GRAPH, _INPUT = 7, 11
Dims = tuple[int | None, ...]


def _varint(data: mmap.mmap, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while pos < end:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise ValueError("truncated varint")


def _fields(data: mmap.mmap, pos: int, end: int) -> Iterator[tuple[int, int, int]]:
    """(field number, start, end) of each length-delimited field in ``data[pos:end]``."""
    while pos < end:
        tag, pos = _varint(data, pos, end)
        wire = tag & 7
        if wire == 0:
            _, pos = _varint(data, pos, end)
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        elif wire == 2:
            length, pos = _varint(data, pos, end)
            if pos + length > end:
                raise ValueError("field runs past its message")
            yield tag >> 3, pos, pos + length
            pos += length
        else:
            raise ValueError(f"wire type {wire}")


def static_input_dims(path: str | os.PathLike[str]) -> dict[str, Dims]:
    """Each graph input's dims: an integer where the graph fixes it, None where it is symbolic."""
    import onnx

    dims: dict[str, Dims] = {}
    try:
        with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            for field, start, end in _fields(data, 0, len(data)):
                if field != _GRAPH:
                    continue
                for inner, a, b in _fields(data, start, end):
                    if inner == _INPUT:
                        value = onnx.ValueInfoProto.FromString(data[a:b])
                        shape = value.type.tensor_type.shape.dim
                        dims[value.name] = tuple(d.dim_value if d.HasField("dim_value") else None for d in shape)
    except (OSError, ValueError) as exc:
        raise ModelFormatError(f"{path}: not a readable ONNX file ({exc})") from None
    return dims
