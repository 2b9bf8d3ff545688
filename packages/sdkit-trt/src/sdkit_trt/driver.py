"""The NVIDIA driver, seen through ``libcuda`` with ctypes: is it there, which GPUs it has.

ctypes and the CUDA driver API keep the probe cheap and free of vendor Python packages: no
torch, no cuda-bindings import, no context created (``cuInit`` plus attribute queries only).
CUDA ordinals are what TensorRT and cuda-bindings use, so ``cuda:N`` here is device N there
(NVML's indices can differ from CUDA's under ``CUDA_VISIBLE_DEVICES``).
"""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass

# CUdevice_attribute values (cuda.h; stable since CUDA 2.x).
_ATTR_CC_MAJOR = 75
_ATTR_CC_MINOR = 76
_CUDA_SUCCESS = 0


@dataclass(frozen=True)
class Gpu:
    """One CUDA device: ordinal, marketing name, compute capability and memory."""

    ordinal: int
    name: str
    compute_capability: tuple[int, int]
    total_memory: int  # bytes

    @property
    def sm(self) -> int:
        """Compute capability as TensorRT-RTX spells it: 8.6 -> 86."""
        return self.compute_capability[0] * 10 + self.compute_capability[1]

    def describe(self) -> str:
        major, minor = self.compute_capability
        return f"{self.name} (compute capability {major}.{minor}, {self.total_memory / 2**30:.0f} GiB)"


@dataclass(frozen=True)
class DriverReport:
    """What the driver said: its CUDA version and GPUs, or why it is unusable (``error``)."""

    cuda_version: tuple[int, int] | None
    gpus: tuple[Gpu, ...]
    error: str = ""


def driver_library_name() -> str:
    return "nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1"


def load_libcuda() -> ctypes.CDLL:
    """Open the driver library. Raises OSError when it is not installed (tests replace this)."""
    if sys.platform == "win32":
        return ctypes.WinDLL(driver_library_name())  # type: ignore[attr-defined,no-any-return]
    return ctypes.CDLL(driver_library_name())


def _error_name(lib: ctypes.CDLL, code: int) -> str:
    name = ctypes.c_char_p()
    try:
        lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        lib.cuGetErrorName.restype = ctypes.c_int
        if lib.cuGetErrorName(code, ctypes.byref(name)) == _CUDA_SUCCESS and name.value:
            return f"{name.value.decode(errors='replace')} ({code})"
    except AttributeError:
        pass
    return f"CUDA error {code}"


def _why_init_failed(code: int, text: str) -> str:
    if code == 100:  # CUDA_ERROR_NO_DEVICE
        return f"the NVIDIA driver is installed but sees no GPU: cuInit returned {text}"
    if code == 35:  # CUDA_ERROR_INSUFFICIENT_DRIVER
        return f"the NVIDIA driver is too old for this CUDA runtime: cuInit returned {text}"
    return f"the NVIDIA driver failed to initialise: cuInit returned {text}"


def query_driver(lib: ctypes.CDLL) -> DriverReport:
    """Ask an opened driver library for its version and devices (no context is created)."""
    int_p = ctypes.POINTER(ctypes.c_int)
    lib.cuInit.argtypes = [ctypes.c_uint]
    lib.cuInit.restype = ctypes.c_int
    code = lib.cuInit(0)
    if code != _CUDA_SUCCESS:
        return DriverReport(None, (), _why_init_failed(code, _error_name(lib, code)))
    version = ctypes.c_int(0)
    lib.cuDriverGetVersion.argtypes = [int_p]
    lib.cuDriverGetVersion.restype = ctypes.c_int
    cuda_version = None
    if lib.cuDriverGetVersion(ctypes.byref(version)) == _CUDA_SUCCESS:
        cuda_version = (version.value // 1000, (version.value % 1000) // 10)
    count = ctypes.c_int(0)
    lib.cuDeviceGetCount.argtypes = [int_p]
    lib.cuDeviceGetCount.restype = ctypes.c_int
    code = lib.cuDeviceGetCount(ctypes.byref(count))
    if code != _CUDA_SUCCESS:
        return DriverReport(cuda_version, (), f"cuDeviceGetCount returned {_error_name(lib, code)}")
    lib.cuDeviceGet.argtypes = [int_p, ctypes.c_int]
    lib.cuDeviceGet.restype = ctypes.c_int
    lib.cuDeviceGetName.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int]
    lib.cuDeviceGetName.restype = ctypes.c_int
    lib.cuDeviceGetAttribute.argtypes = [int_p, ctypes.c_int, ctypes.c_int]
    lib.cuDeviceGetAttribute.restype = ctypes.c_int
    total_mem = getattr(lib, "cuDeviceTotalMem_v2", None)
    if total_mem is not None:
        total_mem.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.c_int]
        total_mem.restype = ctypes.c_int
    gpus: list[Gpu] = []
    for ordinal in range(count.value):
        device = ctypes.c_int(0)
        if lib.cuDeviceGet(ctypes.byref(device), ordinal) != _CUDA_SUCCESS:
            continue
        name = ctypes.create_string_buffer(256)
        lib.cuDeviceGetName(name, 256, device.value)
        major, minor = ctypes.c_int(0), ctypes.c_int(0)
        lib.cuDeviceGetAttribute(ctypes.byref(major), _ATTR_CC_MAJOR, device.value)
        lib.cuDeviceGetAttribute(ctypes.byref(minor), _ATTR_CC_MINOR, device.value)
        memory = ctypes.c_size_t(0)
        if total_mem is not None:
            total_mem(ctypes.byref(memory), device.value)
        gpus.append(Gpu(ordinal, name.value.decode(errors="replace").strip(), (major.value, minor.value), memory.value))
    return DriverReport(cuda_version, tuple(gpus))


def probe_driver() -> DriverReport:
    """Load the driver and list its GPUs; never raises."""
    try:
        lib = load_libcuda()
    except OSError as exc:
        return DriverReport(
            None, (), f"the NVIDIA driver is not installed ({driver_library_name()} cannot be loaded: {exc})"
        )
    try:
        return query_driver(lib)
    except (AttributeError, OSError) as exc:  # a stub or broken libcuda without the symbols
        return DriverReport(None, (), f"{driver_library_name()} is not a usable NVIDIA driver: {exc}")
