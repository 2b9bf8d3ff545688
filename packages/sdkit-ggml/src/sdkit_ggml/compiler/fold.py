"""Compile-time constant folding: nodes whose inputs are all known (weights, Constant nodes,
shapes of static tensors) are evaluated once with onnx.reference, never at run time.

Torch exports compute reshape targets through Shape -> Gather -> Unsqueeze -> Concat chains;
with input shapes fixed per call signature these all fold to constants here.

A large ConstantOfShape folds to one value broadcast to its shape (a numpy view, every stride
0), and elementwise ops whose inputs are all such values fold on one element and broadcast
again: diffusers' baddbmm attention exports ``zeros[batch * heads, q, k] * beta`` in each of
SD 1.5's 32 attentions (1 GiB each for the 5 top-level self-attentions at 512 px, batch 2),
which evaluated in full took most of a build's time and held 2 GiB per attention until the
build ended. The values are the same ones, element for element.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from sdkit.limits import memory_budget, shape_bytes
from sdkit_ggml.compiler.context import Unsupported

# Which nodes fold is decided in ``support.py`` (``Route.FOLD``), for compile and check() alike.

# A cached evaluator is shared by every compile in the process: one fold runs at a time (compiles
# on several threads would otherwise share an op instance mid-run).
_EVALUATING = threading.Lock()
# ConstantOfShape results from this many elements on are broadcast views, not arrays.
UNIFORM_MIN_ELEMENTS = 1 << 12
# Ops computing each output element from the same-position (broadcast) input elements alone.
ELEMENTWISE = frozenset(
    {
        *("Add", "Sub", "Mul", "Div", "Pow", "Mod", "Neg", "Abs", "Reciprocal", "Sqrt", "Exp", "Log"),
        *("Erf", "Sigmoid", "Tanh", "Relu", "Floor", "Ceil", "Round", "Sign", "Sin", "Cos"),
        *("Cast", "CastLike", "Identity", "Where", "Equal", "Less", "LessOrEqual", "Greater"),
        *("GreaterOrEqual", "Not", "And", "Or", "Xor", "IsNaN", "IsInf", "Min", "Max"),
    }
)


def is_uniform(array: np.ndarray) -> bool:
    """Whether ``array`` is one value broadcast to a shape of several elements (every stride 0),
    as the folds below make them: its uniformity known without reading it."""
    return array.size > 1 and not any(array.strides)


def _one_element(array: np.ndarray) -> np.ndarray:
    """The first element of ``array`` at its rank (a view: a broadcast one is never copied)."""
    return array[(slice(0, 1),) * array.ndim]


def _uniform_fold(
    node: onnx.NodeProto, inputs: Sequence[np.ndarray | None], opsets: Mapping[str, int]
) -> list[np.ndarray] | None:
    """The node's results as broadcast views where they are one repeated value, else None."""
    if node.domain not in ("", "ai.onnx"):
        return None
    present = [np.asarray(a) for a in inputs if a is not None]
    if node.op_type == "ConstantOfShape" and len(present) == 1:
        shape = tuple(int(d) for d in present[0].reshape(-1))
        if any(d < 0 for d in shape) or math.prod(shape) < UNIFORM_MIN_ELEMENTS:
            return None
        ones = np.ones(len(shape), dtype=present[0].dtype)
        values = evaluate_node(node, [ones], opsets)
        if any(shape_bytes(shape, r.itemsize) > memory_budget() for r in values):
            return None  # evaluated in full, it fails as it always did (no view of what cannot exist)
        return [np.broadcast_to(r, shape) for r in values]
    if node.op_type not in ELEMENTWISE or not any(is_uniform(a) for a in present):
        return None
    if not all(a.size == 1 or is_uniform(a) for a in present):
        return None
    try:
        shape = np.broadcast_shapes(*(a.shape for a in present))
    except ValueError:
        return None  # the full evaluation reports it
    small = [None if a is None else _one_element(np.asarray(a)) for a in inputs]
    return [np.broadcast_to(r, shape) for r in evaluate_node(node, small, opsets)]


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
    if node.op_type == "Constant":
        return [constant_node_value(node)]
    uniform = _uniform_fold(node, inputs, opsets)
    if uniform is not None:
        return uniform
    canonical, feeds = _canonical(node, inputs)
    dtypes = tuple((name, np.asarray(value).dtype) for name, value in feeds.items())
    try:
        evaluator = _evaluator(canonical.SerializeToString(deterministic=True), dtypes, tuple(sorted(opsets.items())))
        # The graph's own arithmetic, warnings included: T5's relative-position buckets take
        # log(0) = -inf and cast it, then mask it out; numpy's RuntimeWarning would reach users.
        with np.errstate(all="ignore"), _EVALUATING:
            results = evaluator.run(None, feeds)
    except Exception as exc:  # onnx.reference raises many types on bad constants
        raise Unsupported(f"constant folding failed: {type(exc).__name__}: {exc}") from None
    return [np.asarray(r) for r in results]


def _canonical(node: onnx.NodeProto, inputs: Sequence[np.ndarray | None]) -> tuple[onnx.NodeProto, dict[str, Any]]:
    """``node`` with positional value names (``i0``, ``o0``...) and no name, and its feeds:
    nodes that differ only in names (the many Unsqueeze/Gather/Concat of a torch export's
    shape arithmetic) share one evaluator."""
    canonical = onnx.NodeProto()
    canonical.CopyFrom(node)
    canonical.ClearField("name")
    del canonical.input[:]
    del canonical.output[:]
    feeds: dict[str, Any] = {}
    padded = list(inputs) + [None] * (len(node.input) - len(inputs))
    for index, (name, value) in enumerate(zip(node.input, padded, strict=True)):
        canonical.input.append(f"i{index}" if name and value is not None else "")
        if name and value is not None:
            feeds[f"i{index}"] = value
    canonical.output.extend(f"o{index}" if name else "" for index, name in enumerate(node.output))
    return canonical, feeds


@functools.lru_cache(maxsize=4096)
def _evaluator(
    node_bytes: bytes, dtypes: tuple[tuple[str, np.dtype[Any]], ...], opsets: tuple[tuple[str, int], ...]
) -> Any:
    """A ReferenceEvaluator of one canonical node for these input dtypes (built once: building
    one took most of a fold's time)."""
    from onnx.reference import ReferenceEvaluator

    node = onnx.NodeProto.FromString(node_bytes)
    graph_inputs = [
        helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(dtype), None) for name, dtype in dtypes
    ]
    outputs = [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in node.output if o]
    graph = helper.make_graph([node], "fold", graph_inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    return ReferenceEvaluator(model)
