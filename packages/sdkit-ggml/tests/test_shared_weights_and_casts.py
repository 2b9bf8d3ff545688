"""Regressions: a weight shared by Conv and ConvTranspose, narrowing integer casts, and two
models computing at once on the one shared ggml CPU backend."""

from __future__ import annotations

import threading

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import sdkit
from sdkit.errors import UnsupportedModelError
from sdkit.model import Model


def _model(nodes: list, inputs: list, outputs: list, inits: list | None = None) -> Model:
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits or [])
    return Model.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10))


def test_conv_and_conv_transpose_sharing_one_weight_match_onnxruntime() -> None:
    w = np.random.default_rng(0).standard_normal((2, 2, 3, 3)).astype(np.float32)
    model = _model(
        [
            helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]),
            helper.make_node("ConvTranspose", ["y", "w"], ["z"], pads=[1, 1, 1, 1]),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5, 5])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w")],
    )
    x = np.random.default_rng(1).standard_normal((1, 2, 5, 5)).astype(np.float32)
    expected = ort.InferenceSession(model.graph.to_onnx(model.weights).SerializeToString()).run(None, {"x": x})[0]
    got = sdkit.compile(model, backend="ggml").run({"x": x})["z"]
    assert np.max(np.abs(got - expected)) <= 1e-4


def test_narrowing_integer_cast_is_refused_not_wrong() -> None:
    model = _model(
        [
            helper.make_node("Cast", ["x"], ["u"], to=TensorProto.UINT8),
            helper.make_node("Cast", ["u"], ["f"], to=TensorProto.FLOAT),
        ],
        [helper.make_tensor_value_info("x", TensorProto.INT32, [2])],
        [helper.make_tensor_value_info("f", TensorProto.FLOAT, [2])],
    )
    with pytest.raises(UnsupportedModelError, match="uint8"):
        sdkit.compile(model, backend="ggml").run({"x": np.array([300, -1], np.int32)})


def test_two_models_computing_at_once_match_their_sequential_results() -> None:
    """The CPU backend (and its work buffer) is shared by every model on the device: two
    threads computing at once must get exactly what each model computes alone."""
    rng = np.random.default_rng(2)
    compiled, feeds, alone = [], [], []
    for k, n in ((512, 256), (256, 512)):
        model = _model(
            [helper.make_node("MatMul", ["x", "w"], ["y"])],
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, k])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, n])],
            [numpy_helper.from_array(rng.random((k, n), dtype=np.float32), "w")],
        )
        c = sdkit.compile(model, backend="ggml", threads=1, precision="fp16")  # fp16 uses the work buffer
        x = rng.random((64, k), dtype=np.float32)
        compiled.append(c)
        feeds.append(x)
        alone.append(c.run({"x": x})["y"])
    mismatches = [0]

    def work(i: int) -> None:
        for _ in range(150):
            if not np.array_equal(compiled[i].run({"x": feeds[i]})["y"], alone[i]):
                mismatches[0] += 1

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert mismatches[0] == 0


def test_refit_after_a_folded_castlike_matches_onnxruntime() -> None:
    const = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.array([1.0, 2.0], np.float64)))
    model = _model(
        [
            const,
            helper.make_node("CastLike", ["c", "x"], ["cl"]),
            helper.make_node("Mul", ["x", "cl"], ["y0"]),
            helper.make_node("Add", ["y0", "w"], ["y"]),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.zeros(2, np.float32), "w")],
    )
    compiled = sdkit.compile(model, backend="ggml")
    new = model.weights.updated({"w": np.array([0.5, -1.0], np.float32)})
    compiled.refit(new)
    x = np.array([3.0, 4.0], np.float32)
    expected = ort.InferenceSession(model.graph.to_onnx(new).SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(compiled.run({"x": x})["y"], expected, atol=1e-6)
