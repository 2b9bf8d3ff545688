"""The state of one ONNX -> MIL translation: ONNX value name -> MIL Var, plus helpers.

Integer tensors live as int32 in Core ML (it has no int64 tensors): int64 initializers and
constants are narrowed here, saturating the INT64 sentinels ONNX uses for "to the end".
float64 becomes float32.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from sdkit.errors import ModelFormatError, UnsupportedNode, UnsupportedOperatorError

BACKEND_NAME = "coreml"
INT32 = np.iinfo(np.int32)

# ONNX TensorProto data type -> MIL dtype string for ``mb.cast``.
CAST_TARGETS: dict[int, str] = {
    onnx.TensorProto.FLOAT: "fp32",
    onnx.TensorProto.DOUBLE: "fp32",
    onnx.TensorProto.FLOAT16: "fp16",
    onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.INT64: "int32",
    onnx.TensorProto.INT16: "int32",
    onnx.TensorProto.INT8: "int32",
    onnx.TensorProto.UINT8: "int32",
    onnx.TensorProto.BOOL: "bool",
}


def to_mil_array(array: np.ndarray) -> np.ndarray:
    """``array`` in a dtype Core ML holds: int -> int32 (saturating), float64 -> float32."""
    if array.dtype.kind in "iu" and array.dtype != np.int32:
        narrowed: np.ndarray = np.clip(array, INT32.min, INT32.max).astype(np.int32)
        return narrowed
    if array.dtype == np.float64:
        return array.astype(np.float32)
    return array


def mil() -> Any:
    """coremltools' MIL builder (imported on first use: ``check`` works without coremltools)."""
    from coremltools.converters.mil import Builder

    return Builder


class Context:
    """Values of the graph being translated, by ONNX name."""

    def __init__(
        self,
        opset: int,
        initializers: Mapping[str, np.ndarray],
        nodes: list[onnx.NodeProto] | None = None,
        graph_outputs: frozenset[str] = frozenset(),
        sdpa: bool = False,
    ) -> None:
        self.opset = opset
        self.initializers = initializers  # become MIL constants on first use
        self.values: dict[str, Any] = {}
        self.sdpa = sdpa  # the target has scaled_dot_product_attention (macOS 15)
        self.graph_outputs = graph_outputs
        # graph structure, for converters that match patterns (attention)
        self.producers = {out: n for n in nodes or [] for out in n.output if out}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for n in nodes or []:
            for name in n.input:
                self.consumers.setdefault(name, []).append(n)

    def producer(self, name: str) -> onnx.NodeProto | None:
        return self.producers.get(name)

    def private(self, name: str) -> bool:
        """``name`` feeds exactly one node and is not a graph output (safe to fuse away)."""
        return len(self.consumers.get(name, [])) == 1 and name not in self.graph_outputs

    def get(self, name: str) -> Any:
        var = self.values.get(name)
        if var is None:
            if name not in self.initializers:
                raise ModelFormatError(f"ONNX value {name!r} is used before it is defined")
            var = self.values[name] = self.const(self.initializers[name], name=name)
        return var

    def optional(self, node: onnx.NodeProto, index: int) -> Any:
        """Input ``index`` of ``node``, or None when absent or empty."""
        if index >= len(node.input) or not node.input[index]:
            return None
        return self.get(node.input[index])

    def set(self, name: str, var: Any) -> None:
        self.values[name] = var

    def const(self, array: np.ndarray | float | int | bool, name: str | None = None) -> Any:
        value = to_mil_array(np.asarray(array))
        return mil().const(val=value, name=name) if name else mil().const(val=value)

    @staticmethod
    def value(var: Any) -> np.ndarray | None:
        """The compile-time value of ``var`` (constants and shapes MIL could fold), or None."""
        val = getattr(var, "val", None)
        if val is None:
            return None
        return np.asarray(val)

    def known(self, node: onnx.NodeProto, index: int, what: str) -> np.ndarray:
        """An input that must be known at conversion time (axes, pads, scales)."""
        var = self.optional(node, index)
        value = None if var is None else self.value(var)
        if value is None:
            raise UnsupportedOperatorError(
                BACKEND_NAME,
                [unsupported(node, self.opset, f"{what} (input {index}) must be a constant for Core ML")],
            )
        return value


def attrs(node: onnx.NodeProto) -> dict[str, Any]:
    """Node attributes as Python values (strings decoded)."""
    found: dict[str, Any] = {}
    for attribute in node.attribute:
        value = helper.get_attribute_value(attribute)
        if isinstance(value, bytes):
            value = value.decode()
        elif isinstance(value, onnx.TensorProto):
            value = numpy_helper.to_array(value)
        found[attribute.name] = value
    return found


def unsupported(node: onnx.NodeProto, opset: int, reason: str) -> UnsupportedNode:
    return UnsupportedNode(node.name, node.op_type, node.domain, opset, reason)


def fail(node: onnx.NodeProto, opset: int, reason: str) -> UnsupportedOperatorError:
    return UnsupportedOperatorError(BACKEND_NAME, [unsupported(node, opset, reason)])


def rank_of(var: Any) -> int:
    return len(var.shape)


def static_shape(var: Any) -> tuple[int, ...] | None:
    """``var``'s shape when every dim is a known integer."""
    dims = tuple(var.shape)
    if all(isinstance(d, (int, np.integer)) for d in dims):
        return tuple(int(d) for d in dims)
    return None


def weights_by_name(weights: Mapping[str, np.ndarray], names: frozenset[str]) -> dict[str, np.ndarray]:
    missing = sorted(n for n in names if n not in weights)
    if missing:
        raise ModelFormatError(f"weights are missing {len(missing)} initializer(s), e.g. {missing[0]!r}")
    return {n: np.asarray(weights[n]) for n in names}
