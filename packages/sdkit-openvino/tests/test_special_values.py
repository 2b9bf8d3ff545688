"""NaN, infinities and out-of-range indices on OpenVINO agree with onnx.reference (issue 15,
finding 6): its Relu/Clip turned NaN into numbers and its Gather zero-filled rows for indices
out of range (token ids >= 1e9 gave an image, exit 0)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import sdkit
from sdkit.errors import InputError
from sdkit.model import Model

_SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.5, -2.0, 3.4e38, -3.4e38], np.float32)
_N = _SPECIAL.size**2


def _model(op: str, inputs: list[str], attrs: dict[str, Any], inits: list[Any], opset: int = 17) -> Model:
    graph = helper.make_graph(
        [helper.make_node(op, inputs, ["y"], **attrs)],
        op.lower(),
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [_N]) for n in inputs if n in ("a", "b")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [_N])],
        inits,
    )
    return Model.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]))


_CASES = {
    "Max": (["a", "b"], {}, [], 17),
    "Min": (["a", "b"], {}, [], 17),
    "Relu": (["a"], {}, [], 17),
    "Clip": (
        ["a", "lo", "hi"],
        {},
        [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("lo", -1.0), ("hi", 1.0))],
        17,
    ),
    "Clip-6": (["a"], {"min": -1.0, "max": 1.0}, [], 6),
}


@pytest.mark.parametrize("case", sorted(_CASES))
def test_nan_and_infinities_pass_through_as_onnx_says(case: str) -> None:
    inputs, attrs, inits, opset = _CASES[case]
    model = _model(case.split("-", maxsplit=1)[0], inputs, attrs, inits, opset)
    feeds = {"a": np.repeat(_SPECIAL, _SPECIAL.size), "b": np.tile(_SPECIAL, _SPECIAL.size)}
    feeds = {k: v for k, v in feeds.items() if k in inputs}
    got = sdkit.compile(model, backend="openvino").run(feeds)["y"]
    want = ReferenceEvaluator(model.graph.to_onnx(model.weights)).run(None, feeds)[0]
    wrong = ~((got == want) | (np.isnan(got) & np.isnan(want)))
    assert not wrong.any(), (feeds["a"][wrong][:5], got[wrong][:5], want[wrong][:5])


def test_runtime_gather_indices_are_range_checked() -> None:
    table = np.arange(40, dtype=np.float32).reshape(10, 4)
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["ids"], ["ids64"], to=TensorProto.INT64),
            helper.make_node("Gather", ["t", "ids64"], ["y"]),
        ],
        "gather",
        [helper.make_tensor_value_info("ids", TensorProto.INT32, [1, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 4])],
        [numpy_helper.from_array(table, "t")],
    )
    model = Model.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    compiled = sdkit.compile(model, backend="openvino")
    ids = np.array([[1, -1, 9]], np.int32)
    np.testing.assert_array_equal(compiled.run({"ids": ids})["y"], table[ids])
    for bad in (10, -11, 1_000_000_000):
        with pytest.raises(InputError, match=r"indices must lie in \[-10, 10\)"):
            compiled.run({"ids": np.array([[0, bad, 0]], np.int32)})
