"""On a ROCm machine with an AMD GPU: real MIGraphX against onnxruntime. Skipped elsewhere."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import sdkit
from sdkit.model import Model, load_onnx

pytestmark = pytest.mark.rocm
TOLERANCE = {"fp32": 1e-4, "fp16": 1e-2}


def _ort(model: Model, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    proto = model.graph.to_onnx(model.weights)
    proto.ir_version = min(proto.ir_version, 10)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return [np.asarray(r) for r in session.run(None, feeds)]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_taef2_decoder(precision: str, taef2: Path, sdkit_isolated: Path) -> None:
    model = load_onnx(taef2 / "taef2_decoder.onnx")
    latent = np.load(taef2 / "dog_latent_torch.npy")[:, :, :32, :32].copy()
    ours = sdkit.compile(model, backend="migraphx", precision=precision).run({"latent": latent})["image"]
    (want,) = _ort(model, {"latent": latent})
    assert float(np.abs(ours - want).max()) <= TOLERANCE[precision]


@pytest.mark.parametrize("name", ["tiny_clip_text", "tiny_unet", "tiny_controlnet"])
def test_tiny_sd_graphs(name: str, sd_graphs: ModuleType, sdkit_isolated: Path) -> None:
    model = Model.from_proto(sd_graphs.load_model(name, seed=0))
    feeds = sd_graphs.example_inputs(name)
    compiled = sdkit.compile(model, backend="migraphx")
    ours = compiled.run(feeds)
    for info, want in zip(compiled.outputs, _ort(model, feeds), strict=True):
        assert float(np.abs(ours[info.name] - want).max()) <= TOLERANCE["fp32"]
    again = sdkit.compile(model, backend="migraphx")
    again.run(feeds)
    assert again.info["compiles"][0]["from_cache"]
