"""What the graph passes read and write: producers and consumers of every value, the values of
``Constant`` nodes (initializers are weights refit may change: never read), ranks from ONNX
shape inference, and the rebuilt ModelProto.

Passes run before any input shape is known; a pattern whose legality depends on a value or a
rank that is not known here is left as exported.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import numpy as np
import onnx
from onnx import numpy_helper

_T = onnx.TensorProto
# Cast targets whose conversion numpy's astype performs as ONNX defines it
_NUMERIC_CASTS = frozenset(
    {_T.FLOAT, _T.DOUBLE, _T.FLOAT16, _T.INT8, _T.INT16, _T.INT32, _T.INT64, _T.UINT8, _T.UINT16, _T.UINT32, _T.UINT64}
)

# The domain of sdkit-ggml's fused nodes (converters/fused.py).
FUSED_DOMAIN = "ai.sdkit.ggml"
FUSED_OPSET = 1


class GraphView:
    """An editable view of one graph's node list. Nodes are replaced by index; ``None`` marks a
    removed node until ``model()`` writes the new proto."""

    def __init__(self, proto: onnx.ModelProto, *, ranks: bool = False) -> None:
        self.proto = proto
        self.nodes: list[onnx.NodeProto | None] = list(proto.graph.node)
        # graph outputs, and values subgraphs (If/Loop bodies) read from the outer scope:
        # never renamed or dropped
        self.outputs = {o.name for o in proto.graph.output} | _subgraph_reads(proto.graph)
        self.producer: dict[str, int] = {}
        self.consumers: dict[str, list[int]] = defaultdict(list)
        for index, node in enumerate(proto.graph.node):
            for name in node.output:
                if name:
                    self.producer[name] = index
            for name in node.input:
                if name:
                    self.consumers[name].append(index)
        self._ranks = _ranks(proto) if ranks else {}
        self.changed = False

    def node_of(self, name: str) -> onnx.NodeProto | None:
        index = self.producer.get(name)
        return None if index is None else self.nodes[index]

    def only_use(self, name: str) -> int | None:
        """The index of the single node reading ``name``, when nothing else (no graph output) does."""
        users = self.consumers.get(name, [])
        if len(users) != 1 or name in self.outputs:
            return None
        return users[0]

    def constant(self, name: str) -> np.ndarray | None:
        """The value of ``name`` when a ``Constant`` node with a ``value`` tensor produces it."""
        node = self.node_of(name)
        if node is None or node.op_type != "Constant" or node.domain not in ("", "ai.onnx"):
            return None
        for attr in node.attribute:
            if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
                return np.asarray(numpy_helper.to_array(attr.t))
        return None

    def folded_constant(self, name: str) -> np.ndarray | None:
        """The value of ``name`` when it is a ``Constant`` seen through ``Identity`` and numeric
        ``Cast`` nodes (the TorchScript exporter writes a Python scalar as ``Cast(Constant)``),
        each Cast applied as ONNX defines it (numpy's ``astype``: round to nearest)."""
        casts: list[np.dtype] = []
        node = self.node_of(name)
        while node is not None and (is_op(node, "Identity") or is_op(node, "Cast")):
            if node.op_type == "Cast":
                target = int(attr(node, "to", 0))  # type: ignore[call-overload]
                if target not in _NUMERIC_CASTS:
                    return None
                casts.append(onnx.helper.tensor_dtype_to_np_dtype(target))
            name = str(node.input[0])
            node = self.node_of(name)
        value = self.constant(name)
        if value is None or value.dtype.kind not in "fiub":
            return None
        for dtype in reversed(casts):
            value = value.astype(dtype)
        return value

    def rank(self, name: str) -> int | None:
        return self._ranks.get(name)

    def note_rank(self, name: str, rank: int) -> None:
        """The rank of a value a pass adds."""
        self._ranks[name] = rank

    def rename_uses(self, old: str, new: str) -> None:
        """Every node reading ``old`` reads ``new`` instead (``old`` is not a graph output)."""
        for index in self.consumers.pop(old, []):
            node = self.nodes[index]
            if node is None:
                continue
            for i, name in enumerate(node.input):
                if name == old:
                    node.input[i] = new
            self.consumers[new].append(index)
        self.changed = True

    def replace(self, index: int, node: onnx.NodeProto | None) -> None:
        self.nodes[index] = node
        self.changed = True

    def model(self, extra_nodes: Iterable[tuple[int, onnx.NodeProto]] = ()) -> onnx.ModelProto:
        """The proto with the edited nodes (``extra_nodes`` placed at their indices)."""
        placed = dict(extra_nodes)
        nodes: list[onnx.NodeProto] = []
        for index, node in enumerate(self.nodes):
            if node is not None:
                nodes.append(node)
            if index in placed:
                nodes.append(placed[index])
        out = onnx.ModelProto()
        out.CopyFrom(self.proto)
        del out.graph.node[:]
        out.graph.node.extend(nodes)
        if any(n.domain == FUSED_DOMAIN for n in nodes) and not any(e.domain == FUSED_DOMAIN for e in out.opset_import):
            out.opset_import.append(onnx.helper.make_opsetid(FUSED_DOMAIN, FUSED_OPSET))
        return out


def make_fused(op: str, inputs: list[str], outputs: list[str], name: str, **attrs: object) -> onnx.NodeProto:
    """A node of sdkit-ggml's own domain (``converters/fused.py`` lowers it)."""
    node = onnx.helper.make_node(op, inputs, outputs, name=name, domain=FUSED_DOMAIN)
    node.attribute.extend(onnx.helper.make_attribute(key, value) for key, value in attrs.items())
    return node


def copy_node(node: onnx.NodeProto) -> onnx.NodeProto:
    fresh = onnx.NodeProto()
    fresh.CopyFrom(node)
    return fresh


def attr(node: onnx.NodeProto, name: str, default: object = None) -> object:
    for a in node.attribute:
        if a.name == name:
            value = onnx.helper.get_attribute_value(a)
            return value.decode() if isinstance(value, bytes) else value
    return default


def is_op(node: onnx.NodeProto | None, op_type: str) -> bool:
    return node is not None and node.op_type == op_type and node.domain in ("", "ai.onnx")


def _subgraph_reads(graph: onnx.GraphProto) -> set[str]:
    names: set[str] = set()
    for node in graph.node:
        for a in node.attribute:
            bodies = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
            for body in bodies:
                for inner in body.node:
                    names.update(n for n in inner.input if n)
                names |= _subgraph_reads(body)
    return names


def _ranks(proto: onnx.ModelProto) -> dict[str, int]:
    """Ranks of the values ONNX shape inference can tell (initializers carry dims, no data)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=False)
    except Exception:  # an exotic graph shape inference rejects: no ranks, no rank-based rewrite
        return {}
    ranks: dict[str, int] = {}
    graph = inferred.graph
    for vi in [*graph.input, *graph.value_info, *graph.output]:
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
            ranks[vi.name] = len(vi.type.tensor_type.shape.dim)
    for init in graph.initializer:
        ranks[init.name] = len(init.dims)
    return ranks
