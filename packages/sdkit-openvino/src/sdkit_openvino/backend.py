"""``OpenVinoBackend``: sdkit's backend on Intel OpenVINO (CPU, Intel GPU, NPU)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from sdkit.backend import Availability, Backend, CompiledModel, SupportReport
from sdkit.errors import BackendUnavailableError, OptionError
from sdkit_openvino.runtime import (
    BACKEND_NAME,
    INSTALL_HINT,
    MIN_VERSION,
    import_openvino,
    list_devices,
    resolve_device,
    version_tuple,
)

if TYPE_CHECKING:
    from sdkit.device import Device
    from sdkit.model import Graph, WeightSet
    from sdkit.options import Options


class OpenVinoBackend(Backend):
    name: ClassVar[str] = BACKEND_NAME
    priority: ClassVar[int] = 60
    refittable: ClassVar[bool] = True  # refit = reconvert + recompile; OpenVINO's blob hash covers weights
    description: ClassVar[str] = "Intel OpenVINO: CPU (x86/ARM), Intel GPU, NPU"
    # config.PRECISIONS' keys (its inference precision hints), without importing config here
    precisions: ClassVar[tuple[str, ...] | None] = ("fp32", "fp16", "bf16")

    def probe(self) -> Availability:
        try:
            ov = import_openvino()
            version = str(ov.get_version())
            if version_tuple(version) < MIN_VERSION:
                wanted = ".".join(str(p) for p in MIN_VERSION)
                return Availability(False, f"openvino {version} is older than {wanted}", INSTALL_HINT, version)
            devices = list_devices()
        except BackendUnavailableError as exc:
            return Availability(False, exc.reason, exc.install_hint)
        except Exception as exc:  # a plugin that crashes while listing devices
            return Availability(False, f"openvino cannot list devices: {exc}", INSTALL_HINT)
        if not devices:
            return Availability(False, "openvino sees no usable device", INSTALL_HINT, version)
        listed = ", ".join(d.vendor_name for d in devices)
        return Availability(True, f"openvino {version.split('-', maxsplit=1)[0]} ({listed})", version=version)

    def devices(self) -> list[Device]:
        try:
            return [d.device for d in list_devices()]
        except BackendUnavailableError:
            return []

    def check(self, graph: Graph) -> SupportReport:
        from sdkit_openvino.support import check_graph

        return check_graph(graph)

    def compile(self, graph: Graph, weights: WeightSet, device: Device, options: Options) -> CompiledModel:
        from sdkit_openvino.compiled import OpenVinoCompiled
        from sdkit_openvino.config import PRECISIONS

        if options.precision not in PRECISIONS:  # q8_0 is a ggml weight format
            raise OptionError(f"OpenVINO computes in {', '.join(PRECISIONS)}, not {options.precision!r}")
        availability = self.probe()
        if not availability.ok:
            raise BackendUnavailableError(self.name, availability.reason, availability.install_hint)
        return OpenVinoCompiled(graph, weights, resolve_device(device), options)
