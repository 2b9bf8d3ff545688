"""Bad requests and bad folders give one clear SdkitError."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import sdkit
from sdkit.errors import DeviceError, InputError, ModelFormatError, OptionError, SdkitError


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(ModelFormatError, match="not found"):
        sdkit.load_pipeline(tmp_path / "nope")


def test_folder_that_is_not_a_pipeline(tmp_path: Path) -> None:
    with pytest.raises(ModelFormatError, match=r"no model_index\.json"):
        sdkit.load_pipeline(tmp_path)


def test_file_instead_of_folder(tiny_dir: Path) -> None:
    with pytest.raises(ModelFormatError, match="not a pipeline folder"):
        sdkit.load_pipeline(tiny_dir / "model_index.json")


def test_missing_model_file(tiny_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "pipe"
    shutil.copytree(tiny_dir, copy, ignore=shutil.ignore_patterns("unet"))
    with pytest.raises(ModelFormatError, match=r"unet/model\.onnx"):
        sdkit.load_pipeline(copy, backend="reference")


def test_truncated_model_file(tiny_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "pipe"
    shutil.copytree(tiny_dir, copy)
    data = (copy / "vae_decoder" / "model.onnx").read_bytes()
    (copy / "vae_decoder" / "model.onnx").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFormatError):
        sdkit.load_pipeline(copy, backend="reference")


def test_depth_unet_is_refused(tiny_dir: Path, tmp_path: Path) -> None:
    """A UNet with neither the latents' channels nor an inpainting UNet's (2c + 1): refused."""
    copy = tmp_path / "pipe"
    shutil.copytree(tiny_dir, copy)
    config = json.loads((copy / "unet" / "config.json").read_text(encoding="utf-8"))
    config["in_channels"] = 5
    (copy / "unet" / "config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(ModelFormatError, match="5 input channels"):
        sdkit.load_pipeline(copy, backend="reference")


def test_load_model_recognises_pipeline_folders(tiny_dir: Path) -> None:
    pipe = sdkit.load_model(tiny_dir, backend="reference", memory="offload")
    assert isinstance(pipe, sdkit.pipelines.StableDiffusionPipeline)


def test_bad_options(tiny_dir: Path) -> None:
    with pytest.raises(OptionError, match="memory policy"):
        sdkit.load_pipeline(tiny_dir, memory="sometimes")
    with pytest.raises(OptionError, match="component 'unte'"):
        sdkit.load_pipeline(tiny_dir, backend={"unte": "reference"})
    with pytest.raises(SdkitError, match="backend"):
        sdkit.load_pipeline(tiny_dir, backend="no-such-backend")


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"width": 36}, InputError, "width must be a multiple of 8"),
        ({"height": 0}, InputError, "height must be an integer >= 8"),
        ({"steps": 0}, InputError, "steps must be an integer >= 1"),
        ({"num_images": 0}, InputError, "num_images"),
        ({"sampler": "eulr_a"}, SdkitError, "eulr_a"),
        ({"guidance_scale": float("nan")}, InputError, "guidance_scale"),
        ({"latents": np.zeros((1, 4, 8, 8), np.float32)}, InputError, "latents must be float32"),
        ({"init_image": np.zeros((32, 32, 3), np.uint8), "strength": 1.5}, InputError, "strength"),
        ({"init_image": "/no/such/image.png"}, InputError, "init image not found"),
        ({"init_image": np.zeros((32, 32), np.float32)}, InputError, "uint8"),
        ({"output_type": "tensor"}, InputError, "output_type"),
        ({"init_image": np.zeros((32, 32, 3), np.uint8), "strength": 0.1}, InputError, "leaves no step"),
        ({"strength": "lots"}, InputError, "strength must be a number"),
    ],
)
def test_bad_requests(reference_pipe: Any, kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    base = {"width": 32, "height": 32, "steps": 1, "seed": 0}
    with pytest.raises(error, match=match):
        reference_pipe.generate("a cat", **{**base, **kwargs})


def test_devices_per_component(tiny_dir: Path) -> None:
    pipe = sdkit.load_pipeline(tiny_dir, backend="reference", device={"unet": "cpu", "default": None}, memory="offload")
    assert pipe.components["unet"].device == "cpu"
    with pytest.raises(DeviceError, match="no device"):
        sdkit.load_pipeline(tiny_dir, backend="reference", device="cuda:3")


def test_img2img_without_vae_encoder(tiny_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "pipe"
    shutil.copytree(tiny_dir, copy, ignore=shutil.ignore_patterns("vae_encoder"))
    pipe = sdkit.load_pipeline(copy, backend="reference")
    with pytest.raises(ModelFormatError, match="vae_encoder"):
        pipe.generate("a cat", init_image=np.zeros((32, 32, 3), np.uint8), steps=2, seed=0)
