"""Compile-time constant folding: nodes whose inputs are all known (weights, Constant nodes,
shapes of static tensors) are evaluated once with onnx.reference, never at run time.

Torch exports compute reshape targets through Shape -> Gather -> Unsqueeze -> Concat chains;
with input shapes fixed per call signature these all fold to constants here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from sdkit_ggml.compiler.context import Unsupported

# Which nodes fold is decided in ``support.py`` (``Route.FOLD``), for compile and check() alike.


def constant_node_value(node: onnx.NodeProto) -> np.ndarray:
    """The value of a Constant node (any of its value_* attributes)."""
    for attr in node.attribute:
        if attr.name == "value":
            return numpy_helper.to_array(attr.t)
        if attr.name == "value_float":
            return np.array(attr.f, dtype=np.float32)
        if attr.name == "value_floats":
            return np.array(list(attr.floats), dtype=np.float32)
        if attr.name == "value_int":
            return np.array(attr.i, dtype=np.int64)
        if attr.name == "value_ints":
            return np.array(list(attr.ints), dtype=np.int64)
    raise Unsupported("Constant node without a supported value attribute (sparse or string)")


def evaluate_node(
    node: onnx.NodeProto, inputs: Sequence[np.ndarray | None], opsets: Mapping[str, int]
) -> list[np.ndarray]:
    """Run one node on constant inputs with onnx.reference."""
    from onnx.reference import ReferenceEvaluator

    if node.op_type == "Constant":
        return [constant_node_value(node)]
    names = list(node.input)
    feeds: dict[str, Any] = {}
    graph_inputs = []
    for name, value in zip(names, inputs, strict=False):
        if name and value is not None and name not in feeds:
            feeds[name] = value
            graph_inputs.append(
                helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.asarray(value).dtype), None)
            )
    outputs = [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in node.output if o]
    graph = helper.make_graph([node], "fold", graph_inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()])
    try:
        # The graph's own arithmetic, warnings included: T5's relative-position buckets take
        # log(0) = -inf and cast it, then mask it out; numpy's RuntimeWarning would reach users.
        with np.errstate(all="ignore"):
            results = ReferenceEvaluator(model).run(None, feeds)
    except Exception as exc:  # onnx.reference raises many types on bad constants
        raise Unsupported(f"constant folding failed: {type(exc).__name__}: {exc}") from None
    return [np.asarray(r) for r in results]
