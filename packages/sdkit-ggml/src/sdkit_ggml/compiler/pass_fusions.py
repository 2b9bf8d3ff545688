"""Pattern fusions: node chains of exported SD graphs replaced by one node of sdkit-ggml's own
domain (``ai.sdkit.ggml``), which ``converters/fused.py`` builds from fewer ggml ops.

- attention: in ``pass_attention.py``;
- group_norm: ``Reshape([0, G, -1]) -> InstanceNormalization -> Reshape(Shape(x)) -> Mul(gamma)
  -> Add(beta)`` (torch's GroupNorm export), optionally followed by SiLU, becomes
  ``GroupNorm(x, s, t, gamma, beta)``: one ggml_norm, the affine and the activation;
- silu: ``x * Sigmoid(x)`` becomes ``SiLU(x)``;
- conv_concat: a channel ``Concat`` read only by 2-D Convs (ESRGAN's dense blocks) becomes one
  ``ConvConcat(p_0, W, B, p_1, ...)`` per Conv, the concat gone (``converters/conv_concat.py``).

A chain is fused only when its inner values have no other reader.
"""

from __future__ import annotations

import math

import onnx

from sdkit_ggml.compiler.pass_graph import GraphView, attr, is_op, make_fused


def _sigmoid_partner(view: GraphView, node: onnx.NodeProto) -> tuple[str, int] | None:
    """For ``Mul(a, Sigmoid(a))`` (either order): ``a`` and the Sigmoid's node index."""
    if not is_op(node, "Mul") or len(node.input) != 2:
        return None
    for i in (0, 1):
        sig = view.node_of(node.input[i])
        other = node.input[1 - i]
        if is_op(sig, "Sigmoid") and sig is not None and sig.input[0] == other:
            index = view.producer[str(sig.output[0])]
            if view.only_use(str(sig.output[0])) is not None:
                return str(other), index
    return None


def fuse_silu(proto: onnx.ModelProto) -> onnx.ModelProto:
    view = GraphView(proto)
    for index, node in enumerate(view.nodes):
        if node is None:
            continue
        found = _sigmoid_partner(view, node)
        if found is None:
            continue
        source, sig_index = found
        view.replace(sig_index, None)
        view.replace(index, make_fused("SiLU", [source], [str(node.output[0])], node.name or str(node.output[0])))
    return view.model() if view.changed else proto


# -- group norm -----------------------------------------------------------------------------


def _group_reshape(view: GraphView, name: str) -> tuple[onnx.NodeProto, int] | None:
    """The ``Reshape(x, [0 or N, G, -1])`` producing ``name``, and G."""
    node = view.node_of(name)
    if not is_op(node, "Reshape") or node is None or view.only_use(name) is None:
        return None
    shape = view.constant(str(node.input[1]))
    if shape is None or shape.shape != (3,) or int(shape[2]) != -1 or int(shape[1]) <= 0 or int(shape[0]) < 0:
        return None
    return node, int(shape[1])


def _restores_shape(view: GraphView, reshape: onnx.NodeProto, source: str) -> bool:
    """Whether ``reshape`` reshapes back to ``Shape(source)`` (the whole shape)."""
    shape_node = view.node_of(reshape.input[1])
    if not is_op(shape_node, "Shape") or shape_node is None or shape_node.input[0] != source:
        return False
    return attr(shape_node, "start") in (None, 0) and attr(shape_node, "end") is None


def _per_channel_input(view: GraphView, node: onnx.NodeProto | None, value: str, rank: int) -> str | None:
    """The other operand of ``node`` (Mul or Add reading ``value``) when it has per-channel
    dims ``[C, 1, ...]`` of rank ``rank - 1``, as an initializer or constant."""
    if node is None or len(node.input) != 2 or value not in node.input:
        return None
    other = str(node.input[1] if node.input[0] == value else node.input[0])
    dims = _dims(view, other)
    if dims is None or len(dims) != rank - 1 or math.prod(dims[1:]) != 1:
        return None
    return other


def _dims(view: GraphView, name: str) -> list[int] | None:
    for init in view.proto.graph.initializer:
        if init.name == name:
            return [int(d) for d in init.dims]
    value = view.constant(name)
    return None if value is None else list(value.shape)


def _group_norm_at(view: GraphView, norm: onnx.NodeProto) -> tuple[onnx.NodeProto, list[int], int] | None:
    """The fused node replacing the chain around InstanceNormalization ``norm``, the indices of
    the nodes it replaces and the index where it goes."""
    found = _group_reshape(view, str(norm.input[0]))
    if found is None or len(norm.input) != 3:
        return None
    first, groups = found
    x = str(first.input[0])
    rank = view.rank(x)
    back_index = view.only_use(str(norm.output[0]))
    back = view.nodes[back_index] if back_index is not None else None
    if back is None or not is_op(back, "Reshape") or not _restores_shape(view, back, x) or rank is None or rank < 3:
        return None
    mul_index = view.only_use(str(back.output[0]))
    mul = view.nodes[mul_index] if mul_index is not None else None
    gamma = _per_channel_input(view, mul, str(back.output[0]), rank) if is_op(mul, "Mul") else None
    if gamma is None or mul is None or mul_index is None:
        return None
    add_index = view.only_use(str(mul.output[0]))
    add = view.nodes[add_index] if add_index is not None else None
    beta = _per_channel_input(view, add, str(mul.output[0]), rank) if is_op(add, "Add") else None
    if beta is None or add is None or add_index is None:
        return None
    chain = [view.producer[str(first.output[0])], view.producer[str(norm.output[0])], back_index or 0, mul_index]
    out, last = str(add.output[0]), add_index
    activation = ""
    users = view.consumers.get(out, [])
    if len(users) == 2 and out not in view.outputs:
        for user in users:
            candidate = view.nodes[user]
            partner = _sigmoid_partner(view, candidate) if candidate is not None else None
            if candidate is not None and partner is not None and partner[0] == out:
                chain += [add_index, partner[1]]
                out, last, activation = str(candidate.output[0]), user, "silu"
    inputs = [x, str(norm.input[1]), str(norm.input[2]), gamma, beta]
    eps = float(attr(norm, "epsilon", 1e-5))  # type: ignore[arg-type]
    name = norm.name or out
    fused = make_fused("GroupNorm", inputs, [out], name, num_groups=groups, epsilon=eps, activation=activation)
    return fused, chain, last


def fuse_group_norm(proto: onnx.ModelProto) -> onnx.ModelProto:
    view = GraphView(proto, ranks=True)
    for node in list(view.nodes):
        if node is None or not is_op(node, "InstanceNormalization"):
            continue
        found = _group_norm_at(view, node)
        if found is None:
            continue
        fused, chain, last = found
        for dropped in chain:
            view.replace(dropped, None)
        view.replace(last, fused)
    return view.model() if view.changed else proto


# -- conv over a concat ---------------------------------------------------------------------


def _conv_reading(node: onnx.NodeProto | None, value: str) -> bool:
    """Whether ``node`` is a 2-D, ungrouped Conv with ``value`` as its input and only there."""
    if not is_op(node, "Conv") or node is None or len(node.input) < 2 or node.input[0] != value:
        return False
    kernel = attr(node, "kernel_shape")
    return (
        value not in node.input[1:]
        and attr(node, "group", 1) == 1
        and attr(node, "auto_pad", "NOTSET") == "NOTSET"
        and isinstance(kernel, list)
        and len(kernel) == 2
    )


def fuse_conv_concat(proto: onnx.ModelProto) -> onnx.ModelProto:
    view = GraphView(proto)
    for index, node in enumerate(view.nodes):
        if not is_op(node, "Concat") or node is None or attr(node, "axis") != 1 or len(node.input) < 2:
            continue
        out = str(node.output[0])
        users = view.consumers.get(out, [])
        if out in view.outputs or not users or not all(_conv_reading(view.nodes[u], out) for u in users):
            continue
        for user in users:
            conv = view.nodes[user]
            assert conv is not None
            bias = str(conv.input[2]) if len(conv.input) > 2 else ""
            inputs = [str(node.input[0]), str(conv.input[1]), bias, *(str(i) for i in node.input[1:])]
            fused = make_fused("ConvConcat", inputs, [str(o) for o in conv.output], conv.name or str(conv.output[0]))
            fused.attribute.extend(conv.attribute)
            view.replace(user, fused)
        view.replace(index, None)
    return view.model() if view.changed else proto
