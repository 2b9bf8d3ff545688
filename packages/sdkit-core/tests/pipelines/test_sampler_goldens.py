"""The tiny SD pipeline with DPM2, DPM2 a and LMS against diffusers' PyTorch pipelines running
KDPM2DiscreteScheduler, KDPM2AncestralDiscreteScheduler and LMSDiscreteScheduler with the same
weights and noise (fixtures/tiny_pipeline/make_sampler_goldens.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

TOLERANCE = 1e-3  # max |diff| on [0, 1] pixels, as the other tiny-pipeline goldens
GOLDEN = Path(__file__).resolve().parents[4] / "fixtures" / "tiny_pipeline" / "sampler_golden.npz"


FAST = ("dpm_2_a", "txt2img")  # in every CI run (~10 s on 2 cores); the other cases are marked slow


def _cases() -> list[dict[str, Any]]:
    meta = GOLDEN.with_suffix(".json")
    return list(json.loads(meta.read_text(encoding="utf-8"))["cases"]) if meta.is_file() else []


def _params() -> list[Any]:
    return [
        pytest.param(
            c, id=f"{c['sampler']}-{c['mode']}", marks=() if (c["sampler"], c["mode"]) == FAST else pytest.mark.slow
        )
        for c in _cases()
    ]


@pytest.mark.parametrize("case", _params())
def test_sampler_reproduces_diffusers(
    case: dict[str, Any], reference_pipe: Any, golden: dict[str, np.ndarray], case_kwargs: Any
) -> None:
    with np.load(GOLDEN) as data:
        expected = data[f"{case['key']}_image"]
    image = reference_pipe.generate(case["prompt"], **case_kwargs(case, golden))
    assert image.shape == expected.shape
    assert np.abs(image - expected).max() <= TOLERANCE  # measured 1.4e-6 .. 3.9e-6 (the five cases)


def test_sampler_goldens_differ_from_each_other() -> None:
    """The 1e-3 bar means something only if the images differ by much more."""
    with np.load(GOLDEN) as data:
        images = [data[f"{c['key']}_image"] for c in _cases() if c["mode"] == "txt2img"]
    assert len(images) == 3
    for i in range(len(images)):
        for j in range(i + 1, len(images)):
            assert np.abs(images[i] - images[j]).max() > 1e-2
