"""The tiny pipeline with UniPC bh2, TCD, UniPC bh1, DEIS and DDPM against diffusers'
StableDiffusion(Img2Img)Pipeline with UniPCMultistepScheduler(solver_type="bh2" / "bh1",
solver_order=3), TCDScheduler (eta 0.3), DEISMultistepScheduler and DDPMScheduler: same weights, seed
stream and steps (goldens by fixtures/tiny_pipeline/make_multistep_goldens.py). For bh1 and DEIS the
golden's last step (to sigma 0, where diffusers' bh1 gives NaN and its DEIS stops at sigma_min) is
diffusers' own clean estimate of that model output; for DDPM diffusers gets the "normal" schedule's
timesteps as custom timesteps and sdkit's start sample in its coordinates (the script's docstring).
Measured: bh1 1.5e-6, DEIS 2.3e-6, DDPM 2.6e-6 (max |diff| on [0, 1] pixels)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

TOLERANCE = 1e-3  # max |diff| on [0, 1] pixels, as test_golden.py


@pytest.fixture(scope="module")
def multistep(tiny_dir: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    folder = tiny_dir.parent
    if not (folder / "golden_multistep.npz").is_file():
        pytest.skip("golden_multistep.npz is missing")
    with np.load(folder / "golden_multistep.npz") as data:
        arrays = {k: data[k] for k in data.files}
    return json.loads((folder / "golden_multistep.json").read_text(encoding="utf-8")), arrays


# The img2img case (3 UNet steps) and DDPM run in CI; the other txt2img ones (~15 s each on a loaded
# 2-core box) are slow.
CASES = [
    pytest.param(0, id="uni_pc_bh2-txt2img", marks=pytest.mark.slow),
    pytest.param(1, id="uni_pc_bh2_karras-img2img"),
    pytest.param(2, id="tcd-txt2img", marks=pytest.mark.slow),
    pytest.param(3, id="uni_pc_bh1-txt2img", marks=pytest.mark.slow),
    pytest.param(4, id="deis-txt2img", marks=pytest.mark.slow),
    pytest.param(5, id="ddpm-txt2img"),  # in CI: the construction furthest from diffusers' defaults
]


@pytest.mark.parametrize("index", CASES)
def test_multistep_samplers_reproduce_diffusers(
    index: int, reference_pipe: Any, multistep: tuple[dict[str, Any], dict[str, np.ndarray]], case_kwargs: Any
) -> None:
    meta, golden = multistep
    case = meta["cases"][index]
    image = reference_pipe.generate(case["prompt"], **case_kwargs(case, golden))
    expected = golden[f"{case['key']}_image"]
    assert image.shape == expected.shape
    assert np.abs(image - expected).max() <= TOLERANCE
    # and the cases differ from each other by far more than the tolerance
    others = [golden[f"case{j}_image"] for j in range(len(meta["cases"])) if j != index]
    assert all(np.abs(expected - other).max() > 20 * TOLERANCE for other in others)
