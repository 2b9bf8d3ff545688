"""A1111's "Align Your Steps" on an SDXL model takes the SDXL table (as A1111 does), on SD 1.x the
SD 1.5 table; the PNG says "Align Your Steps" either way."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import sdkit
from sdkit.pipelines.request import GenerationRequest
from sdkit.schedulers.sigma_schedules import ays_sigmas

ROOT = Path(__file__).resolve().parents[4] / "fixtures"


@pytest.mark.parametrize(("folder", "table"), [("tiny_xl/sdxl", "sdxl"), ("tiny_pipeline/model", "sd15")])
def test_align_your_steps_table_follows_the_family(folder: str, table: str) -> None:
    if not (ROOT / folder / "model_index.json").is_file():
        pytest.skip(f"fixtures/{folder} missing")
    pipe = sdkit.load_pipeline(ROOT / folder, backend="reference", threads=1)
    try:
        request = pipe.request_class.create(prompt="x", sampler="Euler", schedule="Align Your Steps", steps=6)
        assert request.schedule == "align_your_steps"
        scheduler = pipe.make_scheduler(request)
        scheduler.set_timesteps(6)
        np.testing.assert_allclose(scheduler.sigmas[:-1], ays_sigmas(table, 6), rtol=1e-6)
    finally:
        pipe.close()


def test_request_keeps_the_label_schedule() -> None:
    assert GenerationRequest.create(prompt="x", sampler="UniPC", schedule="ays").schedule == "align_your_steps"
