"""The recorded reference runs the scheduler tests replay (``fixtures/schedulers/*.npz``, written by
``make_golden.py`` and ``make_golden_multistep.py``): each file read once per process, one case's
arrays, the comparison every replay uses and the recorded noise handed back in order."""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

FIXTURES = Path(__file__).resolve().parents[4] / "fixtures" / "schedulers"


class GoldenFile:
    """One ``.npz`` of recorded runs: ``meta`` (its JSON ``meta`` entry) and the other ``arrays``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __str__(self) -> str:
        return str(self.path)

    def is_file(self) -> bool:
        return self.path.is_file()

    @cached_property
    def _loaded(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        with np.load(self.path) as data:
            arrays = {k: data[k] for k in data.files}
        return json.loads(arrays.pop("meta").tobytes().decode()), arrays

    @property
    def meta(self) -> dict[str, Any]:
        return self._loaded[0]

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        return self._loaded[1]

    def cases(self, name: str) -> list[dict[str, Any]]:
        """The meta list ``name`` (empty where the file or the list is missing)."""
        return list(self.meta.get(name, [])) if self.is_file() else []

    def case(self, key: str) -> dict[str, np.ndarray]:
        """The arrays of case ``key`` (``key/name``), by ``name``."""
        prefix = key + "/"
        return {k[len(prefix) :]: v for k, v in self.arrays.items() if k.startswith(prefix)}


GOLDEN = GoldenFile(FIXTURES / "golden.npz")
GOLDEN_MULTISTEP = GoldenFile(FIXTURES / "golden_multistep.npz")


def max_scaled_error(ours: Any, reference: Any) -> float:
    """max |ours - reference| / max(1, |reference|): absolute for values up to 1, relative above."""
    a, b = np.asarray(ours, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    assert a.shape == b.shape, f"shape {a.shape} != {b.shape}"
    return float(np.max(np.abs(a - b) / np.maximum(1.0, np.abs(b)))) if a.size else 0.0


class Replay:
    """A NoiseFn that hands out the recorded draws in order."""

    def __init__(self, draws: np.ndarray) -> None:
        self.draws, self.used = draws, 0

    def __call__(self, shape: tuple[int, ...]) -> np.ndarray:
        assert self.used < len(self.draws), "drew more noise than the reference"
        value = self.draws[self.used]
        assert value.shape == shape
        self.used += 1
        return value
