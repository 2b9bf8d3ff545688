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
