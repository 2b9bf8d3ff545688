"""Shape-checked building blocks over ggml: reshape, permute, broadcasting binary ops, views.

ggml aborts the process (GGML_ASSERT) on a shape it does not accept; these helpers check
the same conditions first and raise ``Unsupported`` instead. Every result is contiguous.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from sdkit_ggml.compiler.builder import Builder
from sdkit_ggml.compiler.context import BOOL, FLOAT_DTYPES, Tensor, Unsupported, ne_of
from sdkit_ggml.runtime import lib as L

__all__ = ["ne_of"]  # re-exported for converters

COMMUTATIVE = {"ggml_add", "ggml_mul"}


def require_float(*tensors: Tensor, what: str = "this op") -> None:
    for t in tensors:
        if t.dtype not in FLOAT_DTYPES and t.dtype != BOOL:
            raise Unsupported(f"ggml runs {what} on float tensors only, not {t.dtype}")
        if t.ggml_type != L.GGML_TYPE_F32:
            raise Unsupported(f"{what} needs F32 data")


def require_rank(t: Tensor, limit: int = 4, what: str = "this op") -> None:
    if t.rank > limit:
        raise Unsupported(f"{what} on a rank-{t.rank} tensor: ggml tensors have at most {limit} dims")


def reshape(b: Builder, t: Tensor, shape: Sequence[int]) -> Tensor:
    shape = tuple(int(d) for d in shape)
    if math.prod(shape) != t.size:
        raise Unsupported(f"cannot reshape {list(t.shape)} to {list(shape)}")
    if ne_of(shape) == ne_of(t.shape):
        return Tensor(t.ptr, shape, t.dtype, t.ggml_type, t.bounds)
    return with_bounds(b.op("ggml_reshape_4d", t.ptr, *ne_of(shape), shape=shape, dtype=t.dtype), t.bounds)


def cont(b: Builder, t: Tensor) -> Tensor:
    return b.op("ggml_cont", t.ptr, shape=t.shape, dtype=t.dtype)


def transpose(b: Builder, t: Tensor, perm: Sequence[int]) -> Tensor:
    """ONNX Transpose: out.shape[i] = in.shape[perm[i]]."""
    r = t.rank
    perm = [int(p) % r if r else 0 for p in perm]
    if sorted(perm) != list(range(r)):
        raise Unsupported(f"invalid permutation {perm} for rank {r}")
    if perm == list(range(r)):
        return t
    # Drop size-1 axes' influence: if the non-1 axes keep their order, it is a reshape.
    moved = [p for p in perm if t.shape[p] != 1]
    out_shape = tuple(t.shape[p] for p in perm)
    if moved == sorted(moved):
        return reshape(b, t, out_shape)
    if r > 4:
        folded = _fold_axes(t.shape, perm)
        if folded is None:  # no merge brings it to 4 axes: permute in rank-4 steps
            return _transpose_in_steps(b, t, perm)
        shape4, perm4 = folded
        return reshape(b, transpose(b, reshape(b, t, shape4), perm4), out_shape)
    # ggml dim k is ONNX axis r-1-k; input dim k goes to output position axes[k].
    axes = list(range(4))
    for j, p in enumerate(perm):
        axes[r - 1 - p] = r - 1 - j
    view = b.op("ggml_permute", t.ptr, *axes, shape=out_shape, dtype=t.dtype)
    # permute gives a non-contiguous view whose ne is already out_shape's.
    return with_bounds(b.op("ggml_cont", view.ptr, shape=out_shape, dtype=t.dtype), t.bounds)


def _fold_axes(shape: Sequence[int], perm: Sequence[int]) -> tuple[tuple[int, ...], list[int]] | None:
    """The same permutation on at most 4 axes, when size-1 axes are dropped and input axes that
    stay next to each other in the output are merged (a channel shuffle's [N, g, C/g, H, W]
    with perm [0, 2, 1, 3, 4] is [N, g, C/g, H*W] with [0, 2, 1, 3]): (merged shape, perm)."""
    kept = [a for a in range(len(shape)) if shape[a] != 1]
    after = dict(itertools.pairwise(kept))  # the next kept input axis
    groups: list[list[int]] = []
    for axis in (p for p in perm if shape[p] != 1):
        if groups and after.get(groups[-1][-1]) == axis:
            groups[-1].append(axis)
        else:
            groups.append([axis])
    if len(groups) > 4:
        return None
    by_input = sorted(range(len(groups)), key=lambda g: groups[g][0])
    merged = tuple(math.prod(shape[a] for a in groups[g]) for g in by_input)
    position = {g: i for i, g in enumerate(by_input)}
    return merged, [position[g] for g in range(len(groups))]


def _transpose_in_steps(b: Builder, t: Tensor, perm: list[int]) -> Tensor:
    """A rank > 4 permutation as rank-4 ones (ggml permutes at most 4 dims; SD3's unpatchify is
    the rank-6 ``nhwpqc->nchpwq``). Output position by position: the axis that belongs at
    position i sits at j >= i; viewing the tensor as ``[axes < i, axes i..j-1, axis j, axes > j]``
    and swapping the middle two moves it there. At most r - 1 copies, each a plain 4-d permute."""
    order = list(range(t.rank))  # the original axis now at each position
    shape = list(t.shape)
    current = t
    for i, wanted in enumerate(perm):
        j = order.index(wanted)
        if j == i:
            continue
        blocks = (math.prod(shape[:i]), math.prod(shape[i:j]), shape[j], math.prod(shape[j + 1 :]))
        moved = transpose(b, reshape(b, current, blocks), [0, 2, 1, 3])
        order = [*order[:i], wanted, *order[i:j], *order[j + 1 :]]
        shape = [*shape[:i], shape[j], *shape[i:j], *shape[j + 1 :]]
        current = reshape(b, moved, shape)
    return current


def broadcast_shape(a: Sequence[int], c: Sequence[int]) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in np.broadcast_shapes(tuple(a), tuple(c)))
    except ValueError:
        raise Unsupported(f"shapes {list(a)} and {list(c)} do not broadcast") from None


def _aligned(shape: Sequence[int], rank: int) -> tuple[int, ...]:
    return (1,) * (rank - len(shape)) + tuple(shape)


def expand(b: Builder, t: Tensor, shape: Sequence[int]) -> Tensor:
    """Broadcast (repeat) ``t`` to ``shape``."""
    shape = tuple(int(d) for d in shape)
    if tuple(t.shape) == shape:
        return t
    aligned = _aligned(t.shape, len(shape))
    if len(shape) > 4 and any(x != y for x, y in zip(aligned[: len(shape) - 3], shape[: len(shape) - 3], strict=True)):
        raise Unsupported(f"broadcasting over the leading dims of a rank-{len(shape)} tensor")
    src = reshape(b, t, aligned)
    if src.ggml_type != L.GGML_TYPE_F32:
        raise Unsupported("ggml repeats F32 tensors only")
    return b.op("ggml_repeat_4d", src.ptr, *ne_of(shape), shape=shape, dtype=t.dtype)


def _repeatable(small: Sequence[int], big: Sequence[int]) -> bool:
    return all(s in (1, g) for s, g in zip(ne_of(small), ne_of(big), strict=True))


def binary(b: Builder, fn: str, x: Tensor, y: Tensor) -> Tensor:
    """ONNX-broadcasting binary op; ggml broadcasts only its second operand."""
    require_float(x, y, what=fn.removeprefix("ggml_"))
    out = broadcast_shape(x.shape, y.shape)
    r = len(out)
    xs, ys = _aligned(x.shape, r), _aligned(y.shape, r)
    if r > 4:
        # Leading dims merge into ne[3]: each operand must match them all or be 1 in all.
        for s in (xs, ys):
            if s[: r - 3] != out[: r - 3] and any(d != 1 for d in s[: r - 3]):
                raise Unsupported(f"broadcasting {list(x.shape)} with {list(y.shape)}: more than 4 dims")
    if xs == out and _repeatable(ys, out):
        return b.op(fn, reshape(b, x, out).ptr, reshape(b, y, ys).ptr, shape=out, dtype=x.dtype)
    if ys == out and fn in COMMUTATIVE and _repeatable(xs, out):
        return b.op(fn, reshape(b, y, out).ptr, reshape(b, x, xs).ptr, shape=out, dtype=x.dtype)
    big = expand(b, x, out)
    ys_t = reshape(b, y, ys)
    if not _repeatable(ys, out):
        ys_t = expand(b, y, out)
    return b.op(fn, big.ptr, ys_t.ptr, shape=out, dtype=x.dtype)


def unary(b: Builder, fn: str, x: Tensor, *args: Any) -> Tensor:
    require_float(x, what=fn.removeprefix("ggml_"))
    return b.op(fn, x.ptr, *args, shape=x.shape, dtype=x.dtype)


def clamp(b: Builder, x: Tensor, low: float, high: float) -> Tensor:
    """``min(max(x, low), high)`` into a new tensor. ggml_clamp works in place (its result is a
    view of its input), so clamping ``x`` itself would change it for every other reader."""
    return unary(b, "ggml_clamp", cont(b, x), float(low), float(high))


def scale(b: Builder, x: Tensor, s: float, bias: float = 0.0) -> Tensor:
    require_float(x, what="scale")
    if bias == 0.0:
        return b.op("ggml_scale", x.ptr, float(s), shape=x.shape, dtype=x.dtype)
    return b.op("ggml_scale_bias", x.ptr, float(s), float(bias), shape=x.shape, dtype=x.dtype)


def cast(b: Builder, x: Tensor, ggml_type: int, dtype: np.dtype[Any]) -> Tensor:
    if x.ggml_type == ggml_type:
        return Tensor(x.ptr, x.shape, np.dtype(dtype), x.ggml_type)
    return b.op("ggml_cast", x.ptr, ggml_type, shape=x.shape, dtype=dtype)


def _merged_slice(
    shape: Sequence[int], starts: Sequence[int], sizes: Sequence[int], steps: Sequence[int]
) -> tuple[list[int], list[tuple[int, int, int]]]:
    """The same slice on fewer dims: an axis merges with the axes inside it when those are
    taken whole and its own step is 1 (rows of a whole inner block stay contiguous). Returns
    the merged dims and each one's (start, size, step), outermost first."""
    groups: list[list[int]] = []  # [dim, start, size, step], innermost first
    for axis in reversed(range(len(shape))):
        dim, start, size, step = int(shape[axis]), int(starts[axis]), int(sizes[axis]), int(steps[axis])
        if groups and step == 1:
            inner = groups[-1]
            if inner[1] == 0 and inner[2] == inner[0] and inner[3] == 1:
                groups[-1] = [dim * inner[0], start * inner[0], size * inner[0], 1]
                continue
        groups.append([dim, start, size, step])
    groups.reverse()
    return [g[0] for g in groups], [(g[1], g[2], g[3]) for g in groups]


def slice_view(b: Builder, t: Tensor, starts: Sequence[int], sizes: Sequence[int], steps: Sequence[int]) -> Tensor:
    """A strided view (copied to contiguous) of ``t``: per ONNX axis start, size, step>0."""
    r = t.rank
    if len(starts) != r or len(sizes) != r or len(steps) != r:
        raise Unsupported(f"slice of a rank-{r} tensor given {len(starts)} axes")
    if r > 4:  # e.g. Flux's RoPE: Split of [B, L, heads, D/2, 2] on its last axis
        dims, merged = _merged_slice(t.shape, starts, sizes, steps)
        require_rank(Tensor(t.ptr, tuple(dims), t.dtype, t.ggml_type), 4, "Slice")
        out_shape = tuple(int(s) for s in sizes)
        view = slice_view(b, reshape(b, t, dims), *(list(m) for m in zip(*merged, strict=True)))
        return reshape(b, view, out_shape)
    for dim, start, size, step in zip(t.shape, starts, sizes, steps, strict=True):
        if size < 1 or step < 1 or start < 0 or start + (size - 1) * step >= dim:
            raise Unsupported(f"slice start {start}, size {size}, step {step} outside a dim of {dim}")
    if r and steps[-1] != 1 and sizes[-1] > 1:
        # ggml views cannot stride the innermost dim; move it out of the way and back.
        perm = [r - 1, *range(r - 1)]
        inv = [*range(1, r), 0]
        moved = transpose(b, t, perm)
        inner = slice_view(b, moved, [starts[-1], *starts[:-1]], [sizes[-1], *sizes[:-1]], [steps[-1], *steps[:-1]])
        return transpose(b, inner, inv)
    elem = 4  # F32 and I32 storage
    ne = ne_of(t.shape)
    nb = [elem, elem * ne[0], elem * ne[0] * ne[1], elem * ne[0] * ne[1] * ne[2]]
    out_shape = tuple(int(s) for s in sizes)
    offset = 0
    view_nb = list(nb)
    for axis in range(r):
        k = r - 1 - axis
        offset += int(starts[axis]) * nb[k]
        view_nb[k] = nb[k] * int(steps[axis])
    out_ne = ne_of(out_shape)
    view = b.op(
        "ggml_view_4d",
        t.ptr,
        *out_ne,
        view_nb[1],
        view_nb[2],
        view_nb[3],
        offset,
        shape=out_shape,
        dtype=t.dtype,
    )
    return with_bounds(b.op("ggml_cont", view.ptr, shape=out_shape, dtype=t.dtype), t.bounds)


def concat(b: Builder, tensors: Sequence[Tensor], axis: int) -> Tensor:
    r = tensors[0].rank
    axis %= max(r, 1)
    if r > 4 and all(t.rank == r and t.shape[:axis] == tensors[0].shape[:axis] for t in tensors):
        # The axes outside and inside the concat axis merge (e.g. Flux's RoPE stacks
        # [B, L, heads, D/2, 1] pairs on the last axis): a rank-3 concat, reshaped back.
        outer = math.prod(tensors[0].shape[:axis])
        if all(t.shape[axis + 1 :] == tensors[0].shape[axis + 1 :] for t in tensors):
            inner = math.prod(tensors[0].shape[axis + 1 :])
            flat = [reshape(b, t, (outer, t.shape[axis], inner)) for t in tensors]
            joined = (*tensors[0].shape[:axis], sum(t.shape[axis] for t in tensors), *tensors[0].shape[axis + 1 :])
            return reshape(b, concat(b, flat, 1), joined)
    require_rank(tensors[0], 4, "Concat")
    result = tensors[0]
    for t in tensors[1:]:
        if t.rank != r or any(
            d1 != d2 for i, (d1, d2) in enumerate(zip(result.shape, t.shape, strict=True)) if i != axis
        ):
            raise Unsupported(f"Concat of shapes {list(result.shape)} and {list(t.shape)} on axis {axis}")
        if t.ggml_type != result.ggml_type:
            raise Unsupported("Concat of tensors of different types")
        shape = list(result.shape)
        shape[axis] += t.shape[axis]
        result = b.op("ggml_concat", result.ptr, t.ptr, r - 1 - axis, shape=shape, dtype=result.dtype)
    return result


def retype(t: Tensor, dtype: np.dtype[Any]) -> Tensor:
    """The same data seen as another ONNX dtype of the same ggml storage."""
    return Tensor(t.ptr, t.shape, np.dtype(dtype), t.ggml_type, t.bounds)


def with_bounds(t: Tensor, bounds: tuple[int, int] | None) -> Tensor:
    return t if bounds is None else dataclasses.replace(t, bounds=bounds)


def pool_rows(b: Builder, rows: Tensor, kind: int, kernel: int, stride: int, out: int) -> Tensor:
    """Pool each row of ``rows`` [R, L] (no padding) -> [R, out]: ggml_pool_1d, or where the
    device has no 1-D pool (CUDA), the same window as a 2-D pool of height 1."""
    shape = (rows.shape[0], out)
    y = b.op("ggml_pool_1d", rows.ptr, kind, kernel, stride, 0, shape=shape, dtype=rows.dtype)
    if b.supported(y):
        return y
    flat = reshape(b, rows, (1, 1, *rows.shape))
    y = b.op("ggml_pool_2d", flat.ptr, kind, kernel, 1, stride, 1, 0.0, 0.0, shape=(1, 1, *shape), dtype=rows.dtype)
    return reshape(b, y, shape)
