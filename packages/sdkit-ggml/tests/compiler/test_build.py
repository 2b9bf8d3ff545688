"""compiler/build.py, lowering.py, builder.py: folding shape chains, refit replay, and the
errors a graph that cannot be lowered gives (never an abort)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import sdkit
from sdkit.errors import SdkitError, UnsupportedModelError
from sdkit.model import Model
from sdkit_ggml.compiler.build import build_plan, replay_constants
from sdkit_ggml.compiler.builder import Builder
from sdkit_ggml.compiler.context import Unsupported
from sdkit_ggml.compiler.shape_only import ShapeOnlyContext
from sdkit_ggml.converter_plugins import default_registry

Lower = Callable[[Model, Mapping[str, np.ndarray]], SdkitError | None]


def _model(nodes: list, inputs: list, outputs: list, initializers: list | None = None) -> Model:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializers or [])
    return Model.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10))


def _torch_style_flatten() -> Model:
    """x -> Reshape(x, Concat(Shape(x)[0], [-1])): the shape chain torch exports."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
        helper.make_node("Mul", ["y", "w"], ["z"]),
    ]
    inits = [
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.array([0], np.int64), "axes"),
        numpy_helper.from_array(np.array([-1], np.int64), "minus_one"),
        numpy_helper.from_array(np.full((1, 12), 2.0, np.float32), "w"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 4])
    return _model(nodes, [x], [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], inits)


def test_shape_chains_fold_and_refit_replays_them() -> None:
    model = _torch_style_flatten()
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    compiled = sdkit.compile(model, backend="ggml")
    np.testing.assert_array_equal(compiled.run({"x": x})["z"], x.reshape(2, 12) * 2)
    compiled.refit(model.weights.updated({"w": np.full((1, 12), 3.0, np.float32)}))
    np.testing.assert_array_equal(compiled.run({"x": x})["z"], x.reshape(2, 12) * 3)


def test_plan_records_what_refit_replays() -> None:
    model = _torch_style_flatten()
    constants = {n: np.asarray(model.weights[n]) for n in model.graph.initializer_names}
    builder = Builder(ShapeOnlyContext(4096))
    plan = build_plan(
        model.graph.proto, constants, {"x": ((2, 3, 4), np.dtype(np.float32))}, default_registry(), builder
    )
    assert [n.op_type for n in plan.folded] == ["Gather", "Unsqueeze", "Concat"]
    np.testing.assert_array_equal(plan.shape_constants["s"], [2, 3, 4])
    assert plan.builder.structural["target"].tolist() == [2, -1]  # the graph's structure depends on it
    replayed = replay_constants(plan, model.graph.proto, constants)
    np.testing.assert_array_equal(replayed["target"], [2, -1])


def test_a_missing_input_names_the_node(compile_without_running: Lower) -> None:
    model = _model(
        [helper.make_node("Add", ["x", "nowhere"], ["y"], name="adder")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    error = compile_without_running(model, {"x": np.zeros(2, np.float32)})
    assert isinstance(error, UnsupportedModelError)
    assert "adder" in str(error) and "'nowhere' is not produced by any node" in str(error)


def test_an_output_nothing_produces(compile_without_running: Lower) -> None:
    model = _model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("ghost", TensorProto.FLOAT, [2])],
    )
    error = compile_without_running(model, {"x": np.zeros(2, np.float32)})
    assert isinstance(error, UnsupportedModelError) and "'ghost' is not produced" in str(error)


def test_builder_checks_what_ggml_would_assert_on() -> None:
    builder = Builder(ShapeOnlyContext(capacity=1))
    builder.max_tensors = 2
    x = builder.new_input((2, 3), np.dtype(np.float32))
    with pytest.raises(Unsupported, match="empty tensor"):
        builder.op("ggml_relu", x.ptr, shape=(0, 3))
    with pytest.raises(Unsupported, match="negative dimension"):
        builder.op("ggml_relu", x.ptr, shape=(-1, 3))
    builder.op("ggml_relu", x.ptr, shape=(2, 3))
    with pytest.raises(Unsupported, match="more than 2 ggml tensors"):
        builder.op("ggml_relu", x.ptr, shape=(2, 3))
    with pytest.raises(Unsupported, match="ggml has no float64 tensors"):
        builder.new_input((2,), np.dtype(np.float64))
    builder.constant(np.ones(2, np.float32))
    with pytest.raises(Unsupported, match="more than 1 weight tensors"):
        builder.constant(np.zeros(3, np.float32))
