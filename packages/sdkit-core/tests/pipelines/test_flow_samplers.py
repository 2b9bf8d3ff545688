"""Issue 27's samplers on the tiny flow pipelines: "UniPC", "DEIS", "iPNDM" on FLUX.1-schnell and
SD3 run their flow variants (uni_pc_flow, ...: each step checked against diffusers in
tests/schedulers/test_multistep_vs_diffusers.py) on the family's schedule, and the PNG parameters
name the sampler as A1111 does."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import sdkit
from sdkit.errors import OptionError

from .test_flow_pipelines import ROOT, kwargs_for


@pytest.fixture(scope="module")
def schnell() -> Any:
    pipe = sdkit.load_pipeline(ROOT / "flux_schnell", backend="reference", threads=1)
    yield pipe
    pipe.close()


def test_flow_samplers_run_and_are_labelled(schnell: Any) -> None:
    base = {**kwargs_for("flux_schnell"), "steps": 3, "output_type": "pil"}
    [euler] = schnell.generate("a photo", **{**base, "sampler": "Euler"})
    images = {}
    for sampler, schedule, label in [
        ("UniPC", "beta", "Sampler: UniPC, Schedule type: Beta"),
        ("deis", None, "Sampler: DEIS, Schedule type: Automatic"),
        ("ipndm_v", "sgm_uniform", "Sampler: iPNDM_v, Schedule type: SGM Uniform"),
    ]:
        [image] = schnell.generate("a photo", **{**base, "sampler": sampler, "schedule": schedule})
        assert label in image.info["parameters"]
        pixels = np.asarray(image, dtype=np.float32)
        assert np.isfinite(pixels).all()
        images[sampler] = pixels
    # the samplers differ from Euler (and from each other) by more than rounding
    assert all(np.abs(p - np.asarray(euler, dtype=np.float32)).max() > 1 for p in images.values())


def test_flow_model_refuses_what_has_no_flow_variant(schnell: Any) -> None:
    with pytest.raises(OptionError, match="does not run 'flow'"):
        schnell.generate("a photo", **{**kwargs_for("flux_schnell"), "sampler": "tcd"})


def multistep_goldens() -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
    import json

    if not (ROOT / "golden_multistep.npz").is_file():
        return [], {}
    with np.load(ROOT / "golden_multistep.npz") as data:
        arrays = {k: data[k] for k in data.files}
    return json.loads((ROOT / "golden_multistep.json").read_text(encoding="utf-8"))["cases"], arrays


@pytest.mark.parametrize("index", [0, pytest.param(1, marks=pytest.mark.slow)], ids=["flux_schnell", "flux_dev"])
def test_uni_pc_bh2_on_flux_reproduces_diffusers(index: int) -> None:
    """uni_pc_bh2 on the tiny FLUX.1 folders against diffusers' FluxPipeline with a flow UniPC (bh2,
    order 3; goldens by fixtures/tiny_flow/make_multistep_goldens.py), within 1e-3 on [0, 1] pixels."""
    cases, arrays = multistep_goldens()
    if not cases:
        pytest.skip("fixtures/tiny_flow/golden_multistep.npz missing")
    c = cases[index]
    pipe = sdkit.load_pipeline(ROOT / c["family"], backend="reference", threads=1)
    try:
        image = pipe.generate(
            c["prompt"],
            seed=c["seed"],
            steps=c["steps"],
            guidance_scale=c["guidance_scale"],
            width=c["width"],
            height=c["height"],
            max_sequence_length=c["max_sequence_length"],
            sampler="uni_pc_bh2",
            output_type="np",
        )
    finally:
        pipe.close()
    expected = arrays[f"{c['key']}/image"]
    assert image.shape == expected.shape
    assert np.abs(image - expected).max() <= 1e-3
