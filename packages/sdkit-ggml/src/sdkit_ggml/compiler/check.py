"""``check()``'s walk: the compile walk (``Lowering``, the same routes and converters) over a
shape-only builder, without the ggml library and without weight values, that goes on past a
node it cannot lower so that every unsupported node is reported at once.

What check() cannot know is left to compile and said so (``GraphCheck.deferred``): a node
fed by a value of unknown shape (symbolic input dims) is decided by its op, opset and
attributes only; a node that needs the value of a weight (check() sees none) or of a graph
input (the compiled model specialises on it) is decided when that value is known.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from sdkit.errors import UnsupportedNode
from sdkit_ggml.compiler.build import capacity_for, describe_failure, unsupported
from sdkit_ggml.compiler.builder import Builder
from sdkit_ggml.compiler.context import SUPPORTED_DTYPES, NeedsValue, Tensor, Value, ValueUnknown
from sdkit_ggml.compiler.lowering import Lowering
from sdkit_ggml.compiler.passes import apply_passes
from sdkit_ggml.compiler.registry import ConverterRegistry, opset_for, opsets_of
from sdkit_ggml.compiler.shape_only import ShapeOnlyContext
from sdkit_ggml.compiler.support import Route, decide, node_label


@dataclass(frozen=True)
class Undetermined:
    """A value whose shape check() does not know: a runtime tensor, or a constant."""

    constant: bool


@dataclass(frozen=True)
class Placeholder:
    """A constant of known shape whose value check() does not have: a weight, or a value
    folded from weights. Converters get zeros in its place; ``const()`` refuses to read it."""

    shape: tuple[int, ...]
    dtype: np.dtype[Any]

    def zeros(self) -> np.ndarray:
        """Read-only zeros that take no memory (a broadcast of one element)."""
        return np.broadcast_to(np.zeros((), dtype=self.dtype), self.shape)


RUNTIME = Undetermined(constant=False)
CONSTANT = Undetermined(constant=True)
CheckValue = Value | Undetermined | Placeholder


@dataclass
class GraphCheck:
    """Every node compile would refuse that check() can see, and what it left to compile."""

    unsupported: list[UnsupportedNode] = field(default_factory=list)
    deferred: dict[str, str] = field(default_factory=dict)  # node -> why compile decides it
    shape_free: list[str] = field(default_factory=list)  # nodes checked by op and attributes only

    def notes(self, limit: int = 5) -> list[str]:
        notes = []
        if self.shape_free:
            notes.append(
                f"{len(self.shape_free)} node(s) have inputs of unknown shape (symbolic input dims): "
                "checked by op, opset and attributes; shape limits are checked when a shape compiles"
            )
        items = list(self.deferred.items())
        notes += [f"{node}: {why}" for node, why in items[:limit]]
        if len(items) > limit:
            notes.append(f"... and {len(items) - limit} more node(s) decided at compile time")
        return notes


def _shape_and_dtype(tp: onnx.TypeProto) -> tuple[tuple[int, ...] | None, np.dtype[Any] | None]:
    if not tp.HasField("tensor_type"):
        return None, None
    tensor_type = tp.tensor_type
    dims = list(tensor_type.shape.dim) if tensor_type.HasField("shape") else None
    static = dims is not None and all(d.HasField("dim_value") for d in dims)
    shape = tuple(int(d.dim_value) for d in dims) if dims is not None and static else None
    return shape, _np_dtype(tensor_type.elem_type)


def infer_outputs(
    node: onnx.NodeProto,
    opsets: dict[str, int],
    inputs: dict[str, tuple[tuple[int, ...], np.dtype[Any]]],
    known: dict[str, np.ndarray],
) -> dict[str, tuple[tuple[int, ...] | None, np.dtype[Any] | None]]:
    """The output (shape, dtype) ONNX's own inference gives a node whose inputs have these
    (shape, dtype); only the values of the ``known`` inputs are revealed to it."""
    try:
        schema = onnx.defs.get_schema(node.op_type, opset_for(node, opsets), node.domain)
        types = {
            name: helper.make_tensor_type_proto(helper.np_dtype_to_tensor_dtype(dtype), shape)
            for name, (shape, dtype) in inputs.items()
        }
        data = {name: numpy_helper.from_array(value, name) for name, value in known.items()}
        imports = [helper.make_opsetid(domain, version) for domain, version in opsets.items()]
        outputs = onnx.shape_inference.infer_node_outputs(schema, node, types, data, opset_imports=imports)
    except Exception:  # no schema (a custom domain), or inference refuses: unknown
        return {}
    return {name: _shape_and_dtype(tp) for name, tp in outputs.items()}


def _np_dtype(elem_type: int) -> np.dtype[Any] | None:
    if not elem_type:
        return None
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        return np.dtype(object)


def _concrete(args: Sequence[CheckValue | None]) -> list[Value | None]:
    """Arguments for a converter: zeros stand in for placeholders, one node at a time (the
    weights are never all held at once)."""
    concrete: list[Value | None] = []
    for arg in args:
        if isinstance(arg, Undetermined):
            raise TypeError("a value of unknown shape cannot be lowered")
        concrete.append(arg.zeros() if isinstance(arg, Placeholder) else arg)
    return concrete


class GraphChecker:
    """One check() walk over one graph."""

    def __init__(self, proto: onnx.ModelProto, registry: ConverterRegistry) -> None:
        self.proto = apply_passes(proto)
        self.opsets = opsets_of(self.proto)
        self.registry = registry
        self.builder = Builder(ShapeOnlyContext(capacity_for(self.proto)), keep_weights=False)
        self.lowering = Lowering(self.opsets, registry, self.builder)
        self.values: dict[str, CheckValue] = {}
        self.result = GraphCheck()

    def run(self) -> GraphCheck:
        self._initializers()
        self._inputs()
        for node in self.proto.graph.node:
            results = self._node(node)
            for name, value in zip(node.output, results, strict=False):
                if name:
                    self.values[name] = value
        for output in self.proto.graph.output:
            if output.name not in self.values:
                self.result.unsupported.append(
                    UnsupportedNode(f"output {output.name}", "<output>", "", 0, "not produced by any node")
                )
        return self.result

    def _initializers(self) -> None:
        """Weights: known shapes, unknown values."""
        for init in self.proto.graph.initializer:
            dtype = _np_dtype(init.data_type) or np.dtype(np.float32)
            self.values[init.name] = Placeholder(tuple(int(d) for d in init.dims), dtype)
        names = {init.name for init in self.proto.graph.initializer}
        self.builder.weight_derived.update(names)
        self.builder.weight_dependent.update(names)
        self.builder.unknown_values.update(names)

    def _inputs(self) -> None:
        weights = set(self.values)
        for vi in self.proto.graph.input:
            if vi.name in weights:
                continue
            shape, dtype = _shape_and_dtype(vi.type)
            if shape is not None and dtype is not None and 0 in shape:
                self.values[vi.name] = np.zeros(shape, dtype=dtype)  # compile makes an empty input a constant
            elif dtype is None or dtype not in SUPPORTED_DTYPES:
                what = f"ggml has no {dtype} tensors" if dtype is not None else "not a tensor"
                self.result.unsupported.append(UnsupportedNode(f"input {vi.name}", "<input>", "", 0, what))
                self.values[vi.name] = RUNTIME
            elif shape is None:
                self.values[vi.name] = RUNTIME
            else:
                tensor = self.builder.new_input(shape, dtype)
                self.builder.input_names[tensor.ptr] = vi.name
                self.values[vi.name] = tensor

    def _node(self, node: onnx.NodeProto) -> Sequence[CheckValue]:
        missing = [name for name in node.input if name and name not in self.values]
        if missing:
            self._refuse(node, f"input {missing[0]!r} is not produced by any node")
            return [RUNTIME] * len(node.output)
        args = [self.values[name] if name else None for name in node.input]
        try:
            if any(isinstance(a, Undetermined) for a in args):
                return self._shape_free(node, args)
            if self._folds_unknown(node, args):
                return self._unknown_fold(node, args)
            results = self.lowering.lower(node, _concrete(args))
        except NeedsValue as need:
            self.result.deferred[node_label(node)] = f"compiled per value of input {need.name!r}"
        except ValueUnknown as need:
            self.result.deferred[node_label(node)] = f"needs the value of {need.name!r} (decided when compiling)"
        except Exception as exc:
            reason = describe_failure(exc)
            if reason is None:
                raise
            self._refuse(node, reason)
        else:
            return self._mark_unknown(node, results)
        return [RUNTIME] * len(node.output)

    def _refuse(self, node: onnx.NodeProto, reason: str) -> None:
        self.result.unsupported.append(unsupported(node, self.opsets, reason))

    def _decide(self, node: onnx.NodeProto, args: Sequence[CheckValue | None]) -> Route:
        present = [a for a in args if a is not None]
        runtime = [isinstance(a, Tensor) or (isinstance(a, Undetermined) and not a.constant) for a in present]
        decision = decide(
            node,
            opset_for(node, self.opsets),
            self.registry,
            constant_inputs=not any(runtime),
            tensor_first=bool(runtime) and runtime[0],
        )
        return decision.route

    def _shape_free(self, node: onnx.NodeProto, args: Sequence[CheckValue | None]) -> Sequence[CheckValue]:
        """A node fed by a value of unknown shape: only the route (and the converter's static
        checks) can be decided."""
        route = self._decide(node, args)
        if route is Route.CONVERT:
            self.result.shape_free.append(node_label(node))
            return [RUNTIME] * len(node.output)
        return [CONSTANT] * len(node.output)

    def _folds_unknown(self, node: onnx.NodeProto, args: Sequence[CheckValue | None]) -> bool:
        """A fold that needs a value check() does not have (a weight's)."""
        unknown = any(name in self.builder.unknown_values for name in node.input if name)
        return unknown and self._decide(node, args) is Route.FOLD

    def _unknown_fold(self, node: onnx.NodeProto, args: Sequence[CheckValue | None]) -> list[CheckValue]:
        """A fold computed from values check() does not have (weights): its outputs are
        constants of the shapes ONNX inference gives (zeros stand in, as for weights), or of
        unknown shape when inference cannot tell without the values."""
        inputs = {
            name: (tuple(a.shape), np.dtype(a.dtype))
            for name, a in zip(node.input, args, strict=False)
            if name and isinstance(a, np.ndarray | Placeholder)
        }
        known = {n: a for n, a in zip(node.input, args, strict=False) if n and isinstance(a, np.ndarray)}
        inferred = infer_outputs(node, self.opsets, inputs, known)
        results: list[CheckValue] = []
        for name in node.output:
            shape, dtype = inferred.get(name, (None, None))
            if not name or shape is None:
                results.append(CONSTANT)
                continue
            self.builder.unknown_values.add(name)
            self.builder.weight_dependent.add(name)
            results.append(Placeholder(shape, dtype or np.dtype(np.float32)))
        return results

    def _mark_unknown(self, node: onnx.NodeProto, results: Sequence[Value]) -> Sequence[CheckValue]:
        """Constants a converter returned from placeholder inputs are placeholders too."""
        if not any(name in self.builder.unknown_values for name in node.input if name):
            return results
        marked: list[CheckValue] = []
        for name, value in zip(node.output, results, strict=False):
            if isinstance(value, Tensor):
                marked.append(value)
            else:
                self.builder.unknown_values.add(name)
                marked.append(Placeholder(tuple(np.shape(value)), np.asarray(value).dtype))
        return marked


def check_graph(proto: onnx.ModelProto, registry: ConverterRegistry) -> GraphCheck:
    """Every node of ``proto`` that compile would refuse, as far as the graph alone tells."""
    return GraphChecker(proto, registry).run()


__all__ = ["GraphCheck", "Placeholder", "Undetermined", "check_graph"]
