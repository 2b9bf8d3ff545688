"""Where sdkit-trt keeps files in sdkit's cache, and the cache key of an engine.

Engines live in ``sdkit.cache.ArtifactCache`` under the core key: graph hash, backend and
flavour version, device identity, options and shapes, and no weights hash (plans are
weight-stripped and refit from the user's weights). The device identity is the GPU model
and compute capability, not its ordinal: an engine built on cuda:1 serves an identical
cuda:0. TensorRT-RTX's runtime cache (kernels it JIT-compiles) and TensorRT's timing cache
are per flavour version and GPU, in ``<cache root>/tensorrt/``.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sdkit.cache import cache_root, make_key
from sdkit_trt.driver import Gpu
from sdkit_trt.runtime import BACKEND_NAME, RuntimeInfo
from sdkit_trt.shapes import Profiles


def device_identity(gpu: Gpu) -> str:
    major, minor = gpu.compute_capability
    return f"sm{major}{minor}:{gpu.name}"


def engine_key(
    *,
    graph_hash: str,
    runtime: RuntimeInfo,
    gpu: Gpu,
    precision: str,
    input_shapes: Mapping[str, Sequence[int]] | None,
    profiles: Profiles,
) -> dict[str, Any]:
    """The ArtifactCache key of one engine (see the module docstring for what is in it)."""
    options = {
        "precision": precision,
        "profiles": {k: p.key() for k, p in sorted(profiles.items())},
        "plan": "strip+refit",
    }
    return make_key(
        graph_hash=graph_hash,
        backend=BACKEND_NAME,
        backend_version=f"{runtime.module}-{runtime.version}",
        device=device_identity(gpu),
        options=options,
        input_shapes=input_shapes,
        weights_hash=None,
    )


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-").lower()


def side_cache_path(kind: str, runtime: RuntimeInfo, gpu: Gpu, root: Path | None = None) -> Path:
    """``<root>/tensorrt/<kind>-<flavour>-<version>-<sm>-<gpu>.bin`` (kind: runtime or timing)."""
    base = (root or cache_root()) / BACKEND_NAME
    major, minor = gpu.compute_capability
    return (
        base / f"{kind}-{runtime.module}-{_slug(runtime.version) or 'unknown'}-sm{major}{minor}-{_slug(gpu.name)}.bin"
    )


def read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def write_atomic(path: Path, data: bytes) -> None:
    """Write through a temporary file renamed into place (readers never see half a file)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        Path(tmp).replace(path)
    except OSError:
        pass  # a cache we cannot write only costs time on the next start
