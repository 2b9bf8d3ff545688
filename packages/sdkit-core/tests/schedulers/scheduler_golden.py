"""Access to fixtures/schedulers/golden.npz (recorded from diffusers by make_golden.py)."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[4]
GOLDEN = REPO / "fixtures" / "schedulers" / "golden.npz"

# The tolerance of every comparison with diffusers: |ours - diffusers| <= TOL * max(1, |diffusers|),
# i.e. 1e-6 absolute for values up to 1 and 1e-6 relative above (latents reach ~50 at sigma_max).
TOL = 1e-6


@lru_cache(maxsize=1)
def load() -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    with np.load(GOLDEN) as data:
        arrays = {k: data[k] for k in data.files}
    meta = json.loads(arrays.pop("meta").tobytes().decode())
    return meta, arrays


def cases() -> list[dict[str, Any]]:
    if not GOLDEN.is_file():
        return []
    return list(load()[0]["cases"])


def case(key: str) -> dict[str, np.ndarray]:
    _, arrays = load()
    prefix = key + "/"
    return {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}


def max_scaled_error(ours: Any, reference: Any) -> float:
    """max |ours - reference| / max(1, |reference|)."""
    a = np.asarray(ours, dtype=np.float64)
    b = np.asarray(reference, dtype=np.float64)
    assert a.shape == b.shape, f"shape {a.shape} != {b.shape}"
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(a - b) / np.maximum(1.0, np.abs(b))))
