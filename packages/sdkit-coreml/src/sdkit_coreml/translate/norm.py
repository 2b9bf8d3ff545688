"""Normalizations and reductions: BatchNormalization (inference), InstanceNormalization,
LayerNormalization, GroupNormalization, ReduceMean/Sum/Max/Min.

SD graphs export GroupNorm as Reshape(N, G, -1) -> InstanceNormalization -> Reshape -> Mul
-> Add. InstanceNormalization becomes ``layer_norm`` over the trailing axes followed by the
per-channel affine, so the group norm reaches Core ML as reshape + layer_norm + affine.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from sdkit_coreml.translate.context import Context, attrs, fail, mil, rank_of
from sdkit_coreml.translate.layout import zero_means_copy
from sdkit_coreml.translate.registry import converter


def _per_channel(ctx: Context, var: Any, rank: int) -> Any:
    """A [C] scale/bias as [C, 1, ...] so it broadcasts over an [N, C, ...] tensor."""
    value = ctx.value(var)
    if value is not None:
        return ctx.const(value.reshape((-1,) + (1,) * (rank - 2)))
    return mil().expand_dims(x=var, axes=list(range(1, rank - 1)))


def _affine(ctx: Context, x: Any, scale: Any, bias: Any, rank: int) -> Any:
    """x * scale + bias per channel, skipping the identity parts."""
    scale_value, bias_value = ctx.value(scale), ctx.value(bias)
    if scale_value is None or not np.all(scale_value == 1):
        x = mil().mul(x=x, y=_per_channel(ctx, scale, rank))
    if bias_value is None or np.any(bias_value != 0):
        x = mil().add(x=x, y=_per_channel(ctx, bias, rank))
    return x


def _check_batch_norm(node: onnx.NodeProto, opset: int) -> str | None:
    if int(attrs(node).get("training_mode", 0)) or (len(node.output) > 1 and any(node.output[1:])):
        return "BatchNormalization in training mode (running statistics as outputs)"
    return None


@converter("BatchNormalization", since=15, check=_check_batch_norm)
def batch_norm(ctx: Context, node: onnx.NodeProto) -> None:
    """Inference BatchNorm (RetinaFace, ParseNet): ``(x - mean) * (scale / sqrt(var + eps)) + bias``
    per channel, the per-channel factor folded in numpy when the statistics are known."""
    x, scale, bias, mean, var = (ctx.get(n) for n in node.input[:5])
    rank = rank_of(x)
    epsilon = float(attrs(node).get("epsilon", 1e-5))
    known = [ctx.value(v) for v in (scale, mean, var)]
    if all(v is not None for v in known):
        s, m, v = (np.asarray(k, dtype=np.float64) for k in known)
        factor: Any = ctx.const((s / np.sqrt(v + epsilon)).astype(np.float32))
        mean_c: Any = ctx.const(m.astype(np.float32))
    else:
        root = mil().sqrt(x=mil().add(x=var, y=ctx.const(np.float32(epsilon))))
        factor, mean_c = mil().real_div(x=scale, y=root), mean
    centred = mil().sub(x=x, y=_per_channel(ctx, mean_c, rank))
    scaled = mil().mul(x=centred, y=_per_channel(ctx, factor, rank))
    ctx.set(node.output[0], mil().add(x=scaled, y=_per_channel(ctx, bias, rank), name=node.output[0]))


@converter("InstanceNormalization")
def instance_norm(ctx: Context, node: onnx.NodeProto) -> None:
    x, scale, bias = (ctx.get(n) for n in node.input)
    rank = rank_of(x)
    epsilon = float(attrs(node).get("epsilon", 1e-5))
    normed = mil().layer_norm(x=x, axes=list(range(2, rank)), epsilon=epsilon)
    ctx.set(node.output[0], mil().identity(x=_affine(ctx, normed, scale, bias, rank), name=node.output[0]))


@converter("LayerNormalization", since=17)
def layer_norm(ctx: Context, node: onnx.NodeProto) -> None:
    if len(node.output) > 1 and any(node.output[1:]):
        raise fail(node, ctx.opset, "LayerNormalization with mean/inv_std_dev outputs")
    x, scale, bias = ctx.get(node.input[0]), ctx.get(node.input[1]), ctx.optional(node, 2)
    found = attrs(node)
    rank = rank_of(x)
    axis = int(found.get("axis", -1))
    axis = axis + rank if axis < 0 else axis
    args: dict[str, Any] = {"x": x, "axes": list(range(axis, rank)), "epsilon": float(found.get("epsilon", 1e-5))}
    scale_value = ctx.value(scale)
    normalized = tuple(x.shape[axis:])
    if scale_value is not None and scale_value.shape == normalized:
        args["gamma"] = scale_value
        bias_value = None if bias is None else ctx.value(bias)
        if bias_value is not None and bias_value.shape == normalized:
            args["beta"] = bias_value
            bias = None
        result = mil().layer_norm(**args)
    else:  # broadcast or dynamic scale: apply it separately
        result = mil().mul(x=mil().layer_norm(**args), y=scale)
    if bias is not None:
        result = mil().add(x=result, y=bias)
    ctx.set(node.output[0], mil().identity(x=result, name=node.output[0]))


@converter("GroupNormalization", since=21)
def group_norm(ctx: Context, node: onnx.NodeProto) -> None:
    x, scale, bias = (ctx.get(n) for n in node.input)
    rank = rank_of(x)
    groups = int(attrs(node)["num_groups"])
    grouped = mil().reshape(x=x, shape=zero_means_copy(ctx, x, ctx.const(np.array([0, groups, -1]))))
    normed = mil().layer_norm(x=grouped, axes=[2], epsilon=float(attrs(node).get("epsilon", 1e-5)))
    restored = mil().reshape(x=normed, shape=mil().shape(x=x))
    ctx.set(node.output[0], mil().identity(x=_affine(ctx, restored, scale, bias, rank), name=node.output[0]))


REDUCE = {"ReduceMean": "reduce_mean", "ReduceSum": "reduce_sum", "ReduceMax": "reduce_max", "ReduceMin": "reduce_min"}


@converter(*REDUCE)
def reduce(ctx: Context, node: onnx.NodeProto) -> None:
    found = attrs(node)
    x = ctx.get(node.input[0])
    if "axes" in found:
        axes = [int(a) for a in found["axes"]]
    elif ctx.optional(node, 1) is not None:
        axes = [int(a) for a in ctx.known(node, 1, "axes").reshape(-1)]
    else:
        axes = list(range(rank_of(x)))
    if not axes and int(found.get("noop_with_empty_axes", 0)):
        ctx.set(node.output[0], x)
        return
    op = getattr(mil(), REDUCE[node.op_type])
    keep = bool(found.get("keepdims", 1))
    ctx.set(node.output[0], op(x=x, axes=axes or list(range(rank_of(x))), keep_dims=keep, name=node.output[0]))
