"""Compile options: one validated object; unknown keys are rejected."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sdkit.errors import OptionError, did_you_mean

PRECISIONS = ("fp32", "fp16", "bf16", "q8_0", "fp8")


@dataclass(frozen=True)
class Options:
    """Options common to every backend, plus backend-specific ``extra`` keys.

    ``precision``: ``fp32`` (default, exact), ``fp16``, ``bf16``, ``q8_0`` (ggml: 8-bit
    quantized matrix weights, activations in fp32) or ``fp8`` (TensorRT on compute capability
    8.9+: FP8 E4M3 matrix weights, activations in fp16). A backend refuses those it cannot run.
    ``threads``: CPU threads (None: the backend's default, normally the physical cores).
    ``cache``: use the on-disk compiled-artifact cache.
    ``extra``: keys a backend declares in ``Backend.extra_options``.
    """

    precision: str = "fp32"
    threads: int | None = None
    cache: bool = True
    extra: Mapping[str, Any] = field(default_factory=dict)

    def key(self) -> dict[str, Any]:
        """The options as plain data, for cache keys."""
        return {
            "precision": self.precision,
            "threads": self.threads,
            "extra": {k: repr(v) for k, v in sorted(self.extra.items())},
        }


COMMON_KEYS = ("precision", "threads", "cache")


def make_options(raw: Mapping[str, Any], extra_schema: Mapping[str, type | tuple[type, ...]] | None = None) -> Options:
    """Validate ``raw`` keyword options against the common keys and a backend's extras."""
    schema = dict(extra_schema or {})
    unknown = [k for k in raw if k not in COMMON_KEYS and k not in schema]
    if unknown:
        known = [*COMMON_KEYS, *schema]
        hint = did_you_mean(unknown[0], known)
        raise OptionError(f"unknown option {unknown[0]!r}{hint}; valid options: {', '.join(known)}")
    precision = raw.get("precision", "fp32")
    if precision not in PRECISIONS:
        raise OptionError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    threads = raw.get("threads")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise OptionError(f"threads must be a positive integer, not {threads!r}")
    cache = raw.get("cache", os.environ.get("SDKIT_CACHE", "1").strip().lower() not in {"0", "false", "no", "off"})
    if not isinstance(cache, bool):
        raise OptionError(f"cache must be true or false, not {cache!r}")
    extra: dict[str, Any] = {}
    for name, expected in schema.items():
        if name in raw:
            if not isinstance(raw[name], expected):
                raise OptionError(f"option {name!r} has the wrong type: {type(raw[name]).__name__}")
            extra[name] = raw[name]
    return Options(precision=precision, threads=threads, cache=cache, extra=extra)


def physical_cores() -> int:
    """Physical core count (not SMT threads), the default for CPU thread pools."""
    try:
        cores: set[tuple[str, str]] = set()
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            phys = core = ""
            for line in f:
                if line.startswith("physical id"):
                    phys = line.split(":", 1)[1].strip()
                elif line.startswith("core id"):
                    core = line.split(":", 1)[1].strip()
                elif not line.strip() and core:
                    cores.add((phys, core))
                    phys = core = ""
            if core:
                cores.add((phys, core))
        if cores:
            return len(cores)
    except OSError:
        pass
    return max(1, (os.cpu_count() or 2) // 2 if (os.cpu_count() or 1) > 2 else (os.cpu_count() or 1))
