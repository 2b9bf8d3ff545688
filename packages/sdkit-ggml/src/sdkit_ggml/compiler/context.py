"""What converters work with: ``Tensor`` (a ggml tensor with its ONNX shape and dtype),
compile-time constants (numpy arrays), ``Node`` (one ONNX node's inputs and attributes), and
the exceptions a lowering raises. The ``Builder`` that creates tensors is in ``builder.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper

from sdkit_ggml.runtime.tensors import (
    BOOL,
    FLOAT_DTYPES,
    INT_DTYPES,
    SUPPORTED_DTYPES,
    Tensor,
    WeightEntry,
    ne_of,
    storage_numpy,
)

__all__ = [
    "BOOL",
    "FLOAT_DTYPES",
    "INT_DTYPES",
    "SUPPORTED_DTYPES",
    "NeedsValue",
    "Node",
    "Tensor",
    "Unsupported",
    "Value",
    "ValueUnknown",
    "WeightEntry",
    "attributes",
    "ne_of",
    "storage_numpy",
]


class Unsupported(Exception):
    """A node (or its attributes, dtypes or shapes) that ggml cannot run; the message says why."""


class NeedsValue(Exception):
    """A graph input is used where a compile-time constant is required (a shape, axes...):
    the compiled model specialises on that input's value and builds again."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


class ValueUnknown(Exception):
    """``check()`` only: a node needs the value of a constant it does not have (a weight, or a
    value computed from weights or symbolic shapes); compile decides it."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


Value = Tensor | np.ndarray


def attributes(node: onnx.NodeProto) -> dict[str, Any]:
    """A node's attributes as Python values (strings decoded)."""
    values = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return {k: v.decode() if isinstance(v, bytes) else v for k, v in values.items()}


@dataclass
class Node:
    """One ONNX node as converters see it."""

    proto: onnx.NodeProto
    inputs: list[Value | None]  # None for an omitted optional input
    opset: int
    attrs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.attrs = attributes(self.proto)

    @property
    def op(self) -> str:
        return self.proto.op_type

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    def has(self, index: int) -> bool:
        return index < len(self.inputs) and self.inputs[index] is not None

    def value(self, index: int) -> Value:
        value = self.inputs[index] if index < len(self.inputs) else None
        if value is None:
            raise Unsupported(f"input {index} is missing")
        return value

    def input_name(self, index: int) -> str:
        return str(self.proto.input[index])
