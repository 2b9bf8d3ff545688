"""Lower an ONNX graph with fixed input shapes to one ggml graph (a ``Plan``).

Walks the nodes in order: constants fold (``fold.py``), ``Shape``/``Size`` of static tensors
become constants, everything else goes through its converter. What cannot be lowered raises
``UnsupportedModelError`` naming the node: nothing is emulated outside ggml.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from sdkit.errors import UnsupportedModelError, UnsupportedNode
from sdkit_ggml.compiler.context import Builder, NeedsValue, Node, Tensor, Unsupported, Value
from sdkit_ggml.compiler.fold import NOT_FOLDABLE, evaluate_node
from sdkit_ggml.compiler.registry import ConverterRegistry
from sdkit_ggml.compiler.static_checks import SUPPORTED_DTYPES

BACKEND = "ggml"


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


def opsets_of(proto: onnx.ModelProto) -> dict[str, int]:
    return {(e.domain if e.domain != "ai.onnx" else ""): int(e.version) for e in proto.opset_import}


def _node_label(node: onnx.NodeProto) -> str:
    return node.name or (node.output[0] if node.output else "")


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
    values: dict[str, Value] = dict(constants)
    builder.weight_derived.update(constants)
    builder.weight_dependent.update(constants)
    values.update(value_inputs or {})
    inputs: dict[str, Tensor] = {}
    plan = Plan(builder, inputs, {}, value_inputs=dict(value_inputs or {}))
    for name, (shape, dtype) in input_specs.items():
        if value_inputs and name in value_inputs:
            continue
        if 0 in shape:  # an empty tensor is fully known from its shape: a constant
            values[name] = np.zeros(shape, dtype=dtype)
            continue
        try:
            tensor = builder.new_input(shape, dtype)
        except Unsupported as exc:
            raise UnsupportedModelError(BACKEND, [f"input {name!r}: {exc}"]) from None
        inputs[name] = tensor
        values[name] = tensor
        builder.input_names[tensor.ptr] = name
    for node in proto.graph.node:
        domain = node.domain if node.domain != "ai.onnx" else ""
        opset = opsets.get(domain, 1)
        args: list[Value | None] = []
        for name in node.input:
            if not name:
                args.append(None)
            elif name in values:
                args.append(values[name])
            else:
                raise UnsupportedModelError(
                    BACKEND,
                    [
                        UnsupportedNode(
                            _node_label(node),
                            node.op_type,
                            domain,
                            opset,
                            f"input {name!r} is not produced by any node",
                        )
                    ],
                )
        try:
            results = _lower(node, args, opset, opsets=opsets, registry=registry, builder=builder, plan=plan)
        except NeedsValue:
            raise
        except (ValueError, IndexError, KeyError, TypeError, ZeroDivisionError, RuntimeError) as exc:
            # a converter tripping over inconsistent attributes or shapes: still one clear error
            raise UnsupportedModelError(
                BACKEND,
                [UnsupportedNode(_node_label(node), node.op_type, domain, opset, f"{type(exc).__name__}: {exc}")],
            ) from None
        except Unsupported as exc:
            raise UnsupportedModelError(
                BACKEND, [UnsupportedNode(_node_label(node), node.op_type, domain, opset, str(exc))]
            ) from None
        for name, value in zip(node.output, results, strict=False):
            if name:
                values[name] = value
    for output in proto.graph.output:
        if output.name not in values:
            raise UnsupportedModelError(BACKEND, [f"graph output {output.name!r} is not produced by any node"])
        plan.outputs[output.name] = values[output.name]
    return plan


def _lower(
    node: onnx.NodeProto,
    args: list[Value | None],
    opset: int,
    *,
    opsets: Mapping[str, int],
    registry: ConverterRegistry,
    builder: Builder,
    plan: Plan,
) -> list[Value]:
    domain = node.domain if node.domain != "ai.onnx" else ""
    present = [a for a in args if a is not None]
    if (
        domain == ""
        and node.op_type == "CastLike"
        and args
        and args[0] is not None
        and not isinstance(args[0], Tensor)
        and node.input[0] not in builder.weight_dependent  # refit could not replay it
    ):
        # only the dtype of the second input matters: a constant first input folds
        like = args[1] if len(args) > 1 else None
        if like is not None and np.dtype(like.dtype) in SUPPORTED_DTYPES:
            target = np.dtype(like.dtype)
            value = np.asarray(args[0]).astype(target)
            plan.shape_constants[node.output[0]] = value  # weight-independent: refit reuses it
            return [value]
    if node.op_type not in NOT_FOLDABLE and not any(isinstance(a, Tensor) for a in present) and not _has_subgraph(node):
        plan.folded.append(node)
        if any(name in builder.weight_dependent for name in node.input if name):
            builder.weight_dependent.update(o for o in node.output if o)
        if all(name in builder.weight_derived for name in node.input if name):
            # computed from weights alone: the same for every input signature
            builder.weight_derived.update(o for o in node.output if o)
        return list(evaluate_node(node, [None if a is None else np.asarray(a) for a in args], opsets))
    if domain == "" and node.op_type in ("Shape", "Size") and present and isinstance(present[0], Tensor):
        value = _shape_of(node, present[0])
        plan.shape_constants[node.output[0]] = value
        return [value]
    converter = registry.lookup(domain, node.op_type, opset)
    if converter is None:
        known = registry.known(domain, node.op_type)
        why = f"no converter for opset {opset} (have: {known})" if known else "operator not supported by sdkit-ggml"
        raise Unsupported(why)
    if converter.check is not None:
        problem = converter.check(node)
        if problem:
            raise Unsupported(problem)
    wrapped = Node(node, args, opset)
    results = converter.convert(builder, wrapped)
    if len(results) < len([o for o in node.output if o]):
        raise Unsupported(f"converter produced {len(results)} outputs, the node has {len(node.output)}")
    return results


def _has_subgraph(node: onnx.NodeProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)


def _shape_of(node: onnx.NodeProto, tensor: Tensor) -> np.ndarray:
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
            raise UnsupportedModelError(BACKEND, [f"refit: {_node_label(node)}: {exc}"]) from None
        for name, value in zip(node.output, results, strict=False):
            if name:
                values[name] = value
    return values
