"""Hires fix (``enable_hr``, ``--hires``): A1111's numbers and PNG labels, the first pass is the
plain txt2img (diffusers-checked: ``test_golden.py``), the second pass runs the tail A1111 runs,
from the upscaled latents (torch's ``interpolate``, ``test_hires.py``) or the 8-bit image resized
by PIL, and every misfit is refused before anything runs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import sdkit
from sdkit.errors import InputError, ModelFormatError
from sdkit.pipelines import GenerationRequest
from sdkit.pipelines.imaging.hires_plan import latent_upscale

ROOT = Path(__file__).resolve().parents[4] / "fixtures" / "tiny_xl"
SD15 = ROOT / "sd15"
pytestmark = pytest.mark.skipif(not (SD15 / "model_index.json").is_file(), reason="fixtures/tiny_xl missing")
BASE: dict[str, Any] = {"seed": 1, "steps": 3, "width": 32, "height": 32, "sampler": "euler", "output_type": "np"}


@pytest.fixture(scope="module")
def pipe() -> Any:
    loaded = sdkit.load_pipeline(SD15, backend="reference")
    yield loaded
    loaded.close()


def run(pipe: Any, **fields: Any) -> tuple[Any, list[tuple[int, int, np.ndarray]]]:
    steps: list[tuple[int, int, np.ndarray]] = []
    out = pipe.generate("a house", **{**BASE, **fields}, callback=lambda i, n, x: steps.append((i, n, x)))
    return out, steps


@contextmanager
def encoder_inputs(pipe: Any) -> Iterator[list[np.ndarray]]:
    """The first input of every VAE-encoder run inside the ``with`` block (the compiled encoder
    wrapped by a recorder that passes every call through)."""
    calls: list[np.ndarray] = []
    encoder = pipe.components["vae_encoder"]
    original = encoder.use

    def spy(work: Any) -> Any:
        def recording(compiled: Any) -> Any:
            class Recorder:
                def __getattr__(self, name: str) -> Any:
                    return getattr(compiled, name)

                def run(self, feeds: Any, *args: Any, **kwargs: Any) -> Any:
                    calls.append(np.asarray(next(iter(feeds.values()))))
                    return compiled.run(feeds, *args, **kwargs)

            return work(Recorder())

        return original(recording)

    encoder.use = spy
    try:
        yield calls
    finally:
        del encoder.use


def test_first_pass_is_the_txt2img_and_the_second_runs_the_tail(pipe: Any) -> None:
    _, plain = run(pipe)
    image, steps = run(pipe, enable_hr=True, hr_scale=1.5, hr_second_pass_steps=2, denoising_strength=0.5)
    assert image.shape == (1, 48, 48, 3)
    assert [(i, n) for i, n, _ in steps] == [(i, 5) for i in range(5)]  # 3 + 2 steps, one count
    for (_, _, got), (_, _, want) in zip(steps[:3], plain, strict=True):
        np.testing.assert_array_equal(got, want)  # the first pass is the plain txt2img
    assert steps[3][2].shape == (1, 4, 24, 24)
    # the second pass's timesteps: the last 2 of a schedule of int(2 / 0.5) = 4 steps
    request = GenerationRequest.create("a", steps=2, enable_hr=True, hr_second_pass_steps=2, denoising_strength=0.5)
    plan = pipe.plan(request.replace(width=32, height=32, sampler="euler"))
    tail = plan.hires.plan.scheduler
    full = pipe.make_scheduler(plan.request)
    full.set_timesteps(4)
    np.testing.assert_array_equal(tail.timesteps, full.timesteps[2:])


def test_latent_upscaler_starts_from_the_resized_latents(pipe: Any) -> None:
    """With denoising_strength 1 and the whole schedule, the second pass starts from
    ``upscaled + noise * sigma_max`` (k-diffusion's img2img): at a huge sigma the start is the
    noise, so compare the upscale on a schedule of a step where the first-pass latents show."""
    _, plain = run(pipe)
    for mode, name in [("bilinear", "Latent"), ("nearest", "Latent (nearest)")]:
        _, steps = run(
            pipe, enable_hr=True, hr_upscaler=name, hr_scale=2, denoising_strength=0.2, hr_second_pass_steps=1
        )
        upscaled = latent_upscale(plain[-1][2], 32, 32, mode)
        second = steps[3][2]  # after the one second-pass step at the lowest sigma of a 5-step schedule
        assert second.shape == upscaled.shape
        assert np.abs(second - upscaled).mean() < 0.5 * np.abs(upscaled).mean()  # close to its start


def test_image_upscaler_decodes_resizes_with_pil_and_encodes(pipe: Any) -> None:
    first = run(pipe, output_type="pil")[0][0]
    with encoder_inputs(pipe) as calls:
        run(pipe, enable_hr=True, hr_upscaler="Lanczos", hr_scale=2)
    expected = np.asarray(first.resize((64, 64), Image.Resampling.LANCZOS), dtype=np.float32) / 255 * 2 - 1
    np.testing.assert_allclose(calls[0][0].transpose(1, 2, 0), expected, atol=1e-6)


def test_png_labels_are_a1111s(pipe: Any) -> None:
    [image] = pipe.generate("a house", **{**BASE, "output_type": "pil"}, enable_hr=True, hr_second_pass_steps=2)
    text = image.info["parameters"]
    assert "Size: 32x32" in text  # A1111 writes the first pass's size
    assert "Denoising strength: 0.7, Hires upscale: 2, Hires steps: 2, Hires upscaler: Latent" in text
    assert image.size == (64, 64)


def test_hr_resize_cuts_the_excess(pipe: Any) -> None:
    image, _ = run(pipe, width=32, height=48, enable_hr=True, hr_resize_x=64, hr_resize_y=64)
    assert image.shape == (1, 64, 64, 3)  # upscaled to 64 x 96 (the box covered), 32 rows cut


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"hr_scale": 3}, "hr_scale is a hires fix option"),
        ({"enable_hr": True, "hr_upscaler": "ESRGAN_4x"}, "unknown hires upscaler"),
        ({"enable_hr": True, "denoising_strength": 0}, "denoising_strength must be in"),
        ({"enable_hr": True, "hr_scale": 0.5}, "hr_scale must be at least 1"),
        ({"enable_hr": True, "init_image": np.zeros((8, 8, 3), np.uint8)}, "hires fix (enable_hr) is for txt2img"),
    ],
)
def test_misfits_are_refused(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        GenerationRequest.create("x", **fields)


def test_cli_hires_writes_the_larger_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sdkit.cli.main import main

    out = tmp_path / "hires.png"
    argv = ["generate", "a house", "-m", str(SD15), "-o", str(out), "--steps", "2", "--width", "32", "--height", "32"]
    argv += ["--backend", "reference", "--sampler", "euler"]
    assert main([*argv, "--hires", "--hr-scale", "1.5", "--hr-upscaler", "nearest", "--denoising-strength", "0.6"]) == 0
    with Image.open(out) as image:
        assert image.size == (48, 48)
        assert "Denoising strength: 0.6, Hires upscale: 1.5, Hires upscaler: Nearest" in image.info["parameters"]
    assert main([*argv, "--hr-steps", "4"]) == 1
    assert capsys.readouterr().err.strip().endswith("sdkit: error: --hr-steps needs --hires")


def test_sdxl_hires_plans_its_second_pass_at_the_target_size() -> None:
    xl = sdkit.load_pipeline(ROOT / "sdxl", backend="reference", prepare=False)
    request = xl.request_class.create("a", width=32, height=32, steps=3, enable_hr=True, hr_scale=1.5)
    second = xl.plan(request).hires.plan
    assert (second.width, second.height, second.latent_shape[2:]) == (48, 48, (24, 24))
    assert second.request.original_size is None  # SDXL's time_ids default to the second pass's size
    image, _ = run(xl, enable_hr=True, hr_scale=1.5, steps=2)
    assert image.shape == (1, 48, 48, 3)


def test_model_upscaler_by_a1111_name_upscales_the_decoded_image(
    pipe: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``hr_upscaler="R-ESRGAN AnimeVideo"`` (a random-weight file of that configuration in
    ``$SDKIT_UPSCALER_DIR``): the encoder receives the first pass's 8-bit image upscaled by that
    model as A1111's ``resize_image`` does (4x, then Lanczos to 64x64); the upscaler itself is
    held to spandrel in ``test_upscaler.py``. The PNG label keeps A1111's name."""
    import importlib.util

    from sdkit.pipelines.stages.upscaler import load_upscaler

    # the spandrel-checked random weights of test_upscaler.py (beside this file)
    spec = importlib.util.spec_from_file_location("upscaler_cases", Path(__file__).with_name("test_upscaler.py"))
    assert spec is not None and spec.loader is not None
    cases = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cases)
    write_case = cases.write_case

    folder = tmp_path / "ups"
    folder.mkdir()
    write_case("full_animevideov3", tmp_path).rename(folder / "realesr-animevideov3.safetensors")
    monkeypatch.setenv("SDKIT_UPSCALER_DIR", str(folder))
    first = run(pipe, output_type="pil")[0][0]
    with encoder_inputs(pipe) as calls:
        out, _ = run(pipe, enable_hr=True, hr_upscaler="r-esrgan animevideo", hr_scale=2, output_type="pil")
    upscaler = load_upscaler(folder / "realesr-animevideov3.safetensors", "reference")
    want = upscaler.upscale(first, 2.0)  # 32 -> 128 (one 4x pass) -> Lanczos 64
    assert want.size == (64, 64)
    expected = np.asarray(want, dtype=np.float32) / 255 * 2 - 1
    np.testing.assert_allclose(calls[0][0].transpose(1, 2, 0), expected, atol=1e-6)
    assert "Hires upscaler: R-ESRGAN AnimeVideo" in out[0].info["parameters"]
    with pytest.raises(InputError, match=r"unknown hires upscaler 'R-ESRGAN 4x\+'.*R-ESRGAN AnimeVideo"):
        GenerationRequest.create("a", enable_hr=True, hr_upscaler="R-ESRGAN 4x+")
    (folder / "RealESRGAN_x4plus.pth").write_bytes(b"PK\x03\x04 never unpickled")
    with pytest.raises(ModelFormatError, match="params_ema"):  # refused before the first pass runs
        pipe.plan(GenerationRequest.create("a", enable_hr=True, hr_upscaler=str(folder / "RealESRGAN_x4plus.pth")))


def test_second_pass_sampler_and_prompts_of_its_own(pipe: Any) -> None:
    """A1111's hr_sampler_name / hr_scheduler / hr_prompt / hr_negative_prompt: the second pass's
    plan takes them (None or "": the first pass's); the first pass is unchanged."""
    fields = {"enable_hr": True, "hr_scale": 1.5, "hr_second_pass_steps": 2, "denoising_strength": 0.5}
    own = {"hr_sampler": "DPM++ 2M", "hr_schedule": "karras", "hr_prompt": "a boat", "hr_negative_prompt": "fog"}
    own["hr_guidance_scale"] = 4.0
    request = GenerationRequest.create("a house", negative_prompt="rain", **{**BASE, **fields, **own})
    assert (request.hr_sampler, request.hr_schedule) == ("dpmpp_2m", "karras")
    second = pipe.plan(request).hires.plan
    assert (second.request.prompt, second.request.negative_prompt) == ("a boat", "fog")
    assert (request.guidance_scale, second.request.guidance_scale) == (7.5, 4.0)
    assert (second.request.sampler, second.request.schedule, type(second.scheduler).name) == (
        "dpmpp_2m",
        "karras",
        "dpmpp_2m",
    )
    same = pipe.plan(request.replace(hr_sampler=None, hr_schedule=None, hr_prompt="", hr_negative_prompt=None))
    assert (same.hires.plan.request.prompt, same.hires.plan.request.sampler) == ("a house", "euler")
    _, plain = run(pipe, **fields)
    _, changed = run(pipe, **fields, **own)
    for (_, _, got), (_, _, want) in zip(changed[:3], plain[:3], strict=True):
        np.testing.assert_array_equal(got, want)  # the first pass is the request's own
    assert float(np.abs(changed[-1][2] - plain[-1][2]).max()) > 1e-3
    with pytest.raises(InputError, match="hr_prompt is a hires fix option"):
        GenerationRequest.create("a", hr_prompt="b")
