"""What a benchmark ran on: CPU model and SIMD flags, load average, library versions, and the
features compiled into the loaded ggml CPU backend."""

from __future__ import annotations

import importlib.metadata
import os
import platform
from pathlib import Path
from typing import Any

SIMD = ("sse4_2", "avx", "avx2", "fma", "f16c", "bmi2", "avx_vnni", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")
PACKAGES = ("sdkit-core", "sdkit-ggml", "sdkit-openvino", "libggml-python", "openvino", "onnxruntime", "numpy",
            "stable-diffusion-cpp-python")  # fmt: skip


def cpuinfo() -> tuple[str, list[str]]:
    model, flags = platform.processor() or "?", []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if (line.startswith("model name") and model in ("?", "")) or line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = line.split(":", 1)[1].split()
    except OSError:
        pass
    return model, [f for f in SIMD if f in flags]


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def versions() -> dict[str, str]:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def ggml_features() -> dict[str, str]:
    try:
        from sdkit_ggml.runtime.buildinfo import backend_features
        from sdkit_ggml.runtime.lib import load_library

        lib = load_library()
        return {"library_dir": str(lib.directory), "version": lib.version, **backend_features(lib)}
    except Exception as exc:  # a benchmark without ggml still runs
        return {"error": str(exc)[:200]}


def describe() -> dict[str, Any]:
    model, flags = cpuinfo()
    return {
        "cpu": model,
        "cpu_flags": flags,
        "cpus": os.cpu_count(),
        "load_before": load_average(),
        "python": platform.python_version(),
        "versions": versions(),
        "ggml_cpu_build": ggml_features(),
        "env": {k: v for k, v in os.environ.items() if k.startswith(("SDKIT_GGML", "OMP_", "OV_"))},
    }


def headline(info: dict[str, Any]) -> str:
    return f"{info['cpu']} ({info['cpus']} cpus; {', '.join(info['cpu_flags'])}), load average {info['load_before']}"
