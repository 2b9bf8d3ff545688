"""Network ops: Conv, ConvTranspose, MatMul, Gemm, Softmax, Resize, Pad, pooling.

Attention in the SD graphs is MatMul -> (scale) -> Softmax -> MatMul, translated op by op, or
as one SDPA op for macOS 15+ targets (``attention.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from sdkit_coreml.translate.context import Context, attrs, fail, mil, rank_of
from sdkit_coreml.translate.registry import converter

AUTO_PADS = {"SAME_UPPER": "same", "SAME_LOWER": "same_lower", "VALID": "valid"}


def _mil_pads(onnx_pads: list[int]) -> list[int]:
    """ONNX [x1_begin, x2_begin, x1_end, x2_end] -> MIL [x1_begin, x1_end, x2_begin, x2_end]."""
    half = len(onnx_pads) // 2
    return [p for i in range(half) for p in (onnx_pads[i], onnx_pads[i + half])]


def _padding(node: onnx.NodeProto, spatial: int) -> dict[str, Any]:
    found = attrs(node)
    auto = found.get("auto_pad", "NOTSET")
    if auto in AUTO_PADS:
        return {"pad_type": AUTO_PADS[auto]}
    return {"pad_type": "custom", "pad": _mil_pads([int(p) for p in found.get("pads", [0] * 2 * spatial)])}


def _check_conv(node: onnx.NodeProto, opset: int) -> str | None:
    if len(node.input) < 2:
        return "Conv without weights"
    return None


@converter("Conv", check=_check_conv)
def conv(ctx: Context, node: onnx.NodeProto) -> None:
    x, weight, bias = ctx.get(node.input[0]), ctx.get(node.input[1]), ctx.optional(node, 2)
    spatial = rank_of(x) - 2
    found = attrs(node)
    args: dict[str, Any] = {
        "x": x,
        "weight": weight,
        "strides": [int(s) for s in found.get("strides", [1] * spatial)],
        "dilations": [int(d) for d in found.get("dilations", [1] * spatial)],
        "groups": int(found.get("group", 1)),
        **_padding(node, spatial),
    }
    if bias is not None:
        args["bias"] = bias
    ctx.set(node.output[0], mil().conv(**args, name=node.output[0]))


def _check_conv_transpose(node: onnx.NodeProto, opset: int) -> str | None:
    if "output_shape" in attrs(node):
        return "ConvTranspose with output_shape is not translated (use pads/output_padding)"
    return None


@converter("ConvTranspose", check=_check_conv_transpose)
def conv_transpose(ctx: Context, node: onnx.NodeProto) -> None:
    x, weight, bias = ctx.get(node.input[0]), ctx.get(node.input[1]), ctx.optional(node, 2)
    spatial = rank_of(x) - 2
    found = attrs(node)
    if any(int(p) for p in found.get("output_padding", [])):
        raise fail(node, ctx.opset, "ConvTranspose with output_padding")
    args: dict[str, Any] = {
        "x": x,
        "weight": weight,
        "strides": [int(s) for s in found.get("strides", [1] * spatial)],
        "dilations": [int(d) for d in found.get("dilations", [1] * spatial)],
        "groups": int(found.get("group", 1)),
        **_padding(node, spatial),
    }
    if bias is not None:
        args["bias"] = bias
    ctx.set(node.output[0], mil().conv_transpose(**args, name=node.output[0]))


@converter("MatMul")
def matmul(ctx: Context, node: onnx.NodeProto) -> None:
    if ctx.sdpa:
        from sdkit_coreml.translate.attention import fuse

        if fuse(ctx, node):
            return
    x, y = ctx.get(node.input[0]), ctx.get(node.input[1])
    ctx.set(node.output[0], mil().matmul(x=x, y=y, name=node.output[0]))


@converter("Gemm")
def gemm(ctx: Context, node: onnx.NodeProto) -> None:
    found = attrs(node)
    a, b, c = ctx.get(node.input[0]), ctx.get(node.input[1]), ctx.optional(node, 2)
    alpha, beta = float(found.get("alpha", 1.0)), float(found.get("beta", 1.0))
    trans_a, trans_b = bool(found.get("transA", 0)), bool(found.get("transB", 0))
    weight = ctx.value(b)
    bias = None if c is None else ctx.value(c)
    if weight is not None and not trans_a and alpha == 1.0 and beta == 1.0 and (c is None or bias is not None):
        # Linear layer: MIL's ``linear`` wants the weight as [out, in]
        args: dict[str, Any] = {"x": a, "weight": weight if trans_b else weight.T}
        if bias is not None:
            args["bias"] = np.broadcast_to(bias, (args["weight"].shape[0],)).astype(np.float32)
        ctx.set(node.output[0], mil().linear(**args, name=node.output[0]))
        return
    result = mil().matmul(x=a, y=b, transpose_x=trans_a, transpose_y=trans_b)
    if alpha != 1.0:
        result = mil().mul(x=result, y=np.float32(alpha))
    if c is not None:
        result = mil().add(x=result, y=c if beta == 1.0 else mil().mul(x=c, y=np.float32(beta)))
    ctx.set(node.output[0], mil().identity(x=result, name=node.output[0]))


@converter("Softmax", since=13)
def softmax(ctx: Context, node: onnx.NodeProto) -> None:
    axis = int(attrs(node).get("axis", -1))
    ctx.set(node.output[0], mil().softmax(x=ctx.get(node.input[0]), axis=axis, name=node.output[0]))


def _check_resize(node: onnx.NodeProto, opset: int) -> str | None:
    found = attrs(node)
    mode = found.get("mode", "nearest")
    transform = found.get("coordinate_transformation_mode", "half_pixel")
    if mode == "nearest" and transform not in ("asymmetric", "tf_half_pixel_for_nn", "half_pixel"):
        return f"nearest Resize with coordinate_transformation_mode={transform}"
    if mode == "nearest" and found.get("nearest_mode", "round_prefer_floor") not in ("floor", "round_prefer_floor"):
        return f"nearest Resize with nearest_mode={found.get('nearest_mode')}"
    if mode == "linear" and transform not in ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"):
        return f"linear Resize with coordinate_transformation_mode={transform}"
    if mode == "cubic":
        return "cubic Resize (Core ML resizes nearest or bilinear)"
    if found.get("antialias", 0):
        return "antialiased Resize"
    return None


def _resize_scales(ctx: Context, node: onnx.NodeProto, x: Any) -> tuple[float, float]:
    if ctx.optional(node, 2) is not None and ctx.known(node, 2, "scales").size:
        scales = ctx.known(node, 2, "scales").astype(np.float64)
    else:
        sizes = ctx.known(node, 3, "sizes").astype(np.float64)
        dims = x.shape
        if not all(isinstance(d, (int, np.integer)) for d in dims[-2:]):
            raise fail(node, ctx.opset, "Resize by sizes needs static spatial dims")
        scales = np.concatenate([np.ones(len(sizes) - 2), sizes[-2:] / np.asarray(dims[-2:], np.float64)])
    if len(scales) != 4 or scales[0] != 1 or scales[1] != 1:
        raise fail(node, ctx.opset, "Resize only of the two spatial dims of an NCHW tensor")
    return float(scales[2]), float(scales[3])


@converter("Resize", since=11, check=_check_resize)
def resize(ctx: Context, node: onnx.NodeProto) -> None:
    reason = _check_resize(node, ctx.opset)
    if reason:
        raise fail(node, ctx.opset, reason)
    x = ctx.get(node.input[0])
    scale_h, scale_w = _resize_scales(ctx, node, x)
    found = attrs(node)
    if found.get("mode", "nearest") == "nearest":
        transform = found.get("coordinate_transformation_mode", "half_pixel")
        if transform != "asymmetric" and not (scale_h.is_integer() and scale_w.is_integer()):
            # Core ML picks floor(i / scale); the half-pixel rules agree with it for whole scales only
            raise fail(node, ctx.opset, f"nearest Resize by {scale_h}x{scale_w} with {transform} coordinates")
        result = mil().upsample_nearest_neighbor(
            x=x, scale_factor_height=scale_h, scale_factor_width=scale_w, name=node.output[0]
        )
    else:
        transform = found.get("coordinate_transformation_mode", "half_pixel")
        result = mil().upsample_bilinear(
            x=x,
            scale_factor_height=scale_h,
            scale_factor_width=scale_w,
            align_corners=transform == "align_corners",
            half_pixel_centers=transform in ("half_pixel", "pytorch_half_pixel"),
            name=node.output[0],
        )
    ctx.set(node.output[0], result)


def _check_pad(node: onnx.NodeProto, opset: int) -> str | None:
    mode = attrs(node).get("mode", "constant")
    if mode not in ("constant", "reflect", "edge"):
        return f"Pad mode {mode}"
    return None


@converter("Pad", since=11, check=_check_pad)
def pad(ctx: Context, node: onnx.NodeProto) -> None:
    x = ctx.get(node.input[0])
    rank = rank_of(x)
    pads = [int(p) for p in ctx.known(node, 1, "pads").reshape(-1)]
    axes = _pad_axes(ctx, node, rank)
    full = [0] * (2 * rank)
    for i, axis in enumerate(axes):
        full[2 * axis], full[2 * axis + 1] = pads[i], pads[i + len(axes)]
    first = next((i for i in range(rank) if full[2 * i] or full[2 * i + 1]), rank)  # MIL pads trailing dims
    mode = {"constant": "constant", "reflect": "reflect", "edge": "replicate"}[attrs(node).get("mode", "constant")]
    value = ctx.value(ctx.optional(node, 2)) if ctx.optional(node, 2) is not None else None
    constant = float(value.reshape(-1)[0]) if value is not None and value.size else 0.0
    result = mil().pad(x=x, pad=np.asarray(full[2 * first :] or [0, 0], np.int32), mode=mode,
                       constant_val=constant, name=node.output[0])  # fmt: skip
    ctx.set(node.output[0], result)


def _pad_axes(ctx: Context, node: onnx.NodeProto, rank: int) -> list[int]:
    if ctx.optional(node, 3) is None:
        return list(range(rank))
    return [int(a) + rank if int(a) < 0 else int(a) for a in ctx.known(node, 3, "axes").reshape(-1)]


def _pool_args(node: onnx.NodeProto, spatial: int) -> dict[str, Any]:
    found = attrs(node)
    return {
        "kernel_sizes": [int(k) for k in found["kernel_shape"]],
        "strides": [int(s) for s in found.get("strides", [1] * spatial)],
        "ceil_mode": bool(found.get("ceil_mode", 0)),
        **_padding(node, spatial),
    }


@converter("MaxPool", "AveragePool")
def pool(ctx: Context, node: onnx.NodeProto) -> None:
    if len(node.output) > 1 and node.output[1]:
        raise fail(node, ctx.opset, "MaxPool with an indices output")
    x = ctx.get(node.input[0])
    args = _pool_args(node, rank_of(x) - 2)
    if node.op_type == "MaxPool":
        result = mil().max_pool(x=x, **args, name=node.output[0])
    else:
        exclude = not bool(attrs(node).get("count_include_pad", 0))
        result = mil().avg_pool(x=x, **args, exclude_padding_from_average=exclude, name=node.output[0])
    ctx.set(node.output[0], result)


@converter("GlobalAveragePool")
def global_average_pool(ctx: Context, node: onnx.NodeProto) -> None:
    x = ctx.get(node.input[0])
    axes = list(range(2, rank_of(x)))
    ctx.set(node.output[0], mil().reduce_mean(x=x, axes=axes, keep_dims=True, name=node.output[0]))
