"""Clean-up passes: identities bypassed, transposes composed, dead nodes dropped.

Exported graphs carry work that changes nothing: diffusers' ``output_scale_factor`` is a
division by 1.0 over a whole feature map, ``Identity`` nodes, transposes undone by the next
one. Each costs a full pass over memory in ggml; these passes remove them.
"""

from __future__ import annotations

import numpy as np
import onnx

from sdkit_ggml.compiler.pass_graph import GraphView, attr, copy_node, is_op

# op -> (the neutral constant, whether the constant may be the first operand)
NEUTRAL = {"Mul": (1.0, True), "Div": (1.0, False), "Add": (0.0, True), "Sub": (0.0, False)}


def _bypassed_input(view: GraphView, node: onnx.NodeProto) -> str | None:
    """The input a neutral node passes through unchanged, or None."""
    if is_op(node, "Identity"):
        return str(node.input[0])
    if node.domain not in ("", "ai.onnx") or node.op_type not in NEUTRAL or len(node.input) != 2:
        return None
    neutral, either_side = NEUTRAL[node.op_type]
    sides = [(0, 1), (1, 0)] if either_side else [(0, 1)]
    for keep, const in sides:
        value = view.constant(node.input[const])
        if value is None or value.size != 1 or value.dtype.kind != "f" or float(value.ravel()[0]) != neutral:
            continue
        kept_rank = view.rank(node.input[keep])
        # broadcasting with the constant must not change the shape: its rank may not exceed x's
        if kept_rank is not None and value.ndim <= kept_rank:
            return str(node.input[keep])
    return None


def remove_identities(proto: onnx.ModelProto) -> onnx.ModelProto:
    """Identity, ``x * 1``, ``x / 1``, ``x + 0``, ``x - 0`` (float constants) bypassed."""
    view = GraphView(proto, ranks=True)
    for index, node in enumerate(view.nodes):
        if node is None or len(node.output) != 1 or node.output[0] in view.outputs:
            continue
        source = _bypassed_input(view, node)
        if source is None:
            continue
        view.rename_uses(str(node.output[0]), source)
        view.replace(index, None)
    return view.model() if view.changed else proto


def _perm(node: onnx.NodeProto) -> list[int] | None:
    perm = attr(node, "perm")
    return [int(p) for p in perm] if isinstance(perm, list) else None


def fold_transposes(proto: onnx.ModelProto) -> onnx.ModelProto:
    """Transpose(Transpose(x, p1), p2) -> Transpose(x, p1[p2]), dropped when that is the identity."""
    view = GraphView(proto)
    for index, node in enumerate(view.nodes):
        if not is_op(node, "Transpose") or node is None:
            continue
        inner = view.node_of(node.input[0])
        if inner is None or not is_op(inner, "Transpose") or view.only_use(str(inner.output[0])) != index:
            continue
        outer_perm, inner_perm = _perm(node), _perm(inner)
        if outer_perm is None or inner_perm is None or len(outer_perm) != len(inner_perm):
            continue  # a default perm (reversal) needs the rank: left alone
        composed = [inner_perm[p] for p in outer_perm]
        inner_index = view.producer[str(inner.output[0])]
        view.replace(inner_index, None)
        if composed == list(range(len(composed))) and node.output[0] not in view.outputs:
            view.rename_uses(str(node.output[0]), str(inner.input[0]))
            view.replace(index, None)
            continue
        fused = copy_node(node)
        fused.input[0] = inner.input[0]
        del fused.attribute[:]
        fused.attribute.append(onnx.helper.make_attribute("perm", composed))
        view.replace(index, fused)
    return view.model() if view.changed else proto


def remove_dead(proto: onnx.ModelProto) -> onnx.ModelProto:
    """Nodes none of whose outputs reaches a graph output dropped (backwards from the outputs)."""
    view = GraphView(proto)
    live = set(view.outputs)
    keep = np.zeros(len(view.nodes), dtype=bool)
    for index in range(len(view.nodes) - 1, -1, -1):
        node = view.nodes[index]
        if node is None or not any(name in live for name in node.output if name):
            continue
        keep[index] = True
        live.update(name for name in node.input if name)
    if keep.all():
        return proto
    for dead in np.flatnonzero(~keep):
        view.replace(int(dead), None)
    return view.model()
