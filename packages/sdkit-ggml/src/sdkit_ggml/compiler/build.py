"""Lower an ONNX graph with fixed input shapes to one ggml graph (a ``Plan``).

Walks the nodes in order through ``Lowering`` (fold, shape query or converter); the first
node that cannot be lowered raises ``UnsupportedModelError`` naming it: nothing is emulated
outside ggml. ``check()`` walks the same way over shapes alone (``check.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from sdkit.errors import UnsupportedModelError, UnsupportedNode
from sdkit_ggml.compiler.builder import Builder
from sdkit_ggml.compiler.context import NeedsValue, Tensor, Unsupported, Value
from sdkit_ggml.compiler.fold import evaluate_node
from sdkit_ggml.compiler.lowering import Lowering
from sdkit_ggml.compiler.registry import ConverterRegistry, onnx_domain, opset_for, opsets_of
from sdkit_ggml.compiler.support import node_label

BACKEND = "ggml"
# Tensors per ONNX node a lowering typically creates (reshapes, views, broadcasts...), with
# headroom: the size of each ggml context block and of the weight context. Lowerings that make
# more (a chunked conv: a few per chunk of output rows) make the compute contexts grow.
TENSORS_PER_NODE = 48
MIN_CAPACITY = 4096
# A converter tripping over inconsistent attributes or shapes: still one clear error.
CONVERTER_ERRORS = (ValueError, IndexError, KeyError, TypeError, ZeroDivisionError, RuntimeError)


def capacity_for(proto: onnx.ModelProto) -> int:
    """How many weights one signature's graph may hold, and the block its compute tensors are
    allocated in (``GgmlContext``)."""
    return max(MIN_CAPACITY, TENSORS_PER_NODE * len(proto.graph.node))


@dataclass
class Plan:
    """A built ggml graph for one input signature, before allocation."""

    builder: Builder
    inputs: dict[str, Tensor]
    outputs: dict[str, Value]  # Tensor, or a numpy constant for folded outputs
    # Replaying these on new weights recomputes every folded constant (refit).
    folded: list[onnx.NodeProto] = field(default_factory=list)
    shape_constants: dict[str, np.ndarray] = field(default_factory=dict)
    value_inputs: dict[str, np.ndarray] = field(default_factory=dict)


def unsupported(node: onnx.NodeProto, opsets: Mapping[str, int], reason: str) -> UnsupportedNode:
    return UnsupportedNode(node_label(node), node.op_type, onnx_domain(node.domain), opset_for(node, opsets), reason)


def describe_failure(exc: BaseException) -> str | None:
    """The reason a lowering exception gives, or None for exceptions that are not about the node."""
    if isinstance(exc, Unsupported):
        return str(exc)
    if isinstance(exc, CONVERTER_ERRORS):
        return f"{type(exc).__name__}: {exc}"
    return None


def _inputs(
    builder: Builder,
    input_specs: Mapping[str, tuple[tuple[int, ...], np.dtype[Any]]],
    values: dict[str, Value],
    value_inputs: Mapping[str, np.ndarray],
) -> dict[str, Tensor]:
    inputs: dict[str, Tensor] = {}
    for name, (shape, dtype) in input_specs.items():
        if name in value_inputs:
            continue
        if 0 in shape:  # an empty tensor is fully known from its shape: a constant
            values[name] = np.zeros(shape, dtype=dtype)
            continue
        try:
            tensor = builder.new_input(shape, dtype)
        except Unsupported as exc:
            raise UnsupportedModelError(BACKEND, [f"input {name!r}: {exc}"]) from None
        inputs[name] = values[name] = tensor
        builder.input_names[tensor.ptr] = name
    return inputs


def build_plan(
    proto: onnx.ModelProto,
    constants: Mapping[str, np.ndarray],
    input_specs: Mapping[str, tuple[tuple[int, ...], np.dtype[Any]]],
    registry: ConverterRegistry,
    builder: Builder,
    *,
    value_inputs: Mapping[str, np.ndarray] | None = None,
) -> Plan:
    """Lower ``proto`` (initializer values in ``constants``) for the given input shapes.
    ``value_inputs``: graph inputs whose values the graph's structure depends on (shapes,
    axes...), compiled in as constants."""
    opsets = opsets_of(proto)
    value_inputs = dict(value_inputs or {})
    values: dict[str, Value] = dict(constants)
    builder.weight_derived.update(constants)
    builder.weight_dependent.update(constants)
    values.update(value_inputs)
    inputs = _inputs(builder, input_specs, values, value_inputs)
    lowering = Lowering(opsets, registry, builder)
    for node in proto.graph.node:
        missing = [name for name in node.input if name and name not in values]
        if missing:
            why = f"input {missing[0]!r} is not produced by any node"
            raise UnsupportedModelError(BACKEND, [unsupported(node, opsets, why)])
        try:
            results = lowering.lower(node, [values[name] if name else None for name in node.input])
        except NeedsValue:
            raise
        except Exception as exc:
            reason = describe_failure(exc)
            if reason is None:
                raise
            raise UnsupportedModelError(BACKEND, [unsupported(node, opsets, reason)]) from None
        for name, value in zip(node.output, results, strict=False):
            if name:
                values[name] = value
    plan = Plan(builder, inputs, {}, lowering.folded, lowering.shape_constants, value_inputs)
    for output in proto.graph.output:
        if output.name not in values:
            raise UnsupportedModelError(BACKEND, [f"graph output {output.name!r} is not produced by any node"])
        plan.outputs[output.name] = values[output.name]
    return plan


def replay_constants(plan: Plan, proto: onnx.ModelProto, constants: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every folded value recomputed from new initializer values (for refit)."""
    opsets = opsets_of(proto)
    values: dict[str, np.ndarray] = dict(constants)
    values.update(plan.shape_constants)
    values.update(plan.value_inputs)
    for node in plan.folded:
        args = [values.get(name) if name else None for name in node.input]
        try:
            results = evaluate_node(node, args, opsets)
        except Unsupported as exc:
            raise UnsupportedModelError(BACKEND, [f"refit: {node_label(node)}: {exc}"]) from None
        for name, value in zip(node.output, results, strict=False):
            if name:
                values[name] = value
    return values
