"""Committed diffusers goldens and the checks every pipeline test makes against them.

A golden set is a fixture folder's ``golden.json`` (``cases``: one dict per case, keyed by
``key``; optional ``array_refs``: an alias -> stored-array name, where cases share an input) and
``golden.npz`` (the arrays: ``<case>/image`` on [0, 1] NHWC, ``<case>/step_latents``, inputs),
written by the folder's fixture script with diffusers. The tests compare sdkit's output with them
on every installed backend; a backend that is not installed or not usable is skipped, by name.
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


class GoldenSet:
    """The goldens of one fixture folder (``root/golden.json`` and ``root/golden.npz``)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def missing(self) -> bool:
        """For ``pytest.mark.skipif``: the folder has no goldens (not generated here)."""
        return not (self.root / "golden.json").is_file()

    @cached_property
    def meta(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.root / "golden.json").read_text(encoding="utf-8"))
        return data

    @cached_property
    def arrays(self) -> dict[str, np.ndarray]:
        with np.load(self.root / "golden.npz") as data:
            return {k: data[k] for k in data.files}

    def array(self, key: str) -> np.ndarray:
        """A stored array, by its name or its ``array_refs`` alias."""
        return self.arrays[self.meta.get("array_refs", {}).get(key, key)]

    def case(self, key: str) -> dict[str, Any]:
        found: dict[str, Any] = next(c for c in self.meta["cases"] if c["key"] == key)
        return found

    def check(
        self,
        key: str,
        image: np.ndarray,
        steps: StepRecorder,
        tolerance: float,
        step_tolerance: float,
        label: str = "",
        convert: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
    ) -> float:
        """``image`` within ``tolerance`` (max |diff|) of the case's golden image, and the latents
        after each step (``steps``, the generate call's callback) within ``step_tolerance`` of its
        ``step_latents``, numbered as one run; rows with NaN (a separator, such as SDXL's between
        base and refiner) are dropped. ``convert(ours, theirs)`` brings ours to the golden's
        layout. Returns the image's max |diff|."""
        expected = self.array(f"{key}/image")
        assert image.shape == expected.shape, f"{key}: shape {image.shape}, golden {expected.shape}"
        diff = float(np.abs(image - expected).max())
        print(f"{key}{f' on {label}' if label else ''}: max |diff| {diff:.3g}")
        assert diff <= tolerance, f"{key}: max |diff| {diff:.3g} > {tolerance:g}"
        want = self.array(f"{key}/step_latents")
        want = want[~np.isnan(want).reshape(len(want), -1).any(axis=1)]
        assert steps.counts == [(i, len(want)) for i in range(len(want))], f"{key}: steps {steps.counts}"
        for index, (ours, theirs) in enumerate(zip(steps.latents, want, strict=True)):
            mine = convert(ours, theirs) if convert else ours
            assert float(np.abs(mine - theirs).max()) <= step_tolerance, f"{key} step {index}"
        return diff


class StepRecorder:
    """A ``generate`` callback that keeps ``(step, steps)`` and a copy of the latents of each call."""

    def __init__(self) -> None:
        self.counts: list[tuple[int, int]] = []
        self.latents: list[np.ndarray] = []

    def __call__(self, step: int, steps: int, latents: np.ndarray) -> None:
        self.counts.append((step, steps))
        self.latents.append(latents.copy())
