"""CUDA memory and streams through ``cuda-bindings`` (the runtime API; no torch, no pycuda).

cuda-bindings links the CUDA runtime statically and needs only the driver. Its calls return
``(error, *results)`` tuples; ``check`` turns a failure into a DeviceError with CUDA's own
error text. Pointers are plain ints, which is what TensorRT's ``set_tensor_address`` takes.
Pinned (page-locked) host buffers make the copies truly asynchronous on the model's stream.
"""

from __future__ import annotations

import ctypes
import importlib
from types import ModuleType
from typing import Any

import numpy as np

from sdkit.errors import BackendUnavailableError, DeviceError
from sdkit_trt.runtime import BACKEND_NAME, INSTALL_HINT


def cudart() -> ModuleType:
    """The runtime module of cuda-bindings (``cuda.bindings.runtime``; ``cuda.cudart`` before 12.6)."""
    for name in ("cuda.bindings.runtime", "cuda.cudart"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise BackendUnavailableError(BACKEND_NAME, "cuda-bindings is not installed", INSTALL_HINT)


def check(result: Any, what: str) -> Any:
    """Unpack ``(err, *values)``; raise DeviceError unless err is cudaSuccess."""
    rt = cudart()
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != rt.cudaError_t.cudaSuccess:
        _, text = rt.cudaGetErrorString(err)
        raise DeviceError(
            f"CUDA {what} failed: {text.decode(errors='replace') if isinstance(text, bytes) else text} ({err})"
        )
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def set_device(ordinal: int) -> None:
    check(cudart().cudaSetDevice(ordinal), f"cudaSetDevice({ordinal})")


class Stream:
    """One CUDA stream (each compiled model owns one)."""

    def __init__(self) -> None:
        self.handle: Any = check(cudart().cudaStreamCreate(), "cudaStreamCreate")

    @property
    def ptr(self) -> int:
        return int(self.handle)

    def synchronize(self) -> None:
        check(cudart().cudaStreamSynchronize(self.handle), "cudaStreamSynchronize")

    def close(self) -> None:
        if self.handle is not None:
            cudart().cudaStreamDestroy(self.handle)
            self.handle = None


class DeviceBuffer:
    """``nbytes`` of device memory (at least one byte, so empty tensors get a valid address)."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = max(1, int(nbytes))
        self.ptr: int = int(check(cudart().cudaMalloc(self.nbytes), f"cudaMalloc({self.nbytes} bytes)"))

    def close(self) -> None:
        if self.ptr:
            cudart().cudaFree(self.ptr)
            self.ptr = 0


class PinnedBuffer:
    """Page-locked host memory viewed as a numpy array of ``shape`` and ``dtype``."""

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> None:
        self.nbytes = max(1, int(np.prod(shape, dtype=np.int64)) * dtype.itemsize)
        self.ptr: int = int(check(cudart().cudaMallocHost(self.nbytes), f"cudaMallocHost({self.nbytes} bytes)"))
        raw = (ctypes.c_byte * self.nbytes).from_address(self.ptr)
        count = int(np.prod(shape, dtype=np.int64))
        self.array: np.ndarray[Any, Any] = np.frombuffer(memoryview(raw), dtype=dtype, count=count).reshape(shape)

    def close(self) -> None:
        if self.ptr:
            self.array = np.empty(0)
            cudart().cudaFreeHost(self.ptr)
            self.ptr = 0


def copy_to_device(dst: DeviceBuffer, src: PinnedBuffer, stream: Stream) -> None:
    rt = cudart()
    kind = rt.cudaMemcpyKind.cudaMemcpyHostToDevice
    check(
        rt.cudaMemcpyAsync(dst.ptr, src.ptr, src.array.nbytes, kind, stream.handle), "cudaMemcpyAsync (host to device)"
    )


def copy_to_host(dst: PinnedBuffer, src: DeviceBuffer, stream: Stream) -> None:
    rt = cudart()
    kind = rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
    check(
        rt.cudaMemcpyAsync(dst.ptr, src.ptr, dst.array.nbytes, kind, stream.handle), "cudaMemcpyAsync (device to host)"
    )
