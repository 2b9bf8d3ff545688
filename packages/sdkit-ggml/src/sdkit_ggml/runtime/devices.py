"""ggml's backend registry as sdkit Devices: ``cpu``, ``cuda:N``, ``vulkan:N``, ``metal``...

A device is opened once per process and shared by every compiled model on it (CPU thread
counts are set per compute, so models with different ``threads`` can share it).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from sdkit.device import Device
from sdkit.errors import DeviceError
from sdkit_ggml.runtime.lib import DEV_TYPE_ACCEL, DEV_TYPE_CPU, GgmlLib


@dataclass(frozen=True)
class GgmlDevice:
    """One entry of ggml's device registry."""

    device: Device
    name: str  # ggml's name, e.g. "CPU", "CUDA0", "Vulkan1"
    handle: int  # ggml_backend_dev_t
    is_cpu: bool


def list_devices(lib: GgmlLib) -> list[GgmlDevice]:
    """Every compute device ggml registered (accelerator helpers such as BLAS excluded)."""
    found: list[GgmlDevice] = []
    for i in range(lib.ggml_backend_dev_count()):
        handle = lib.ggml_backend_dev_get(i)
        kind = lib.ggml_backend_dev_type(handle)
        if kind == DEV_TYPE_ACCEL:
            continue
        name = (lib.ggml_backend_dev_name(handle) or b"").decode()
        description = (lib.ggml_backend_dev_description(handle) or b"").decode()
        if kind == DEV_TYPE_CPU:
            device = Device("cpu", description=description)
        else:
            try:
                device = Device.from_vendor(name, description)
            except DeviceError:
                continue
        found.append(GgmlDevice(device, name, handle, kind == DEV_TYPE_CPU))
    return found


def find_device(lib: GgmlLib, wanted: Device) -> GgmlDevice:
    devices = list_devices(lib)
    for entry in devices:
        same_index = entry.device.index == wanted.index or (wanted.index in (None, 0) and entry.device.index is None)
        if entry.device.kind == wanted.kind and (wanted.index is None or same_index):
            return entry
    names = ", ".join(str(d.device) for d in devices) or "none"
    raise DeviceError(f"ggml has no device {wanted}; available: {names}")


_lock = threading.Lock()
_opened: dict[int, int] = {}
_compute_locks: dict[int, threading.Lock] = {}


def compute_lock(backend: int) -> threading.Lock:
    """One lock per ggml_backend_t: the backend is shared by every model on its device and
    keeps per-compute state (the CPU work buffer, the thread count), so computes, weight
    uploads and frees on it are serialised."""
    with _lock:
        return _compute_locks.setdefault(backend, threading.Lock())


def open_backend(lib: GgmlLib, entry: GgmlDevice) -> int:
    """The ggml_backend_t of a device, initialised once per process."""
    with _lock:
        backend = _opened.get(entry.handle)
        if backend is None:
            backend = lib.ggml_backend_dev_init(entry.handle, None)
            if not backend:
                raise DeviceError(f"ggml could not initialise device {entry.device} ({entry.name})")
            _opened[entry.handle] = backend
        return backend
