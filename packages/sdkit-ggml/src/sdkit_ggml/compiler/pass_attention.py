"""Attention fusion: ``softmax(scale * Q K^T [+ mask]) V`` as exported becomes one node of
sdkit-ggml's own domain, ``Attention(Q, K or Kt, V[, mask[, q_scale[, k_scale]]])``
(attributes ``scale``, ``k_transposed``), which ``converters/fused.py`` lowers to
``ggml_flash_attn_ext`` (or, where the device has no kernel for it, to mul_mat, soft_max_ext,
mul_mat). Which patterns are taken (``lowering_modes.attention_patterns``):

- ``"plain"``: ``MatMul(Q, Kt) -> Mul|Div(scale) [-> Add(zeros)] -> Softmax(last) -> MatMul(., V)``
  (diffusers' baddbmm attention as torch exports it; Casts to float in between are skipped);
- ``"all"``: besides, an additive mask or bias ``Add(scores, M)`` with any ``M`` broadcastable
  to the scores (CLIP's causal mask), and torch SDPA's export ``MatMul(Q * s, Kt * s)`` (each
  operand scaled by a scalar ``s = sqrt(scale)``, computed from shapes at compile time);
  and the forms of the shipped family graphs' exports: a scale or zero beta written as
  ``Cast(Constant)`` (read through Cast and Identity), SDPA's runtime ``s`` proven to hold one
  element (``_one_element_rank``), and ranks from Transpose perms where shape inference lost
  them (Flux's Q/K/V after RoPE), and T5's ``(scores + bias) + hard mask`` as
  ``scores + (bias + mask)`` (``_biased_hard_mask``). ``"plain"`` matches exactly what it matched before these, so
  the fp32 default's results stay bit for bit.

A chain is fused only when its inner values have no other reader.
"""

from __future__ import annotations

import numpy as np
import onnx

from sdkit_ggml.compiler.pass_graph import GraphView, attr, is_op, make_fused


def _skip_casts(view: GraphView, name: str, chain: list[int]) -> onnx.NodeProto | None:
    """The producer of ``name`` looking through single-use Casts to float (recorded in ``chain``)."""
    node = view.node_of(name)
    while is_op(node, "Cast") and node is not None and attr(node, "to") == onnx.TensorProto.FLOAT:
        if view.only_use(str(node.output[0])) is None:
            return None
        chain.append(view.producer[str(node.output[0])])
        node = view.node_of(node.input[0])
    return node


def _scalar(view: GraphView, name: str, extended: bool) -> float | None:
    """A one-element float constant; ``extended``: also through Cast and Identity
    (``Cast(Constant)``, the TorchScript exporter's Python scalar)."""
    value = view.folded_constant(name) if extended else view.constant(name)
    if value is None or value.size != 1 or value.dtype.kind != "f":
        return None
    return float(value.ravel()[0])


def _zeros(view: GraphView, name: str, extended: bool) -> bool:
    """Whether ``name`` is ``ConstantOfShape(...) * 0`` (baddbmm's beta=0 input)."""
    node = view.node_of(name)
    if not is_op(node, "Mul") or node is None:
        return False
    for i in (0, 1):
        source = view.node_of(node.input[i])
        if (
            is_op(source, "ConstantOfShape")
            and _scalar(view, str(node.input[1 - i]), extended) == 0.0
            and source is not None
        ):
            fill = attr(source, "value")
            fill_value = onnx.numpy_helper.to_array(fill) if isinstance(fill, onnx.TensorProto) else np.zeros(1)
            return bool(np.all(np.isfinite(fill_value)))
    return False


def _scores_product(
    view: GraphView, node: onnx.NodeProto | None, chain: list[int], extended: bool
) -> tuple[onnx.NodeProto, float] | None:
    """``MatMul(Q, Kt)``, optionally ``* scale`` or ``/ d`` by a constant: the MatMul and the scale."""
    scale = 1.0
    if node is not None and node.op_type in ("Mul", "Div") and node.domain in ("", "ai.onnx"):
        factor = _scalar(view, str(node.input[1]), extended)
        if factor is None or factor == 0.0 or view.only_use(str(node.input[0])) is None:
            return None
        scale = factor if node.op_type == "Mul" else 1.0 / factor
        chain.append(view.producer[str(node.output[0])])
        node = view.node_of(node.input[0])
    if not is_op(node, "MatMul") or node is None:
        return None
    return node, scale


# A mask value at or below this is "masked": adding it to any score of sane size (|x| < 1e22,
# below half its ulp) gives the value itself, and softmax weighs it 0 beside any unmasked key.
_MASKED = -1e30


def _hard_mask(view: GraphView, name: str) -> bool:
    """Whether ``name`` is ``Where(c, a, b)`` with ``a``, ``b`` one-element float constants,
    each 0 or masked (``<= -1e30``, -inf): transformers' T5 mask ``Where(keep, 0, finfo.min)``."""
    node = view.node_of(name)
    if not is_op(node, "Where") or node is None or len(node.input) != 3:
        return False
    values = [view.folded_constant(str(i)) for i in node.input[1:]]
    return all(
        v is not None and v.size == 1 and v.dtype.kind == "f" and (v.item() == 0.0 or v.item() <= _MASKED)
        for v in values
    )


def _biased_hard_mask(
    view: GraphView, outer: onnx.NodeProto, chain: list[int], extra: list[tuple[int, onnx.NodeProto]]
) -> tuple[onnx.NodeProto, float, str] | None:
    """``(scores + bias) + mask`` with a hard mask (T5: the position bias, then the padding
    mask) as ``scores + (bias + mask)``: the outer Add becomes ``Add(bias, mask)`` (recorded in
    ``extra``), the fused node's mask. Equal after softmax: where the mask is 0 both sides add
    the same two terms to the score, and where it is masked both give the mask value itself."""
    slot = view.producer[str(outer.output[0])]
    for i in (0, 1):
        inner_name, hard = str(outer.input[i]), str(outer.input[1 - i])
        inner = view.node_of(inner_name)
        if not is_op(inner, "Add") or inner is None or view.only_use(inner_name) is None or not _hard_mask(view, hard):
            continue
        for j in (0, 1):
            scores, bias = str(inner.input[j]), str(inner.input[1 - j])
            ranks = (view.rank(bias), view.rank(hard))
            if view.only_use(scores) is None or ranks[0] is None or ranks[1] is None:
                continue
            mask = f"{outer.output[0]}_bias_and_mask"
            found = _with_mask(view, scores, [*chain, view.producer[inner_name]], chain, mask, True)
            if found is not None:
                view.note_rank(mask, max(ranks[0], ranks[1]))
                extra.append((slot, onnx.helper.make_node("Add", [bias, hard], [mask], name=mask)))
                return found
    return None


def _scaled_scores(
    view: GraphView, name: str, chain: list[int], masks: bool, extra: list[tuple[int, onnx.NodeProto]]
) -> tuple[onnx.NodeProto, float, str] | None:
    """The scores feeding ``name``: ``MatMul(Q, Kt) [* scale]`` with an optional ``+ zeros``
    or (``masks``) ``+ mask`` or ``+ bias + hard mask``: the score MatMul, the scale and the
    mask's name ("" for none); a node the mask needs goes to ``extra`` (its slot, the node)."""
    node = view.node_of(name)
    if not is_op(node, "Add") or node is None:
        product = _scores_product(view, node, chain, masks)
        return None if product is None else (product[0], product[1], "")
    add = view.producer[str(node.output[0])]
    for i in (0, 1):
        if _zeros(view, str(node.input[1 - i]), masks) and view.only_use(str(node.input[i])) is not None:
            found = _with_mask(view, str(node.input[i]), [*chain, add], chain, "", masks)
            if found is not None:
                return found
    if not masks:
        return None
    for i in (0, 1):
        if view.only_use(str(node.input[i])) is not None:
            found = _with_mask(view, str(node.input[i]), [*chain, add], chain, str(node.input[1 - i]), masks)
            if found is not None:
                return found
    return _biased_hard_mask(view, node, chain, extra)


def _with_mask(
    view: GraphView, scores: str, trial: list[int], chain: list[int], mask: str, extended: bool
) -> tuple[onnx.NodeProto, float, str] | None:
    """The scaled score product ``scores`` with ``mask`` added; ``chain`` takes ``trial``'s
    nodes only when it matches."""
    found = _scores_product(view, view.node_of(scores), trial, extended)
    if found is None:
        return None
    chain[:] = trial
    return found[0], found[1], mask


def _softmax_last(view: GraphView, node: onnx.NodeProto) -> bool:
    axis = int(attr(node, "axis", -1))  # type: ignore[call-overload]
    rank = view.rank(str(node.input[0]))
    return axis == -1 or (rank is not None and axis == rank - 1)


_UNARY = frozenset({"Cast", "Identity", "Sqrt", "Reciprocal", "Neg", "Abs"})
_BINARY = frozenset({"Add", "Sub", "Mul", "Div", "Pow"})
_INT64_MAX = 2**63 - 1


def _rank(view: GraphView, name: str, extended: bool) -> int | None:
    """The rank of ``name`` from shape inference; ``extended``: else that of a Transpose's
    output (its perm's length), where inference lost it (Flux's RoPE export)."""
    rank = view.rank(name)
    node = view.node_of(name)
    if rank is None and extended and is_op(node, "Transpose") and node is not None:
        perm = attr(node, "perm")
        rank = len(perm) if isinstance(perm, list) else None
    return rank


def _last_dim(view: GraphView, node: onnx.NodeProto) -> bool:
    """Whether ``node`` is ``Slice(Shape(x), [-1], [INT64_MAX])`` of an ``x`` of rank >= 1:
    one element (x's last dim, torch SDPA's ``q.size(-1)``)."""
    if len(node.input) != 3 or not is_op(view.node_of(node.input[0]), "Shape"):
        return False
    shape = view.node_of(node.input[0])
    if shape is None or attr(shape, "start") not in (None, 0) or attr(shape, "end") is not None:
        return False
    starts, ends = view.folded_constant(str(node.input[1])), view.folded_constant(str(node.input[2]))
    if starts is None or ends is None or starts.tolist() != [-1] or ends.tolist() != [_INT64_MAX]:
        return False
    return (_rank(view, str(shape.input[0]), True) or 0) >= 1


def _one_element_rank(view: GraphView, name: str, depth: int = 0) -> int | None:
    """The rank of ``name`` when it provably holds one element: a constant of one element, the
    last dim of a shape, or unary / elementwise binary arithmetic on such values (torch SDPA's
    ``sqrt(1 / sqrt(q.size(-1)))``); else None."""
    value = view.folded_constant(name)
    if value is not None:
        return value.ndim if value.size == 1 else None
    node = view.node_of(name)
    if node is None or node.domain not in ("", "ai.onnx") or depth > 16:
        return None
    if node.op_type == "Slice" and _last_dim(view, node):
        return 1
    if node.op_type in _UNARY and len(node.input) == 1:
        return _one_element_rank(view, str(node.input[0]), depth + 1)
    if node.op_type in _BINARY and len(node.input) == 2:
        ranks = [_one_element_rank(view, str(i), depth + 1) for i in node.input]
        return None if None in ranks else max(r for r in ranks if r is not None)
    return None


def _prescaled(view: GraphView, name: str, chain: list[int]) -> tuple[str, str]:
    """``name`` and "" , or for ``Mul(x, s)`` with a scalar ``s`` (torch SDPA's export scales Q
    and K^T by sqrt(scale) each) ``x`` and ``s``. ``s`` must hold one element and have at most
    ``x``'s rank, so that ``x * s`` has ``x``'s shape."""
    node = view.node_of(name)
    if not is_op(node, "Mul") or node is None or view.only_use(name) is None:
        return name, ""
    for i in (0, 1):
        factor, x = str(node.input[1 - i]), str(node.input[i])
        x_rank = _rank(view, x, True)
        factor_rank = 0 if view.rank(factor) == 0 else _one_element_rank(view, factor)
        if x_rank is not None and factor_rank is not None and factor_rank <= x_rank:
            chain.append(view.producer[name])
            return x, factor
    return name, ""


def _attention_at(
    view: GraphView, node: onnx.NodeProto, masks: bool, extra: list[tuple[int, onnx.NodeProto]]
) -> tuple[onnx.NodeProto, list[int]] | None:
    """The fused node for the attention ending in MatMul ``node`` and the nodes it replaces;
    a node its mask needs goes to ``extra``."""
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
    found = _scaled_scores(view, str(pre.output[0]), chain, masks, extra)
    if found is None:
        return None
    scores, scale, mask = found
    if view.only_use(str(scores.output[0])) is None:
        return None
    chain.append(view.producer[str(scores.output[0])])
    q, kt, v = str(scores.input[0]), str(scores.input[1]), str(node.input[1])
    q_scale = k_scale = ""
    if masks:
        q, q_scale = _prescaled(view, q, chain)
        kt, k_scale = _prescaled(view, kt, chain)
    ranks = {_rank(view, q, masks), _rank(view, kt, masks), _rank(view, v, masks)}
    if len(ranks) != 1 or ranks.pop() not in (3, 4):
        return None  # batched 3-D or 4-D attention of one rank only
    mask_rank = view.rank(mask) if mask else 0
    if mask_rank is None or mask_rank > (_rank(view, q, masks) or 0):
        return None  # a mask that widens the scores: left as exported
    fused_inputs = [q, kt, v, mask, q_scale, k_scale]
    k_transposed = 1
    transpose = view.node_of(kt)
    perm = attr(transpose, "perm") if transpose is not None else None
    rank = _rank(view, kt, masks) or 0
    swap_last = [*range(rank - 2), rank - 1, rank - 2]
    if is_op(transpose, "Transpose") and transpose is not None and perm == swap_last and view.only_use(kt) is not None:
        fused_inputs[1] = str(transpose.input[0])
        k_transposed = 0
        chain.append(view.producer[kt])
    while fused_inputs[-1] == "":
        fused_inputs.pop()
    name = node.name or str(node.output[0])
    fused = make_fused("Attention", fused_inputs, [str(node.output[0])], name, scale=scale, k_transposed=k_transposed)
    return fused, chain


def fuse_attention(proto: onnx.ModelProto, patterns: str = "plain") -> onnx.ModelProto:
    """``patterns``: ``"plain"``, ``"all"`` (masks and SDPA's scaled operands too) or ``"none"``."""
    if patterns == "none":
        return proto
    view = GraphView(proto, ranks=True)
    for index, node in enumerate(view.nodes):
        if not is_op(node, "MatMul") or node is None:
            continue
        extra: list[tuple[int, onnx.NodeProto]] = []
        found = _attention_at(view, node, patterns == "all", extra)
        if found is None:
            continue
        fused, chain = found
        for dropped in chain:
            view.replace(dropped, None)
        for slot, added in extra:  # in the slot of a node the chain replaced
            view.replace(slot, added)
        view.replace(index, fused)
    return view.model() if view.changed else proto
