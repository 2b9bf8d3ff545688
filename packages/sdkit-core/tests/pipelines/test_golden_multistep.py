"""The tiny pipeline with UniPC bh2 and TCD against diffusers' StableDiffusion(Img2Img)Pipeline with
UniPCMultistepScheduler(solver_type="bh2", solver_order=3) and TCDScheduler (eta 0.3): same weights,
seed stream and steps (goldens by fixtures/tiny_pipeline/make_multistep_goldens.py)."""

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


# The img2img case (3 UNet steps) runs in CI; the txt2img ones (~15 s each on a loaded 2-core box) are slow.
CASES = [
    pytest.param(0, id="uni_pc_bh2-txt2img", marks=pytest.mark.slow),
    pytest.param(1, id="uni_pc_bh2_karras-img2img"),
    pytest.param(2, id="tcd-txt2img", marks=pytest.mark.slow),
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
