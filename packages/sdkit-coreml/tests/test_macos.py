"""Numbers on the real Core ML runtime (macOS): every fixture against onnxruntime, fp32 and
fp16, and the compiled model's plumbing (cache, int64 inputs, refit). Skipped elsewhere."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from coreml_helpers import FIXTURES, fixture_model, graph_model, run_ort
from onnx import TensorProto, helper

import sdkit

pytestmark = pytest.mark.macos
TOLERANCE = {"fp32": 1e-4, "fp16": 1e-3}


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_matches_onnxruntime(
    name: str, precision: str, sd_graphs: ModuleType, taef2: Path, sdkit_isolated: Path
) -> None:
    model, feeds = fixture_model(name, sd_graphs, taef2)
    compiled = sdkit.compile(model, backend="coreml", device="cpu", precision=precision)
    ours = compiled.run(feeds)
    want = run_ort(model.graph.to_onnx(model.weights), feeds)
    for info, expected in zip(compiled.outputs, want, strict=True):
        worst = float(np.abs(ours[info.name].astype(np.float64) - expected).max())
        print(f"{name} {precision} {info.name}: max |diff| {worst:.2e}")
        assert worst <= TOLERANCE[precision]


@pytest.mark.parametrize("units", ["ALL", "CPU_AND_NE", "CPU_AND_GPU", "CPU_ONLY"])
def test_compute_units_run(units: str, taef2: Path, sdkit_isolated: Path) -> None:
    from sdkit.model import load_onnx

    latent = np.load(taef2 / "dog_latent_torch.npy")[:, :, :16, :16].copy()
    model = load_onnx(taef2 / "taef2_decoder.onnx")
    compiled = sdkit.compile(model, backend="coreml", compute_units=units, precision="fp16")
    (want,) = run_ort(model.graph.to_onnx(model.weights), {"latent": latent})
    assert float(np.abs(compiled.run({"latent": latent})["image"] - want).max()) <= 1e-2
    assert compiled.info["compute_units"] == units


def test_int64_feeds_cache_and_refit(sdkit_isolated: Path) -> None:
    nodes = [helper.make_node("Gather", ["table", "ids"], ["y"], axis=0)]
    table = np.arange(12, dtype=np.float32).reshape(6, 2)
    model = graph_model(nodes, [("ids", TensorProto.INT64, [1, 3])], [("y", TensorProto.FLOAT, None)], {"table": table})
    ids = np.array([[0, 5, 2]], np.int64)
    compiled = sdkit.compile(model, backend="coreml", device="cpu")
    np.testing.assert_array_equal(compiled.run({"ids": ids})["y"], table[ids])
    again = sdkit.compile(model, backend="coreml", device="cpu")
    assert again.info["conversions"][0]["from_cache"]
    compiled.refit(model.weights.updated({"table": table * 2}))
    np.testing.assert_array_equal(compiled.run({"ids": ids})["y"], 2 * table[ids])
    assert compiled.info["refit_seconds"] > 0
