"""Lazy access to the OpenVINO runtime: import, one shared ``Core``, devices, error text.

Everything that touches ``openvino`` goes through here, so the rest of the plugin can be
imported (and the hooks loaded) on a machine without OpenVINO.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from sdkit.device import Device
from sdkit.errors import BackendUnavailableError, DeviceError
from sdkit.known_backends import install_command

BACKEND_NAME = "openvino"
INSTALL_HINT = install_command("intel")
MIN_VERSION = (2025, 0)

_lock = threading.Lock()
_core: Any = None


def import_openvino() -> ModuleType:
    """``import openvino``, or BackendUnavailableError with the reason and install hint."""
    try:
        import openvino
    except ImportError as exc:
        raise BackendUnavailableError(BACKEND_NAME, f"openvino is not installed ({exc})", INSTALL_HINT) from None
    except Exception as exc:  # a broken install (missing shared library, ABI mismatch)
        raise BackendUnavailableError(BACKEND_NAME, f"openvino fails to import: {exc}", INSTALL_HINT) from None
    module: ModuleType = openvino
    return module


def version_tuple(text: str) -> tuple[int, ...]:
    """``"2026.4.1-22982-..."`` -> ``(2026, 4, 1)``."""
    head = text.split("-", 1)[0]
    parts: list[int] = []
    for piece in head.split("."):
        if not piece.isdigit():
            break
        parts.append(int(piece))
    return tuple(parts)


def openvino_version() -> str:
    return str(import_openvino().get_version())


def get_core() -> Any:
    """The process-wide ``openvino.Core`` (creating one loads the device plugins)."""
    global _core
    ov = import_openvino()  # every time: cheap once imported, and honest if it went away
    with _lock:
        if _core is None:
            try:
                _core = ov.Core()
            except Exception as exc:
                raise BackendUnavailableError(
                    BACKEND_NAME, f"openvino.Core() failed: {first_line(exc)}", INSTALL_HINT
                ) from None
        return _core


@dataclass(frozen=True)
class OvDevice:
    """An OpenVINO device name (``CPU``, ``GPU.0``, ``NPU``) and its sdkit Device."""

    vendor_name: str
    device: Device
    capabilities: frozenset[str]


def list_devices() -> list[OvDevice]:
    """Every device OpenVINO sees, CPU first. A device whose plugin fails is left out."""
    core = get_core()
    found: list[OvDevice] = []
    for name in core.available_devices:
        try:
            full_name = str(core.get_property(name, "FULL_DEVICE_NAME"))
            caps = frozenset(str(c).upper() for c in core.get_property(name, "OPTIMIZATION_CAPABILITIES"))
        except Exception:  # a listed device whose driver cannot answer is unusable
            continue
        found.append(OvDevice(name, Device.from_vendor(name, full_name), caps))
    return sorted(found, key=lambda d: (d.device.kind != "cpu", d.device))


def resolve_device(device: Device) -> OvDevice:
    """The OpenVINO device for an sdkit Device (``gpu`` matches ``GPU.0``)."""
    devices = list_devices()
    for candidate in devices:
        if device.matches(candidate.device):
            return candidate
    listed = ", ".join(str(d.device) for d in devices) or "none"
    raise DeviceError(f"OpenVINO has no device {device}; its devices: {listed}")


def first_line(exc: BaseException) -> str:
    """The informative part of an OpenVINO exception (its messages start with C++ file/line
    noise like ``Exception from src/inference/src/...``)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    noise = ("Exception from src", "Check '", "FrontEnd API failed", "Summary:", "-- ")
    useful = [ln for ln in lines if not ln.startswith(noise)]
    text = (useful or lines or [type(exc).__name__])[0]
    return text[:400]
