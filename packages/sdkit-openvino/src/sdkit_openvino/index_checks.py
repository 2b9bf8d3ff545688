"""Gather indices that come from graph inputs are range-checked before OpenVINO runs.

OpenVINO's CPU plugin fills the rows of out-of-range Gather indices with zeros: token ids of
1e9 gave an image, exit 0, where ONNX, onnxruntime and the other backends call them an error.
``index_bounds`` finds each graph input that reaches a Gather's indices through value-preserving
ops only (Cast, Reshape, Squeeze...: the token ids of a text encoder) with the size of the dim
it indexes; ``check_indices`` refuses feeds outside ``[-dim, dim)`` (negatives count from the
end, as ONNX says) with an InputError before inference.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import helper

from sdkit.errors import InputError
from sdkit.model import Graph

# ops whose output holds the same index values as their first input
_VALUE_PRESERVING = frozenset({"Cast", "Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten"})


def _static_dims(proto: onnx.ModelProto) -> dict[str, list[int]]:
    """Known shapes: initializers (their dims survive weight stripping) and static value infos."""
    graph = proto.graph
    dims = {t.name: [int(d) for d in t.dims] for t in graph.initializer}
    for value in (*graph.input, *graph.value_info, *graph.output):
        shape = value.type.tensor_type.shape.dim
        if value.type.HasField("tensor_type") and shape and all(d.HasField("dim_value") for d in shape):
            dims.setdefault(value.name, [int(d.dim_value) for d in shape])
    return dims


def _source(name: str, producers: Mapping[str, onnx.NodeProto]) -> str:
    node = producers.get(name)
    while node is not None and node.op_type in _VALUE_PRESERVING and node.domain in ("", "ai.onnx"):
        name = node.input[0]
        node = producers.get(name)
    return name


def index_bounds(graph: Graph) -> dict[str, int]:
    """Graph input -> the smallest dim any Gather it feeds (through value-preserving ops) indexes."""
    proto = graph.proto
    inputs = {i.name for i in graph.inputs}
    producers = {out: node for node in proto.graph.node for out in node.output}
    dims = _static_dims(proto)
    bounds: dict[str, int] = {}
    for node in proto.graph.node:
        if node.op_type != "Gather" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
            continue
        data = dims.get(node.input[0])
        source = _source(node.input[1], producers)
        if not data or source not in inputs:
            continue
        axis = next((int(helper.get_attribute_value(a)) for a in node.attribute if a.name == "axis"), 0)
        dim = data[axis % len(data)]
        bounds[source] = min(dim, bounds.get(source, dim))
    return bounds


def check_indices(bounds: Mapping[str, int], feeds: Mapping[str, np.ndarray]) -> None:
    for name, dim in bounds.items():
        values = feeds.get(name)
        if values is None or not values.size or values.dtype.kind not in "iu":
            continue
        low, high = values.min(), values.max()
        if low < -dim or high >= dim:
            raise InputError(f"input {name!r}: indices must lie in [{-dim}, {dim}), got [{low}, {high}]")
