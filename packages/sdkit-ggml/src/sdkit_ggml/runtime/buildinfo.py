"""What the loaded ggml CPU backend was built with: ISA flags, OpenMP, llamafile sgemm, repack.

ggml's backend registry publishes this itself: each backend's ``ggml_backend_reg_t`` answers
``ggml_backend_reg_get_proc_address(reg, "ggml_backend_get_features")`` with a
NULL-terminated array of ``{name, value}`` pairs (``AVX2=1``, ``OPENMP=1``, ``LLAMAFILE=1``,
``REPACK=1``...). These are the features compiled into the variant that is loaded, not what
the CPU could do: comparing the two says whether a native build could gain anything.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from sdkit_ggml.runtime.devices import list_devices
from sdkit_ggml.runtime.lib import GgmlLib


class BackendFeature(ctypes.Structure):
    """struct ggml_backend_feature."""

    _fields_ = (("name", ctypes.c_char_p), ("value", ctypes.c_char_p))


GET_FEATURES = ctypes.CFUNCTYPE(ctypes.POINTER(BackendFeature), ctypes.c_void_p)


def backend_features(lib: GgmlLib, device_name: str = "CPU") -> dict[str, str]:
    """The compiled-in features of one ggml device's backend (``{}`` when it publishes none)."""
    for entry in list_devices(lib):
        if entry.name != device_name:
            continue
        reg = lib.ggml_backend_dev_backend_reg(entry.handle)
        address = lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_get_features") if reg else None
        if not address:
            return {}
        features = GET_FEATURES(address)(reg)
        found: dict[str, str] = {}
        i = 0
        while features and features[i].name:
            found[features[i].name.decode()] = (features[i].value or b"").decode()
            i += 1
        return found
    return {}


def cpu_flags() -> set[str]:
    """The flags this CPU reports (Linux /proc/cpuinfo; empty elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return set()


# ggml feature name -> /proc/cpuinfo flag, for the x86 features a build may leave out.
_X86 = {
    "SSE3": "pni",
    "SSSE3": "ssse3",
    "AVX": "avx",
    "AVX2": "avx2",
    "F16C": "f16c",
    "FMA": "fma",
    "BMI2": "bmi2",
    "AVX_VNNI": "avx_vnni",
    "AVX512": "avx512f",
    "AVX512_VBMI": "avx512_vbmi",
    "AVX512_VNNI": "avx512_vnni",
    "AVX512_BF16": "avx512_bf16",
    "AMX_INT8": "amx_int8",
}


def missing_isa(features: dict[str, str], flags: set[str]) -> list[str]:
    """ISA extensions this CPU has that the loaded ggml build does not use."""
    return [name for name, flag in _X86.items() if flag in flags and features.get(name) != "1"]


def build_note(lib: GgmlLib) -> str:
    """What ``sdkit backends`` / ``doctor`` add after the library folder: which kind of build is
    loaded and, for the portable one, the command that makes a faster one for this CPU."""
    from sdkit_ggml.runtime.native import REBUILD, gpu_backends_of, native_dir

    features = backend_features(lib)
    kernels = ", ".join(name for name in ("LLAMAFILE", "OPENMP") if features.get(name) == "1") or "no llamafile sgemm"
    if native_dir() == lib.directory:
        gpus = "".join(f", {name.upper()}" for name in gpu_backends_of(lib.directory))
        return f" (built for this machine: {kernels}{gpus})"
    if features and features.get("LLAMAFILE") != "1" and "SDKIT_GGML_LIB_DIR" not in os.environ:
        return f" ({kernels}: `{REBUILD}` builds ~1.7x faster CPU kernels for this machine)"
    return f" ({kernels})" if features else ""
