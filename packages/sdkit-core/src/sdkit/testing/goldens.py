"""Committed diffusers goldens and the checks the pipeline tests make against them.

A golden set is a fixture folder's ``golden.json`` (``cases``, one dict per ``key``; optional
``array_refs``, alias -> stored name, where cases share an array) and ``golden.npz`` (images on
[0, 1] NHWC as ``<case>/image``, ``<case>/step_latents``, inputs), written with diffusers by the
folder's fixture script.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pytest


def require_backend(name: str) -> None:
    """Skip the calling test unless backend ``name`` is installed and usable here."""
    import sdkit

    info = next((b for b in sdkit.backends() if b.name == name), None)
    if info is None or not info.available:
        pytest.skip(f"backend {name} unavailable: {info.reason if info else 'not installed'}")


class StepRecorder:
    """A ``generate`` callback that keeps ``(step, steps)`` and a copy of the latents of each call."""

    def __init__(self) -> None:
        self.counts: list[tuple[int, int]] = []
        self.latents: list[np.ndarray] = []

    def __call__(self, step: int, steps: int, latents: np.ndarray) -> None:
        self.counts.append((step, steps))
        self.latents.append(latents.copy())


class GoldenSet:
    """The goldens of one fixture folder (``root/golden.json``, ``root/golden.npz``)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._npz: dict[str, dict[str, np.ndarray]] = {}

    @property
    def missing(self) -> bool:
        """For ``pytest.mark.skipif``: the folder's goldens are not there."""
        return not (self.root / "golden.json").is_file()

    @cached_property
    def meta(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.root / "golden.json").read_text(encoding="utf-8"))
        return data

    def npz(self, name: str = "golden.npz") -> dict[str, np.ndarray]:
        """Every array of ``root/name``, read once."""
        if name not in self._npz:
            with np.load(self.root / name) as data:
                self._npz[name] = {k: data[k] for k in data.files}
        return self._npz[name]

    def array(self, key: str) -> np.ndarray:
        """An array of ``golden.npz``, by its name or its ``array_refs`` alias."""
        return self.npz()[self.meta.get("array_refs", {}).get(key, key)]

    def case(self, key: str) -> dict[str, Any]:
        found: dict[str, Any] = next(c for c in self.meta["cases"] if c["key"] == key)
        return found

    def check(
        self,
        key: str,
        image: np.ndarray,
        steps: StepRecorder,
        tolerances: tuple[float, float],
        label: str = "",
        convert: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
    ) -> None:
        """``image`` and the latents after each step (numbered as one run) within ``tolerances``
        (image, latents; max |diff|) of the case's ``image`` and ``step_latents``. Rows with NaN
        (SDXL's separator between base and refiner) are dropped; ``convert(ours, golden)`` brings
        ours to the golden's layout."""
        expected = self.array(f"{key}/image")
        assert image.shape == expected.shape, f"{key}: shape {image.shape}, golden {expected.shape}"
        diff = float(np.abs(image - expected).max())
        print(f"{key}{f' on {label}' if label else ''}: max |diff| {diff:.3g}")
        assert diff <= tolerances[0], f"{key}: max |diff| {diff:.3g}"
        want = self.array(f"{key}/step_latents")
        want = want[~np.isnan(want).reshape(len(want), -1).any(axis=1)]
        assert steps.counts == [(i, len(want)) for i in range(len(want))], f"{key}: steps {steps.counts}"
        for index, (ours, theirs) in enumerate(zip(steps.latents, want, strict=True)):
            mine = convert(ours, theirs) if convert else ours
            assert float(np.abs(mine - theirs).max()) <= tolerances[1], f"{key} step {index}"
