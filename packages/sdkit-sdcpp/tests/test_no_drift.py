"""No drift: for the same request and seed, the plugin's image equals calling
stable-diffusion-cpp-python directly (written here with sd.cpp's own names), pixel for pixel.

Full-architecture random-weight files (``sdcpp_checkpoints``): SD 1.5 (2.1 GB, written in ~40 s,
generations at 64 px) and SDXL (6.9 GB); both are marked ``slow``. Each feature's image is also
checked to differ from plain txt2img's, so an option dropped on the way would fail.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from sdcpp_checkpoints import cached_checkpoint, write_lora
from sdcpp_helpers import needs_binding

import sdkit
from sdkit.cli.main import main
from sdkit_sdcpp import binding

pytestmark = [needs_binding, pytest.mark.slow]
THREADS = 2


@pytest.fixture(scope="module")
def direct(sd15: Path) -> Iterator[Any]:
    # Loaded as the plugin loads it (RTLD_DEEPBIND): in a test process where sdkit-ggml already
    # put libggml-python's ggml in the global scope, a plain load would run sd.cpp's ggml calls
    # on that other ggml (test_another_ggml_in_the_process shows the plugin is immune).
    binding.import_binding()
    from stable_diffusion_cpp import StableDiffusion

    model = StableDiffusion(  # the plugin's settings: LoRAs at runtime (weights never modified)
        model_path=str(sd15), n_threads=THREADS, vae_decode_only=False, lora_apply_mode="at_runtime", verbose=False
    )
    yield model
    model.close()


@pytest.fixture(scope="module")
def pipe(sd15: Path) -> Iterator[Any]:
    with sdkit.load_pipeline(sd15, backend="sdcpp", threads=THREADS) as loaded:
        yield loaded


def _pixels(image: Image.Image) -> np.ndarray:
    return np.asarray(image.convert("RGB"))


def test_txt2img_equals_the_binding(pipe: Any, direct: Any) -> None:
    steps: list[tuple[int, int]] = []
    [ours] = pipe.generate(
        "a photo of a cat", negative_prompt="blurry", seed=7, steps=3, width=64, height=64,
        sampler="DPM++ 2M Karras", guidance_scale=5.0, callback=lambda i, n, _: steps.append((i, n)),
    )  # fmt: skip
    [theirs] = direct.generate_image(
        prompt="a photo of a cat", negative_prompt="blurry", seed=7, sample_steps=3, width=64, height=64,
        sample_method="dpm++2m", scheduler="karras", cfg_scale=5.0,
    )  # fmt: skip
    assert np.array_equal(_pixels(ours), _pixels(theirs))
    assert _pixels(ours).std() > 1  # an image, not a flat field
    assert steps == [(0, 3), (1, 3), (2, 3)]
    assert "Sampler: DPM++ 2M, Schedule type: Karras, CFG scale: 5, Seed: 7, Size: 64x64" in ours.info["parameters"]


def test_batch_seeds_equal_the_binding(pipe: Any, direct: Any) -> None:
    ours = pipe.generate("a dog", seed=11, steps=2, width=64, height=64, num_images=2, sampler="euler")
    theirs = direct.generate_image(
        prompt="a dog", seed=11, sample_steps=2, width=64, height=64, batch_count=2, sample_method="euler",
        cfg_scale=7.5,
    )  # fmt: skip
    for a, b in zip(ours, theirs, strict=True):
        assert np.array_equal(_pixels(a), _pixels(b))
    assert [image.info["sdkit_parameters"].seed for image in ours] == [11, 12]
    assert not np.array_equal(_pixels(ours[0]), _pixels(ours[1]))


def test_img2img_and_inpainting_equal_the_binding(pipe: Any, direct: Any) -> None:
    init = Image.fromarray((np.random.default_rng(1).random((64, 64, 3)) * 255).astype(np.uint8))
    mask = np.zeros((64, 64), np.uint8)
    mask[:, 32:] = 255
    common = {"seed": 3, "width": 64, "height": 64}
    [ours] = pipe.generate("a house", steps=4, strength=0.5, init_image=init, sampler="euler_a", **common)
    [theirs] = direct.generate_image(
        prompt="a house", sample_steps=4, strength=0.5, init_image=init, sample_method="euler_a", cfg_scale=7.5,
        **common,
    )  # fmt: skip
    assert np.array_equal(_pixels(ours), _pixels(theirs))
    [masked] = pipe.generate("a house", steps=4, strength=0.5, init_image=init, mask=mask, sampler="euler_a", **common)
    [reference] = direct.generate_image(
        prompt="a house", sample_steps=4, strength=0.5, init_image=init, mask_image=Image.fromarray(mask, "L"),
        sample_method="euler_a", cfg_scale=7.5, **common,
    )  # fmt: skip
    assert np.array_equal(_pixels(masked), _pixels(reference))
    assert not np.array_equal(_pixels(masked), _pixels(ours))
    assert "Denoising strength: 0.5" in masked.info["parameters"]


def test_vae_tiling_and_lora_equal_the_binding(pipe: Any, direct: Any, tmp_path: Path) -> None:
    common = {"seed": 5, "width": 96, "height": 64}
    [plain] = pipe.generate("a tree", steps=2, sampler="euler", **common)
    [tiled] = pipe.generate("a tree", steps=2, sampler="euler", vae_tiling=True, vae_tile_size=32, **common)
    [reference] = direct.generate_image(
        prompt="a tree", sample_steps=2, sample_method="euler", cfg_scale=7.5, vae_tiling=True,
        vae_tile_size="4x4", vae_tile_overlap=0.25, **common,
    )  # fmt: skip
    assert np.array_equal(_pixels(tiled), _pixels(reference))
    assert not np.array_equal(_pixels(tiled), _pixels(plain))
    lora = write_lora(tmp_path / "style.safetensors")
    pipe.set_loras([(lora, 0.8)])
    try:
        [ours] = pipe.generate("a tree", steps=2, sampler="euler", **common)
    finally:
        pipe.set_loras([])
    [theirs] = direct.generate_image(
        prompt=f"a tree<lora:{lora}:0.8>", sample_steps=2, sample_method="euler", cfg_scale=7.5, **common
    )
    assert np.array_equal(_pixels(ours), _pixels(theirs))
    assert not np.array_equal(_pixels(ours), _pixels(plain))  # the LoRA was applied, not dropped
    assert 'Lora: "style: 0.8"' in ours.info["parameters"]
    [after] = pipe.generate("a tree", steps=2, sampler="euler", **common)
    assert np.array_equal(_pixels(after), _pixels(plain))  # without it again: the base, bit for bit


def test_cli_generate_equals_the_binding(sd15: Path, direct: Any, tmp_path: Path) -> None:
    out = tmp_path / "cat.png"
    argv = ["generate", "--model", str(sd15), "--backend", "sdcpp", "--threads", str(THREADS), "-W", "64", "-H", "64"]
    argv += ["--steps", "2", "--seed", "9", "--sampler", "euler", "-o", str(out), "a cat"]
    assert main(argv) == 0
    [theirs] = direct.generate_image(
        prompt="a cat", seed=9, sample_steps=2, width=64, height=64, sample_method="euler", cfg_scale=7.0
    )
    saved = Image.open(out)
    assert np.array_equal(_pixels(saved), _pixels(theirs))
    expected = "a cat\nSteps: 2, Sampler: Euler, Schedule type: Automatic, CFG scale: 7"
    assert saved.text["parameters"].startswith(expected)


CLASH = """
import sys, numpy as np, sdkit
from sdkit_ggml.runtime.lib import load_library
load_library()  # libggml-python's ggml, loaded RTLD_GLOBAL, before stable-diffusion.cpp
pipe = sdkit.load_pipeline(sys.argv[1], backend="sdcpp", threads=int(sys.argv[3]))
[image] = pipe.generate("a cat", seed=9, steps=2, width=64, height=64, sampler="euler", guidance_scale=7.0)
np.save(sys.argv[2], np.asarray(image.convert("RGB")))
"""


def test_another_ggml_in_the_process(sd15: Path, direct: Any, tmp_path: Path) -> None:
    """sdkit-ggml's ggml loaded first (as in a process that ran a graph on it) changes no pixel."""
    import subprocess
    import sys

    pytest.importorskip("sdkit_ggml")
    out = tmp_path / "clash.npy"
    subprocess.run([sys.executable, "-c", CLASH, str(sd15), str(out), str(THREADS)], check=True)
    [theirs] = direct.generate_image(
        prompt="a cat", seed=9, sample_steps=2, width=64, height=64, sample_method="euler", cfg_scale=7.0
    )
    assert np.array_equal(np.load(out), _pixels(theirs))


def test_sdxl_equals_the_binding(request: pytest.FixtureRequest) -> None:
    from stable_diffusion_cpp import StableDiffusion

    sdxl = cached_checkpoint(request, "sdxl")
    with sdkit.load_pipeline(sdxl, backend="sdcpp", threads=THREADS) as sdxl_pipe:
        assert sdxl_pipe.family == "SDXL" and sdxl_pipe.config.default_size == 1024
        [ours] = sdxl_pipe.generate("a castle", seed=2, steps=2, width=64, height=64, sampler="euler")
    binding.import_binding()
    model = StableDiffusion(
        model_path=str(sdxl), n_threads=THREADS, vae_decode_only=False, lora_apply_mode="at_runtime", verbose=False
    )
    try:
        [theirs] = model.generate_image(
            prompt="a castle", seed=2, sample_steps=2, width=64, height=64, sample_method="euler", cfg_scale=7.5
        )
    finally:
        model.close()
    assert np.array_equal(_pixels(ours), _pixels(theirs))
