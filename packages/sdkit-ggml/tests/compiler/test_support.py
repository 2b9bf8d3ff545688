"""compiler/support.py and fold.py: the one routing decision (fold, shape query, converter) and
compile-time evaluation with onnx.reference."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from sdkit_ggml.compiler.context import Unsupported
from sdkit_ggml.compiler.fold import constant_node_value, evaluate_node
from sdkit_ggml.compiler.support import Route, decide, foldable
from sdkit_ggml.converters import BUILTIN_CONVERTERS


def _route(node: object, *, constant: bool, tensor_first: bool = False, opset: int = 17) -> Route:
    return decide(node, opset, BUILTIN_CONVERTERS, constant_inputs=constant, tensor_first=tensor_first).route  # type: ignore[arg-type]


def test_constant_inputs_fold_except_randomness_and_subgraphs() -> None:
    assert _route(helper.make_node("Add", ["a", "b"], ["c"]), constant=True) is Route.FOLD
    assert _route(helper.make_node("Mod", ["a", "b"], ["c"]), constant=True) is Route.FOLD  # no converter needed
    random = helper.make_node("RandomNormalLike", ["a"], ["b"])
    assert not foldable(random)
    with pytest.raises(Unsupported, match="operator not supported"):
        _route(random, constant=True)
    branch = helper.make_graph([], "b", [], [])
    conditional = helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)
    with pytest.raises(Unsupported, match="operator not supported"):
        _route(conditional, constant=True)


def test_shape_of_a_runtime_tensor_is_a_query() -> None:
    assert _route(helper.make_node("Shape", ["x"], ["s"]), constant=False, tensor_first=True) is Route.SHAPE
    assert (
        _route(helper.make_node("Size", ["x"], ["s"], domain="ai.onnx"), constant=False, tensor_first=True)
        is Route.SHAPE
    )


def test_converter_route_runs_the_static_check() -> None:
    assert _route(helper.make_node("Relu", ["x"], ["y"]), constant=False) is Route.CONVERT
    with pytest.raises(Unsupported, match="Resize mode 'cubic'"):
        _route(helper.make_node("Resize", ["x", "", "s"], ["y"], mode="cubic"), constant=False)
    with pytest.raises(Unsupported, match=r"no converter for opset 5 \(have: \[6\]\)"):
        _route(helper.make_node("LeakyRelu", ["x"], ["y"]), constant=False, opset=5)


def test_evaluate_node() -> None:
    node = helper.make_node("Gather", ["data", "i"], ["y"], axis=0)
    [value] = evaluate_node(node, [np.array([5, 6, 7]), np.array([2, 0])], {"": 17})
    np.testing.assert_array_equal(value, [7, 5])
    with pytest.raises(Unsupported, match="constant folding failed"):
        evaluate_node(helper.make_node("Reshape", ["x", "s"], ["y"]), [np.zeros(6), np.array([4, 4])], {"": 17})


def test_constant_node_values() -> None:
    tensor = helper.make_tensor("t", TensorProto.FLOAT, [2], [1.0, 2.0])
    np.testing.assert_array_equal(constant_node_value(helper.make_node("Constant", [], ["c"], value=tensor)), [1, 2])
    assert constant_node_value(helper.make_node("Constant", [], ["c"], value_ints=[3, 4])).dtype == np.int64
    with pytest.raises(Unsupported, match="sparse or string"):
        constant_node_value(helper.make_node("Constant", [], ["c"], value_strings=["a"]))
