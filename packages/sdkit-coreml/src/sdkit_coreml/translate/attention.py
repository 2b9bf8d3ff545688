"""Attention as one ``scaled_dot_product_attention`` op for macOS 15+ targets.

Exporters spell attention out: MatMul(q, kᵀ) -> Mul/Div by a constant scale -> [Add mask]
-> Softmax(last axis) -> MatMul(·, v), with Casts sprinkled between. At the final MatMul,
once every op of the chain has been translated one by one, the chain is matched and the
MatMul's result is computed by one SDPA op instead; the op-by-op chain is left unused, and
coremltools' dead-code pass removes it. SDPA divides by sqrt(E) itself, so q is scaled by
``scale * sqrt(E)`` to keep the graph's own scale. Anything that does not match exactly
(a second consumer of an intermediate, a non-constant scale, an unknown head size) stays
op by op.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from sdkit_coreml.translate.context import Context, attrs, mil, rank_of


@dataclass
class Match:
    q: str
    k_transposed: str
    v: str
    scale: float
    mask: str | None


def _skip_casts(ctx: Context, name: str) -> tuple[str, onnx.NodeProto | None]:
    """Walk back through single-use Casts (and Identities); (the value reached, its producer)."""
    node = ctx.producer(name)
    while node is not None and node.op_type in ("Cast", "Identity") and ctx.private(name):
        name = node.input[0]
        node = ctx.producer(name)
    return name, node


def _scalar(ctx: Context, name: str) -> float | None:
    value = ctx.value(ctx.get(name)) if name in ctx.values or name in ctx.initializers else None
    return float(value.reshape(-1)[0]) if value is not None and value.size == 1 else None


def _scores(ctx: Context, name: str) -> tuple[onnx.NodeProto, float] | None:
    """The MatMul(q, kᵀ) behind ``name`` (through Casts and one constant Mul/Div)."""
    name, node = _skip_casts(ctx, name)
    if node is None or not ctx.private(name):
        return None
    scale = 1.0
    if node.op_type in ("Mul", "Div"):
        for side in (0, 1) if node.op_type == "Mul" else (0,):
            factor = _scalar(ctx, node.input[1 - side])
            inner, producer = _skip_casts(ctx, node.input[side])
            if factor is not None and producer is not None and producer.op_type == "MatMul" and ctx.private(inner):
                return producer, factor if node.op_type == "Mul" else 1.0 / factor
        return None
    return (node, scale) if node.op_type == "MatMul" else None


def match(ctx: Context, node: onnx.NodeProto) -> Match | None:
    """``node`` (a MatMul) as the end of an attention chain, or None."""
    probs, softmax = _skip_casts(ctx, node.input[0])
    if softmax is None or softmax.op_type != "Softmax" or not ctx.private(probs):
        return None
    logits, producer = _skip_casts(ctx, softmax.input[0])
    if producer is None or not ctx.private(logits):
        return None
    rank = rank_of(ctx.get(softmax.input[0]))
    if int(attrs(softmax).get("axis", -1)) not in (-1, rank - 1):
        return None
    mask = None
    found = _scores(ctx, logits)
    if found is None and producer.op_type == "Add":
        for side in (0, 1):
            found = _scores(ctx, producer.input[side])
            if found is not None:
                mask = producer.input[1 - side]
                break
    if found is None:
        return None
    scores, scale = found
    return Match(scores.input[0], scores.input[1], node.input[1], scale, mask)


def _key(ctx: Context, k_transposed: str) -> Any:
    """k from kᵀ: the Transpose's input when kᵀ came from swapping the last two axes."""
    producer = ctx.producer(k_transposed)
    var = ctx.get(k_transposed)
    rank = rank_of(var)
    swap = [*range(rank - 2), rank - 1, rank - 2]
    if producer is not None and producer.op_type == "Transpose" and list(attrs(producer).get("perm", [])) == swap:
        return ctx.get(producer.input[0])
    return mil().transpose(x=var, perm=swap)


def fuse(ctx: Context, node: onnx.NodeProto) -> bool:
    """Translate ``node`` as SDPA when it ends an attention chain; False to go op by op."""
    found = match(ctx, node)
    if found is None:
        return False
    q, v = ctx.get(found.q), ctx.get(found.v)
    head = q.shape[-1]
    if rank_of(q) < 3 or not isinstance(head, (int, np.integer)) or rank_of(v) != rank_of(q):
        return False
    factor = found.scale * float(np.sqrt(int(head)))
    if abs(factor - 1.0) > 1e-7:
        q = mil().mul(x=q, y=ctx.const(np.float32(factor)))
    args: dict[str, Any] = {"query": q, "key": _key(ctx, found.k_transposed), "value": v}
    if found.mask is not None:
        mask = ctx.get(found.mask)
        known = ctx.value(mask)
        if known is None or np.any(known != 0):  # an all-zero additive mask is no mask
            args["attn_mask"] = mask
    ctx.set(node.output[0], mil().scaled_dot_product_attention(**args, name=node.output[0]))
    return True
