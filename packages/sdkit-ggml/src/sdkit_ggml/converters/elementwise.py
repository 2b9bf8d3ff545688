"""Elementwise ops: arithmetic with ONNX broadcasting, activations, Clip, Pow, Erf, Gelu,
Min/Max/Sum/Mean. (Casts are in ``cast.py``; integer arithmetic in ``integer.py``.)"""

from __future__ import annotations

import numpy as np

from sdkit_ggml.compiler import ops
from sdkit_ggml.compiler.builder import Builder
from sdkit_ggml.compiler.context import Node, Tensor, Unsupported, Value
from sdkit_ggml.compiler.fold import is_uniform
from sdkit_ggml.converters.integer import integer_binary, is_integer
from sdkit_ggml.converters.nan_safe import exact_max, exact_min, keep_nan, relu
from sdkit_ggml.converters.table import converter

BINARY = {"Add": "ggml_add", "Sub": "ggml_sub", "Mul": "ggml_mul", "Div": "ggml_div"}
UNARY = {
    "Relu": "ggml_relu",
    "Tanh": "ggml_tanh",
    "Sigmoid": "ggml_sigmoid",
    "Exp": "ggml_exp",
    "Log": "ggml_log",
    "Sqrt": "ggml_sqrt",
    "Neg": "ggml_neg",
    "Abs": "ggml_abs",
    "Floor": "ggml_floor",
    "Ceil": "ggml_ceil",
    "Sin": "ggml_sin",
    "Cos": "ggml_cos",
    "Softplus": "ggml_softplus",
    "Sign": "ggml_sgn",
}
# Abramowitz & Stegun 7.1.26: |erf error| <= 1.5e-7.
_ERF_P = 0.3275911
_ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
# x op c == x exactly for these (op, c); the constant side may be on the left for + and *.
_NEUTRAL = {("Add", 0.0, 1), ("Add", 0.0, 0), ("Sub", 0.0, 1), ("Mul", 1.0, 1), ("Mul", 1.0, 0), ("Div", 1.0, 1)}


def _with_uniform_constant(b: Builder, node: Node) -> Tensor | None:
    """A constant operand holding one repeated value (torch's baddbmm exports add a zeros
    tensor as large as the attention scores) is not materialised: a neutral one is dropped,
    another is uploaded as a single broadcast element. Only for constants refit cannot change."""
    for index in (0, 1):
        other = node.value(1 - index)
        array = b.fixed_value(node, index)
        if array is None or not isinstance(other, Tensor) or array.size == 0:
            continue
        first = array.flat[0]  # a broadcast constant (fold.is_uniform) is never copied or scanned
        if array.dtype.kind != "f" or not (is_uniform(array) or bool((array == first).all())):
            continue
        out_shape = ops.broadcast_shape(other.shape, array.shape)
        if (node.op, float(first), index) in _NEUTRAL and not np.signbit(first):
            return ops.expand(b, other, out_shape)
        single = b.constant(np.full((1,) * max(array.ndim, 1), first, dtype=np.float32), dtype=other.dtype)
        pair = (single, other) if index == 0 else (other, single)
        result = ops.binary(b, BINARY[node.op], *pair)
        return result if result.shape == out_shape else ops.expand(b, result, out_shape)
    return None


@converter(list(BINARY), since_version=7)
def convert_binary(b: Builder, node: Node) -> list[Value]:
    if is_integer(node.value(0)) or is_integer(node.value(1)):
        return [integer_binary(b, node)]
    simplified = _with_uniform_constant(b, node)
    if simplified is not None:
        return [simplified]
    return [ops.binary(b, BINARY[node.op], b.tensor(node, 0), b.tensor(node, 1))]


@converter(list(UNARY), since_version=6)
def convert_unary(b: Builder, node: Node) -> list[Value]:
    x = b.tensor(node, 0)
    if node.op == "Relu":  # ggml_relu is x > 0 ? x : 0, which turns NaN into 0
        return [relu(b, x)]
    return [ops.unary(b, UNARY[node.op], x)]


def _training(b: Builder, node: Node) -> bool:
    return node.has(2) and bool(np.asarray(b.const(node, 2, "training_mode")))


@converter(["Identity", "Dropout"], since_version=1)
def convert_identity(b: Builder, node: Node) -> list[Value]:
    x = node.value(0)
    if node.op == "Dropout" and _training(b, node):
        raise Unsupported("Dropout in training mode (random) is not supported")
    results: list[Value] = [x]
    if node.op == "Dropout" and len(node.proto.output) > 1:
        results.append(np.ones(x.shape, dtype=np.bool_))
    return results


@converter("LeakyRelu", since_version=6)
def convert_leaky(b: Builder, node: Node) -> list[Value]:
    return [ops.unary(b, "ggml_leaky_relu", b.tensor(node, 0), float(node.attr("alpha", 0.01)), False)]


@converter("Elu", since_version=6)
def convert_elu(b: Builder, node: Node) -> list[Value]:
    alpha = float(node.attr("alpha", 1.0))
    x = b.tensor(node, 0)
    if alpha == 1.0:
        return [ops.unary(b, "ggml_elu", x)]
    # elu(x) = relu(x) + alpha * (exp(min(x, 0)) - 1)
    neg = ops.clamp(b, x, float("-inf"), 0.0)
    tail = ops.scale(b, ops.unary(b, "ggml_exp", neg), alpha, -alpha)
    return [ops.binary(b, "ggml_add", ops.unary(b, "ggml_relu", x), tail)]


@converter("HardSigmoid", since_version=6)
def convert_hardsigmoid(b: Builder, node: Node) -> list[Value]:
    alpha, beta = float(node.attr("alpha", 0.2)), float(node.attr("beta", 0.5))
    return [ops.clamp(b, ops.scale(b, b.tensor(node, 0), alpha, beta), 0.0, 1.0)]


@converter("PRelu", since_version=7)
def convert_prelu(b: Builder, node: Node) -> list[Value]:
    x, slope = b.tensor(node, 0), b.tensor(node, 1)
    positive = ops.unary(b, "ggml_relu", x)
    negative = ops.unary(b, "ggml_neg", ops.unary(b, "ggml_relu", ops.unary(b, "ggml_neg", x)))
    return [ops.binary(b, "ggml_add", positive, ops.binary(b, "ggml_mul", negative, slope))]


def _reciprocal(b: Builder, x: Tensor) -> Tensor:
    return ops.binary(b, "ggml_div", b.constant(np.ones((1,) * max(x.rank, 1), np.float32)), x)


@converter("Reciprocal", since_version=6)
def convert_reciprocal(b: Builder, node: Node) -> list[Value]:
    return [_reciprocal(b, b.tensor(node, 0))]


@converter("Clip", since_version=6)
def convert_clip(b: Builder, node: Node) -> list[Value]:
    x = b.tensor(node, 0)
    if node.opset < 11:
        low, high = float(node.attr("min", -np.inf)), float(node.attr("max", np.inf))
    else:
        low = float(np.asarray(b.const(node, 1, "min")).reshape(-1)[0]) if node.has(1) else -np.inf
        high = float(np.asarray(b.const(node, 2, "max")).reshape(-1)[0]) if node.has(2) else np.inf
    low = min(low, high)  # ONNX: min > max sets everything to max
    return [keep_nan(b, ops.clamp(b, x, low, high), x)]  # ggml_clamp turns NaN into max


def _exponent_size(node: Node) -> int:
    value = node.value(1)
    return value.size if isinstance(value, Tensor) else int(np.asarray(value).size)


@converter("Pow", since_version=7)
def convert_pow(b: Builder, node: Node) -> list[Value]:
    x = b.tensor(node, 0)
    if _exponent_size(node) != 1:  # known from the shape alone, before the value is needed
        raise Unsupported("Pow with a non-scalar exponent: ggml has no pow kernel")
    exponent = np.asarray(b.const(node, 1, "exponent (ggml has no pow kernel)"))
    e = float(exponent.reshape(()))
    out_shape = ops.broadcast_shape(x.shape, exponent.shape)
    if e == 0.5:
        result = ops.unary(b, "ggml_sqrt", x)
    elif e == int(e) and 0 < abs(e) <= 8:
        result = x
        for _ in range(int(abs(e)) - 1):
            result = ops.binary(b, "ggml_mul", result, x)
        if e < 0:
            result = _reciprocal(b, result)
    elif e == 0:
        result = ops.scale(b, x, 0.0, 1.0)
    else:
        raise Unsupported(f"Pow with exponent {e}: ggml has no pow kernel (integers up to 8 and 0.5 are lowered)")
    return [ops.reshape(b, result, out_shape) if result.shape != out_shape else result]


def erf(b: Builder, x: Tensor) -> Tensor:
    """erf composed from ggml ops (Abramowitz & Stegun 7.1.26, |error| <= 1.5e-7)."""
    sign = ops.unary(b, "ggml_sgn", x)
    ax = ops.unary(b, "ggml_abs", x)
    t = ops.unary(b, "ggml_exp", ops.unary(b, "ggml_neg", ops.unary(b, "ggml_log", ops.scale(b, ax, _ERF_P, 1.0))))
    poly = ops.scale(b, t, _ERF_A[4], _ERF_A[3])
    for coeff in (_ERF_A[2], _ERF_A[1], _ERF_A[0]):
        poly = ops.scale(b, ops.binary(b, "ggml_mul", poly, t), 1.0, coeff)
    poly = ops.binary(b, "ggml_mul", poly, t)
    gauss = ops.unary(b, "ggml_exp", ops.unary(b, "ggml_neg", ops.unary(b, "ggml_sqr", ax)))
    magnitude = ops.scale(b, ops.binary(b, "ggml_mul", poly, gauss), -1.0, 1.0)
    return ops.binary(b, "ggml_mul", magnitude, sign)


@converter("Erf", since_version=9)
def convert_erf(b: Builder, node: Node) -> list[Value]:
    return [erf(b, b.tensor(node, 0))]


@converter("Gelu", since_version=20)
def convert_gelu(b: Builder, node: Node) -> list[Value]:
    x = b.tensor(node, 0)
    half_x = ops.scale(b, x, 0.5)
    if node.attr("approximate", "none") == "tanh":
        # 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))
        cube = ops.binary(b, "ggml_mul", ops.unary(b, "ggml_sqr", x), x)
        inner = ops.scale(b, ops.binary(b, "ggml_add", x, ops.scale(b, cube, 0.044715)), float(np.sqrt(2 / np.pi)))
        return [ops.binary(b, "ggml_mul", half_x, ops.scale(b, ops.unary(b, "ggml_tanh", inner), 1.0, 1.0))]
    # 0.5 * x * (1 + erf(x / sqrt(2))), with the accurate erf above
    e = erf(b, ops.scale(b, x, float(1 / np.sqrt(2))))
    return [ops.binary(b, "ggml_mul", half_x, ops.scale(b, e, 1.0, 1.0))]


@converter(["Max", "Min"], since_version=8)
def convert_minmax(b: Builder, node: Node) -> list[Value]:
    tensors = [b.tensor(node, i) for i in range(len(node.inputs))]
    result = tensors[0]
    for other in tensors[1:]:
        result = exact_max(b, result, other) if node.op == "Max" else exact_min(b, result, other)
    return [result]


def _sum(b: Builder, node: Node) -> Tensor:
    result = b.tensor(node, 0)
    for i in range(1, len(node.inputs)):
        result = ops.binary(b, "ggml_add", result, b.tensor(node, i))
    return result


@converter("Sum", since_version=8)
def convert_sum(b: Builder, node: Node) -> list[Value]:
    return [_sum(b, node)]


@converter("Mean", since_version=8)
def convert_mean(b: Builder, node: Node) -> list[Value]:
    count = b.constant(np.full((1,), len(node.inputs), np.float32))
    return [ops.binary(b, "ggml_div", _sum(b, node), count)]
