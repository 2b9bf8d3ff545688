"""check(): every node OpenVINO cannot run, at once, from the weightless graph."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import sdkit
from sdkit.model import Model, load_onnx


def _model(
    nodes: list, inputs: list, outputs: list, initializers: list | None = None, domains: tuple[str, ...] = ()
) -> Model:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializers or [])
    opsets = [helper.make_opsetid("", 17), *(helper.make_opsetid(d, 1) for d in domains)]
    return Model.from_proto(helper.make_model(graph, opset_imports=opsets))


def test_reports_every_unsupported_node() -> None:
    model = _model(
        [
            helper.make_node("Relu", ["x"], ["a"], name="relu"),
            helper.make_node("Frobnicate", ["a"], ["b"], name="frob", domain="example.custom"),
            helper.make_node("StringNormalizer", ["s"], ["t"], name="norm"),
            helper.make_node("Wobble", ["b"], ["y"], name="wobble", domain="example.custom"),
        ],
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("s", TensorProto.STRING, [2]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("t", TensorProto.STRING, [2]),
        ],
        domains=("example.custom",),
    )
    report = sdkit.check(model, backend="openvino")["openvino"]
    assert not report.ok
    found = {(u.node, u.op_type, u.domain) for u in report.unsupported}
    assert found == {
        ("frob", "Frobnicate", "example.custom"),
        ("wobble", "Wobble", "example.custom"),
        ("norm", "StringNormalizer", ""),
    }
    assert all("no conversion rule" in u.reason for u in report.unsupported)


def test_value_dependent_nodes_are_not_flagged() -> None:
    """check() has no weights: a Reshape whose shape initializer it cannot see must not fail."""
    model = _model(
        [helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("MatMul", ["r", "w"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [
            numpy_helper.from_array(np.array([6, 4], np.int64), "shape"),
            numpy_helper.from_array(np.ones((4, 5), np.float32), "w"),
        ],
    )
    assert sdkit.check(model, backend="openvino")["openvino"].ok


def test_real_model_is_clean(taef2: Path) -> None:
    for name in ("taef2_encoder.onnx", "taef2_decoder.onnx"):
        report = sdkit.check(load_onnx(taef2 / name), backend="openvino")["openvino"]
        assert report.ok, report.summary()


@pytest.mark.parametrize("name", ["tiny_clip_text", "tiny_unet", "sd15_vae_decoder"])
def test_sd_graphs_are_clean(sd_graphs: object, name: str) -> None:
    import onnx

    proto = onnx.load(str(sd_graphs.graph_path(name)), load_external_data=False)  # type: ignore[attr-defined]
    for tensor in proto.graph.initializer:  # stripped graph: check() must not need the data
        tensor.ClearField("external_data")
        tensor.data_location = TensorProto.EXTERNAL
        entry = tensor.external_data.add()
        entry.key, entry.value = "location", "sdkit:weightset"
    from sdkit.model import Graph

    report = sdkit.selection.get_backend("openvino").check(Graph(proto))
    assert report.ok, report.summary()


@pytest.mark.parametrize("name", ["flux_dev_transformer", "flux_schnell_transformer"])
def test_shipped_flux_transformer_passes_check(name: str) -> None:
    """FLUX.1's transformer as shipped (``sdkit/families/graphs``: 19 double + 38 single blocks,
    11.9B weights, dynamic batch / image / text tokens), weightless."""
    from sdkit.families import shipped
    from sdkit.selection import get_backend

    report = get_backend("openvino").check(shipped.load_graph(name))
    assert report.ok, report.unsupported
