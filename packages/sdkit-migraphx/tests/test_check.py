"""check(): MIGraphX's parser coverage and documented limits, every offending node at once."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from sdkit.families import shipped
from sdkit.model import Graph, Model, load_onnx
from sdkit_migraphx.backend import MigraphxBackend

FIXTURES = ("tiny_clip_text", "tiny_unet", "tiny_controlnet", "sd15_vae_decoder", "sd15_vae_encoder", "sd15_unet")


@pytest.mark.parametrize("name", FIXTURES)
def test_sd_graphs_are_supported(name: str, sd_graphs: ModuleType) -> None:
    report = MigraphxBackend().check(Graph(sd_graphs.load_graph(name)))  # weightless: check needs no data
    assert report.ok, report.unsupported


@pytest.mark.parametrize("name", ["taef2_encoder", "taef2_decoder"])
def test_taef2_is_supported(name: str, taef2: Path) -> None:
    assert MigraphxBackend().check(load_onnx(taef2 / f"{name}.onnx").graph).ok


def test_every_unsupported_node_is_named() -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="fine"),
        helper.make_node("DFT", ["a"], ["f"], name="fourier"),
        helper.make_node("Resize", ["a", "", "scales"], ["r"], name="cubic", mode="cubic"),
        helper.make_node("Pad", ["a", "pads"], ["p"], name="edge_pad", mode="edge"),
        helper.make_node("Reshape", ["a", "shape"], ["z"], name="zero_shape", allowzero=1),
        helper.make_node("MyOp", ["a"], ["m"], name="custom", domain="my.domain"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("f", "r", "p", "z", "m")],
        initializer=[
            numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
            numpy_helper.from_array(np.zeros(8, np.int64), "pads"),
            numpy_helper.from_array(np.array([1, 4], np.int64), "shape"),
        ],
    )
    model = Model.from_proto(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19), helper.make_opsetid("my.domain", 1)])
    )
    report = MigraphxBackend().check(model.graph)
    found = {u.node: u for u in report.unsupported}
    assert set(found) == {"fourier", "cubic", "edge_pad", "zero_shape", "custom"}
    assert "no rule" in found["fourier"].reason
    assert "cubic" in found["cubic"].reason and "edge" in found["edge_pad"].reason
    assert "allowzero" in found["zero_shape"].reason
    assert found["custom"].domain == "my.domain" and found["custom"].opset == 1


@pytest.mark.parametrize("name", shipped.names())
def test_shipped_full_size_graphs_are_supported(name: str) -> None:
    """sdkit's weightless full-size graphs (Flux / Chroma / SD3 transformers, T5-XXL, the VAEs,
    CLIP, the UNets): every node has a MIGraphX parser rule and is within its documented limits."""
    report = MigraphxBackend().check(shipped.load_graph(name))
    assert report.ok, report.summary()
