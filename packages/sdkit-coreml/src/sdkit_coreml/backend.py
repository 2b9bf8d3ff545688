"""The ``coreml`` backend: Apple's Core ML on macOS (Neural Engine, GPU, CPU).

``probe`` is ok only where Core ML can run: macOS with coremltools >= 8 and its runtime
binding. Elsewhere (Linux CI) the backend is unavailable and says why, so automatic choice
never picks it; the translator still works there (``sdkit_coreml.export_mlpackage``).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, ClassVar

from sdkit.backend import Availability, Backend, CompiledModel, SupportReport
from sdkit.device import Device
from sdkit.errors import BackendUnavailableError, DeviceError
from sdkit_coreml.runtime import (
    BACKEND_NAME,
    INSTALL_HINT,
    MIN_VERSION,
    apple_devices,
    coremltools_version,
    on_macos,
    runtime_available,
    version_tuple,
)
from sdkit_coreml.settings import PRECISIONS

if TYPE_CHECKING:
    from sdkit.model import Graph, WeightSet
    from sdkit.options import Options


class CoremlBackend(Backend):
    name: ClassVar[str] = BACKEND_NAME
    priority: ClassVar[int] = 80
    refittable: ClassVar[bool] = False  # packages embed the weights: refit re-converts
    extra_options: ClassVar[Mapping[str, type | tuple[type, ...]]] = {
        "compute_units": str,
        "target": str,
        "enumerated_shapes": dict,
        "shape_ranges": dict,
    }
    description: ClassVar[str] = "Apple Core ML (macOS): Neural Engine, GPU, CPU"
    precisions: ClassVar[tuple[str, ...] | None] = PRECISIONS

    def probe(self) -> Availability:
        version = coremltools_version()
        converts = f"; coremltools {version} is installed and converts to .mlpackage here" if version else ""
        if not on_macos():
            return Availability(False, f"Core ML runs on macOS only (this is {sys.platform}){converts}", INSTALL_HINT)
        if version is None:
            return Availability(False, "coremltools is not installed", INSTALL_HINT)
        if version_tuple(version) < MIN_VERSION:
            wanted = ".".join(str(p) for p in MIN_VERSION)
            return Availability(False, f"coremltools {version} is older than {wanted}", INSTALL_HINT, version)
        ok, why = runtime_available()
        if not ok:
            return Availability(False, why, INSTALL_HINT, version)
        units = ", ".join(str(d) for d in apple_devices())
        return Availability(True, f"coremltools {version}, Core ML ({units})", version=version)

    def devices(self) -> list[Device]:
        return apple_devices() if on_macos() and self.probe().ok else []

    def check(self, graph: Graph) -> SupportReport:
        """Every node the translator cannot take (op, opset, attributes), without coremltools."""
        from sdkit_coreml.program import preflight

        report = SupportReport(self.name)
        report.unsupported.extend(preflight(graph))
        return report

    def compile(self, graph: Graph, weights: WeightSet, device: Device, options: Options) -> CompiledModel:
        from sdkit_coreml.compiled import CoremlCompiled
        from sdkit_coreml.settings import settings_for

        availability = self.probe()
        if not availability.ok:
            raise BackendUnavailableError(self.name, availability.reason, availability.install_hint)
        if not any(device.matches(d) for d in self.devices()):
            listed = ", ".join(str(d) for d in self.devices())
            raise DeviceError(f"the coreml backend has no device {device}; its devices: {listed}")
        settings = settings_for(options, device, graph.inputs)
        return CoremlCompiled(graph, weights, device, settings, options.cache)
