"""Graph + weights -> a MIL ``Program`` (coremltools' intermediate form), node by node.

Input dims that are symbolic in the graph become MIL symbols (one per ``dim_param`` name, so
``batch`` stays one dim across inputs); fixed dims stay fixed. Core ML names must be plain
identifiers: ONNX names are sanitized and the mapping is kept (``IoNames``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sdkit.backend import TensorInfo
from sdkit.errors import InputError, SdkitError, UnsupportedNode, UnsupportedOperatorError
from sdkit.model import Graph
from sdkit_coreml.runtime import BACKEND_NAME, Target, first_line
from sdkit_coreml.translate.builtin import load_converters, why_unsupported
from sdkit_coreml.translate.context import Context, fail, weights_by_name

# numpy dtype of a graph input -> Core ML input dtype name (Core ML has no int64 inputs)
INPUT_DTYPES = {"float32": "fp32", "float16": "fp16", "int64": "int32", "int32": "int32", "bool": "bool"}


@dataclass
class IoNames:
    """ONNX input/output name -> Core ML feature name."""

    inputs: dict[str, str] = field(default_factory=dict)
    outputs: dict[str, str] = field(default_factory=dict)


def sanitize(name: str, taken: set[str]) -> str:
    clean = re.sub(r"\W", "_", name) or "value"
    clean = f"v_{clean}" if clean[0].isdigit() else clean
    unique, n = clean, 1
    while unique in taken:
        unique, n = f"{clean}_{n}", n + 1
    taken.add(unique)
    return unique


def preflight(graph: Graph) -> list[UnsupportedNode]:
    """Every node (and graph input/output) that cannot be translated, without translating."""
    opset = graph.opset()
    problems = []
    for node in graph.nodes:
        reason = why_unsupported(node, opset)
        if reason:
            problems.append(UnsupportedNode(node.name, node.op_type, node.domain, opset, reason))
    for info in [*graph.inputs, *graph.outputs]:
        if info.kind != "tensor" or info.dtype.name not in INPUT_DTYPES:
            what = info.kind if info.kind != "tensor" else info.dtype.name
            problems.append(
                UnsupportedNode(info.name, "<graph input/output>", "", opset, f"Core ML has no {what} inputs/outputs")
            )
    return problems


def input_specs(inputs: list[TensorInfo]) -> dict[str, Any]:
    """MIL placeholders by ONNX input name: fixed dims as ints, the rest as shared symbols."""
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import get_new_symbol, types

    symbols: dict[str, Any] = {}
    specs: dict[str, Any] = {}
    for info in inputs:
        dims: list[Any] = []
        for dim in info.shape:
            if isinstance(dim, int) and dim >= 0:
                dims.append(dim)
            elif isinstance(dim, str) and dim:
                dims.append(symbols.setdefault(dim, get_new_symbol()))
            else:
                dims.append(get_new_symbol())
        if not dims:
            raise InputError(f"input {info.name!r} is a scalar; Core ML inputs have rank >= 1")
        dtype = {"fp32": types.fp32, "fp16": types.fp16, "int32": types.int32, "bool": types.bool}
        specs[info.name] = mb.TensorSpec(shape=tuple(dims), dtype=dtype[INPUT_DTYPES[info.dtype.name]])
    return specs


def context_for(graph: Graph, initializers: Mapping[str, np.ndarray], target: Target) -> Context:
    outputs = frozenset(o.name for o in graph.outputs)
    return Context(graph.opset(), initializers, graph.nodes, outputs, sdpa=target.sdpa)


def translate_nodes(ctx: Context, nodes: list[Any], converters: Mapping[str, Any]) -> None:
    """Every node in graph order; a failure inside coremltools names the node."""
    for node in nodes:
        try:
            converters[node.op_type].fn(ctx, node)
        except SdkitError:
            raise
        except Exception as exc:  # coremltools' type inference rejects the node
            raise fail(node, ctx.opset, f"Core ML cannot translate it: {first_line(exc)}") from None


def build_program(graph: Graph, weights: Mapping[str, np.ndarray], target: Target) -> tuple[Any, IoNames]:
    """The MIL program of ``graph`` with ``weights`` baked in as constants."""
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import Function, Program

    problems = preflight(graph)
    if problems:
        raise UnsupportedOperatorError(BACKEND_NAME, problems)
    converters = load_converters()
    names = IoNames()
    taken: set[str] = set()
    specs = {sanitize(i.name, taken): s for i, s in zip(graph.inputs, input_specs(graph.inputs).values(), strict=True)}
    names.inputs = {i.name: mil_name for i, mil_name in zip(graph.inputs, specs, strict=True)}
    ctx = context_for(graph, weights_by_name(weights, graph.initializer_names), target)
    with Function(specs, opset_version=target.mil_opset) as function:
        for onnx_name, mil_name in names.inputs.items():
            ctx.set(onnx_name, function.inputs[mil_name])
        translate_nodes(ctx, graph.nodes, converters)
        outputs = []
        for info in graph.outputs:
            mil_name = sanitize(info.name, taken)
            names.outputs[info.name] = mil_name
            var = ctx.get(info.name)
            # an op already named after the output is returned as is (a second op may not reuse the name)
            outputs.append(var if var.name == mil_name and var.op is not None else mb.identity(x=var, name=mil_name))
        function.set_outputs(outputs)
    program = Program()
    program.add_function("main", function)
    shrink(program)
    return program, names


def shrink(program: Any) -> None:
    """Fold what is already known and drop what is unused, once, before ct.convert: the
    exported shape arithmetic (Shape -> Gather -> Concat...) is most of a static graph's ops,
    and coremltools validates the whole program after each of its ~100 passes."""
    from coremltools.converters.mil.mil.passes.pass_registry import PASS_REGISTRY

    for name in ("common::const_elimination", "common::dead_code_elimination"):
        PASS_REGISTRY[name](program)
