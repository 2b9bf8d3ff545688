"""Keep NaN through Relu, Clip, Max and Min, as ONNX, onnxruntime and the other backends do.

OpenVINO's kernels compare (``x > 0 ? x : 0``), so a NaN born inside a model (fp16 overflow,
0/0) came out as a plausible number. Its ``Maximum(a, b)`` is ``a > b ? a : b`` and
``Minimum(a, b)`` is ``a < b ? a : b``: with the constant first, a NaN ``x`` is returned as is.

- ``Relu(x)``          -> ``Max(0, x)``                 (same cost: one eltwise op)
- ``Clip(x, lo, hi)``  -> ``Where(IsNaN(x), x, Clip(x, lo, hi))`` (a Max/Min pair would be fused
  back into OpenVINO's Clamp)
- ``Max/Min(a, b...)`` -> ``Where(IsNaN(a) or IsNaN(b)..., a + b..., Max/Min(a, b...))`` (the sum
  is NaN exactly where an input is; these ops are rare in SD graphs, so the cost is too)

Float tensors only (integers have no NaN); types come from ONNX shape inference. A test pins
the behaviour against onnx.reference on NaN and +-inf, so a future OpenVINO that reorders the
comparison shows at once.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

_FLOATS = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16})
_TARGETS = frozenset({"Relu", "Clip", "Max", "Min"})


class _Rewriter:
    def __init__(self, proto: onnx.ModelProto) -> None:
        self.types = self._types(proto)
        self.count = 0
        self.constants: list[onnx.NodeProto] = []  # Constant nodes, put first

    @staticmethod
    def _types(proto: onnx.ModelProto) -> dict[str, int]:
        try:
            inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=False)
        except Exception:  # no types known: nothing is rewritten
            return {}
        graph = inferred.graph
        found = {t.name: int(t.data_type) for t in graph.initializer}
        for value in (*graph.input, *graph.value_info, *graph.output):
            if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type:
                found[value.name] = int(value.type.tensor_type.elem_type)
        return found

    def name(self, base: str) -> str:
        self.count += 1
        return f"{base}__sdkit_nan{self.count}"

    def constant(self, value: float, elem_type: int, base: str) -> str:
        dtype = helper.tensor_dtype_to_np_dtype(elem_type)
        name = self.name(base)
        value_tensor = numpy_helper.from_array(np.array(value, dtype=dtype), name)
        self.constants.append(helper.make_node("Constant", [], [name], value=value_tensor))
        return name

    def relu(self, node: onnx.NodeProto, elem_type: int) -> list[onnx.NodeProto]:
        zero = self.constant(0.0, elem_type, node.output[0])
        return [helper.make_node("Max", [zero, node.input[0]], [node.output[0]], name=node.name)]

    def clip(self, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        # Max(lo, Min(hi, x)) would do, but OpenVINO fuses such a pair back into its Clamp
        clipped, nan = self.name(node.output[0]), self.name(node.output[0])
        inner = onnx.NodeProto()
        inner.CopyFrom(node)
        inner.name = ""
        inner.output[0] = clipped
        return [
            inner,
            helper.make_node("IsNaN", [node.input[0]], [nan]),
            helper.make_node("Where", [nan, node.input[0], clipped], [node.output[0]], name=node.name),
        ]

    def minmax(self, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        inputs = list(node.input)
        if len(inputs) < 2:
            return [node]
        out = node.output[0]
        plain, total, masks = self.name(out), inputs[0], []
        nodes = [helper.make_node(node.op_type, inputs, [plain])]
        for value in inputs:
            masks.append(self.name(out))
            nodes.append(helper.make_node("IsNaN", [value], [masks[-1]]))
        mask = masks[0]
        for other, value in zip(masks[1:], inputs[1:], strict=True):
            joined, summed = self.name(out), self.name(out)
            nodes += [
                helper.make_node("Or", [mask, other], [joined]),
                helper.make_node("Add", [total, value], [summed]),
            ]
            mask, total = joined, summed
        nodes.append(helper.make_node("Where", [mask, total, plain], [out], name=node.name))
        return nodes


def keep_nan(proto: onnx.ModelProto) -> onnx.ModelProto:
    """Rewrite the main graph's float Relu/Clip/Max/Min in place (see the module docstring)."""
    if not any(n.op_type in _TARGETS and n.domain in ("", "ai.onnx") for n in proto.graph.node):
        return proto
    rewriter = _Rewriter(proto)
    rules: dict[str, Callable[[onnx.NodeProto, int], list[onnx.NodeProto]]] = {
        "Relu": rewriter.relu,
        "Clip": lambda node, _: rewriter.clip(node),
        "Max": lambda node, _: rewriter.minmax(node),
        "Min": lambda node, _: rewriter.minmax(node),
    }
    nodes: list[onnx.NodeProto] = []
    for node in proto.graph.node:
        elem_type = rewriter.types.get(node.input[0]) if node.input else None
        rule = rules.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        nodes.extend(rule(node, elem_type) if rule is not None and elem_type in _FLOATS else [node])
    del proto.graph.node[:]
    proto.graph.node.extend([*rewriter.constants, *nodes])
    return proto
