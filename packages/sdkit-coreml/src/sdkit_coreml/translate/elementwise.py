"""Element-wise ONNX ops: unary math, binary arithmetic and comparisons, Mod, Where, Cast.

MIL's binary ops broadcast like numpy (as ONNX does). Integer Div becomes ``floor_div``:
ONNX truncates toward zero, which equals flooring for the non-negative sizes that shape
arithmetic divides (the only place integer Div appears in SD graphs). Mod is written out with
``floor_div`` (as coremltools' own torch ``remainder`` is) rather than MIL's ``mod``, whose
sign convention for negative operands the Core ML spec does not state.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from sdkit_coreml.translate.context import CAST_TARGETS, Context, attrs, fail, mil, static_shape
from sdkit_coreml.translate.registry import converter

UNARY = {
    "Relu": "relu",
    "Sigmoid": "sigmoid",
    "Tanh": "tanh",
    "Erf": "erf",
    "Sin": "sin",
    "Cos": "cos",
    "Exp": "exp",
    "Log": "log",
    "Sqrt": "sqrt",
    "Abs": "abs",
    "Floor": "floor",
    "Ceil": "ceil",
    "Reciprocal": "inverse",
    "Not": "logical_not",
    "Softplus": "softplus",
}
BINARY = {
    "Add": "add",
    "Sub": "sub",
    "Mul": "mul",
    "Pow": "pow",
    "Equal": "equal",
    "Less": "less",
    "LessOrEqual": "less_equal",
    "Greater": "greater",
    "GreaterOrEqual": "greater_equal",
    "And": "logical_and",
    "Or": "logical_or",
    "Xor": "logical_xor",
}
VARIADIC = {"Max": "maximum", "Min": "minimum", "Sum": "add"}


def _is_int(var: object) -> bool:
    from coremltools.converters.mil.mil import types

    dtype = getattr(var, "dtype", None)
    return dtype is not None and types.is_int(dtype)


@converter(*UNARY)
def unary(ctx: Context, node: onnx.NodeProto) -> None:
    op = getattr(mil(), UNARY[node.op_type])
    ctx.set(node.output[0], op(x=ctx.get(node.input[0]), name=node.output[0]))


@converter("LeakyRelu")
def leaky_relu(ctx: Context, node: onnx.NodeProto) -> None:
    alpha = float(attrs(node).get("alpha", 0.01))
    ctx.set(node.output[0], mil().leaky_relu(x=ctx.get(node.input[0]), alpha=alpha, name=node.output[0]))


@converter("PRelu")
def prelu(ctx: Context, node: onnx.NodeProto) -> None:
    """``relu(x) + slope * (x - relu(x))``: ONNX broadcasts the slope to x numpy-style (the
    ESRGAN Compact exports' ``[C, 1, 1]``); MIL's ``prelu`` takes only one alpha per channel."""
    x, slope = ctx.get(node.input[0]), ctx.get(node.input[1])
    positive = mil().relu(x=x)
    negative = mil().mul(x=mil().sub(x=x, y=positive), y=slope)
    ctx.set(node.output[0], mil().add(x=positive, y=negative, name=node.output[0]))


@converter("Neg")
def neg(ctx: Context, node: onnx.NodeProto) -> None:
    x = ctx.get(node.input[0])
    minus_one = ctx.const(np.array(-1, np.int32 if _is_int(x) else np.float32))
    ctx.set(node.output[0], mil().mul(x=x, y=minus_one, name=node.output[0]))


@converter("Identity", "Dropout")
def identity(ctx: Context, node: onnx.NodeProto) -> None:
    ctx.set(node.output[0], ctx.get(node.input[0]))


FILL_ARITHMETIC = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}


def _uniform(value: np.ndarray | None) -> bool:
    """A known value with one element, or one element broadcast (every stride 0, as a fill)."""
    return value is not None and (value.size == 1 or all(s == 0 for s in value.strides))


def _on_fills(ctx: Context, node: onnx.NodeProto, x: Any, y: Any) -> Any:
    """Arithmetic on fills stays a fill, and adding a zero fill is no op: the exported SDPA
    adds a zero bias ``ConstantOfShape([H, L, S]) * scale`` to its scores, which MIL would
    otherwise fold into a real constant (with static shapes, 2.9 GB of zeros in a 512 px SD 1.5
    UNet). None where neither applies."""
    if node.op_type not in FILL_ARITHMETIC:
        return None
    xv, yv = ctx.value(x), ctx.value(y)
    if xv is not None and yv is not None and _uniform(xv) and _uniform(yv) and max(xv.size, yv.size) > 1:
        scalar = np.asarray(FILL_ARITHMETIC[node.op_type](xv.reshape(-1)[0], yv.reshape(-1)[0]))
        return ctx.const(np.broadcast_to(scalar, np.broadcast_shapes(xv.shape, yv.shape)), name=node.output[0])
    pairs = [(x, yv)] + ([(y, xv)] if node.op_type == "Add" else [])
    for kept, fill in pairs:
        shape = static_shape(kept)
        if fill is None or shape is None or not _uniform(fill) or fill.reshape(-1)[0]:
            continue
        if np.broadcast_shapes(shape, fill.shape) == shape:  # the zeros change no value and no shape
            return kept
    return None


@converter(*BINARY)
def binary(ctx: Context, node: onnx.NodeProto) -> None:
    op = getattr(mil(), BINARY[node.op_type])
    x, y = ctx.get(node.input[0]), ctx.get(node.input[1])
    result = _on_fills(ctx, node, x, y)
    ctx.set(node.output[0], op(x=x, y=y, name=node.output[0]) if result is None else result)


@converter("Div")
def div(ctx: Context, node: onnx.NodeProto) -> None:
    x, y = ctx.get(node.input[0]), ctx.get(node.input[1])
    op = mil().floor_div if _is_int(x) else mil().real_div
    ctx.set(node.output[0], op(x=x, y=y, name=node.output[0]))


@converter("Mod", since=10)
def mod(ctx: Context, node: onnx.NodeProto) -> None:
    """fmod=0: the sign of the divisor (Python's %, ``x - floor(x / y) * y``); fmod=1: the sign
    of the dividend (C's fmod): a nonzero floored remainder of operands of opposite signs
    moves by one divisor. Both for integers and floats (ONNX allows floats with fmod=1 only;
    fmod=0 on floats follows numpy's ``mod``)."""
    x, y = ctx.get(node.input[0]), ctx.get(node.input[1])
    floored = mil().sub(x=x, y=mil().mul(x=mil().floor_div(x=x, y=y), y=y))
    if not int(attrs(node).get("fmod", 0)):
        ctx.set(node.output[0], mil().identity(x=floored, name=node.output[0]))
        return
    zero = ctx.const(np.array(0, np.int32 if _is_int(x) else np.float32))
    opposite = mil().logical_xor(x=mil().less(x=x, y=zero), y=mil().less(x=y, y=zero))
    moves = mil().logical_and(x=opposite, y=mil().not_equal(x=floored, y=zero))
    ctx.set(node.output[0], mil().select(cond=moves, a=mil().sub(x=floored, y=y), b=floored, name=node.output[0]))


@converter(*VARIADIC)
def variadic(ctx: Context, node: onnx.NodeProto) -> None:
    op = getattr(mil(), VARIADIC[node.op_type])
    result = ctx.get(node.input[0])
    for name in node.input[1:]:
        result = op(x=result, y=ctx.get(name))
    ctx.set(node.output[0], mil().identity(x=result, name=node.output[0]))


@converter("Where")
def where(ctx: Context, node: onnx.NodeProto) -> None:
    from coremltools.converters.mil.mil import types

    cond, a, b = (ctx.get(n) for n in node.input)
    if len(cond.shape) > max(len(a.shape), len(b.shape)) and a.dtype != types.bool:
        # MIL's select takes its output shape from a and b only: broadcast a to cond's shape
        dtype = "int32" if types.is_int(a.dtype) else types.builtin_to_string(a.dtype)
        zeros = mil().mul(x=mil().cast(x=cond, dtype=dtype), y=ctx.const(np.zeros((), np.int32 if dtype == "int32"
                          else np.float16 if dtype == "fp16" else np.float32)))  # fmt: skip
        a = mil().add(x=a, y=zeros)
    ctx.set(node.output[0], mil().select(cond=cond, a=a, b=b, name=node.output[0]))


@converter("Clip", since=11)
def clip(ctx: Context, node: onnx.NodeProto) -> None:
    x = ctx.get(node.input[0])
    low, high = ctx.optional(node, 1), ctx.optional(node, 2)
    result = x if low is None else mil().maximum(x=x, y=low)
    result = result if high is None else mil().minimum(x=result, y=high)
    ctx.set(node.output[0], mil().identity(x=result, name=node.output[0]))


def _check_cast(node: onnx.NodeProto, opset: int) -> str | None:
    target = int(attrs(node).get("to", 0))
    if target not in CAST_TARGETS:
        return f"Core ML has no {onnx.TensorProto.DataType.Name(target).lower()} tensors"
    return None


@converter("Cast", check=_check_cast)
def cast(ctx: Context, node: onnx.NodeProto) -> None:
    x = ctx.get(node.input[0])
    target = CAST_TARGETS.get(int(attrs(node)["to"]))
    if target is None:
        raise fail(node, ctx.opset, _check_cast(node, ctx.opset) or "unsupported cast")
    ctx.set(node.output[0], mil().cast(x=x, dtype=target, name=node.output[0]))


@converter("Gelu", since=20)
def gelu(ctx: Context, node: onnx.NodeProto) -> None:
    mode = "TANH_APPROXIMATION" if attrs(node).get("approximate", "none") == "tanh" else "EXACT"
    ctx.set(node.output[0], mil().gelu(x=ctx.get(node.input[0]), mode=mode, name=node.output[0]))
