"""SD 1.x and SDXL inpainting, masked img2img and ControlNet against diffusers' goldens (``fixtures/tiny_xl``,
README sections 3.3 and 3.4), on every installed backend.

Oracle: diffusers 0.42.1's ``StableDiffusionInpaintPipeline`` (9-channel and 4-channel UNets) and
``StableDiffusionControlNetPipeline`` (one and two ControlNets), ``StableDiffusionXLInpaintPipeline``
and ``StableDiffusionXLControlNetPipeline`` images and per-step latents, made
with sdkit's noise stream by ``make_fixtures.py``. Every image within 1e-3 on [0, 1] pixels on
the reference, ggml and openvino backends; the per-step latents within 1e-3 (absolute, latents of
magnitude ~10); the latent mask exactly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import sdkit
from sdkit.errors import UnsupportedModelError
from sdkit.pipelines.features.inpainting import plan_mask
from sdkit.pipelines.request import GenerationRequest
from sdkit.testing.goldens import GoldenSet, StepRecorder, require_backend

ROOT = Path(__file__).resolve().parents[4] / "fixtures" / "tiny_xl"
TOLERANCE = 1e-3  # max |diff| on [0, 1] pixels
STEP_TOLERANCE = 1e-3
INPAINT_CASES = ("sd15_inpaint9_full", "sd15_inpaint9_partial", "sd15_masked_img2img", "sd15_masked_full")
CONTROL_CASES = ("sd15_controlnet", "sd15_controlnet_multi")
XL_CASES = ("sdxl_masked_img2img", "sdxl_controlnet", "sdxl_controlnet_multi")
BACKENDS = ("reference", "ggml", "openvino")


GOLDENS = GoldenSet(ROOT)
golden, case = GOLDENS.array, GOLDENS.case
pytestmark = pytest.mark.skipif(GOLDENS.missing, reason="fixtures/tiny_xl missing")


def common(c: dict[str, Any]) -> dict[str, Any]:
    return {
        "negative_prompt": c["negative_prompt"],
        "seed": c["seed"],
        "steps": c["steps"],
        "guidance_scale": c["guidance_scale"],
        "sampler": c["sampler"],
        "schedule": c.get("schedule"),
        "width": c["width"],
        "height": c["height"],
        "output_type": "np",
    }


def inpaint_kwargs(key: str) -> dict[str, Any]:
    c = case(key)
    return {**common(c), "init_image": golden("init_image"), "mask": golden("mask_image"), "strength": c["strength"]}


def control_kwargs(key: str) -> dict[str, Any]:
    c = case(key)
    images = {"edges": golden("control_edges"), "blocks": golden("control_blocks")}
    units = zip(
        c["control_images"],
        c["controlnets"],
        c["controlnet_conditioning_scale"],
        c["control_guidance_start"],
        c["control_guidance_end"],
        strict=True,
    )
    return {**common(c), "control": [(images[i], m, s, a, b) for i, m, s, a, b in units]}


_PIPES: dict[tuple[str, str], Any] = {}


def pipe(folder: str, backend: str) -> Any:
    """One pipeline per folder and backend for the module (ControlNets sd15_a and sd15_b on sd15)."""
    require_backend(backend)
    key = (folder, backend)
    if key not in _PIPES:
        nets = {"sd15": ("sd15_a", "sd15_b"), "sdxl": ("sdxl_a", "sdxl_b")}.get(folder)
        controlnets = [ROOT / "controlnet" / name for name in nets] if nets else None
        try:
            # threads=1: ggml's thread pool spins, and on a loaded 2-core machine that costs 10x.
            _PIPES[key] = sdkit.load_pipeline(ROOT / folder, backend=backend, threads=1, controlnets=controlnets)
        except UnsupportedModelError as exc:  # a backend gap: its message names the node
            pytest.fail(f"{backend} cannot compile {folder}: {exc}")
    return _PIPES[key]


@pytest.fixture(scope="module", autouse=True)
def _close_pipes() -> Any:
    yield
    for loaded in _PIPES.values():
        loaded.close()
    _PIPES.clear()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("key", INPAINT_CASES)
def test_inpainting_reproduces_diffusers(key: str, backend: str) -> None:
    folder = "sd15_inpaint" if case(key)["family"] == "sd15_inpaint" else "sd15"
    steps = StepRecorder()
    loaded = pipe(folder, backend)
    image = loaded.generate(case(key)["prompt"], **inpaint_kwargs(key), callback=steps)
    GOLDENS.check(key, image, steps, (TOLERANCE, STEP_TOLERANCE), backend)
    assert {loaded.backends()[c] for c in ("unet", "vae_encoder", "vae_decoder")} == {backend}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("key", CONTROL_CASES)
def test_controlnet_reproduces_diffusers(key: str, backend: str) -> None:
    steps = StepRecorder()
    loaded = pipe("sd15", backend)
    image = loaded.generate(case(key)["prompt"], **control_kwargs(key), callback=steps)
    GOLDENS.check(key, image, steps, (TOLERANCE, STEP_TOLERANCE), backend)
    used = {loaded.backends()[c] for c in ("unet_controlnet", "controlnet:sd15_a")}
    assert used == {backend}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("key", XL_CASES)
def test_sdxl_variants_reproduce_diffusers(key: str, backend: str) -> None:
    """StableDiffusionXLInpaintPipeline (4-channel UNet) and StableDiffusionXLControlNetPipeline
    (one and two ControlNets, SDXL's text_embeds and time_ids fed to them too)."""
    c = case(key)
    kwargs = inpaint_kwargs(key) if c["family"] == "sdxl_masked" else control_kwargs(key)
    steps = StepRecorder()
    image = pipe("sdxl", backend).generate(c["prompt"], **kwargs, callback=steps)
    GOLDENS.check(key, image, steps, (TOLERANCE, STEP_TOLERANCE), backend)


def test_the_latent_mask_is_diffusers() -> None:
    """Binarised at >= 128, the top-left pixel of each 2x2 cell (the tiny VAE's factor)."""
    loaded = pipe("sd15_inpaint", "reference")
    request = GenerationRequest.create("x", init_image=golden("init_image"), mask=golden("mask_image"))
    planned = plan_mask(request, 48, 32, loaded.config)
    expected = golden("sd15_inpaint9_full/mask_latents")
    np.testing.assert_array_equal(planned.latent_mask[0], expected[0])
    np.testing.assert_array_equal(planned.latent_mask[0], expected[1])  # CFG doubles it


def test_goldens_depend_on_the_mask_and_the_controlnet() -> None:
    """The 1e-3 bar means something: the cases differ from their plain counterparts by much more."""
    plain = golden("sd15_masked_full/image")
    assert float(np.abs(golden("sd15_inpaint9_full/image") - plain).max()) > 20 * TOLERANCE
    scale0 = GOLDENS.meta["sensitivity_max_abs_diff"]["sd15_controlnet vs scale 0"]
    window = GOLDENS.meta["sensitivity_max_abs_diff"]["sd15_controlnet_multi vs guidance start/end 0/1"]
    assert min(scale0, window) > 20 * TOLERANCE


def test_explicit_latents_replace_the_start_noise() -> None:
    """``latents=`` is the start-noise draw (also the latent blending's noise): diffusers' own
    noise gives diffusers' image, and the other draws still come from the seed."""
    key = "sd15_masked_img2img"
    image = pipe("sd15", "reference").generate(
        case(key)["prompt"], **inpaint_kwargs(key), latents=golden(f"{key}/noise")
    )
    assert float(np.abs(image - golden(f"{key}/image")).max()) <= TOLERANCE


def test_controlnet_with_inpainting_and_img2img() -> None:
    """The hooks compose: a ControlNet at scale 0 leaves a masked (or img2img) image unchanged; at
    scale 1 it changes it."""
    loaded = pipe("sd15", "reference")
    kwargs = inpaint_kwargs("sd15_masked_img2img")
    edges = golden("control_edges")
    for extra in ({}, {"mask": None}):
        request = {**kwargs, **extra}
        plain = loaded.generate("a cat", **request)
        off = loaded.generate("a cat", **request, control=[(edges, "sd15_a", 0.0)])
        on = loaded.generate("a cat", **request, control=[(edges, "sd15_a", 1.0)])
        assert float(np.abs(off - plain).max()) <= 1e-5
        assert float(np.abs(on - plain).max()) > 1e-2
