"""SDXL base and refiner against diffusers' goldens (``fixtures/tiny_xl``, README section 3).

Oracle: diffusers 0.42.1's ``StableDiffusionXLPipeline`` / ``StableDiffusionXLImg2ImgPipeline``
images, per-step latents and first UNet inputs, made with sdkit's noise stream
(``make_fixtures.py``). Every golden within 1e-3 on [0, 1] pixels on each installed backend
(reference, ggml, openvino); the intermediate arrays on the reference backend within 1e-4.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import sdkit
from sdkit.pipelines import StableDiffusionXLPipeline
from sdkit.testing.goldens import GoldenSet, StepRecorder, require_backend

ROOT = Path(__file__).resolve().parents[4] / "fixtures" / "tiny_xl"
TOLERANCE = 1e-3  # max |diff| on [0, 1] pixels
STEP_TOLERANCE = 1e-4
CASES = ("sdxl_euler", "sdxl_dpmpp_2m_karras", "sdxl_euler_a_no_negative", "sdxl_img2img", "sdxl_base_refiner")
BACKENDS = ("reference", "ggml", "openvino")
SIZE_FIELDS = (
    "original_size",
    "crops_coords_top_left",
    "target_size",
    "negative_original_size",
    "negative_crops_coords_top_left",
    "negative_target_size",
    "aesthetic_score",
    "negative_aesthetic_score",
)


GOLDENS = GoldenSet(ROOT)
golden, case = GOLDENS.array, GOLDENS.case
pytestmark = pytest.mark.skipif(GOLDENS.missing, reason="fixtures/tiny_xl missing")


def load(folder: str, backend: str) -> Any:
    # threads=1: ggml's thread pool spins, and on a loaded 2-core machine that costs 50x.
    return sdkit.load_pipeline(ROOT / folder, backend=backend, threads=1)


def kwargs_for(key: str, refiner: Any = None) -> dict[str, Any]:
    """``generate`` arguments that reproduce one golden case."""
    c = case(key)
    kwargs: dict[str, Any] = {
        "negative_prompt": c.get("negative_prompt", ""),
        "prompt_2": c.get("prompt_2", ""),
        "seed": c["seed"],
        "steps": c["steps"],
        "guidance_scale": c["guidance_scale"],
        "sampler": c["sampler"],
        "schedule": c.get("schedule"),
        "width": c["width"],
        "height": c["height"],
        "output_type": "np",
    }
    kwargs.update({name: c[name] for name in SIZE_FIELDS if name in c})
    if c["family"] == "sdxl_img2img":
        kwargs.update(init_image=golden("init_image"), strength=c["strength"])
    if c["family"] == "sdxl_refiner":
        assert c["denoising_end"] == c["denoising_start"]
        kwargs.update(refiner=refiner, refiner_switch_at=c["denoising_end"])
    return kwargs


@pytest.fixture(scope="module", params=BACKENDS)
def pipes(request: pytest.FixtureRequest) -> Any:
    backend = request.param
    require_backend(backend)
    base, refiner = load("sdxl", backend), load("sdxl_refiner", backend)
    yield backend, base, refiner
    base.close()
    refiner.close()


@pytest.fixture(scope="module")
def reference() -> Any:
    base, refiner = load("sdxl", "reference"), load("sdxl_refiner", "reference")
    yield base, refiner
    base.close()
    refiner.close()


@pytest.mark.parametrize("key", CASES)
def test_golden_on_every_backend(pipes: Any, key: str) -> None:
    """The image, and the latents after each step (base, then refiner: diffusers'
    ``step_latents``, numbered as one run by the callback)."""
    backend, base, refiner = pipes
    steps = StepRecorder()
    image = base.generate(case(key)["prompt"], **kwargs_for(key, refiner), callback=steps)
    assert image.shape == (1, 32, 48, 3)
    GOLDENS.check(key, image, steps, (TOLERANCE, STEP_TOLERANCE), backend)
    assert set(base.backends().values()) - {None} == {backend}


@pytest.mark.parametrize("key", ["sdxl_euler", "sdxl_dpmpp_2m_karras", "sdxl_euler_a_no_negative"])
def test_unet_conditioning_is_diffusers(reference: Any, key: str) -> None:
    """Two encoders' penultimate states concatenated, pooled text_embeds, time_ids (sdxl_euler
    sets every size, prompt_2 and negative sizes), zeros for an empty negative prompt."""
    base, _ = reference
    plan = base.plan(base.accept(base.request_class.create(case(key)["prompt"], **kwargs_for(key))))
    feeds = base.conditioning(plan)
    for name in ("encoder_hidden_states", "text_embeds", "time_ids"):
        assert np.abs(feeds[name] - golden(f"{key}/unet0/{name}")).max() <= 1e-5, name
    if key == "sdxl_euler_a_no_negative":
        assert not feeds["encoder_hidden_states"][0].any() and not feeds["text_embeds"][0].any()


def test_refiner_takes_over_where_diffusers_does(reference: Any) -> None:
    base, refiner = reference
    key = "sdxl_base_refiner"
    plan = base.plan(base.accept(base.request_class.create(case(key)["prompt"], **kwargs_for(key, refiner))))
    stage = plan.refiner
    assert stage is not None and stage.pipeline is refiner and stage.base_steps == 2
    assert list(stage.plan.scheduler.timesteps) == list(golden(f"{key}/refiner_timesteps")[2:])
    feeds = refiner.conditioning(stage.plan, second_stage=True)
    assert np.abs(feeds["encoder_hidden_states"] - golden(f"{key}/refiner_unet0/encoder_hidden_states")).max() <= 1e-5
    assert np.abs(feeds["time_ids"] - golden(f"{key}/refiner_unet0/time_ids")).max() == 0
    handoff: list[np.ndarray] = []
    base.generate(
        case(key)["prompt"], **kwargs_for(key, refiner), callback=lambda i, n, x: handoff.append(x) if i == 1 else None
    )
    assert np.abs(handoff[0] - golden(f"{key}/handoff_latents")).max() <= STEP_TOLERANCE
    assert isinstance(refiner, StableDiffusionXLPipeline) and refiner.is_refiner and not base.is_refiner


def test_png_says_refiner_and_switch(reference: Any) -> None:
    base, refiner = reference
    kwargs = {**kwargs_for("sdxl_base_refiner", refiner), "output_type": "pil"}
    [image] = base.generate("a photo of an astronaut", **kwargs)
    text = image.info["parameters"]
    assert ", Refiner: sdxl_refiner, Refiner switch at: 0.5, Software: sdkit" in text
    assert "Model: sdxl," in text


def test_batch_is_the_single_images(reference: Any) -> None:
    """Image i of a batch is the one-image request with seed + i, refiner included: the SDXL feeds
    are batched [negative x N, positive x N] like the sample."""
    base, refiner = reference
    kwargs = {**kwargs_for("sdxl_base_refiner", refiner), "steps": 4, "sampler": "euler_a"}
    batch = base.generate("a photo of an astronaut", **{**kwargs, "num_images": 2})
    for i in range(2):
        single = base.generate("a photo of an astronaut", **{**kwargs, "seed": kwargs["seed"] + i})
        assert np.abs(batch[i] - single[0]).max() <= 1e-5
