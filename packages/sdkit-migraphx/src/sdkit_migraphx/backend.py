"""The ``migraphx`` backend: detects ROCm's MIGraphX runtime and AMD GPUs.

MIGraphX is not on PyPI: it ships with ROCm (``/opt/rocm/lib`` holds its Python module). The
compiler comes in its own issue; until then ``probe`` reports the backend unavailable, also
where the runtime is present, so automatic choice never picks a backend that cannot compile.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from sdkit.backend import Availability, Backend, CompiledModel, SupportReport
from sdkit.device import Device
from sdkit.errors import BackendUnavailableError
from sdkit.known_backends import requirement

if TYPE_CHECKING:
    from sdkit.model import Graph, WeightSet
    from sdkit.options import Options

INSTALL_HINT = f"install ROCm with MIGraphX (https://rocm.docs.amd.com), then pip install {requirement('amd')}"
KFD_NODES = "/sys/class/kfd/kfd/topology/nodes"


def rocm_roots() -> list[Path]:
    roots = [Path(os.environ.get("ROCM_PATH", "/opt/rocm")), Path("/opt/rocm")]
    roots += sorted(Path("/opt").glob("rocm-*"), reverse=True)
    return [r for r in dict.fromkeys(roots) if r.is_dir()]


def find_migraphx() -> tuple[str | None, str]:
    """(version, where) of an importable ``migraphx`` module, or (None, why not)."""
    for root in rocm_roots():
        lib = str(root / "lib")
        if lib not in sys.path and Path(lib).is_dir():
            sys.path.append(lib)  # ROCm installs the Python module there, not in site-packages
    try:
        module = importlib.import_module("migraphx")
    except ImportError as exc:
        where = ", ".join(str(r) for r in rocm_roots()) or "no ROCm installation found (/opt/rocm)"
        return None, f"the migraphx Python module is not importable ({exc}); looked in {where}"
    return str(getattr(module, "__version__", "unknown")), str(getattr(module, "__file__", ""))


def amd_gpus(nodes_dir: str = KFD_NODES) -> list[Device]:
    """AMD GPUs from the KFD topology (CPU nodes have simd_count 0)."""
    devices: list[Device] = []
    nodes = [p for p in Path(nodes_dir).glob("*") if p.name.isdigit()]
    for node in sorted(nodes, key=lambda p: int(p.name)):
        try:
            props = dict(
                line.split(maxsplit=1) for line in Path(node, "properties").read_text().splitlines() if " " in line
            )
            name = Path(node, "name").read_text().strip() if Path(node, "name").exists() else ""
        except OSError:
            continue
        if int(props.get("simd_count", "0") or 0) > 0:
            devices.append(Device("rocm", len(devices), name or f"gfx{props.get('gfx_target_version', '?')}"))
    return devices


class MigraphxBackend(Backend):
    name: ClassVar[str] = "migraphx"
    priority: ClassVar[int] = 85
    description: ClassVar[str] = "AMD MIGraphX (ROCm)"

    def probe(self) -> Availability:
        if not sys.platform.startswith("linux"):
            return Availability(False, f"MIGraphX runs on Linux with ROCm, not {sys.platform}", INSTALL_HINT)
        gpus = amd_gpus()
        version, where = find_migraphx()
        if version is None:
            return Availability(False, where, INSTALL_HINT)
        if not gpus:
            return Availability(
                False, "MIGraphX is installed but no AMD GPU is visible (/dev/kfd, KFD topology)", version=version
            )
        return Availability(
            False,
            f"MIGraphX {version} and {len(gpus)} AMD GPU(s) found, "
            "but sdkit-migraphx's compiler is not implemented yet",
            version=version,
        )

    def devices(self) -> list[Device]:
        return amd_gpus()

    def check(self, graph: Graph) -> SupportReport:
        report = SupportReport(self.name)
        report.notes.append("the MIGraphX compiler is not implemented yet; nothing was checked")
        return report

    def compile(self, graph: Graph, weights: WeightSet, device: Device, options: Options) -> CompiledModel:
        availability = self.probe()
        raise BackendUnavailableError(self.name, availability.reason, availability.install_hint)
