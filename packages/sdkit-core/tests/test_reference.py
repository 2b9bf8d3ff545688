"""The reference backend against independent oracles: the ONNX node suite and onnxruntime on
the real TAEF2 model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import sdkit
from sdkit.errors import OptionError
from sdkit.testing import run_conformance

EXCLUSIONS = Path(__file__).parent / "data" / "reference_exclusions.txt"


def test_onnx_node_suite_on_reference() -> None:
    result = run_conformance("reference", exclusions=EXCLUSIONS)
    assert result.failed == {}, f"{len(result.failed)} failed: {sorted(result.failed.items())[:10]}"
    assert len(result.passed) >= 1800, result.summary()


def test_taef2_decoder_matches_onnxruntime(taef2: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    latent = np.load(taef2 / "dog_latent_torch.npy")[:, :, 20:28, 24:32].copy()
    compiled = sdkit.compile(taef2 / "taef2_decoder.onnx", backend="reference")
    image = compiled.run({"latent": latent})["image"]
    expected = ort.InferenceSession(str(taef2 / "taef2_decoder.onnx")).run(None, {"latent": latent})[0]
    assert image.shape == (1, 3, 64, 64)
    assert np.max(np.abs(image - expected)) <= 1e-4


def test_refit_swaps_weights(taef2: Path) -> None:
    model = sdkit.load_model(taef2 / "taef2_decoder.onnx")
    latent = np.load(taef2 / "dog_latent_torch.npy")[:, :, :4, :4].copy()
    compiled = sdkit.compile(model, backend="reference")
    before = compiled.run({"latent": latent})["image"]
    scaled = {k: v * 0.5 if v.ndim == 4 else v for k, v in model.weights.items()}
    compiled.refit(model.weights.updated(scaled))
    after = compiled.run({"latent": latent})["image"]
    fresh = sdkit.compile(model.with_weights(scaled), backend="reference").run({"latent": latent})["image"]
    assert np.max(np.abs(before - after)) > 1e-3
    np.testing.assert_array_equal(after, fresh)


@pytest.mark.parametrize(("precision", "owner"), [("q8_0", "ggml's"), ("fp8", "tensorrt's")])
def test_quantized_precisions_are_refused(taef2: Path, precision: str, owner: str) -> None:
    with pytest.raises(OptionError, match=f"no quantized weights \\(precision '{precision}' is {owner}\\)"):
        sdkit.compile(taef2 / "taef2_decoder.onnx", backend="reference", precision=precision)
