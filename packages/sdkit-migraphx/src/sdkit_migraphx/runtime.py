"""Finding ROCm's ``migraphx`` module and the AMD GPUs, lazily and without side effects
beyond ``sys.path``.

MIGraphX is not on PyPI: ROCm installs its Python module under ``<rocm>/lib``
(``/opt/rocm/lib/migraphx.cpython-*.so``), so the probe adds those folders to ``sys.path``
before importing it. Everything that touches ``migraphx`` goes through here.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from types import ModuleType

from sdkit.device import Device
from sdkit.errors import BackendUnavailableError
from sdkit.known_backends import install_command

BACKEND_NAME = "migraphx"
INSTALL_HINT = f"install ROCm with MIGraphX (https://rocm.docs.amd.com), then {install_command('amd')}"
KFD_NODES = "/sys/class/kfd/kfd/topology/nodes"


def rocm_roots() -> list[Path]:
    roots = [Path(os.environ.get("ROCM_PATH", "/opt/rocm")), Path("/opt/rocm")]
    roots += sorted(Path("/opt").glob("rocm-*"), reverse=True)
    return [r for r in dict.fromkeys(roots) if r.is_dir()]


def import_migraphx() -> ModuleType:
    """``import migraphx`` (PYTHONPATH first, then each ROCm root's ``lib``), or
    BackendUnavailableError saying where it looked."""
    for root in rocm_roots():
        lib = str(root / "lib")
        if lib not in sys.path and Path(lib).is_dir():
            sys.path.append(lib)  # ROCm installs the Python module there, not in site-packages
    try:
        module = importlib.import_module("migraphx")
    except ImportError as exc:
        roots = ", ".join(f"{r}/lib" for r in rocm_roots())
        where = f"on PYTHONPATH and in {roots}" if roots else "on PYTHONPATH; no ROCm installation found (/opt/rocm)"
        reason = f"the migraphx Python module is not importable ({exc}); looked {where}"
        raise BackendUnavailableError(BACKEND_NAME, reason, INSTALL_HINT) from None
    except Exception as exc:  # a broken install: missing HIP libraries, ABI mismatch
        raise BackendUnavailableError(BACKEND_NAME, f"migraphx fails to import: {exc}", INSTALL_HINT) from None
    return module


def migraphx_version(module: ModuleType) -> str:
    return str(getattr(module, "__version__", "unknown"))


def amd_gpus(nodes_dir: str = KFD_NODES) -> list[Device]:
    """AMD GPUs from the KFD topology (CPU nodes have simd_count 0); the description is the
    gfx target (``gfx1100``), which also identifies compiled programs in the cache."""
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
            devices.append(Device("rocm", len(devices), name or gfx_name(props.get("gfx_target_version", ""))))
    return devices


def gfx_name(target_version: str) -> str:
    """KFD's ``gfx_target_version`` (``110000``) as LLVM's name (``gfx1100``)."""
    if not target_version.isdigit() or int(target_version) == 0:
        return "gfx?"
    value = int(target_version)
    major, minor, step = value // 10000, (value // 100) % 100, value % 100
    return f"gfx{major}{minor:x}{step:x}"


def first_line(exc: BaseException) -> str:
    """The informative part of a MIGraphX exception (``/path/file.cpp:625: parse_graph: msg``)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = (lines or [type(exc).__name__])[0]
    if ".cpp:" in text:
        text = text.split(": ", 2)[-1] if text.count(": ") >= 2 else text
    return text[:400]
