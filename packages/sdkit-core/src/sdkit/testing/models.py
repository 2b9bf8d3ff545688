"""Small ONNX models built with ``onnx.helper`` and a comparison against ``onnx.reference``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from sdkit.model import Model


def one_node_model(
    op_type: str,
    inputs: Mapping[str, np.ndarray],
    attributes: Mapping[str, Any] | None = None,
    initializers: Mapping[str, np.ndarray] | None = None,
    outputs: int = 1,
    opset: int = 17,
    domain: str = "",
) -> Model:
    """A Model with one node; ``inputs`` become graph inputs (with their shapes), and
    ``initializers`` weights. Output shapes come from ONNX shape inference."""
    initializers = dict(initializers or {})
    names = [*inputs, *initializers]
    out_names = [f"out{i}" for i in range(outputs)]
    node = helper.make_node(op_type, names, out_names, domain=domain, **dict(attributes or {}))
    graph_inputs = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.asarray(a).dtype), np.asarray(a).shape)
        for n, a in inputs.items()
    ]
    graph_outputs = [helper.make_tensor_value_info(n, onnx.TensorProto.UNDEFINED, None) for n in out_names]
    graph = helper.make_graph(
        [node],
        f"{op_type.lower()}_test",
        graph_inputs,
        graph_outputs,
        initializer=[numpy_helper.from_array(np.asarray(a), n) for n, a in initializers.items()],
    )
    # IR 10: readable by onnxruntime and OpenVINO (onnx 1.23 would write IR 14 by default)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid(domain, opset)], ir_version=10)
    proto = onnx.shape_inference.infer_shapes(proto, strict_mode=True)
    return Model.from_proto(proto)


def compare_with_reference(
    compiled_outputs: Mapping[str, np.ndarray], model: Model, feeds: Mapping[str, np.ndarray]
) -> dict[str, float]:
    """Max |diff| per output between ``compiled_outputs`` and ``onnx.reference`` on ``model``."""
    from onnx.reference import ReferenceEvaluator

    evaluator = ReferenceEvaluator(model.graph.to_onnx(model.weights))
    expected = evaluator.run(None, dict(feeds))
    diffs = {}
    for info, expected_value in zip(model.outputs, expected, strict=True):
        got = np.asarray(compiled_outputs[info.name])
        want = np.asarray(expected_value)
        if got.shape != want.shape:
            raise AssertionError(f"output {info.name!r}: shape {got.shape} != reference {want.shape}")
        diffs[info.name] = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))) if got.size else 0.0
    return diffs
