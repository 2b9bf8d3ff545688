"""Hires fix on the flow pipelines (SD3, FLUX.1 dev/schnell, Chroma) against diffusers.

Oracle: ``fixtures/tiny_flow/make_hires_goldens.py``: diffusers has no hires fix, so A1111's
recipe run with diffusers' own pipelines: txt2img (latents out), the upscale ("Latent": torch's
bilinear ``interpolate`` of the latents; "Lanczos": the VAE-decoded 8-bit image resized by PIL),
then the family's img2img pipeline at the target size with ``num_inference_steps =
int(hr_second_pass_steps / denoising_strength)`` and ``strength = denoising_strength``, every draw
sdkit's stream. The image within 1e-3 on [0, 1] pixels, the first pass's final latents and the
latents after every step of the second within 1e-4 (1e-3 after an image upscaler's 8-bit
rounding), on each installed backend (reference, ggml with ``threads=1``, openvino); the second
pass's timesteps within 1e-4. The tiny Flux and Chroma transformers take 96 image tokens only, so
their cases keep the size (``hr_scale`` 1: the second pass is the img2img tail on the first pass's
latents or on its 8-bit image encoded again); SD3's upscale 1.5x.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import sdkit
from sdkit.pipelines.models.flux_latents import pack
from sdkit.testing.goldens import require_backend

ROOT = Path(__file__).resolve().parents[4] / "fixtures" / "tiny_flow"
TOLERANCE = 1e-3
STEP_TOLERANCE = 1e-4
ROUNDED_STEP_TOLERANCE = 1e-3  # after an image upscaler's 8-bit rounding (see the test)
BACKENDS = ("reference", "ggml", "openvino")
pytestmark = pytest.mark.skipif(not (ROOT / "hires_golden.json").is_file(), reason="fixtures/tiny_flow missing")


def cases() -> dict[str, dict[str, Any]]:
    if not (ROOT / "hires_golden.json").is_file():
        return {}
    meta = json.loads((ROOT / "hires_golden.json").read_text(encoding="utf-8"))
    return {c["key"]: c for c in meta["cases"]}


CASES = cases()


@pytest.fixture(scope="module")
def golden() -> dict[str, np.ndarray]:
    with np.load(ROOT / "hires_golden.npz") as data:
        return {k: data[k] for k in data.files}


def request_fields(c: dict[str, Any]) -> dict[str, Any]:
    return {
        "negative_prompt": c["negative_prompt"] or "",
        "seed": c["seed"],
        "steps": c["steps"],
        "guidance_scale": c["guidance_scale"],
        "width": c["width"],
        "height": c["height"],
        "max_sequence_length": c["max_sequence_length"],
        "enable_hr": True,
        "hr_scale": c["hr_scale"],
        "hr_upscaler": c["hr_upscaler"],
        "hr_second_pass_steps": c["hr_second_pass_steps"],
        "denoising_strength": c["denoising_strength"],
    }


@pytest.fixture(scope="module", params=BACKENDS)
def pipes(request: pytest.FixtureRequest) -> Any:
    backend = request.param
    require_backend(backend)
    families = sorted({c["family"] for c in CASES.values()})
    loaded = {f: sdkit.load_pipeline(ROOT / f, backend=backend, threads=1) for f in families}
    yield backend, loaded
    for pipe in loaded.values():
        pipe.close()


def like(latents: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    """sdkit's callback hands ``[N, C, h, w]``; diffusers' Flux and Chroma latents are packed."""
    return pack(latents) if theirs.ndim == 3 else latents


@pytest.mark.parametrize("key", sorted(CASES))
def test_hires_is_diffusers_txt2img_upscale_img2img(pipes: Any, golden: dict[str, np.ndarray], key: str) -> None:
    backend, loaded = pipes
    c = CASES[key]
    pipe = loaded[c["family"]]
    steps: list[tuple[int, int, np.ndarray]] = []
    image = pipe.generate(
        c["prompt"], **request_fields(c), output_type="np", callback=lambda i, n, x: steps.append((i, n, x))
    )
    height, width = c["target"]
    assert image.shape == (1, height, width, 3)
    second = golden[f"{key}/second_step_latents"]
    total = c["steps"] + len(second)
    assert [(i, n) for i, n, _ in steps] == [(i, total) for i in range(total)]  # one count over both passes
    first = golden[f"{key}/first_pass_latents"][None]  # the first pass's final latents (what is upscaled)
    steps = steps[c["steps"] - 1 :]
    # An image upscaler rounds the first pass's pixels to 8 bits: a pixel within ~1e-7 of a rounding
    # boundary (flux_schnell's case has one) can round the other way than diffusers' torch decode,
    # one 8-bit step on one pixel, which moves the second pass's latents by ~5e-4 (the image less).
    rounded = c["hr_upscaler"] != "Latent"
    tolerances = [STEP_TOLERANCE] * len(first) + [ROUNDED_STEP_TOLERANCE if rounded else STEP_TOLERANCE] * len(second)
    for (_, _, ours), theirs, tolerance in zip(steps, [*first, *second], tolerances, strict=True):
        assert np.abs(like(ours, theirs) - theirs).max() <= tolerance
    gap = float(np.abs(image - golden[f"{key}/image"]).max())
    assert gap <= TOLERANCE, f"{key} on {backend}: max |diff| {gap:.3g}"
    assert set(pipe.backends().values()) - {None} == {backend}


@pytest.mark.parametrize("key", sorted(CASES))
def test_second_pass_runs_the_tail_of_the_family_schedule(key: str) -> None:
    """The second pass's timesteps: the last ``hr_second_pass_steps`` of diffusers' img2img
    schedule at the target size (shift ``mu`` of its token count, Flux's linear sigmas)."""
    c = CASES[key]
    pipe = sdkit.load_pipeline(ROOT / c["family"], backend="reference", prepare=False)
    plan = pipe.plan(pipe.accept(pipe.request_class.create(c["prompt"], **request_fields(c))))
    with np.load(ROOT / "hires_golden.npz") as data:
        whole = data[f"{key}/second_timesteps"]
    tail = np.asarray(plan.hires.plan.scheduler.timesteps)
    assert len(tail) == c["hr_second_pass_steps"]
    assert np.abs(tail - whole[len(whole) - len(tail) :]).max() <= 1e-4


def test_png_labels_and_the_command_line(tmp_path: Path) -> None:
    """``sdkit generate --hires`` on the SD3 folder: the upscaled PNG (diffusers' image, 8-bit)
    with A1111's hires labels and the first pass's size."""
    from PIL import Image

    from sdkit.cli.main import main

    c = CASES["sd3_hires_latent"]
    out = tmp_path / "hires.png"
    argv = ["generate", c["prompt"], "--model", str(ROOT / "sd3"), "-o", str(out), "--backend", "reference"]
    argv += ["--steps", "3", "--seed", str(c["seed"]), "--cfg", "5", "--width", "48", "--height", "32"]
    argv += ["--negative", c["negative_prompt"], "--max-sequence-length", "32"]
    argv += ["--hires", "--hr-scale", "1.5", "--hr-steps", "2", "--denoising-strength", "0.5"]
    assert main(argv) == 0
    with Image.open(out) as image:
        pixels = np.asarray(image, np.float32) / 255.0
        text = image.info["parameters"]
    assert "Size: 48x32" in text
    assert "Denoising strength: 0.5, Hires upscale: 1.5, Hires steps: 2, Hires upscaler: Latent" in text
    with np.load(ROOT / "hires_golden.npz") as data:
        assert np.abs(pixels - data["sd3_hires_latent/image"][0]).max() <= 1 / 255 + TOLERANCE
