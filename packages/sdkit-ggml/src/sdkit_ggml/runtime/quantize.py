"""Weights quantized by ggml itself (``ggml_quantize_chunk``), for precision="q8_0".

The blocks are written by the library whose kernels read them, so the layout (Q8_0: per 32
weights one F16 scale ``d = max|w| / 127`` and 32 int8 ``round(w / d)``) is ggml's by
construction. Only whole rows are quantized: a row (the innermost dim) must be a whole number
of blocks, which the compiler checks before it chooses the type (``quantizable``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from sdkit.errors import InputError
from sdkit_ggml.runtime.tensors import QUANTIZED, tensor_bytes

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sdkit_ggml.runtime.lib import GgmlLib


def quantizable(shape: Sequence[int], ggml_type: int) -> bool:
    """Whether a weight of ``shape`` can be stored as ``ggml_type``: a matrix whose rows hold a
    whole number of blocks."""
    block, _ = QUANTIZED[ggml_type]
    return len(shape) >= 2 and int(shape[-1]) % block == 0


def quantize(lib: GgmlLib, array: np.ndarray, ggml_type: int, what: str) -> np.ndarray:
    """``array`` (rows along its last dim) as the raw bytes of a ``ggml_type`` tensor."""
    src = np.ascontiguousarray(array, dtype=np.float32)
    if src.ndim < 1 or not quantizable((1, *src.shape[-1:]), ggml_type):
        raise InputError(f"{what}: rows of {src.shape[-1:]} elements cannot be quantized")
    per_row = int(src.shape[-1])
    rows = src.size // per_row
    expected = tensor_bytes(src.shape, ggml_type)
    if int(lib.ggml_row_size(ggml_type, per_row)) * rows != expected:
        # these bindings' block table disagrees with the library: a bug, not a user error
        raise RuntimeError(f"ggml's row size of type {ggml_type} differs from sdkit's")
    dst = np.empty(expected, dtype=np.uint8)
    written = lib.ggml_quantize_chunk(ggml_type, src.ctypes.data, dst.ctypes.data, 0, rows, per_row, None)
    if int(written) != expected:
        raise RuntimeError(f"ggml_quantize_chunk wrote {written} bytes, expected {expected}")
    return dst
