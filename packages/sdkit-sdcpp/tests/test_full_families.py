"""Opt-in, full size: the families stable-diffusion.cpp runs and sdkit never did, each loaded
through ``sdkit.load_pipeline(..., backend="sdcpp")`` and run for one step at 256 px, when its
environment variable names the files (skipped otherwise, saying which variable):

    SDKIT_SDCPP_FLUX1, SDKIT_SDCPP_KONTEXT, SDKIT_SDCPP_FILL, SDKIT_SDCPP_FLUX2, SDKIT_SDCPP_SD3,
    SDKIT_SDCPP_CHROMA, SDKIT_SDCPP_QWEN_IMAGE, SDKIT_SDCPP_QWEN_IMAGE_EDIT, SDKIT_SDCPP_Z_IMAGE,
    SDKIT_SDCPP_WAN (5 frames, written as WebP + PNGs), SDKIT_SDCPP_PHOTOMAKER

Each names a whole single file, or a folder holding the denoiser (the one file whose tensor names
say its family; a Wan2.2 14B high-noise expert has ``high`` in its name) and its component files,
told apart by name: ``*vae*``/``ae.*``, ``*clip_l*``, ``*clip_g*``, ``*t5*`` (T5-XXL, Wan's umT5),
``*clip_vision*``, ``*qwen*``/``*llm*``/``*mistral*`` (the language-model encoder), and for
PhotoMaker an SDXL checkpoint, ``*photomaker*`` and an ``id/`` folder of the person's images.
``SDKIT_SDCPP_THREADS`` sets the threads (default: sd.cpp's).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from sdcpp_helpers import needs_binding

import sdkit
from sdkit_sdcpp.loader import file_family

COMPONENT_NAMES = (  # (part of the file name, load_pipeline keyword), first match wins
    ("clip_vision", "clip_vision"), ("photomaker", "photo_maker"), ("photo_maker", "photo_maker"),
    ("clip_l", "clip_l"), ("clip_g", "clip_g"), ("t5", "t5xxl"), ("qwen", "llm"), ("llm", "llm"),
    ("mistral", "llm"), ("vae", "vae"), ("ae.", "vae"),
)  # fmt: skip
SUFFIXES = (".safetensors", ".sft", ".gguf")


def family_files(variable: str) -> tuple[Path, dict[str, str], str]:
    """The denoiser (or whole file), its component files by keyword, and its family."""
    given = os.environ.get(variable)
    if not given:
        pytest.skip(f"full-size opt-in test: set {variable}=<file or folder> (see this module's docstring)")
    root = Path(given).expanduser()
    if root.is_file():
        return root, {}, file_family(root)
    files: dict[str, str] = {}
    denoisers: list[Path] = []
    for path in sorted(p for p in root.iterdir() if p.suffix.lower() in SUFFIXES):
        lower = path.name.lower()
        family = file_family(path)
        if family.startswith("Wan") and "high" in lower:
            files["high_noise_diffusion_model"] = str(path)
        elif family != "unknown" and not any(part in lower for part, _ in COMPONENT_NAMES[:2]):
            denoisers.append(path)
        else:
            keyword = next((key for part, key in COMPONENT_NAMES if part in lower), None)
            assert keyword is not None, f"{path.name}: not a component name this test knows ({COMPONENT_NAMES})"
            files[keyword] = str(path)
    assert len(denoisers) == 1, f"{root}: one denoiser file expected, found {[p.name for p in denoisers]}"
    return denoisers[0], files, file_family(denoisers[0])


def _load(path: Path, files: dict[str, str]) -> Any:
    threads = int(os.environ.get("SDKIT_SDCPP_THREADS", "-1"))
    return sdkit.load_pipeline(path, backend="sdcpp", threads=threads, **files)


def _check(images: list[Image.Image], size: tuple[int, int]) -> None:
    assert images and all(image.size == size for image in images)
    pixels = np.asarray(images[0], np.float32)
    assert np.isfinite(pixels).all() and pixels.std() > 0  # an image, not a blank
    assert "Engine: stable-diffusion.cpp" in images[0].info["parameters"]


FAMILIES = {  # variable -> (family prefix its file must have, extra request fields)
    "SDKIT_SDCPP_FLUX1": ("FLUX.1", {}),
    "SDKIT_SDCPP_KONTEXT": ("FLUX.1", {"reference_images": "ref"}),
    "SDKIT_SDCPP_FILL": ("FLUX.1 Fill", {"init_image": "ref", "mask": "mask"}),
    "SDKIT_SDCPP_FLUX2": ("FLUX.2", {}),
    "SDKIT_SDCPP_SD3": ("SD3", {}),
    "SDKIT_SDCPP_CHROMA": ("Chroma", {}),
    "SDKIT_SDCPP_QWEN_IMAGE": ("Qwen-Image", {}),
    "SDKIT_SDCPP_QWEN_IMAGE_EDIT": ("Qwen-Image", {"reference_images": "ref"}),
    "SDKIT_SDCPP_Z_IMAGE": ("Z-Image", {}),
}


def _fields(extra: dict[str, str]) -> dict[str, Any]:
    ref = Image.fromarray(np.random.default_rng(0).integers(0, 256, (256, 256, 3), np.uint8))
    mask = np.zeros((256, 256), np.uint8)
    mask[64:192, 64:192] = 255
    values = {"ref": ref, "mask": mask}
    return {name: ([values[v]] if name == "reference_images" else values[v]) for name, v in extra.items()}


@needs_binding
@pytest.mark.parametrize("variable", list(FAMILIES))
def test_family_one_step_at_256(variable: str) -> None:
    prefix, extra = FAMILIES[variable]
    path, files, family = family_files(variable)
    assert family.startswith(prefix), f"{path.name} is a {family} file, not {prefix}"
    with _load(path, files) as pipe:
        images = pipe.generate("a red lighthouse", seed=1, steps=1, width=256, height=256, **_fields(extra))
    _check(images, (256, 256))


@needs_binding
def test_wan_five_frames_at_256(tmp_path: Path) -> None:
    from sdkit.pipelines.imaging.video import read_webp_parameters, save_video

    path, files, family = family_files("SDKIT_SDCPP_WAN")
    assert family.startswith("Wan"), f"{path.name} is a {family} file, not Wan"
    fields: dict[str, Any] = {"video_frames": 5, "fps": 16}
    if "I2V" in family:  # I2V and TI2V take the first frame
        fields["init_image"] = Image.new("RGB", (256, 256), (200, 60, 40))
    with _load(path, files) as pipe:
        frames = pipe.generate("a boat on a lake", seed=1, steps=1, width=256, height=256, **fields)
    assert len(frames) == 5
    _check(frames, (256, 256))
    webp, pngs = save_video(frames, tmp_path / "wan.webp", frames[0].info["sdkit_video"], fps=16)
    with Image.open(webp) as video:
        assert video.n_frames == 5
    assert len(pngs) == 5 and "Frames: 5, FPS: 16" in (read_webp_parameters(webp) or "")


@needs_binding
def test_photomaker_one_step_at_256() -> None:
    path, files, family = family_files("SDKIT_SDCPP_PHOTOMAKER")
    assert family.startswith("SDXL") and "photo_maker" in files, f"{path.name}: an SDXL file and *photomaker*"
    folder = Path(os.environ["SDKIT_SDCPP_PHOTOMAKER"]) / "id"
    with _load(path, files) as pipe:
        images = pipe.generate(
            "a photo of a man img", seed=1, steps=1, width=256, height=256, photomaker_images=str(folder),
            photomaker_style_strength=20,
        )  # fmt: skip
    _check(images, (256, 256))
