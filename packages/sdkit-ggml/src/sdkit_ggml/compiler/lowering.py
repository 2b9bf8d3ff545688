"""Lowering one node into a ``Builder``: the procedure compile and ``check()`` share.

The route comes from ``support.decide``; a folded node is evaluated with onnx.reference and
remembered (refit replays it on new weights), a shape query becomes a constant, everything
else goes through its converter. Graph passes that rewrite the ONNX graph before lowering
(pattern fusions...) belong in ``passes.py``, which both compile and check() apply first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from sdkit_ggml.compiler.builder import Builder
from sdkit_ggml.compiler.context import Node, Tensor, Unsupported, Value
from sdkit_ggml.compiler.fold import evaluate_node
from sdkit_ggml.compiler.registry import ConverterRegistry, opset_for
from sdkit_ggml.compiler.support import Route, decide


def shape_of(node: onnx.NodeProto, tensor: Tensor) -> np.ndarray:
    """The value of Shape (with start/end) or Size of a runtime tensor."""
    if node.op_type == "Size":
        return np.array(tensor.size, dtype=np.int64)
    shape = np.array(tensor.shape, dtype=np.int64)
    attrs = {a.name: a.i for a in node.attribute}
    rank = len(shape)
    start = attrs.get("start", 0)
    end = attrs.get("end", rank)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    return shape[start:end]


class Lowering:
    """Lowers nodes one at a time; records what refit must replay."""

    def __init__(self, opsets: Mapping[str, int], registry: ConverterRegistry, builder: Builder) -> None:
        self.opsets = dict(opsets)
        self.registry = registry
        self.builder = builder
        # Replaying these on new weights recomputes every folded constant (refit).
        self.folded: list[onnx.NodeProto] = []
        # Constants computed from shapes or input values, never from weights: refit reuses them.
        self.shape_constants: dict[str, np.ndarray] = {}

    def lower(self, node: onnx.NodeProto, args: Sequence[Value | None]) -> list[Value]:
        present = [a for a in args if a is not None]
        first = present[0] if present else None
        opset = opset_for(node, self.opsets)
        decision = decide(
            node,
            opset,
            self.registry,
            constant_inputs=not any(isinstance(a, Tensor) for a in present),
            tensor_first=isinstance(first, Tensor),
        )
        if decision.route is Route.FOLD:
            return self.fold(node, args)
        if decision.route is Route.SHAPE and isinstance(first, Tensor):
            value = shape_of(node, first)
            self.shape_constants[node.output[0]] = value
            return [value]
        if decision.converter is None:  # decide() returns a converter for the CONVERT route
            raise Unsupported("no converter")
        results = decision.converter.convert(self.builder, Node(node, list(args), opset))
        if len(results) < len([o for o in node.output if o]):
            raise Unsupported(f"converter produced {len(results)} outputs, the node has {len(node.output)}")
        self._remember_constants(node, results)
        return results

    def fold(self, node: onnx.NodeProto, args: Sequence[Value | None]) -> list[Value]:
        b = self.builder
        self.folded.append(node)
        inputs = [name for name in node.input if name]
        outputs = [name for name in node.output if name]
        if any(name in b.weight_dependent for name in inputs):
            b.weight_dependent.update(outputs)
        if all(name in b.weight_derived for name in inputs):
            b.weight_derived.update(outputs)  # computed from weights alone: the same for every signature
        return list(evaluate_node(node, [None if a is None else np.asarray(a) for a in args], self.opsets))

    def _remember_constants(self, node: onnx.NodeProto, results: Sequence[Value]) -> None:
        """A converter may answer with constants (a CastLike of a constant, a Dropout mask,
        ConstantOfShape specialised on an input value): refit must see them too."""
        from_weights = any(name in self.builder.weight_dependent for name in node.input if name)
        for name, value in zip(node.output, results, strict=False):
            if not name or isinstance(value, Tensor):
                continue
            if from_weights:
                self.builder.weight_dependent.add(name)
            else:
                self.shape_constants[name] = np.asarray(value)
