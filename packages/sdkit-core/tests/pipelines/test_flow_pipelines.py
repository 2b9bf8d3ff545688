"""SD3, FLUX.1 dev/schnell and Chroma against diffusers' goldens (``fixtures/tiny_flow``).

Oracle: diffusers 0.42.1's ``StableDiffusion3Pipeline``, ``FluxPipeline`` and ``ChromaPipeline``
images, per-step latents, prompt embeddings and first transformer inputs, and their img2img
pipelines' (``StableDiffusion3Img2ImgPipeline``, ``FluxImg2ImgPipeline``, ``ChromaImg2ImgPipeline``)
images, per-step latents and schedules, made with sdkit's noise stream (``make_fixtures.py``).
Every image within 1e-3 on [0, 1] pixels on each installed backend (reference, ggml with
``threads=1``, openvino), the latents after every step within 1e-4; the intermediate arrays on the
reference backend within 1e-5.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import sdkit
from sdkit.errors import InputError, OptionError, UnsupportedFeatureError
from sdkit.pipelines.loaders.loading import pipeline_class_for
from sdkit.pipelines.models.chroma import ChromaPipeline
from sdkit.pipelines.models.flux import FluxPipeline
from sdkit.pipelines.models.flux_latents import pack
from sdkit.pipelines.models.sd3 import StableDiffusion3Pipeline
from sdkit.pipelines.stages.rng import NoiseStream
from sdkit.testing.goldens import GoldenSet, StepRecorder, require_backend

ROOT = Path(__file__).resolve().parents[4] / "fixtures" / "tiny_flow"
TOLERANCE = 1e-3  # max |diff| on [0, 1] pixels
STEP_TOLERANCE = 1e-4
FEED_TOLERANCE = 1e-5
BACKENDS = ("reference", "ggml", "openvino")
FAMILIES = ("sd3", "flux_dev", "flux_schnell", "chroma")
CASES = ("sd3_cfg", "sd3_no_cfg", "flux_dev", "flux_schnell", "chroma_cfg")
IMG2IMG_CASES = ("sd3_img2img", "flux_dev_img2img", "flux_schnell_img2img", "chroma_img2img")
CLASSES = {
    "sd3": StableDiffusion3Pipeline,
    "flux_dev": FluxPipeline,
    "flux_schnell": FluxPipeline,
    "chroma": ChromaPipeline,
}


GOLDENS = GoldenSet(ROOT)
golden, case = GOLDENS.array, GOLDENS.case
pytestmark = pytest.mark.skipif(GOLDENS.missing, reason="fixtures/tiny_flow missing")


def kwargs_for(key: str) -> dict[str, Any]:
    c = case(key)
    return {
        "negative_prompt": c["negative_prompt"] or "",
        "seed": c["seed"],
        "steps": c["steps"],
        "guidance_scale": c["guidance_scale"],
        "width": c["width"],
        "height": c["height"],
        "max_sequence_length": c["max_sequence_length"],
        "output_type": "np",
    }


def img2img_kwargs(key: str) -> dict[str, Any]:
    from PIL import Image

    image = Image.fromarray(golden("img2img_init_image"))
    return {**kwargs_for(key), "init_image": image, "strength": case(key)["strength"]}


def load(family: str, backend: str) -> Any:
    # threads=1: ggml's thread pool spins, and on a loaded 2-core machine that costs 50x.
    return sdkit.load_pipeline(ROOT / family, backend=backend, threads=1)


@pytest.fixture(scope="module", params=BACKENDS)
def pipes(request: pytest.FixtureRequest) -> Any:
    backend = request.param
    require_backend(backend)
    loaded = {family: load(family, backend) for family in FAMILIES}
    yield backend, loaded
    for pipe in loaded.values():
        pipe.close()


@pytest.fixture(scope="module")
def reference() -> Any:
    loaded = {family: load(family, "reference") for family in FAMILIES}
    yield loaded
    for pipe in loaded.values():
        pipe.close()


@pytest.mark.parametrize("key", CASES)
def test_golden_on_every_backend(pipes: Any, key: str) -> None:
    """The image within 1e-3 and the latents after each step within 1e-4 (diffusers'
    ``callback_on_step_end`` latents: packed for Flux and Chroma; sdkit's callback unpacks)."""
    backend, loaded = pipes
    c = case(key)
    pipe = loaded[c["family"]]
    steps = StepRecorder()
    image = pipe.generate(c["prompt"], **kwargs_for(key), callback=steps)
    assert image.shape == (1, 32, 48, 3)
    assert all(latents.shape == (1, 16, 16, 24) for latents in steps.latents)
    GOLDENS.check(key, image, steps, (TOLERANCE, STEP_TOLERANCE), backend, convert=packed_like)
    assert set(pipe.backends().values()) - {None} == {backend}


@pytest.mark.parametrize("key", IMG2IMG_CASES)
def test_img2img_golden_on_every_backend(pipes: Any, key: str) -> None:
    """img2img (VAE encode with shift and scaling, the steps strength keeps, ``scale_noise``,
    Flux's packing) as diffusers' img2img pipelines: the image within 1e-3, each kept step's
    latents within 1e-4."""
    backend, loaded = pipes
    c = case(key)
    pipe = loaded[c["family"]]
    steps = StepRecorder()
    image = pipe.generate(c["prompt"], **img2img_kwargs(key), callback=steps)
    GOLDENS.check(key, image, steps, (TOLERANCE, STEP_TOLERANCE), backend, convert=packed_like)
    assert set(pipe.backends().values()) - {None} == {backend}


@pytest.mark.parametrize("key", IMG2IMG_CASES)
def test_img2img_schedule_is_diffusers(reference: Any, key: str) -> None:
    """The kept timesteps and sigmas (``int(steps - steps * strength)`` dropped, no rounding
    first), from Flux's linear sigmas and ``mu`` as txt2img."""
    c = case(key)
    pipe = reference[c["family"]]
    plan = pipe.plan(pipe.accept(pipe.request_class.create(c["prompt"], **img2img_kwargs(key))))
    # diffusers' scheduler.timesteps is the whole schedule; its img2img loop runs the last ``kept``
    kept = {"sd3_img2img": 2, "flux_dev_img2img": 2, "flux_schnell_img2img": 2, "chroma_img2img": 3}[key]
    whole = golden(f"{key}/timesteps")
    assert len(golden(f"{key}/step_latents")) == kept and len(whole) == c["steps"]
    assert np.abs(np.asarray(plan.scheduler.timesteps) - whole[len(whole) - kept :]).max() <= 1e-4
    sigmas = golden(f"{key}/sigmas")  # the whole table and the final 0; sdkit's: what is left
    assert np.abs(np.asarray(plan.scheduler.sigmas) - sigmas[len(sigmas) - kept - 1 :]).max() <= 1e-6


def packed_like(latents: np.ndarray, golden_latents: np.ndarray) -> np.ndarray:
    return pack(latents) if golden_latents.ndim == 3 else latents


@pytest.mark.parametrize("key", CASES)
def test_schedule_and_transformer_inputs_are_diffusers(reference: Any, key: str) -> None:
    """Timesteps/sigmas (shift, Flux's linear sigmas and mu), the conditioning feeds and the
    first transformer call's inputs, on the reference backend."""
    c = case(key)
    pipe = reference[c["family"]]
    plan = pipe.plan(pipe.accept(pipe.request_class.create(c["prompt"], **kwargs_for(key))))
    assert np.abs(np.asarray(plan.scheduler.timesteps) - golden(f"{key}/timesteps")).max() <= 1e-4
    assert np.abs(np.asarray(plan.scheduler.sigmas) - golden(f"{key}/sigmas")).max() <= 1e-6
    feeds = pipe.conditioning(plan)
    latents = pipe.initial_latents(plan, NoiseStream(plan.seeds))
    call = f"{key}/transformer_call0"
    assert np.abs(latents - golden(f"{call}/hidden_states")[:1]).max() == 0  # the same noise draw
    guided = c["family"] in ("sd3", "chroma") and c["guidance_scale"] > 1
    for name, value in feeds.items():
        if guided and c["family"] == "chroma" and name in ("encoder_hidden_states", "attention_mask"):
            # diffusers' Chroma calls the transformer twice, positive first: sdkit's [negative, positive]
            theirs = np.concatenate([golden(f"{key}/transformer_call1/{name}"), golden(f"{call}/{name}")])
        else:
            theirs = golden(f"{call}/{name}")
        assert value.shape == theirs.shape, name
        assert np.abs(value - theirs).max() <= FEED_TOLERANCE, name


def test_folders_load_as_their_family() -> None:
    for family, cls in CLASSES.items():
        assert pipeline_class_for(ROOT / family) is cls


def test_parameters_and_refusals(reference: Any) -> None:
    pipe = reference["flux_schnell"]
    [image] = pipe.generate("a photo", **{**kwargs_for("flux_schnell"), "output_type": "pil"})
    text = image.info["parameters"]
    assert "Steps: 2, Sampler: Euler, Schedule type: Automatic, CFG scale: 0, Seed: 11, Size: 48x32" in text
    assert "Model: flux_schnell, Software: sdkit" in text
    with pytest.raises(InputError, match=r"expects \[1,32,16\]"):  # the fixture's fixed T5 length
        pipe.generate("a photo", **{**kwargs_for("flux_schnell"), "max_sequence_length": 64})
    [image] = pipe.generate("a photo", **{**img2img_kwargs("flux_schnell_img2img"), "output_type": "pil"})
    assert "Denoising strength: 0.75" in image.info["parameters"]
    with pytest.raises(InputError, match="strength must be in"):
        pipe.generate("a photo", **{**img2img_kwargs("flux_schnell_img2img"), "strength": 0.0})
    with pytest.raises(UnsupportedFeatureError, match=r"FLUX.1 pipelines do not support A1111 prompt weighting"):
        pipe.generate("a photo", **kwargs_for("flux_schnell"), prompt_weighting="a1111")
    with pytest.raises(OptionError, match="does not run 'flow' models"):
        pipe.generate("a photo", **{**kwargs_for("flux_schnell"), "sampler": "restart"})


def test_other_samplers_run_on_the_family_schedule(reference: Any) -> None:
    """A sampler other than Euler is its flow variant (ComfyUI's algorithm on flow sigmas, checked in
    tests/schedulers/test_k_solvers.py) on the sigmas Euler gets (shift, Flux's linear sigmas, mu);
    the PNG names its A1111 label."""
    c = case("flux_dev")
    pipe = reference["flux_dev"]
    base = pipe.plan(pipe.accept(pipe.request_class.create(c["prompt"], **kwargs_for("flux_dev"))))
    samplers = [("DPM++ 2M", "dpmpp_2m_flow"), ("DPM2 a", "dpm_2_a_flow"), ("LMS", "lms_flow")]
    samplers += [("DPM++ 3M SDE", "dpmpp_3m_sde_flow"), ("DDPM", "ddpm_flow"), ("DPM++ SDE", "dpmpp_sde_flow")]
    for sampler, name in [*samplers, ("DDIM", "ddim_flow"), ("LCM", "lcm_flow")]:
        request = pipe.request_class.create(c["prompt"], **kwargs_for("flux_dev"), sampler=sampler)
        scheduler = pipe.plan(pipe.accept(request)).scheduler
        assert scheduler.name == name
        assert np.array_equal(scheduler._all_sigmas, base.scheduler.sigmas)
        # ComfyUI's half-log-SNR samplers start at percent_to_sigma(1e-4) of the resolution's mu
        offset = name in ("dpmpp_3m_sde_flow", "dpmpp_sde_flow")
        assert (scheduler.sigmas[0] < 1.0) == offset and scheduler.sigmas[0] > 0.9999
    schnell = reference["flux_schnell"]
    [image] = schnell.generate("a photo", **{**kwargs_for("flux_schnell"), "sampler": "Euler a", "output_type": "pil"})
    assert "Sampler: Euler a, Schedule type: Automatic" in image.info["parameters"]
    for sampler in ("DPM++ 2M SDE", "DPM++ SDE", "LCM", "DDIM Karras"):
        name, schedule = (sampler, "Automatic") if sampler != "DDIM Karras" else ("DDIM", "Karras")
        kwargs = {**kwargs_for("flux_schnell"), "sampler": sampler, "output_type": "pil"}
        [image] = schnell.generate("a photo", **kwargs)
        assert f"Sampler: {name}, Schedule type: {schedule}" in image.info["parameters"]


def test_batch_is_the_single_images(reference: Any) -> None:
    """Image i of a batch is the one-image request with seed + i (Chroma: CFG batch of 4 through a
    batch-1 transformer, in four calls)."""
    pipe = reference["chroma"]
    kwargs = {**kwargs_for("chroma_cfg"), "steps": 2}
    batch = pipe.generate("a photo of an astronaut", **{**kwargs, "num_images": 2})
    for i in range(2):
        single = pipe.generate("a photo of an astronaut", **{**kwargs, "seed": kwargs["seed"] + i})
        assert np.abs(batch[i] - single[0]).max() <= 1e-5


def test_command_line_makes_the_golden_image(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``sdkit generate`` on a Flux folder: Euler by default, ``--max-sequence-length``, and the
    PNG holds diffusers' image (8-bit) with A1111's parameters."""
    from PIL import Image

    from sdkit.cli.main import main

    c = case("flux_dev")
    out = tmp_path / "flux.png"
    argv = ["generate", c["prompt"], "--model", str(ROOT / "flux_dev"), "-o", str(out), "--backend", "ggml"]
    argv += ["--steps", "3", "--seed", "11", "--cfg", "3.5", "--width", "48", "--height", "32", "--threads", "1"]
    require_backend("ggml")
    assert main([*argv, "--max-sequence-length", "32"]) == 0
    with Image.open(out) as image:
        pixels = np.asarray(image, np.float32) / 255.0
        text = image.info["parameters"]
    assert "Steps: 3, Sampler: Euler, Schedule type: Automatic, CFG scale: 3.5, Seed: 11" in text
    assert np.abs(pixels - golden("flux_dev/image")[0]).max() <= 1 / 255 + TOLERANCE
    capsys.readouterr()
    sd_folder = ROOT.parent / "tiny_pipeline" / "model"
    assert main(["generate", "a cat", "--model", str(sd_folder), "--max-sequence-length", "32"]) == 1
    assert "unknown generation option 'max_sequence_length'" in capsys.readouterr().err


def test_command_line_img2img(tmp_path: Path) -> None:
    """``sdkit generate --init-image --strength`` on a Flux folder (the size is the image's):
    diffusers' ``FluxImg2ImgPipeline`` image (8-bit), A1111's ``Denoising strength``."""
    from PIL import Image

    from sdkit.cli.main import main

    require_backend("ggml")
    c = case("flux_dev_img2img")
    init, out = tmp_path / "init.png", tmp_path / "out.png"
    Image.fromarray(golden("img2img_init_image")).save(init)
    argv = ["generate", c["prompt"], "--model", str(ROOT / "flux_dev"), "-o", str(out), "--backend", "ggml"]
    argv += ["--steps", "3", "--seed", "11", "--cfg", "3.5", "--threads", "1", "--max-sequence-length", "32"]
    assert main([*argv, "--init-image", str(init), "--strength", "0.6"]) == 0
    with Image.open(out) as image:
        pixels = np.asarray(image, np.float32) / 255.0
        text = image.info["parameters"]
    assert "Denoising strength: 0.6" in text and "Size: 48x32" in text
    assert np.abs(pixels - golden("flux_dev_img2img/image")[0]).max() <= 1 / 255 + TOLERANCE
