"""TAEF2 (real weights) through ggml vs onnxruntime, and the photo round trip."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import sdkit
from sdkit.model import load_onnx

ort = pytest.importorskip("onnxruntime")


def _ort(path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, feeds)[0])


def _photo(taef2: Path, size: int) -> np.ndarray:
    from PIL import Image

    image = np.asarray(Image.open(taef2 / "dog.png").convert("RGB"), dtype=np.float32) / 255.0
    top = (image.shape[0] - size) // 2
    crop = image[top : top + size, top : top + size]
    return np.ascontiguousarray(crop.transpose(2, 0, 1)[None])


@pytest.mark.parametrize("name", ["taef2_encoder.onnx", "taef2_decoder.onnx"])
def test_matches_onnxruntime(taef2: Path, name: str) -> None:
    model = load_onnx(taef2 / name)
    shape = (1, 3, 64, 64) if "encoder" in name else (1, 32, 8, 8)
    x = np.random.default_rng(0).random(shape, dtype=np.float32)
    feeds = {model.inputs[0].name: x}
    got = sdkit.compile(model, backend="ggml").run(feeds)[model.outputs[0].name]
    want = _ort(taef2 / name, feeds)
    assert got.shape == want.shape
    assert float(np.abs(got - want).max()) <= 1e-3


def _round_trip_psnr(taef2: Path, size: int) -> tuple[float, float]:
    image = _photo(taef2, size)
    encoder, decoder = load_onnx(taef2 / "taef2_encoder.onnx"), load_onnx(taef2 / "taef2_decoder.onnx")
    latent = sdkit.compile(encoder, backend="ggml").run({encoder.inputs[0].name: image})[encoder.outputs[0].name]
    decoded = sdkit.compile(decoder, backend="ggml").run({decoder.inputs[0].name: latent})[decoder.outputs[0].name]
    ref_latent = _ort(taef2 / "taef2_encoder.onnx", {encoder.inputs[0].name: image})
    ref = _ort(taef2 / "taef2_decoder.onnx", {decoder.inputs[0].name: ref_latent})

    def psnr(out: np.ndarray) -> float:
        mse = float(np.mean((np.clip(out, 0, 1) - image) ** 2))
        return 10 * np.log10(1.0 / mse)

    return psnr(decoded), psnr(ref)


def test_round_trip_crop(taef2: Path) -> None:
    ours, reference = _round_trip_psnr(taef2, 128)
    assert abs(ours - reference) <= 0.05


@pytest.mark.slow
def test_round_trip_full_photo(taef2: Path) -> None:
    ours, _ = _round_trip_psnr(taef2, 512)
    assert abs(ours - 31.87) <= 0.05
