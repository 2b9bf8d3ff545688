"""The one decision of how a node is lowered, shared by compile (``lowering.py``) and
``check()`` (``check.py``): fold it at compile time, answer a shape query, or convert it with
the registered converter after that converter's static checks. A node neither can handle
raises ``Unsupported`` with the same reason in both.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import onnx

from sdkit_ggml.compiler.context import Unsupported
from sdkit_ggml.compiler.registry import Converter, ConverterRegistry, no_converter_reason, onnx_domain

# Ops whose result must not be computed once and reused (randomness).
NOT_FOLDABLE = frozenset(
    {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}
)
SHAPE_QUERIES = frozenset({"Shape", "Size"})


class Route(enum.Enum):
    FOLD = "fold"  # every input is a compile-time constant: evaluated once (onnx.reference)
    SHAPE = "shape"  # Shape/Size of a runtime tensor: its static shape
    CONVERT = "convert"  # built from ggml ops by a converter


@dataclass(frozen=True)
class Decision:
    route: Route
    converter: Converter | None = None


def has_subgraph(node: onnx.NodeProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)


def foldable(node: onnx.NodeProto) -> bool:
    """Whether a node whose inputs are all constants may be evaluated at compile time."""
    return node.op_type not in NOT_FOLDABLE and not has_subgraph(node)


def decide(
    node: onnx.NodeProto,
    opset: int,
    registry: ConverterRegistry,
    *,
    constant_inputs: bool,
    tensor_first: bool,
) -> Decision:
    """How ``node`` is lowered. ``constant_inputs``: every present input is a compile-time
    constant; ``tensor_first``: its first present input is a runtime tensor."""
    if constant_inputs and foldable(node):
        return Decision(Route.FOLD)
    domain = onnx_domain(node.domain)
    if domain == "" and node.op_type in SHAPE_QUERIES and tensor_first:
        return Decision(Route.SHAPE)
    converter = registry.lookup(domain, node.op_type, opset)
    if converter is None:
        raise Unsupported(no_converter_reason(registry, domain, node.op_type, opset))
    if converter.check is not None:
        problem = converter.check(node)
        if problem:
            raise Unsupported(problem)
    return Decision(Route.CONVERT, converter)


def node_label(node: onnx.NodeProto) -> str:
    """How errors name a node: its name, else its first output."""
    return node.name or (node.output[0] if node.output else "")
