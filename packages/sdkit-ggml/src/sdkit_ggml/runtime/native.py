"""The ggml build made for this machine (``python -m sdkit_ggml.runtime.native_build``), found
and used without any setting.

The prebuilt libggml-python wheel is one portable CPU build without llamafile's sgemm; a build
for the machine runs the SD 1.5 VAE decoder about 1.7x faster on an AVX2 EPYC (benchmarks/
README.md). ``native_build`` puts its libraries in ``<sdkit cache>/ggml-native/<libggml-python
version>/`` with a record of what it was built for; the loader takes that folder when the
record matches the installed libggml-python and this CPU, and the wheel otherwise. A build made
with ``-march=native`` on one CPU can die of an illegal instruction on another (a cache folder
shared between machines, a VM moved to older hardware), so a record whose instruction-set flags
this CPU lacks is ignored with a warning naming them. ``SDKIT_GGML_NATIVE=0`` ignores the build;
``SDKIT_GGML_LIB_DIR`` (any build) takes precedence over both.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import warnings
from pathlib import Path
from typing import Any

from sdkit.cache import cache_root
from sdkit.cpu_features import cpu_info

PACKAGE = "libggml-python"
RECORD = "sdkit-native-build.json"
OPT_OUT = "SDKIT_GGML_NATIVE"
REBUILD = "python -m sdkit_ggml.runtime.native_build"

# /proc/cpuinfo flags that name instruction sets a compiler may emit under -march=native
# (the other flags, e.g. constant_tsc or hypervisor, change across VMs without mattering).
_ISA_PREFIXES = ("sse", "ssse", "avx", "fma", "f16c", "bmi", "amx", "popcnt", "lzcnt", "abm", "movbe", "adx",
                 "sha", "aes", "vaes", "vpclmulqdq", "pclmulqdq", "gfni", "xop", "cx16", "rdrand", "rdseed",
                 "asimd", "sve", "fp16", "dotprod", "i8mm", "bf16")  # fmt: skip


_warned: set[tuple[Path, str]] = set()


def installed_version() -> str | None:
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None


def default_dest(version: str) -> Path:
    return cache_root() / "ggml-native" / version


def isa_flags(flags: frozenset[str] | set[str]) -> set[str]:
    return {flag for flag in flags if flag.startswith(_ISA_PREFIXES)}


def write_record(dest: Path, version: str, cmake_flags: list[str], gpu_backends: list[str] | None = None) -> None:
    """Say what the build in ``dest`` was made for (read back by :func:`native_dir`) and which
    GPU backends it has (``cuda``, ``vulkan``: informative, ggml registers their devices)."""
    info = cpu_info()
    record = {
        "libggml_python": version,
        "cpu": info.name,
        "machine": info.machine,
        "isa_flags": sorted(isa_flags(info.flags)),
        "cmake": cmake_flags,
        "gpu_backends": list(gpu_backends or []),
    }
    (dest / RECORD).write_text(json.dumps(record, indent=1) + "\n")


def gpu_backends_of(dest: Path) -> list[str]:
    """The GPU backends the record in ``dest`` says the build has (``[]`` when none or unreadable)."""
    try:
        record = json.loads((dest / RECORD).read_text())
    except (OSError, ValueError):
        return []
    found = record.get("gpu_backends", []) if isinstance(record, dict) else []
    return [str(name) for name in found] if isinstance(found, list) else []


def mismatch(record: dict[str, Any], version: str) -> str:
    """Why this machine must not load the build ``record`` describes ("" when it may)."""
    if record.get("libggml_python") != version:
        return f"it was built from libggml-python {record.get('libggml_python')}, {version} is installed"
    info = cpu_info()
    if record.get("machine") != info.machine:
        return f"it was built for {record.get('machine')}, this machine is {info.machine}"
    if info.checked is not None and not info.checked:
        return "this CPU's instruction-set features cannot be read"
    missing = sorted(set(record.get("isa_flags", [])) - info.flags)
    if missing:
        return f"this CPU lacks {' '.join(missing)} (it was built on: {record.get('cpu')})"
    return ""


def native_dir() -> Path | None:
    """The machine build to load, or None (none made, opted out, or made for something else)."""
    if os.environ.get(OPT_OUT, "1").strip() == "0":
        return None
    version = installed_version()
    if version is None:
        return None
    dest = default_dest(version)
    path = dest / RECORD
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        problem = mismatch(record, version) if isinstance(record, dict) else "its record is not a JSON object"
    except (OSError, ValueError) as exc:
        problem = f"its record cannot be read ({exc})"
    if problem:
        if (dest, problem) not in _warned:  # once per process, not at every probe
            _warned.add((dest, problem))
            warnings.warn(f"sdkit-ggml ignores the ggml build in {dest}: {problem}; run `{REBUILD}` again",
                          RuntimeWarning, stacklevel=2)  # fmt: skip
        return None
    return dest


# A prebuilt ggml shipped as a Python package (tools/ggml_vulkan_wheel.py makes the
# sdkit-ggml-vulkan wheel): its libraries in <package>/lib with the same record as a machine build.
PREBUILT_PACKAGES = ("sdkit_ggml_vulkan",)


def prebuilt_dir() -> Path | None:
    """The libraries of an installed prebuilt ggml package whose record matches the installed
    libggml-python (the bindings check the ggml version too), or None. Located, not imported."""
    version = installed_version()
    if version is None or os.environ.get(OPT_OUT, "1").strip() == "0":
        return None
    for name in PREBUILT_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            continue
        folder = Path(next(iter(spec.submodule_search_locations))) / "lib"
        try:
            record = json.loads((folder / RECORD).read_text())
        except (OSError, ValueError):
            continue
        built = record.get("libggml_python") if isinstance(record, dict) else None
        if built == version:
            return folder
        if (folder, version) not in _warned:
            _warned.add((folder, version))
            warnings.warn(f"sdkit-ggml ignores the ggml build of {name} ({folder}): it was built for libggml-python "
                          f"{built}, {version} is installed", RuntimeWarning, stacklevel=2)  # fmt: skip
    return None
