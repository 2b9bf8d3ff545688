"""Converters of the fused nodes the graph passes create (domain ``ai.sdkit.ggml``,
``compiler/pass_fusions.py``). Each is built from ggml ops only, so it runs on every backend.
"""

from __future__ import annotations

import math

import numpy as np

from sdkit_ggml.compiler import ops
from sdkit_ggml.compiler.builder import Builder
from sdkit_ggml.compiler.context import Node, Tensor, Unsupported, Value
from sdkit_ggml.compiler.pass_graph import FUSED_DOMAIN
from sdkit_ggml.converters.norm import normalize_rows
from sdkit_ggml.converters.table import converter
from sdkit_ggml.runtime import lib as L

F16_MAX = 65504.0  # a mask value beyond it (torch's finfo.min) becomes -inf in F16: clamped


@converter("SiLU", since_version=1, domain=FUSED_DOMAIN)
def convert_silu(b: Builder, node: Node) -> list[Value]:
    return [ops.unary(b, "ggml_silu", b.tensor(node, 0))]


def _is_fill(b: Builder, node: Node, index: int, fill: float) -> bool:
    """Whether input ``index`` is a constant refit cannot change, all equal to ``fill``."""
    value = b.fixed_value(node, index)
    return value is not None and bool(np.all(value == fill))


def _per_channel(b: Builder, node: Node, index: int, channels: int, rank: int) -> Tensor:
    t = b.tensor(node, index)
    if t.size not in (1, channels):
        raise Unsupported(f"GroupNorm: input {index} has {t.size} values for {channels} channels")
    return ops.reshape(b, t, (1, t.size) + (1,) * (rank - 2))


@converter("GroupNorm", since_version=1, domain=FUSED_DOMAIN)
def convert_group_norm(b: Builder, node: Node) -> list[Value]:
    """GroupNorm(x, s, t, gamma, beta): per-group normalization with the InstanceNormalization
    affine ``s``, ``t`` (per group; skipped when they are the ones and zeros torch exports),
    then the per-channel ``gamma``, ``beta`` and an optional SiLU."""
    x = b.tensor(node, 0)
    groups = int(node.attr("num_groups"))
    if x.rank < 3 or x.shape[1] % groups:
        raise Unsupported(f"GroupNorm: {list(x.shape)} does not split into {groups} groups")
    n, channels = x.shape[0], x.shape[1]
    y = normalize_rows(b, x, n * groups, float(node.attr("epsilon", 1e-5)))
    if not (_is_fill(b, node, 1, 1.0) and _is_fill(b, node, 2, 0.0)):
        grouped = ops.reshape(b, y, (n, groups, x.size // (n * groups)))
        s, t = b.tensor(node, 1), b.tensor(node, 2)
        if s.size != groups or t.size != groups:
            raise Unsupported(f"GroupNorm: the instance scale and bias need {groups} values")
        grouped = ops.binary(b, "ggml_mul", grouped, ops.reshape(b, s, (1, groups, 1)))
        grouped = ops.binary(b, "ggml_add", grouped, ops.reshape(b, t, (1, groups, 1)))
        y = ops.reshape(b, grouped, x.shape)
    y = ops.binary(b, "ggml_mul", y, _per_channel(b, node, 3, channels, x.rank))
    y = ops.binary(b, "ggml_add", y, _per_channel(b, node, 4, channels, x.rank))
    activation = str(node.attr("activation", ""))
    if activation == "silu":
        y = ops.unary(b, "ggml_silu", y)
    elif activation:
        raise Unsupported(f"GroupNorm activation {activation!r}")
    return [y]


def _as_heads(b: Builder, t: Tensor) -> Tensor:
    """A rank-3 [B*H, L, d] operand as rank 4 [1, B*H, L, d] (ggml's n_head axis)."""
    return ops.reshape(b, t, (1, *t.shape)) if t.rank == 3 else t


def _half(b: Builder, t: Tensor) -> Tensor:
    """``t`` as F16 where the fp16 compute path is on (``Builder.f16_activations``)."""
    return ops.cast(b, t, L.GGML_TYPE_F16, t.dtype) if b.f16_activations else t


def _prescale(b: Builder, node: Node, index: int, t: Tensor) -> tuple[Tensor, float]:
    """SDPA's ``Q * s`` / ``K^T * s`` (input ``index``): a constant ``s`` folds into the scale,
    a runtime one multiplies the operand."""
    if not node.has(index):
        return t, 1.0
    value = b.fixed_value(node, index)
    if value is not None and value.size == 1:
        return t, float(value.ravel()[0])
    return ops.binary(b, "ggml_mul", t, b.tensor(node, index)), 1.0


def _mask4(b: Builder, node: Node, batch: tuple[int, ...], lq: int, lk: int) -> Tensor | None:
    """The additive mask (input 3) as F32 ``[m0, m1, Lq, Lk]`` beside ``[nb, heads, Lq, d]``
    operands: the score dims broadcast (ggml needs whole rows of Lq x Lk), the batch and head
    dims each 1 or whole (ggml broadcasts those by modulo)."""
    if not node.has(3):
        return None
    mask = b.tensor(node, 3)
    ops.require_float(mask, what="an attention mask")
    scores = (*batch, lq, lk)
    if mask.rank > len(scores):
        raise Unsupported(f"attention mask {list(mask.shape)} has more dims than the scores {list(scores)}")
    aligned = (1,) * (len(scores) - mask.rank) + tuple(mask.shape)
    if any(m not in (1, s) for m, s in zip(aligned, scores, strict=True)):
        raise Unsupported(f"attention mask {list(mask.shape)} does not broadcast to the scores {list(scores)}")
    aligned4 = (1,) * (4 - len(aligned)) + aligned
    return ops.expand(b, ops.reshape(b, mask, aligned4), (*aligned4[:2], lq, lk))


def _f16_exact(mask: np.ndarray | None) -> bool:
    """Whether a constant mask reads the same in F16 (clamped): each value F16-exact, or at most
    -65504 (a weight exp() makes 0 in F32 either way)."""
    if mask is None:
        return False
    values = np.asarray(mask, dtype=np.float32)
    clamped = np.clip(values, -F16_MAX, F16_MAX)
    return bool(np.all((values <= -F16_MAX) | (clamped.astype(np.float16).astype(np.float32) == values)))


@converter("Attention", since_version=1, domain=FUSED_DOMAIN)
def convert_attention(b: Builder, node: Node) -> list[Value]:
    """softmax(scale * Q K^T [+ mask]) V as one ggml_flash_attn_ext: the score matrix is never
    stored. ``k_transposed``: input 1 is K^T ([.., d, Lk]) rather than K. Optional inputs: 3 an
    additive mask, 4 and 5 scalars multiplying Q and K^T (torch SDPA's export). ggml reads the
    mask in F16 (clamped to +-65504, so torch's finfo.min gives no NaN): at fp32 a mask takes
    flash attention only when it is a constant F16 holds exactly (0 / -inf / finfo.min, a causal
    mask), any other one the explicit path with the F32 mask."""
    q, k, v = b.tensor(node, 0), b.tensor(node, 1), b.tensor(node, 2)
    ops.require_float(q, k, v, what="attention")
    if not q.rank == k.rank == v.rank or q.rank not in (3, 4):
        raise Unsupported("attention operands must all be rank 3 or all rank 4")
    q, q_scale = _prescale(b, node, 4, q)
    k, k_scale = _prescale(b, node, 5, k)
    if int(node.attr("k_transposed", 0)):
        k = ops.transpose(b, k, [*range(k.rank - 2), k.rank - 1, k.rank - 2])
    batch = q.shape[:-2]
    if k.shape[:-2] != batch or v.shape[:-2] != batch or k.shape[-1] != q.shape[-1] or v.shape[-2] != k.shape[-2]:
        raise Unsupported(f"attention shapes Q {list(q.shape)}, K {list(k.shape)}, V {list(v.shape)} do not match")
    q4, k4, v4 = _as_heads(b, q), _as_heads(b, k), _as_heads(b, v)
    nb, heads, lq, dv = q4.shape[0], q4.shape[1], q4.shape[2], v4.shape[3]
    scale = float(node.attr("scale", 1.0 / math.sqrt(q.shape[-1]))) * q_scale * k_scale
    mask = _mask4(b, node, batch, lq, k.shape[-2])
    kh, vh = _half(b, k4), _half(b, v4)
    if mask is not None and b.precision == "fp32" and not _f16_exact(b.fixed_value(node, 3)):
        # flash attention reads the mask in F16: at fp32 only a constant mask F16 holds exactly
        return [ops.reshape(b, _explicit_attention(b, q4, kh, vh, scale, mask), (*batch, lq, dv))]
    mask_h = None if mask is None else ops.cast(b, ops.clamp(b, mask, -F16_MAX, F16_MAX), L.GGML_TYPE_F16, mask.dtype)
    args = (q4.ptr, kh.ptr, vh.ptr, None if mask_h is None else mask_h.ptr, scale, 0.0, 0.0)
    out = b.op("ggml_flash_attn_ext", *args, shape=(nb, lq, heads, dv), dtype=q.dtype)
    if not b.supported(out):  # e.g. CUDA's kernels: head sizes 40/64/72/80/96/112/128/256 only
        return [ops.reshape(b, _explicit_attention(b, q4, kh, vh, scale, mask), (*batch, lq, dv))]
    b.set_precision_f32(out)
    result = ops.transpose(b, out, (0, 2, 1, 3))  # ggml's result is [batch, Lq, heads, dv]
    return [ops.reshape(b, result, (*batch, lq, dv))]


def _explicit_attention(b: Builder, q4: Tensor, k4: Tensor, v4: Tensor, scale: float, mask: Tensor | None) -> Tensor:
    """softmax(scale * Q K^T + mask) V as mul_mat, soft_max_ext, mul_mat ([B, H, Lq, dv]):
    where the device has no flash-attention kernel for these operands. The scores are stored
    (F32); K and V come as flash attention would take them (F16 on the fp16 path)."""
    nb, heads, lq, lk = q4.shape[0], q4.shape[1], q4.shape[2], k4.shape[2]
    dv = v4.shape[3]
    scores = b.op("ggml_mul_mat", ops.cont(b, k4).ptr, ops.cont(b, q4).ptr, shape=(nb, heads, lq, lk), dtype=q4.dtype)
    masks = None if mask is None else mask.ptr
    probs = b.op("ggml_soft_max_ext", scores.ptr, masks, scale, 0.0, shape=(nb, heads, lq, lk), dtype=q4.dtype)
    v_t = ops.cont(b, ops.transpose(b, v4, (0, 1, 3, 2)))  # [B, H, dv, Lk]
    return b.op("ggml_mul_mat", v_t.ptr, probs.ptr, shape=(nb, heads, lq, dv), dtype=q4.dtype)
