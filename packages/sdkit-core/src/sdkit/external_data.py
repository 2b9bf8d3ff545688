"""Initializers stored as ONNX external data (``model.onnx_data``, ``weights.pb``, one file per
tensor), read on access from a read-only memory map instead of into the ModelProto.

``onnx.load_external_data_for_model`` copies every external tensor into the protobuf, and the
WeightSet then copies it again into numpy: loading a 24 GB bf16 transformer would need 48 GB
before any backend sees it. An ``ExternalTensor`` is a ``LazyArray``: its shape and dtype come
from the graph, ``load()`` maps the file's bytes (the OS page cache backs them, shared and
reclaimable), and each backend reads the weights one at a time while it converts them. Tensors
that cannot be mapped as they are (strings, packed 4-bit and 2-bit types, a byte length that
does not match the shape, a big-endian host) are loaded into the protobuf as before.
"""

from __future__ import annotations

import errno
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from sdkit.errors import ModelFormatError, ResourceLimitError
from sdkit.limits import check_bytes, human
from sdkit.onnx_checks import is_external

# ONNX packs these several to a byte (numpy's ml_dtypes types hold one per byte): not mappable.
_PACKED = frozenset(
    getattr(TensorProto, name)
    for name in ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2")
    if hasattr(TensorProto, name)
)


@dataclass(frozen=True)
class ExternalTensor:
    """One initializer's bytes in an external data file, as a read-only array on access."""

    path: Path
    offset: int
    shape: tuple[int, ...]
    dtype: np.dtype[Any]

    def load(self) -> np.ndarray:
        try:
            mapped = np.memmap(self.path, dtype=self.dtype, mode="r", offset=self.offset, shape=self.shape)
        except MemoryError as exc:  # ENOMEM: the address space (``ulimit -v``) has no room for it
            raise ResourceLimitError(self._failed(exc, "is more than this process can map")) from None
        except (OSError, ValueError) as exc:
            if isinstance(exc, OSError) and exc.errno == errno.ENOMEM:
                raise ResourceLimitError(self._failed(exc, "is more than this process can map")) from None
            raise ModelFormatError(self._failed(exc, "cannot be read")) from None
        return mapped.view(np.ndarray)  # a plain read-only array; the map lives as long as it

    def _failed(self, exc: BaseException, why: str) -> str:
        size = math.prod(self.shape) * self.dtype.itemsize
        return (
            f"external weight {self.path.name} ({human(size)} at offset {self.offset}) {why}: "
            f"{exc.strerror if isinstance(exc, OSError) and exc.strerror else exc} "
            "(an address-space limit such as `ulimit -v` counts mapped files)"
        )


def _entries(tensor: TensorProto) -> dict[str, str]:
    return {entry.key: entry.value for entry in tensor.external_data}


def mappable(tensor: TensorProto, folder: Path) -> ExternalTensor | None:
    """The lazy form of an external initializer, or None when it must be loaded eagerly.
    Locations are checked beforehand (``check_external_locations``)."""
    if sys.byteorder != "little" or tensor.data_type in _PACKED or tensor.data_type == TensorProto.STRING:
        return None
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type))
    except (KeyError, TypeError, ValueError):
        return None
    entries = _entries(tensor)
    shape = tuple(int(d) for d in tensor.dims)
    nbytes = math.prod(shape) * dtype.itemsize
    try:
        offset = int(entries.get("offset", "0"))
        length = int(entries["length"]) if "length" in entries else None
    except ValueError:
        return None
    path = folder / entries.get("location", "")
    if nbytes == 0 or offset < 0 or (length is not None and length != nbytes) or not path.is_file():
        return None
    if offset + nbytes > path.stat().st_size:
        return None  # the eager reader names the short file
    return ExternalTensor(path, offset, shape, dtype)


def load_external(proto: onnx.ModelProto, folder: Path) -> dict[str, ExternalTensor]:
    """Map the main graph's external initializers that can be mapped (returned by name, left
    as external references in ``proto``) and load every other external tensor into ``proto``."""
    from onnx.external_data_helper import _get_all_tensors, load_external_data_for_tensor

    lazy: dict[str, ExternalTensor] = {}
    for tensor in proto.graph.initializer:
        if is_external(tensor):
            found = mappable(tensor, folder)
            if found is not None:
                lazy[tensor.name] = found
    for tensor in _get_all_tensors(proto):  # subgraphs', functions' and Constant nodes' too
        if is_external(tensor) and not _is_mapped(tensor, lazy, folder):
            check_bytes(_eager_bytes(tensor, folder), f"external tensor {tensor.name!r} (read into memory)")
            load_external_data_for_tensor(tensor, str(folder))
            tensor.data_location = TensorProto.DEFAULT
            del tensor.external_data[:]
    return lazy


def _eager_bytes(tensor: TensorProto, folder: Path) -> int:
    """What reading an external tensor into memory takes: its ``length``, else the rest of its
    file from ``offset`` (what onnx reads then), before a byte is read."""
    entries = _entries(tensor)
    try:
        if "length" in entries:
            return max(int(entries["length"]), 0)
        size = (folder / entries.get("location", "")).stat().st_size
        return max(size - int(entries.get("offset", "0")), 0)
    except (OSError, ValueError):
        return 0  # the reader names what is wrong


def _is_mapped(tensor: TensorProto, lazy: dict[str, ExternalTensor], folder: Path) -> bool:
    found = lazy.get(tensor.name)
    if found is None:
        return False
    entries = _entries(tensor)
    return folder / entries.get("location", "") == found.path and int(entries.get("offset", "0")) == found.offset
