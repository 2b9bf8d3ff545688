"""Pattern fusions: node chains of exported SD graphs replaced by one node of sdkit-ggml's own
domain (``ai.sdkit.ggml``), which ``converters/fused.py`` builds from fewer ggml ops.

- attention: ``MatMul(Q, Kt) -> Mul(scale) [-> Add(zeros)] -> Softmax(last) -> MatMul(., V)``
  (diffusers' baddbmm attention as torch exports it; Casts to float in between are skipped)
  becomes ``Attention(Q, K or Kt, V)``, lowered to ``ggml_flash_attn_ext``;
- group_norm: ``Reshape([0, G, -1]) -> InstanceNormalization -> Reshape(Shape(x)) -> Mul(gamma)
  -> Add(beta)`` (torch's GroupNorm export), optionally followed by SiLU, becomes
  ``GroupNorm(x, s, t, gamma, beta)``: one ggml_norm, the affine and the activation;
- silu: ``x * Sigmoid(x)`` becomes ``SiLU(x)``.

A chain is fused only when its inner values have no other reader.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from sdkit_ggml.compiler.pass_graph import FUSED_DOMAIN, GraphView, attr, is_op


def _make(op: str, inputs: list[str], outputs: list[str], name: str, **attrs: object) -> onnx.NodeProto:
    node = onnx.helper.make_node(op, inputs, outputs, name=name, domain=FUSED_DOMAIN)
    node.attribute.extend(onnx.helper.make_attribute(key, value) for key, value in attrs.items())
    return node


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
        view.replace(index, _make("SiLU", [source], [str(node.output[0])], node.name or str(node.output[0])))
    return view.model() if view.changed else proto


# -- attention ------------------------------------------------------------------------------


def _skip_casts(view: GraphView, name: str, chain: list[int]) -> onnx.NodeProto | None:
    """The producer of ``name`` looking through single-use Casts to float (recorded in ``chain``)."""
    node = view.node_of(name)
    while is_op(node, "Cast") and node is not None and attr(node, "to") == onnx.TensorProto.FLOAT:
        if view.only_use(str(node.output[0])) is None:
            return None
        chain.append(view.producer[str(node.output[0])])
        node = view.node_of(node.input[0])
    return node


def _scalar(view: GraphView, name: str) -> float | None:
    value = view.constant(name)
    if value is None or value.size != 1 or value.dtype.kind != "f":
        return None
    return float(value.ravel()[0])


def _zeros(view: GraphView, name: str) -> bool:
    """Whether ``name`` is ``ConstantOfShape(...) * 0`` (baddbmm's beta=0 input)."""
    node = view.node_of(name)
    if not is_op(node, "Mul") or node is None:
        return False
    for i in (0, 1):
        source = view.node_of(node.input[i])
        if is_op(source, "ConstantOfShape") and _scalar(view, str(node.input[1 - i])) == 0.0 and source is not None:
            fill = attr(source, "value")
            fill_value = onnx.numpy_helper.to_array(fill) if isinstance(fill, onnx.TensorProto) else np.zeros(1)
            return bool(np.all(np.isfinite(fill_value)))
    return False


def _scaled_scores(view: GraphView, name: str, chain: list[int]) -> tuple[onnx.NodeProto, float] | None:
    """``MatMul(Q, Kt) * scale`` (or ``/ d``, or unscaled) feeding ``name``, with an optional
    ``+ zeros``: the score MatMul and the scale."""
    node = view.node_of(name)
    if is_op(node, "Add") and node is not None:
        for i in (0, 1):
            if _zeros(view, str(node.input[1 - i])) and view.only_use(str(node.input[i])) is not None:
                chain.append(view.producer[str(node.output[0])])
                node = view.node_of(node.input[i])
                break
        else:
            return None
    scale = 1.0
    if node is not None and node.op_type in ("Mul", "Div") and node.domain in ("", "ai.onnx"):
        factor = _scalar(view, str(node.input[1]))
        if factor is None or factor == 0.0 or view.only_use(str(node.input[0])) is None:
            return None
        scale = factor if node.op_type == "Mul" else 1.0 / factor
        chain.append(view.producer[str(node.output[0])])
        node = view.node_of(node.input[0])
    if not is_op(node, "MatMul") or node is None:
        return None
    return node, scale


def _softmax_last(view: GraphView, node: onnx.NodeProto) -> bool:
    axis = int(attr(node, "axis", -1))  # type: ignore[call-overload]
    rank = view.rank(str(node.input[0]))
    return axis == -1 or (rank is not None and axis == rank - 1)


def _attention_at(view: GraphView, index: int, node: onnx.NodeProto) -> tuple[onnx.NodeProto, list[int]] | None:
    chain: list[int] = []
    probs = _skip_casts(view, str(node.input[0]), chain)
    if not is_op(probs, "Softmax") or probs is None or not _softmax_last(view, probs):
        return None
    if view.only_use(str(probs.output[0])) is None:
        return None
    chain.append(view.producer[str(probs.output[0])])
    pre = _skip_casts(view, str(probs.input[0]), chain)
    if pre is None or view.only_use(str(pre.output[0])) is None:
        return None
    found = _scaled_scores(view, str(pre.output[0]), chain)
    if found is None:
        return None
    scores, scale = found
    if view.only_use(str(scores.output[0])) is None:
        return None
    chain.append(view.producer[str(scores.output[0])])
    q, kt, v = str(scores.input[0]), str(scores.input[1]), str(node.input[1])
    ranks = {view.rank(q), view.rank(kt), view.rank(v)}
    if len(ranks) != 1 or ranks.pop() not in (3, 4):
        return None  # batched 3-D or 4-D attention of one rank only
    fused_inputs = [q, kt, v]
    k_transposed = 1
    transpose = view.node_of(kt)
    perm = attr(transpose, "perm") if transpose is not None else None
    rank = view.rank(kt) or 0
    swap_last = [*range(rank - 2), rank - 1, rank - 2]
    if is_op(transpose, "Transpose") and transpose is not None and perm == swap_last and view.only_use(kt) is not None:
        fused_inputs[1] = str(transpose.input[0])
        k_transposed = 0
        chain.append(view.producer[kt])
    name = node.name or str(node.output[0])
    fused = _make("Attention", fused_inputs, [str(node.output[0])], name, scale=scale, k_transposed=k_transposed)
    return fused, chain


def fuse_attention(proto: onnx.ModelProto) -> onnx.ModelProto:
    view = GraphView(proto, ranks=True)
    for index, node in enumerate(view.nodes):
        if not is_op(node, "MatMul") or node is None:
            continue
        found = _attention_at(view, index, node)
        if found is None:
            continue
        fused, chain = found
        for dropped in chain:
            view.replace(dropped, None)
        view.replace(index, fused)
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
    fused = _make("GroupNorm", inputs, [out], norm.name or out, num_groups=groups, epsilon=eps, activation=activation)
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
