"""The ``migraphx`` backend: AMD GPUs through ROCm's MIGraphX.

``probe`` is ok only with an importable ``migraphx`` module, at least one AMD GPU in the KFD
topology and MIGraphX's ``gpu`` target. Elsewhere it says which piece is missing, so
automatic choice never picks it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, ClassVar

from sdkit.backend import Availability, Backend, CompiledModel, SupportReport
from sdkit.errors import BackendUnavailableError, DeviceError
from sdkit_migraphx.runtime import BACKEND_NAME, INSTALL_HINT, amd_gpus, first_line, import_migraphx, migraphx_version
from sdkit_migraphx.settings import EXTRA_OPTIONS, PRECISIONS

if TYPE_CHECKING:
    from sdkit.device import Device
    from sdkit.model import Graph, WeightSet
    from sdkit.options import Options


class MigraphxBackend(Backend):
    name: ClassVar[str] = BACKEND_NAME
    priority: ClassVar[int] = 85
    refittable: ClassVar[bool] = False  # compiled programs embed the weights: refit recompiles
    extra_options: ClassVar[Mapping[str, type | tuple[type, ...]]] = EXTRA_OPTIONS
    description: ClassVar[str] = "AMD MIGraphX (ROCm GPUs)"
    precisions: ClassVar[tuple[str, ...] | None] = PRECISIONS

    def probe(self) -> Availability:
        if not sys.platform.startswith("linux"):
            return Availability(False, f"MIGraphX runs on Linux with ROCm, not {sys.platform}", INSTALL_HINT)
        try:
            mx = import_migraphx()
        except BackendUnavailableError as exc:
            return Availability(False, exc.reason, exc.install_hint)
        version = migraphx_version(mx)
        gpus = amd_gpus()
        if not gpus:
            return Availability(
                False, f"MIGraphX {version} is installed but no AMD GPU is visible (/dev/kfd, KFD topology)",
                version=version,
            )  # fmt: skip
        try:
            mx.get_target("gpu")
        except Exception as exc:
            return Availability(False, f"MIGraphX {version} has no gpu target: {first_line(exc)}", version=version)
        listed = ", ".join(f"{d} {d.description}" for d in gpus)
        return Availability(True, f"MIGraphX {version} ({listed})", version=version)

    def devices(self) -> list[Device]:
        return amd_gpus() if self.probe().ok else []

    def check(self, graph: Graph) -> SupportReport:
        from sdkit_migraphx.support import check_graph

        return check_graph(graph)

    def compile(self, graph: Graph, weights: WeightSet, device: Device, options: Options) -> CompiledModel:
        from sdkit_migraphx.compiled import MigraphxCompiled
        from sdkit_migraphx.settings import settings_for

        availability = self.probe()
        if not availability.ok:
            raise BackendUnavailableError(self.name, availability.reason, availability.install_hint)
        settings = settings_for(options)
        gpus = amd_gpus()
        found = next((g for g in gpus if device.matches(g)), None)
        if found is None:
            listed = ", ".join(str(g) for g in gpus)
            raise DeviceError(f"the migraphx backend has no device {device}; its devices: {listed}")
        if found.index not in (0, None):
            # MIGraphX compiles for the current HIP device; sdkit does not switch it
            raise DeviceError(
                f"sdkit-migraphx runs on rocm:0; choose another GPU with HIP_VISIBLE_DEVICES={found.index}"
            )
        return MigraphxCompiled(import_migraphx(), graph, weights, found, settings, options.cache)
