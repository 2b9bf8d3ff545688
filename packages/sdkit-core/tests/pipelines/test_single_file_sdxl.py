"""SDXL base and refiner single-file checkpoints through the SDXL pipeline, on the tiny graphs.

Oracles (``fixtures/families/tiny/``): diffusers' ``StableDiffusionXLPipeline.from_single_file``
on the same files with sdkit's noise stream (``sdxl/goldens.npz``, ``sdxl_<dtype>/txt2img/image``:
Euler, 3 steps, CFG 7.5, 32x32, seed 11; ``make_checkpoints.py``), and the base handing its
latents to ``StableDiffusionXLImg2ImgPipeline.from_single_file`` at 0.5 (``sdxl_refiner/goldens.npz``,
``sdxl_refiner_<dtype>/base_refiner/image``: Euler, 6 steps, CFG 5, seed 35, aesthetic scores
6 / 2.5; ``make_refiner_goldens.py``). Required: max |diff| <= 1e-3 on [0, 1] pixels on the
reference, ggml and openvino backends, from fp16 and bf16 files.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import sdkit
from sdkit.cli.main import main
from sdkit.errors import UnsupportedModelError
from sdkit.families import Family
from sdkit.pipelines import StableDiffusionPipeline, StableDiffusionXLPipeline
from sdkit.pipelines.loaders.loading import pipeline_class_for

TINY = Path(__file__).resolve().parents[4] / "fixtures" / "families" / "tiny"
TOLERANCE = 1e-3
PROMPT = "a photo of an astronaut riding a horse on the moon"
NEGATIVE = "blurry, low quality"
TXT2IMG: dict[str, Any] = {
    "negative_prompt": NEGATIVE,
    "steps": 3,
    "guidance_scale": 7.5,
    "width": 32,
    "height": 32,
    "seed": 11,
    "sampler": "euler",
    "output_type": "np",
}
REFINED: dict[str, Any] = {
    **TXT2IMG,
    "steps": 6,
    "guidance_scale": 5.0,
    "seed": 35,
    "refiner_switch_at": 0.5,
    "aesthetic_score": 6.0,
    "negative_aesthetic_score": 2.5,
}
BACKENDS = ("reference", "ggml", "openvino")


def golden(family: str, key: str) -> np.ndarray:
    with np.load(TINY / family / "goldens.npz", allow_pickle=False) as data:
        image: np.ndarray = data[key]
    return image


def _backend(name: str) -> None:
    info = next((b for b in sdkit.backends() if b.name == name), None)
    if info is None or not info.available:
        pytest.skip(f"backend {name} unavailable: {info.reason if info else 'not installed'}")


def _load(path: Path, backend: str) -> Any:
    options = {"threads": 1} if backend == "ggml" else {}  # ggml threads spin on a loaded machine
    try:
        return sdkit.load_pipeline(path, backend=backend, **options)
    except UnsupportedModelError as exc:  # a backend gap: say which node, never work around it
        pytest.fail(f"{backend} cannot run a tiny SDXL graph: {exc}")


@pytest.fixture(params=BACKENDS)
def pipes(request: pytest.FixtureRequest, tiny_families: dict[str, Family]) -> Iterator[tuple[str, Any, Any]]:
    """The fp16 base and refiner files loaded on one backend."""
    backend = request.param
    _backend(backend)
    base = _load(TINY / "sdxl" / "sdxl_fp16.safetensors", backend)
    refiner = _load(TINY / "sdxl_refiner" / "sdxl_refiner_fp16.safetensors", backend)
    yield backend, base, refiner
    base.close()
    refiner.close()


def test_sdxl_files_from_fp16_and_bf16_equal_diffusers(pipes: tuple[str, Any, Any]) -> None:
    """txt2img from the fp16 file, then the bf16 file swapped in (refit where the backend can):
    both images are diffusers' ``from_single_file`` images; so are base + refiner from the fp16
    files, then from the bf16 ones."""
    backend, base, refiner = pipes
    assert isinstance(base, StableDiffusionXLPipeline) and isinstance(refiner, StableDiffusionXLPipeline)
    assert not base.is_refiner and refiner.is_refiner
    assert base.config.force_zeros_for_empty_prompt and not refiner.config.force_zeros_for_empty_prompt
    assert set(base.config.fp32_components) == {"vae_decoder", "vae_encoder"}
    diffs = {}
    for dtype in ("fp16", "bf16"):
        if dtype == "bf16":
            base.set_checkpoint(TINY / "sdxl" / "sdxl_bf16.safetensors")
            refiner.set_checkpoint(TINY / "sdxl_refiner" / "sdxl_refiner_bf16.safetensors")
        image = base.generate(PROMPT, **TXT2IMG)
        diffs[f"txt2img {dtype}"] = float(np.abs(image - golden("sdxl", f"sdxl_{dtype}/txt2img/image")).max())
        image = base.generate(PROMPT, refiner=refiner, **REFINED)
        want = golden("sdxl_refiner", f"sdxl_refiner_{dtype}/base_refiner/image")
        diffs[f"base+refiner {dtype}"] = float(np.abs(image - want).max())
    assert set(base.backends().values()) <= {backend, None}
    assert max(diffs.values()) <= TOLERANCE, diffs


def test_sdxl_diffusers_layout_file(tiny_families: dict[str, Family]) -> None:
    """The same fp16 values in the diffusers layout (one file, component prefixes)."""
    pipe = _load(TINY / "sdxl" / "sdxl_diffusers_fp16.safetensors", "reference")
    assert pipe.checkpoint is not None and pipe.checkpoint.layout == "diffusers"
    image = pipe.generate(PROMPT, **TXT2IMG)
    assert np.abs(image - golden("sdxl", "sdxl_fp16/txt2img/image")).max() <= TOLERANCE


def test_the_file_picks_the_pipeline_class(tiny_families: dict[str, Family]) -> None:
    """From the header alone, before any model loads (what the CLI checks SDXL options with)."""
    assert pipeline_class_for(TINY / "sdxl" / "sdxl_bf16.safetensors") is StableDiffusionXLPipeline
    assert pipeline_class_for(TINY / "sdxl_refiner" / "sdxl_refiner_fp16.safetensors") is StableDiffusionXLPipeline
    assert pipeline_class_for(TINY / "sd1" / "sd1_fp16.safetensors") is StableDiffusionPipeline
    assert pipeline_class_for(TINY / "sd1_inpaint" / "sd1_inpaint_fp16.safetensors") is StableDiffusionPipeline


def test_cli_generates_from_an_sdxl_file(
    tiny_families: dict[str, Family], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``sdkit generate --model my_xl.safetensors --refiner my_refiner.safetensors``: the SDXL
    pipeline for both files, diffusers' image (8-bit PNG); ``--prompt-2`` refused on SD 1.x."""
    model = Path(shutil.copy(TINY / "sdxl" / "sdxl_fp16.safetensors", tmp_path / "my_xl.safetensors"))
    refiner = Path(shutil.copy(TINY / "sdxl_refiner" / "sdxl_refiner_fp16.safetensors", tmp_path / "ref.safetensors"))
    out = tmp_path / "castle.png"
    argv = ["generate", PROMPT, "--model", str(model), "-o", str(out), "--negative", NEGATIVE, "--steps", "6"]
    argv += ["--seed", "35", "--sampler", "euler", "--cfg", "5", "--width", "32", "--height", "32"]
    argv += ["--backend", "reference", "--refiner", str(refiner), "--refiner-switch-at", "0.5"]
    assert main(argv) == 0
    expected = golden("sdxl_refiner", "sdxl_refiner_fp16/base_refiner/image")[0]
    with Image.open(out) as image:
        pixels = np.asarray(image, dtype=np.float32) / 255
        assert "Model: my_xl" in image.info["parameters"] and "Refiner: ref" in image.info["parameters"]
    assert np.abs(pixels - expected).max() <= 0.5 / 255 + TOLERANCE
    capsys.readouterr()
    sd1 = ["generate", PROMPT, "--model", str(TINY / "sd1" / "sd1_fp16.safetensors"), "--prompt-2", "x"]
    assert main([*sd1, "-o", str(tmp_path / "no.png")]) == 1
    assert "prompt-2" in capsys.readouterr().err
