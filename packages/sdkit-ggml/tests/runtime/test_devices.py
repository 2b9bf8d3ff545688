"""runtime/devices.py: ggml's device registry as sdkit Devices."""

from __future__ import annotations

import pytest

from sdkit.device import Device
from sdkit.errors import DeviceError
from sdkit_ggml.runtime.devices import compute_lock, find_device, list_devices, open_backend
from sdkit_ggml.runtime.lib import load_library


def test_cpu_is_listed_and_opened_once() -> None:
    lib = load_library()
    cpu = find_device(lib, Device("cpu"))
    assert cpu.is_cpu and any(d.device.kind == "cpu" for d in list_devices(lib))
    backend = open_backend(lib, cpu)
    assert open_backend(lib, cpu) == backend
    assert compute_lock(backend) is compute_lock(backend)


def test_an_absent_device_names_the_available_ones() -> None:
    with pytest.raises(DeviceError, match=r"available: (.*, )?cpu"):
        find_device(load_library(), Device("cuda", 7))


class RegistryOf:
    """ggml's device registry as a GPU build of ggml fills it (names as ggml 0.20 gives them)."""

    def __init__(self, entries: list[tuple[str, int, str]]) -> None:
        self.entries = entries

    def ggml_backend_dev_count(self) -> int:
        return len(self.entries)

    def ggml_backend_dev_get(self, i: int) -> int:
        return i

    def ggml_backend_dev_type(self, handle: int) -> int:
        return self.entries[handle][1]

    def ggml_backend_dev_name(self, handle: int) -> bytes:
        return self.entries[handle][0].encode()

    def ggml_backend_dev_description(self, handle: int) -> bytes:
        return self.entries[handle][2].encode()


def test_a_cuda_and_vulkan_build_lists_cuda_n_and_vulkan_n() -> None:
    from sdkit_ggml.runtime.lib import DEV_TYPE_ACCEL, DEV_TYPE_CPU, DEV_TYPE_GPU

    registry = RegistryOf([("CUDA0", DEV_TYPE_GPU, "NVIDIA H200"), ("CUDA1", DEV_TYPE_GPU, "NVIDIA H100"),
                           ("Vulkan0", DEV_TYPE_GPU, "NVIDIA H200"), ("BLAS", DEV_TYPE_ACCEL, "OpenBLAS"),
                           ("CPU", DEV_TYPE_CPU, "AMD EPYC")])  # fmt: skip
    devices = list_devices(registry)  # type: ignore[arg-type]
    assert [str(d.device) for d in devices] == ["cuda:0", "cuda:1", "vulkan:0", "cpu"]
    assert devices[0].device.description == "NVIDIA H200" and devices[-1].is_cpu
    assert find_device(registry, Device("vulkan", 0)).name == "Vulkan0"  # type: ignore[arg-type]
    assert find_device(registry, Device("cuda")).name == "CUDA0"  # type: ignore[arg-type]
