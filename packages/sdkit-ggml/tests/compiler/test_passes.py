"""compiler/passes.py: each pass finds the exported pattern, the rewritten graph runs on ggml
within tolerance of onnxruntime on the original graph (the oracle), check() accepts it, and
SDKIT_GGML_PASSES_OFF switches passes off."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import sdkit
from sdkit.model import Model
from sdkit_ggml.backend import GgmlBackend
from sdkit_ggml.compiler.passes import apply_passes

ort = pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(0)


def const(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value), name + "_v"))


def model_of(nodes: list[onnx.NodeProto], inputs: dict[str, tuple[int, ...]], inits: dict[str, np.ndarray]) -> Model:
    graph = helper.make_graph(
        nodes,
        "pattern",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()],
    )
    return Model.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10))


def rel_l2(model: Model, feeds: dict[str, np.ndarray]) -> float:
    session = ort.InferenceSession(model.graph.to_onnx(model.weights).SerializeToString())
    want = session.run(None, feeds)[0]
    assert GgmlBackend().check(model.graph).ok
    got = sdkit.compile(model, backend="ggml", threads=1).run(feeds)["out"]
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def test_transposes_cancel_and_dead_nodes_go() -> None:
    nodes = [
        helper.make_node("Transpose", ["x"], ["t1"], perm=[0, 2, 3, 1]),
        helper.make_node("Transpose", ["t1"], ["t2"], perm=[0, 3, 1, 2]),
        helper.make_node("Relu", ["t2"], ["out"]),
        helper.make_node("Sigmoid", ["x"], ["unused"]),
    ]
    model = model_of(nodes, {"x": (1, 2, 3, 4)}, {})
    assert [n.op_type for n in apply_passes(model.graph.proto).graph.node] == ["Relu"]
    assert rel_l2(model, {"x": RNG.standard_normal((1, 2, 3, 4)).astype(np.float32)}) == 0.0


def test_composed_transpose_kept_when_not_identity() -> None:
    nodes = [
        helper.make_node("Transpose", ["x"], ["t1"], perm=[0, 2, 3, 1]),
        helper.make_node("Transpose", ["t1"], ["out"], perm=[0, 2, 1, 3]),
    ]
    model = model_of(nodes, {"x": (1, 2, 3, 4)}, {})
    (node,) = apply_passes(model.graph.proto).graph.node
    assert list(node.attribute[0].ints) == [0, 3, 2, 1]
    assert rel_l2(model, {"x": RNG.standard_normal((1, 2, 3, 4)).astype(np.float32)}) == 0.0
