"""Tensors as the compiler hands them to the runtime: a ggml tensor pointer with its ONNX shape
and dtype, how each ONNX dtype is stored in ggml, and ONNX shapes as ggml ``ne``.

Layout convention: a Tensor is always contiguous, with ggml ``ne`` the reversed ONNX shape
(``ne[0]`` innermost). ONNX ranks above 4 keep their leading dims merged into ``ne[3]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sdkit_ggml.runtime import lib as L

# ONNX dtypes a runtime tensor may have, and how ggml stores them.
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))
INT_DTYPES = tuple(np.dtype(t) for t in (np.int64, np.int32, np.int16, np.int8, np.uint8, np.uint16))
BOOL = np.dtype(np.bool_)
SUPPORTED_DTYPES = (*FLOAT_DTYPES, *INT_DTYPES, BOOL)


def storage_type(dtype: np.dtype[Any]) -> int | None:
    """The ggml type holding an ONNX dtype (floats and bools as 0/1 in F32, integers in I32);
    None for dtypes ggml has no tensors for."""
    if dtype in FLOAT_DTYPES or dtype == BOOL:
        return L.GGML_TYPE_F32
    if dtype in INT_DTYPES:
        return L.GGML_TYPE_I32
    return None


# Quantized weight types: ggml type -> (elements per block, bytes per block). Q8_0 is 32 int8
# values and one F16 scale (ggml-common.h's block_q8_0): 34 bytes per 32 weights.
QUANTIZED: dict[int, tuple[int, int]] = {L.GGML_TYPE_Q8_0: (32, 34)}


def type_size(ggml_type: int) -> int:
    """Bytes per element of the ggml types the compiler creates (F32, F16, I32), rounded up for
    quantized types (an upper bound, for the size checks made before ggml sees a shape)."""
    if ggml_type in QUANTIZED:
        return 2
    return 2 if ggml_type == L.GGML_TYPE_F16 else 4


def tensor_bytes(shape: Sequence[int], ggml_type: int) -> int:
    """Exact bytes of a contiguous tensor of ``shape`` stored as ``ggml_type`` (a quantized
    type needs its innermost dim to be a whole number of blocks)."""
    count = math.prod(int(d) for d in shape)
    if ggml_type in QUANTIZED:
        block, block_bytes = QUANTIZED[ggml_type]
        return count // block * block_bytes
    return count * type_size(ggml_type)


def storage_numpy(ggml_type: int) -> np.dtype[Any]:
    if ggml_type in QUANTIZED:  # raw blocks, written by ggml_quantize_chunk
        return np.dtype(np.uint8)
    if ggml_type == L.GGML_TYPE_F32:
        return np.dtype(np.float32)
    if ggml_type == L.GGML_TYPE_F16:
        return np.dtype(np.float16)
    return np.dtype(np.int32)


def ne_of(shape: Sequence[int]) -> tuple[int, int, int, int]:
    """ggml ne (innermost first) for an ONNX shape; leading dims beyond 4 merge into ne[3]."""
    dims = [int(d) for d in shape]
    if len(dims) > 4:
        dims = [math.prod(dims[: len(dims) - 3]), *dims[-3:]]
    ne = [*reversed(dims), *([1] * (4 - len(dims)))]
    return ne[0], ne[1], ne[2], ne[3]


@dataclass(frozen=True, eq=False)
class Tensor:
    """A runtime value: a ggml tensor pointer, its ONNX shape and ONNX dtype."""

    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    ggml_type: int = L.GGML_TYPE_F32
    # Known value range of an integer tensor (argmax results, index arithmetic): lets
    # computed gather indices be proven in range at compile time.
    bounds: tuple[int, int] | None = None

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass
class WeightEntry:
    """A constant uploaded to a weight buffer; ``source`` names the graph value it comes from
    (recomputed on refit) and ``transform`` the compile-time preprocessing applied to it.
    ``pending``: ``array`` is still the untransformed value, transformed at upload (one weight
    at a time, so a model's transposed copies never all sit in memory beside its weights)."""

    tensor: Tensor
    source: str | None
    array: np.ndarray
    transform: Callable[[np.ndarray], np.ndarray] | None = None
    pending: bool = False

    def value(self) -> np.ndarray:
        """The array to upload: ``array``, transformed now when that is pending."""
        if self.pending and self.transform is not None:
            return self.transform(self.array)
        return self.array
