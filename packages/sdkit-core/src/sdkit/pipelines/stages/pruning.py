"""Drop graph outputs a pipeline never reads, and the nodes that only fed them.

A CLIP text encoder exported for diffusers also returns ``pooler_output`` (an ArgMax over the
token ids and a Gather), which Stable Diffusion ignores. Pruning it means a backend that lacks
integer ArgMax can still run the text encoder, and no backend spends time on it.
"""

from __future__ import annotations

from collections.abc import Collection

import onnx

from sdkit.model import Graph, Model


def _has_subgraphs(graph: onnx.GraphProto) -> bool:
    return any(
        a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in graph.node for a in n.attribute
    )


def keep_outputs(model: Model, wanted: Collection[str]) -> Model:
    """``model`` with only the outputs in ``wanted`` (unchanged when that is all of them, when
    none of them exist, or when the graph has control-flow subgraphs)."""
    graph = model.graph.proto.graph
    names = [o.name for o in graph.output]
    kept = [n for n in names if n in wanted]
    if not kept or len(kept) == len(names) or _has_subgraphs(graph):
        return model
    needed = set(kept)
    nodes: list[onnx.NodeProto] = []
    for node in reversed(graph.node):
        if any(out in needed for out in node.output):
            nodes.append(node)
            needed.update(i for i in node.input if i)
    nodes.reverse()
    proto = onnx.ModelProto()
    proto.CopyFrom(model.graph.proto)
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    outputs = [o for o in proto.graph.output if o.name in kept]
    del proto.graph.output[:]
    proto.graph.output.extend(outputs)
    initializers = [t for t in proto.graph.initializer if t.name in needed]
    del proto.graph.initializer[:]
    proto.graph.initializer.extend(initializers)
    value_info = [v for v in proto.graph.value_info if v.name in needed]
    del proto.graph.value_info[:]
    proto.graph.value_info.extend(value_info)
    weights = model.weights.subset(t.name for t in initializers)  # lazy weights stay unread
    return Model(Graph(proto), weights, model.path)
