"""The CPU's name and the instruction-set features the backends' CPU kernels depend on.

Backends pick different kernels by instruction set: OpenVINO (oneDNN) runs bf16 natively only
with AVX-512 (``avx512bw``) or AVX-NE-CONVERT, fp16 with ``avx512_fp16`` or AVX-NE-CONVERT, and
uses AMX tiles where present; the libggml-python CPU build needs AVX2, FMA and F16C. So the same
model can give slightly (or, through a vendor bug, very) different results on an AVX2 machine
and on an AVX-512/AMX one. ``sdkit doctor`` prints these features, and conformance exclusion
files key CPU-dependent groups on them (``sdkit.testing.adapter``).

Flags use Linux's ``/proc/cpuinfo`` names. ``ONEDNN_MAX_CPU_ISA`` (oneDNN's cap, which the
OpenVINO CPU plugin honours) removes the flags above the cap, so an AVX-512 machine run with
``ONEDNN_MAX_CPU_ISA=AVX2`` is keyed as the AVX2 machine its kernels then behave like.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# The features worth showing, with what uses them.
RELEVANT: dict[str, str] = {
    "avx": "every x86 backend",
    "avx2": "ggml's CPU build; OpenVINO's AVX2 kernels",
    "fma": "ggml's CPU build",
    "f16c": "ggml's CPU build (fp16 conversion)",
    "avx512f": "OpenVINO's AVX-512 kernels",
    "avx512bw": "OpenVINO: native bf16",
    "avx512_bf16": "OpenVINO: bf16 dot products",
    "avx512_fp16": "OpenVINO: native fp16",
    "avx_ne_convert": "OpenVINO: native bf16/fp16 on AVX2 CPUs",
    "amx_bf16": "OpenVINO: AMX bf16 matmuls",
    "amx_fp16": "OpenVINO: AMX fp16 matmuls",
}

# oneDNN's ISA levels, lowest first, with the flags each one adds (ONEDNN_MAX_CPU_ISA values).
_ONEDNN_LEVELS: tuple[tuple[tuple[str, ...], frozenset[str]], ...] = (
    (("SSE41",), frozenset()),
    (("AVX",), frozenset({"avx"})),
    (("AVX2",), frozenset({"avx2", "fma", "f16c"})),
    (("AVX2_VNNI",), frozenset({"avx_vnni"})),
    (("AVX2_VNNI_2",), frozenset({"avx_ne_convert", "avx_vnni_int8"})),
    (("AVX512_CORE",), frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"})),
    (("AVX512_CORE_VNNI",), frozenset({"avx512_vnni"})),
    (("AVX512_CORE_BF16",), frozenset({"avx512_bf16"})),
    (("AVX512_CORE_FP16", "AVX10_1_512"), frozenset({"avx512_fp16"})),
    (("AVX512_CORE_AMX", "AVX10_1_512_AMX"), frozenset({"amx_tile", "amx_bf16", "amx_int8"})),
    (("AVX512_CORE_AMX_FP16", "AVX10_1_512_AMX_FP16"), frozenset({"amx_fp16"})),
)
_CAPPABLE = frozenset().union(*(flags for _, flags in _ONEDNN_LEVELS))


@dataclass(frozen=True)
class CpuInfo:
    """What the OS says about the CPU. ``flags`` is empty when it could not be read."""

    name: str
    machine: str
    flags: frozenset[str]
    source: str  # where the flags came from, e.g. "/proc/cpuinfo"
    checked: frozenset[str] | None = None  # the flags the source can tell (None: all of them)
    isa_cap: str = ""  # ONEDNN_MAX_CPU_ISA, when it removed flags

    def has(self, flag: str) -> bool:
        return flag.lower() in self.flags

    def describe(self) -> str:
        """``AMD EPYC (x86_64): avx avx2 fma f16c; lacks avx512f ...``: the relevant features."""
        head = f"{self.name} ({self.machine})"
        if self.checked is not None and not self.checked:
            return f"{head}: instruction-set features unknown ({self.source})"
        have = [f for f in RELEVANT if f in self.flags]
        lacks = [f for f in RELEVANT if f not in self.flags and (self.checked is None or f in self.checked)]
        text = f"{head}: {' '.join(have) or 'no AVX'}"
        if lacks:
            text += f"; lacks {' '.join(lacks)}"
        if self.isa_cap:
            text += f" (capped by ONEDNN_MAX_CPU_ISA={self.isa_cap})"
        return text


def _read_linux() -> tuple[str, frozenset[str]]:
    name, flags = "", ""
    for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "hardware", "cpu model") and not name:
            name = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = value
        if name and flags:
            break
    return name, frozenset(flags.lower().split())


def _sysctl(name: str) -> str:
    try:
        done = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def _read_macos() -> tuple[str, frozenset[str]]:
    # Intel Macs list CPUID features in upper case (AVX1.0, AVX2, FMA, F16C, AVX512BW): lower
    # case, they are Linux's names but for AVX1.0.
    text = f"{_sysctl('machdep.cpu.features')} {_sysctl('machdep.cpu.leaf7_features')}".lower()
    flags = {"avx" if f == "avx1.0" else f for f in text.split()}
    if _sysctl("hw.optional.arm.FEAT_BF16") == "1":
        flags.add("bf16")
    return _sysctl("machdep.cpu.brand_string"), frozenset(flags)


# Windows' IsProcessorFeaturePresent knows only these (Windows 10 and later).
_WINDOWS_FEATURES = {39: "avx", 40: "avx2", 41: "avx512f"}


def _read_windows() -> tuple[str, frozenset[str]]:
    kernel32 = ctypes.windll.kernel32  # type: ignore[attr-defined]
    present = {flag for code, flag in _WINDOWS_FEATURES.items() if kernel32.IsProcessorFeaturePresent(code)}
    return platform.processor(), frozenset(present)


def _read() -> tuple[str, frozenset[str], str, frozenset[str] | None]:
    """(name, flags, source, the flags the source can tell: None for all)."""
    system: str = sys.platform  # a plain str: mypy would otherwise drop the other OSes' branches
    if system.startswith("linux"):
        return (*_read_linux(), "/proc/cpuinfo", None)
    if system == "darwin":
        return (*_read_macos(), "sysctl", None)
    if system == "win32":
        return (*_read_windows(), "IsProcessorFeaturePresent", frozenset(_WINDOWS_FEATURES.values()))
    return platform.processor(), frozenset(), f"no reader for {system}", frozenset()


def _onednn_cap(flags: frozenset[str], cap: str) -> frozenset[str]:
    """``flags`` without those above oneDNN ISA level ``cap`` (unknown caps change nothing)."""
    allowed: set[str] = set()
    for names, level_flags in _ONEDNN_LEVELS:
        allowed |= level_flags
        if cap in names:
            return frozenset(f for f in flags if f in allowed or f not in _CAPPABLE)
    return flags


@functools.cache
def cpu_info() -> CpuInfo:
    """This machine's CPU (read once per process; never raises)."""
    try:
        name, flags, source, checked = _read()
    except (OSError, AttributeError, ValueError) as exc:
        name, flags, source, checked = platform.processor(), frozenset(), f"unreadable: {exc}", frozenset()
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    capped = _onednn_cap(flags, cap) if cap else flags
    return CpuInfo(
        name=name or platform.processor() or "unknown CPU",
        machine=platform.machine() or "unknown",
        flags=capped,
        source=source,
        checked=checked,
        isa_cap=cap if capped != flags else "",
    )
