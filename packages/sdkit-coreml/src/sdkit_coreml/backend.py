"""The ``coreml`` backend: detects macOS, coremltools and the Apple compute units.

The compiler comes in its own issue; until then ``probe`` reports the backend unavailable,
also where coremltools is present, so automatic choice never picks it.
"""

from __future__ import annotations

import importlib.util
import platform
import sys
from typing import TYPE_CHECKING, ClassVar

from sdkit.backend import Availability, Backend, CompiledModel, SupportReport
from sdkit.device import Device
from sdkit.errors import BackendUnavailableError
from sdkit.known_backends import requirement

if TYPE_CHECKING:
    from sdkit.model import Graph, WeightSet
    from sdkit.options import Options

INSTALL_HINT = f"on a Mac: pip install {requirement('apple')}"


def coremltools_version() -> str | None:
    if importlib.util.find_spec("coremltools") is None:
        return None
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("coremltools")
    except PackageNotFoundError:
        return "unknown"


def apple_devices(machine: str | None = None) -> list[Device]:
    """Core ML compute units: the Neural Engine and GPU on Apple silicon, always the CPU."""
    machine = machine or platform.machine()
    devices = [Device("cpu")]
    if machine == "arm64":
        devices = [Device("ane", description="Apple Neural Engine"), Device("gpu", 0, "Apple GPU"), *devices]
    return devices


class CoremlBackend(Backend):
    name: ClassVar[str] = "coreml"
    priority: ClassVar[int] = 80
    description: ClassVar[str] = "Apple Core ML (macOS)"

    def probe(self) -> Availability:
        if sys.platform != "darwin":
            return Availability(False, f"Core ML runs on macOS only (this is {sys.platform})", INSTALL_HINT)
        version = coremltools_version()
        if version is None:
            return Availability(False, "coremltools is not installed", INSTALL_HINT)
        return Availability(
            False, f"coremltools {version} found, but sdkit-coreml's compiler is not implemented yet", version=version
        )

    def devices(self) -> list[Device]:
        return apple_devices() if sys.platform == "darwin" else []

    def check(self, graph: Graph) -> SupportReport:
        report = SupportReport(self.name)
        report.notes.append("the Core ML compiler is not implemented yet; nothing was checked")
        return report

    def compile(self, graph: Graph, weights: WeightSet, device: Device, options: Options) -> CompiledModel:
        availability = self.probe()
        raise BackendUnavailableError(self.name, availability.reason, availability.install_hint)
