"""sdkit's images against diffusers' PyTorch pipelines with the same weights, scheduler and noise
(golden arrays written by fixtures/tiny_pipeline/make_tiny_pipeline.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sdkit.pipelines.imaging.images import float_to_pil
from sdkit.schedulers import scheduler_names

TOLERANCE = 1e-3  # max |diff| on [0, 1] pixels
CASE_IDS = [
    "euler-txt2img",
    "euler_a-txt2img",
    "dpmpp_2m_karras-txt2img",
    "ddim-txt2img",
    "euler-img2img",
    "euler_a-img2img",
    "dpmpp_2m_karras-img2img",
    "ddim-img2img",
    "euler-v_prediction-txt2img",
]


@pytest.fixture(scope="module")
def v_prediction_pipe(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The tiny pipeline with scheduler_config.json saying v_prediction (as SD 2.x-768 ships)."""
    import sdkit

    copy = tmp_path_factory.mktemp("v_prediction") / "model"
    shutil.copytree(tiny_dir, copy)
    config_file = copy / "scheduler" / "scheduler_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    config["prediction_type"] = "v_prediction"
    config_file.write_text(json.dumps(config), encoding="utf-8")
    return sdkit.load_pipeline(copy, backend="reference")


@pytest.mark.parametrize("index", range(len(CASE_IDS)), ids=CASE_IDS)
def test_seed_reproduces_diffusers(
    request: pytest.FixtureRequest,
    index: int,
    reference_pipe: Any,
    golden: dict[str, np.ndarray],
    meta: dict[str, Any],
    case_kwargs: Any,
) -> None:
    case = meta["cases"][index]
    if case["sampler"] not in scheduler_names():
        pytest.skip(f"sampler {case['sampler']} is not in sdkit.schedulers yet")
    overrides = case.get("scheduler_overrides") or {}
    assert overrides in ({}, {"prediction_type": "v_prediction"})
    pipe = request.getfixturevalue("v_prediction_pipe") if overrides else reference_pipe
    image = pipe.generate(case["prompt"], **case_kwargs(case, golden))
    expected = golden[f"{case['key']}_image"]
    assert image.shape == expected.shape == (1, case["height"], case["width"], 3)
    assert image.dtype == np.float32
    assert np.abs(image - expected).max() <= TOLERANCE


def test_explicit_latents_reproduce_diffusers(
    reference_pipe: Any, golden: dict[str, np.ndarray], meta: dict[str, Any], case_kwargs: Any
) -> None:
    """The initial latents handed to diffusers, given explicitly. euler_a: the per-step noise after
    them must still be the seed's (the stream advances past the replaced draw)."""
    case = meta["cases"][1]
    assert case["sampler"] == "euler_a"
    kwargs = case_kwargs(case, golden)
    image = reference_pipe.generate(case["prompt"], **kwargs, latents=golden[f"{case['key']}_latents"])
    assert np.abs(image - golden[f"{case['key']}_image"]).max() <= TOLERANCE


def test_goldens_tell_cases_apart(golden: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    """The 1e-3 bar means something only if the cases differ from each other by much more."""
    images = [golden[f"{c['key']}_image"] for c in meta["cases"]]
    for i, a in enumerate(images):
        assert a.std() > 0.05
        for b in images[i + 1 :]:
            assert np.abs(a - b).max() > 20 * TOLERANCE


def test_pil_conversion_rounds_like_diffusers(golden: dict[str, np.ndarray]) -> None:
    """PIL images are ``round(x * 255)`` of the float output, as diffusers' numpy_to_pil."""
    floats = golden["case0_image"]
    [image] = float_to_pil(floats)
    assert image.mode == "RGB"
    assert image.size == (floats.shape[2], floats.shape[1])
    np.testing.assert_array_equal(np.asarray(image), np.round(floats[0] * 255).astype(np.uint8))
