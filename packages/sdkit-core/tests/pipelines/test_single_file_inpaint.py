"""Inpainting from single-file checkpoints: a SD 1.x inpainting ``.safetensors`` (9-channel UNet,
LDM key layout, fp16 and bf16) runs on ``StableDiffusionPipeline`` with its mask and init image.

Oracle: diffusers 0.42.1's ``StableDiffusionInpaintPipeline.from_single_file`` on the same tiny
files (``fixtures/families/make_inpaint_goldens.py`` -> ``tiny/sd1_inpaint/inpaint_goldens.*``):
Euler, CFG 7.5, 32x32, seed 11, sdkit's noise stream in diffusers' draw order; ``full`` is
strength 1.0 (3 steps), ``partial`` strength 0.75 (4 steps, 3 run). Required: max |diff| <= 1e-3
on [0, 1] pixels on the reference, ggml (threads=1) and openvino backends.
"""

from __future__ import annotations

import json
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import sdkit
from sdkit.errors import InputError, UnsupportedFamilyError, UnsupportedModelError
from sdkit.families import Family, FamilyComponent, builtin
from sdkit.pipelines.loaders import families as pipeline_families
from sdkit.pipelines.models.stable_diffusion import StableDiffusionPipeline
from sdkit.testing.cli_output import without_progress

FOLDER = Path(__file__).resolve().parents[4] / "fixtures" / "families" / "tiny" / "sd1_inpaint"
TOLERANCE = 1e-3
PROMPT = "a photo of an astronaut riding a horse on the moon"
pytestmark = pytest.mark.skipif(not (FOLDER / "inpaint_goldens.npz").is_file(), reason="inpaint goldens missing")


@lru_cache(maxsize=1)
def goldens() -> dict[str, np.ndarray]:
    with np.load(FOLDER / "inpaint_goldens.npz", allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


@lru_cache(maxsize=1)
def meta() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FOLDER / "inpaint_goldens.json").read_text(encoding="utf-8"))
    return data


def request(file: str, case: str) -> dict[str, Any]:
    c = meta()["files"][file][case]
    return {
        "negative_prompt": c["negative_prompt"],
        "steps": c["num_inference_steps"],
        "strength": c["strength"],
        "guidance_scale": c["guidance_scale"],
        "width": c["width"],
        "height": c["height"],
        "seed": c["seed"],
        "sampler": "euler",
        "init_image": goldens()["inputs/init_image"],
        "mask": goldens()["inputs/mask"],
        "output_type": "np",
    }


def _backend(name: str) -> dict[str, Any]:
    info = next((b for b in sdkit.backends() if b.name == name), None)
    if info is None or not info.available:
        pytest.skip(f"backend {name} unavailable: {info.reason if info else 'not installed'}")
    return {"threads": 1} if name == "ggml" else {}


def _load(file: str, backend: str) -> Any:
    try:
        return sdkit.load_pipeline(FOLDER / f"{file}.safetensors", backend=backend, **_backend(backend))
    except UnsupportedModelError as exc:  # a backend gap: say which node, never work around it
        pytest.fail(f"{backend} cannot run the tiny inpainting graphs: {exc}")


FILES = ("sd1_inpaint_fp16", "sd1_inpaint_bf16")


@pytest.mark.parametrize("backend", ["reference", "ggml", "openvino"])
@pytest.mark.parametrize("file", FILES)
def test_inpainting_file_equals_diffusers(tiny_families: dict[str, Family], backend: str, file: str) -> None:
    """Both cases (strength 1 and 0.75) on one loaded pipeline: the images are diffusers'."""
    pipe = _load(file, backend)
    assert type(pipe) is StableDiffusionPipeline and pipe.config.inpainting
    assert pipe.checkpoint is not None and pipe.checkpoint.family.name == "tiny_sd1_inpaint"
    for case in ("full", "partial"):
        image = pipe.generate(PROMPT, **request(file, case))
        assert np.abs(image - goldens()[f"{file}/{case}/image"]).max() <= TOLERANCE, case
    assert set(pipe.backends().values()) <= {backend, None}


def test_the_goldens_tell_the_files_and_cases_apart() -> None:
    """The tolerance is tighter than what the test must tell apart: fp16 vs bf16 weights, strength."""
    g = goldens()
    assert np.abs(g["sd1_inpaint_fp16/full/image"] - g["sd1_inpaint_bf16/full/image"]).max() > 2 * TOLERANCE
    assert np.abs(g["sd1_inpaint_fp16/full/image"] - g["sd1_inpaint_fp16/partial/image"]).max() > 10 * TOLERANCE


def test_without_a_mask_is_one_clear_error(tiny_families: dict[str, Family]) -> None:
    """As diffusers' StableDiffusionInpaintPipeline (image and mask_image are required): txt2img and
    img2img without a mask are refused before anything runs."""
    pipe = sdkit.load_pipeline(FOLDER / "sd1_inpaint_fp16.safetensors", backend="reference", prepare=False)
    for extra in ({}, {"init_image": goldens()["inputs/init_image"]}):
        with pytest.raises(InputError, match=r"is an inpainting model .*give an init_image and a mask"):
            pipe.generate(PROMPT, steps=4, width=32, height=32, **extra)
    assert all(c.compiled is None for c in pipe.components.values())


def test_set_checkpoint_between_inpainting_files(tiny_families: dict[str, Family]) -> None:
    pipe = _load("sd1_inpaint_fp16", "reference")
    assert set(pipe.set_checkpoint(FOLDER / "sd1_inpaint_bf16.safetensors")) >= {"unet", "text_encoder"}
    assert pipe.config.inpainting
    image = pipe.generate(PROMPT, **request("sd1_inpaint_bf16", "full"))
    assert np.abs(image - goldens()["sd1_inpaint_bf16/full/image"]).max() <= TOLERANCE


def test_builtin_inpainting_families() -> None:
    assert builtin.SD1_INPAINT.label == "SD 1.x inpainting" and builtin.SD1_INPAINT.inpainting
    assert builtin.SD1_INPAINT.components["unet"].probes["conv_in.weight"] == (320, 9, 3, 3)
    assert pipeline_families.pipeline_class(builtin.SD1_INPAINT) is StableDiffusionPipeline
    assert builtin.SDXL_INPAINT.inpainting and not builtin.SD1.inpainting and not builtin.SDXL.inpainting
    with pytest.raises(UnsupportedFamilyError, match=r"SDXL inpainting checkpoint .*sdxl_inpaint_unet\) yet"):
        pipeline_families.pipeline_class(builtin.SDXL_INPAINT, "model.safetensors")


def test_a_family_whose_graph_is_not_shipped_is_refused_at_load(
    tiny_families: dict[str, Family], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file of such a family (SDXL inpainting today; here the tiny SD 1.x inpainting family with
    the unshipped graph's name) is refused with one ``UnsupportedFamilyError``, before mapping."""
    family = tiny_families["sd1_inpaint"]
    unet = FamilyComponent("sdxl_inpaint_unet", family.components["unet"].layouts, family.components["unet"].probes)
    unshipped = replace(family, components={**family.components, "unet": unet})
    monkeypatch.setattr(pipeline_families, "registered_families", lambda: [unshipped])
    with pytest.raises(UnsupportedFamilyError, match=r"sdkit does not ship the unet graph it runs on"):
        sdkit.load_pipeline(FOLDER / "sd1_inpaint_fp16.safetensors", backend="reference")


def test_generate_and_inspect_from_the_command_line(
    tiny_families: dict[str, Family], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``sdkit generate --model tiny_inpaint.safetensors --init-image ... --mask ...``: diffusers'
    image (rounded to 8 bits by the PNG); ``sdkit inspect`` says it is an inpainting checkpoint."""
    import shutil

    from sdkit.cli.main import main

    model = Path(shutil.copy(FOLDER / "sd1_inpaint_fp16.safetensors", tmp_path / "tiny_inpaint.safetensors"))
    out = tmp_path / "out.png"
    argv = ["generate", PROMPT, "--model", str(model), "-o", str(out), "--backend", "reference"]
    argv += ["--init-image", str(FOLDER / "init.png"), "--mask", str(FOLDER / "mask.png"), "--strength", "1"]
    argv += ["--negative", "blurry, low quality", "--steps", "3", "--seed", "11", "--sampler", "euler", "--cfg", "7.5"]
    assert main(argv) == 0
    with Image.open(out) as image:
        pixels = np.asarray(image, dtype=np.float32) / 255
        assert "Model: tiny_inpaint" in image.info["parameters"]
    assert np.abs(pixels - goldens()["sd1_inpaint_fp16/full/image"][0]).max() <= 0.5 / 255 + TOLERANCE
    capsys.readouterr()
    assert main(["inspect", "--json", str(model)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["kind"] == "checkpoint" and data["title"] == "tiny sd1_inpaint checkpoint"
    assert data["details"]["inpainting"].startswith("yes")
    argv = ["generate", PROMPT, "--model", str(model), "-o", str(out), "--backend", "reference", "--force"]
    assert main(argv) == 1
    err = without_progress(capsys.readouterr().err)
    assert err.startswith("sdkit: error: ") and "is an inpainting model" in err and err.count("\n") == 1, err
