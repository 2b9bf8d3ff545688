"""Einsum as MIL's transpose / reduce_sum / mul / matmul / reshape.

The exports use it for the patchify and unpatchify permutations (SD3's ``nhwpqc->nchpwq``)
and for RoPE's outer product (Flux's ``i,j->ij``). One operand: indices missing from the
output are summed, the rest permuted. Two operands: indices found in one operand only and not
in the output are summed first; without a contracted index the product is a broadcast ``mul``
(outer and element-wise products), with one it is a ``matmul`` over
[batch..., left, inner] x [batch..., inner, right], each group flattened to one dim where it
has several (dims read with ``shape``: with static shapes they fold away). Ellipses, repeated
indices in one operand (diagonals) and three or more operands stay untranslated: ``check``
names the node and the equation.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from sdkit_coreml.translate.context import Context, attrs, fail, mil, rank_of
from sdkit_coreml.translate.registry import converter


def parse_equation(equation: str) -> tuple[list[str], str]:
    """``'ij,jk->ik'`` -> (['ij', 'jk'], 'ik'); ValueError saying why it is not translated.
    Implicit mode (no ``->``): the output is the indices used once, sorted, as in numpy."""
    text = equation.replace(" ", "")
    if "." in text:
        raise ValueError("ellipsis ('...') is not translated")
    lhs, arrow, out = text.partition("->")
    operands = lhs.split(",")
    letters = "".join(operands)
    if not arrow:
        out = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    if not all(c.isalpha() for c in letters + out):
        raise ValueError("subscripts must be letters")
    if len(operands) > 2:
        raise ValueError(f"{len(operands)} operands (one or two are translated)")
    for sub in operands:
        if len(set(sub)) != len(sub):
            raise ValueError(f"an index repeated within {sub!r} (a diagonal) is not translated")
    if len(set(out)) != len(out) or set(out) - set(letters):
        raise ValueError(f"output {out!r} repeats an index or uses one no operand has")
    return operands, out


def _check_einsum(node: onnx.NodeProto, opset: int) -> str | None:
    equation = str(attrs(node).get("equation", ""))
    try:
        operands, _ = parse_equation(equation)
    except ValueError as exc:
        return f"Einsum {equation!r}: {exc}"
    if len(operands) != len(node.input):
        return f"Einsum {equation!r} names {len(operands)} operand(s) for {len(node.input)} input(s)"
    return None


def _sum_out(var: Any, sub: str, keep: str) -> tuple[Any, str]:
    """Sum over the indices of ``sub`` that ``keep`` lacks."""
    axes = [i for i, c in enumerate(sub) if c not in keep]
    if not axes:
        return var, sub
    return mil().reduce_sum(x=var, axes=axes, keep_dims=False), "".join(c for c in sub if c in keep)


def _permute(var: Any, sub: str, order: str) -> Any:
    return var if sub == order else mil().transpose(x=var, perm=[sub.index(c) for c in order])


def _dims(var: Any, begin: int, end: int) -> Any:
    """``var``'s dims ``begin:end`` as an int32 vector (read at run time unless static)."""
    return mil().slice_by_index(x=mil().shape(x=var), begin=[begin], end=[end])


def _flat_shape(ctx: Context, var: Any, sizes: tuple[int, int, int]) -> Any:
    """``var``'s shape with its axes in three consecutive groups of ``sizes``: the first kept,
    the second and third flattened to one dim each (1 when empty)."""
    parts = [_dims(var, 0, sizes[0])] if sizes[0] else []
    start = sizes[0]
    for size in sizes[1:]:
        flat = mil().reduce_prod(x=_dims(var, start, start + size), axes=[0], keep_dims=True) if size else None
        parts.append(flat if flat is not None else ctx.const(np.ones(1, np.int32)))
        start += size
    return mil().concat(values=parts, axis=0)


def _contract(ctx: Context, a: Any, sa: str, b: Any, sb: str, out: str) -> tuple[Any, str]:
    """The product of two operands (lonely indices already summed), with its index order."""
    batch = "".join(c for c in out if c in sa and c in sb)
    left = "".join(c for c in sa if c not in sb)
    right = "".join(c for c in sb if c not in sa)
    inner = "".join(c for c in sa if c in sb and c not in out)
    order = batch + left + right
    if not inner:  # outer / element-wise product: line both up and broadcast
        a = _permute(a, sa, batch + left)
        b = _permute(b, sb, batch + right)
        if right:
            a = mil().expand_dims(x=a, axes=list(range(len(batch + left), len(order))))
        if left:
            b = mil().expand_dims(x=b, axes=list(range(len(batch), len(batch + left))))
        return mil().mul(x=a, y=b), order
    a = _permute(a, sa, batch + left + inner)
    b = _permute(b, sb, batch + inner + right)
    if len(left) == len(inner) == len(right) == 1:
        return mil().matmul(x=a, y=b), order
    product = mil().matmul(
        x=mil().reshape(x=a, shape=_flat_shape(ctx, a, (len(batch), len(left), len(inner)))),
        y=mil().reshape(x=b, shape=_flat_shape(ctx, b, (len(batch), len(inner), len(right)))),
    )
    # [batch..., L, R] -> [batch..., left..., right...]: batch and left dims from a, right dims from b
    parts = [_dims(a, 0, len(batch + left))] if batch + left else []
    parts += [_dims(b, len(batch + inner), len(batch + inner + right))] if right else []
    shape = mil().concat(values=parts, axis=0) if len(parts) > 1 else parts[0] if parts else np.zeros(0, np.int32)
    return mil().reshape(x=product, shape=shape), order


@converter("Einsum", since=12, check=_check_einsum)
def einsum(ctx: Context, node: onnx.NodeProto) -> None:
    reason = _check_einsum(node, ctx.opset)
    if reason:
        raise fail(node, ctx.opset, reason)
    operands, out = parse_equation(str(attrs(node)["equation"]))
    values = [ctx.get(name) for name in node.input]
    for sub, var in zip(operands, values, strict=True):
        if len(sub) != rank_of(var):
            raise fail(node, ctx.opset, f"Einsum subscripts {sub!r} for an input of rank {rank_of(var)}")
    if len(values) == 1:
        var, sub = _sum_out(values[0], operands[0], out)
        result = _permute(var, sub, out)
    else:
        (sa, sb), (a, b) = operands, values
        a, sa = _sum_out(a, sa, sb + out)
        b, sb = _sum_out(b, sb, sa + out)
        product, order = _contract(ctx, a, sa, b, sb, out)
        result = _permute(product, order, out)
    ctx.set(node.output[0], mil().identity(x=result, name=node.output[0]))
