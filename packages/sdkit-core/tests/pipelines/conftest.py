"""Shared fixtures: the tiny pipeline committed at ``<repo root>/fixtures/tiny_pipeline`` (made by
its ``make_tiny_pipeline.py`` with diffusers) and its golden images."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

TINY = Path(__file__).resolve().parents[4] / "fixtures" / "tiny_pipeline"


@pytest.fixture(scope="session")
def tiny_dir() -> Path:
    if not (TINY / "model" / "model_index.json").is_file():
        pytest.skip(f"the tiny pipeline fixture is missing ({TINY})")
    return TINY / "model"


@pytest.fixture(scope="session")
def golden(tiny_dir: Path) -> dict[str, np.ndarray]:
    with np.load(tiny_dir.parent / "golden.npz", allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


@pytest.fixture(scope="session")
def meta(tiny_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((tiny_dir.parent / "golden.json").read_text(encoding="utf-8"))
    return data


@pytest.fixture(scope="session")
def reference_pipe(tiny_dir: Path) -> Any:
    import sdkit

    pipe = sdkit.load_pipeline(tiny_dir, backend="reference")
    yield pipe
    pipe.close()


@pytest.fixture(scope="session")
def case_kwargs() -> Callable[[dict[str, Any], dict[str, np.ndarray]], dict[str, Any]]:
    return golden_case_kwargs


def golden_case_kwargs(case: dict[str, Any], golden: dict[str, np.ndarray]) -> dict[str, Any]:
    """``generate`` arguments that reproduce one golden case."""
    kwargs: dict[str, Any] = {
        "negative_prompt": case["negative_prompt"],
        "seed": case["seed"],
        "steps": case["steps"],
        "guidance_scale": case["guidance_scale"],
        "sampler": case["sampler"],
        "schedule": case["schedule"],
        "width": case["width"],
        "height": case["height"],
        "output_type": "np",
    }
    if case["mode"] == "img2img":
        kwargs.update(init_image=golden["init_image"], strength=case["strength"])
    return kwargs
