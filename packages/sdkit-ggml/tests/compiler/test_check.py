"""compiler/check.py: check() walks the compile path over shapes alone, reports every node at
once, and says what it leaves to compile."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from sdkit.model import Model
from sdkit_ggml.compiler.check import check_graph
from sdkit_ggml.converter_plugins import default_registry


def _model(nodes: list, inputs: list, initializers: list | None = None, opset: int = 17) -> Model:
    out = helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.UNDEFINED, None)
    graph = helper.make_graph(nodes, "g", inputs, [out], initializers or [])
    return Model.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10))


def _x(*shape: int | str) -> object:
    return helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))


def test_every_unsupported_node_at_once() -> None:
    nodes = [
        helper.make_node("Det", ["x"], ["a"], name="det"),
        helper.make_node("Conv", ["x", "w"], ["b"], name="conv"),  # kernel larger than the input
        helper.make_node("Hardmax", ["b"], ["y"], name="hardmax"),
    ]
    w = numpy_helper.from_array(np.zeros((1, 1, 5, 5), np.float32), "w")
    model = _model(nodes, [_x(1, 1, 3, 3)], [w])
    # Det's result is a graph output too: an unused node would be dropped as dead (passes.py)
    model.graph.proto.graph.output.append(helper.make_tensor_value_info("a", TensorProto.UNDEFINED, None))
    result = check_graph(model.graph.proto, default_registry())
    assert {u.node: u.reason for u in result.unsupported} == {
        "det": "operator not supported by sdkit-ggml",
        "conv": "Conv: a 5x5 kernel does not fit input 3x3 (padding (0, 0))",
        "hardmax": "operator not supported by sdkit-ggml",  # checked although its input is refused
    }


def test_dead_nodes_are_not_checked() -> None:
    nodes = [helper.make_node("Det", ["x"], ["unused"], name="det"), helper.make_node("Relu", ["x"], ["y"])]
    assert check_graph(_model(nodes, [_x(1, 3, 3)]).graph.proto, default_registry()).unsupported == []


def test_symbolic_shapes_leave_shape_limits_to_compile() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"), helper.make_node("Det", ["a"], ["y"], name="det")]
    result = check_graph(_model(nodes, [_x("n", 3)]).graph.proto, default_registry())
    assert [u.node for u in result.unsupported] == ["det"]  # still refused by op
    assert result.shape_free == ["relu"]
    assert "unknown shape" in result.notes()[0]


def test_values_check_does_not_have_are_left_to_compile() -> None:
    nodes = [
        helper.make_node("Reshape", ["x", "target"], ["a"], name="by_weight"),
        helper.make_node("Reshape", ["a", "shape_input"], ["y"], name="by_input"),
    ]
    target = numpy_helper.from_array(np.array([3, 2], np.int64), "target")
    shape_input = helper.make_tensor_value_info("shape_input", TensorProto.INT64, [2])
    result = check_graph(_model(nodes, [_x(2, 3), shape_input], [target]).graph.proto, default_registry())
    assert not result.unsupported
    assert "needs the value of 'target'" in result.deferred["by_weight"]
    assert result.shape_free == ["by_input"]  # fed by a value of unknown shape


def test_check_needs_no_ggml_library(tmp_path: object) -> None:
    code = (
        "import numpy as np, sdkit; from sdkit.testing import one_node_model; "
        "from sdkit_ggml.backend import GgmlBackend; b = GgmlBackend(); "
        "r = b.check(one_node_model('Det', {'x': np.zeros((2, 2), np.float32)}).graph); "
        "print(b.probe().ok, [u.op_type for u in r.unsupported])"
    )
    env = {**os.environ, "SDKIT_GGML_LIB_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert out.split() == ["False", "['Det']"]
