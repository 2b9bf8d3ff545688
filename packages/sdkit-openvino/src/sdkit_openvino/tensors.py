"""numpy <-> ``openvino.Tensor`` for the dtypes OpenVINO's Python binding does not map.

numpy has no bfloat16, float8 or 4-bit types; ONNX (and sdkit) use the ``ml_dtypes``
extension types for them, whose numpy kind is ``V``. OpenVINO exposes such tensors as raw
storage (bf16 as a float16-typed view, f8 as uint8, 4-bit types as packed bytes), so values
are moved bit for bit: same-width types through a view, 4-bit types packed two per byte,
element 0 in the low nibble (OpenVINO's layout; ml_dtypes keeps one value per byte).
"""

from __future__ import annotations

from typing import Any

import numpy as np

_NUMPY_KINDS = "biufcUSO"  # dtypes the binding maps itself


def _is_extension(dtype: np.dtype[Any]) -> bool:
    return dtype.kind not in _NUMPY_KINDS


def _bit_width(element_type: Any) -> int:
    return int(element_type.bitwidth)


def to_ov(array: np.ndarray, element_type: Any) -> Any:
    """``array`` as something ``InferRequest.infer`` accepts for an input of ``element_type``."""
    if not _is_extension(array.dtype):
        return array
    import openvino as ov

    width = _bit_width(element_type)
    if width not in (4, array.dtype.itemsize * 8):  # OpenVINO widened the input: convert by value
        return array.astype(np.float32)
    tensor = ov.Tensor(element_type, ov.Shape(list(array.shape)))
    raw = (
        np.ascontiguousarray(array)
        .reshape(-1)
        .view(np.uint8 if array.dtype.itemsize == 1 else f"u{array.dtype.itemsize}")
    )
    storage = tensor.data
    if width == 4:
        nibbles = raw & 0x0F
        if nibbles.size % 2:
            nibbles = np.append(nibbles, np.uint8(0))
        packed = (nibbles[0::2] | (nibbles[1::2] << 4)).astype(np.uint8)
        storage.reshape(-1).view(np.uint8)[: packed.size] = packed
    else:
        storage.reshape(-1).view(raw.dtype)[:] = raw
    return tensor


def from_ov(tensor: Any, dtype: np.dtype[Any]) -> np.ndarray:
    """A copy of output ``tensor`` as ``dtype`` (the graph's declared output type)."""
    storage = tensor.data
    if not _is_extension(dtype):
        out = np.array(storage, copy=True)
        return out if out.dtype == dtype else out.astype(dtype)  # e.g. f64 outputs computed as f32
    shape = tuple(int(d) for d in tensor.get_shape())
    count = int(np.prod(shape, dtype=np.int64))
    width = _bit_width(tensor.get_element_type())
    if width not in (4, dtype.itemsize * 8):  # computed in another width: convert by value
        return np.array(storage, dtype=np.float32).astype(dtype)
    if width == 4:
        packed = np.ascontiguousarray(storage).reshape(-1).view(np.uint8)
        nibbles = np.empty(packed.size * 2, dtype=np.uint8)
        nibbles[0::2], nibbles[1::2] = packed & 0x0F, packed >> 4
        unpacked: np.ndarray = nibbles[:count].view(dtype).reshape(shape).copy()
        return unpacked
    raw = np.ascontiguousarray(storage).reshape(-1)
    same_width: np.ndarray = raw.view(np.uint8).view(dtype).reshape(shape).copy()
    return same_width
