"""TAEF2 (real weights): openvino vs onnxruntime, and the encode/decode round trip."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
from PIL import Image

import sdkit
from sdkit.model import load_onnx

EXPECTED_PSNR = 31.87  # onnxruntime / PyTorch, from the model's README


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    return float(10 * np.log10(1.0 / np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)))


def _ort(path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def test_decoder_matches_onnxruntime(taef2: Path, sdkit_isolated: Path) -> None:
    latent = np.load(taef2 / "dog_latent_torch.npy")[:, :, :32, :32]
    decoder = sdkit.compile(load_onnx(taef2 / "taef2_decoder.onnx"), backend="openvino", threads=2)
    ours = decoder.run({"latent": latent})["image"]
    want = _ort(taef2 / "taef2_decoder.onnx", {"latent": latent})
    assert ours.shape == want.shape == (1, 3, 256, 256)
    assert float(np.abs(ours - want).max()) <= 1e-4


def test_round_trip_psnr(taef2: Path, sdkit_isolated: Path) -> None:
    image = np.asarray(Image.open(taef2 / "dog.png").convert("RGB"), dtype=np.float32) / 255.0
    pixels = image.transpose(2, 0, 1)[None].copy()
    encoder = sdkit.compile(load_onnx(taef2 / "taef2_encoder.onnx"), backend="openvino", threads=2)
    decoder = sdkit.compile(load_onnx(taef2 / "taef2_decoder.onnx"), backend="openvino", threads=2)
    latent = encoder.run({"image": pixels})["latent"]
    assert float(np.abs(latent - np.load(taef2 / "dog_latent_torch.npy")).max()) <= 1e-4
    decoded = np.clip(decoder.run({"latent": latent})["image"], 0.0, 1.0)
    assert abs(_psnr(decoded, pixels) - EXPECTED_PSNR) <= 0.02
