"""The preview decoder: sdkit-compiled, checked against onnxruntime on the same latents."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sdkit_serve.preview import PreviewDecoder


def test_preview_matches_onnxruntime(preview_decoder: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    latents = np.random.default_rng(1).standard_normal((2, 4, 8, 8)).astype(np.float32)
    decoder = PreviewDecoder(preview_decoder, backend="reference")
    image = decoder.decode(latents)
    [expected] = ort.InferenceSession(str(preview_decoder)).run(None, {"latent": latents[:1]})
    want = np.round(np.clip(expected[0].transpose(1, 2, 0), 0, 1) * 255).astype(np.uint8)
    assert image.size == (16, 16)
    assert np.abs(np.asarray(image, np.int16) - want).max() <= 1  # rounding at .5 boundaries


def test_preview_caches_per_key_and_survives_bad_latents(preview_decoder: Path) -> None:
    decoder = PreviewDecoder(preview_decoder, backend="reference")
    latents = np.zeros((1, 4, 4, 4), np.float32)
    first = decoder.preview(("job", 0, 1), latents)
    assert decoder.preview(("job", 0, 1), latents + 5) is first  # same step: no second decode
    assert decoder.preview(("job", 0, 2), np.zeros((1, 16, 4, 4), np.float32)) is None  # wrong channels: no image
