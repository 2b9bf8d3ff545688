"""Elementwise ops: arithmetic with ONNX broadcasting, activations, Clip, Pow, Erf, Cast."""

from __future__ import annotations

import numpy as np

from sdkit_ggml.compiler import ops
from sdkit_ggml.compiler.context import BOOL, Builder, Node, Tensor, Unsupported, Value
from sdkit_ggml.compiler.registry import ConverterRegistry
from sdkit_ggml.compiler.static_checks import SUPPORTED_DTYPES, check_cast
from sdkit_ggml.converters.integer import integer_binary, is_integer
from sdkit_ggml.runtime import lib as L

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


def _binary_values(b: Builder, node: Node, fn: str) -> Tensor:
    x, y = b.tensor(node, 0), b.tensor(node, 1)
    return ops.binary(b, fn, x, y)


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
        first = array.reshape(-1)[0]
        if not bool((array == first).all()) or array.dtype.kind != "f":
            continue
        out_shape = ops.broadcast_shape(other.shape, array.shape)
        if (node.op, float(first), index) in _NEUTRAL and not np.signbit(first):
            return ops.expand(b, other, out_shape)
        single = b.constant(np.full((1,) * max(array.ndim, 1), first, dtype=np.float32), dtype=other.dtype)
        pair = (single, other) if index == 0 else (other, single)
        result = ops.binary(b, BINARY[node.op], *pair)
        return result if result.shape == out_shape else ops.expand(b, result, out_shape)
    return None


def register(registry: ConverterRegistry) -> None:
    @registry.register(list(BINARY), since_version=7)
    def convert_binary(b: Builder, node: Node) -> list[Value]:
        if is_integer(node.value(0)) or is_integer(node.value(1)):
            return [integer_binary(b, node)]
        simplified = _with_uniform_constant(b, node)
        if simplified is not None:
            return [simplified]
        return [_binary_values(b, node, BINARY[node.op])]

    @registry.register(list(UNARY), since_version=6)
    def convert_unary(b: Builder, node: Node) -> list[Value]:
        return [ops.unary(b, UNARY[node.op], b.tensor(node, 0))]

    @registry.register(["Identity", "Dropout"], since_version=1)
    def convert_identity(b: Builder, node: Node) -> list[Value]:
        x = node.value(0)
        results: list[Value] = [x]
        if node.op == "Dropout" and len(node.proto.output) > 1:
            training = node.has(2) and bool(np.asarray(b.const(node, 2, "training_mode")))
            if training:
                raise Unsupported("Dropout in training mode (random) is not supported")
            results.append(np.ones(x.shape, dtype=np.bool_))
        elif node.op == "Dropout" and node.has(2) and bool(np.asarray(b.const(node, 2, "training_mode"))):
            raise Unsupported("Dropout in training mode (random) is not supported")
        return results

    @registry.register("LeakyRelu", since_version=6)
    def convert_leaky(b: Builder, node: Node) -> list[Value]:
        return [ops.unary(b, "ggml_leaky_relu", b.tensor(node, 0), float(node.attr("alpha", 0.01)), False)]

    @registry.register("Elu", since_version=6)
    def convert_elu(b: Builder, node: Node) -> list[Value]:
        alpha = float(node.attr("alpha", 1.0))
        x = b.tensor(node, 0)
        if alpha == 1.0:
            return [ops.unary(b, "ggml_elu", x)]
        # elu(x) = relu(x) + alpha * (exp(min(x, 0)) - 1)
        neg = ops.unary(b, "ggml_clamp", x, float("-inf"), 0.0)
        tail = ops.scale(b, ops.unary(b, "ggml_exp", neg), alpha, -alpha)
        return [ops.binary(b, "ggml_add", ops.unary(b, "ggml_relu", x), tail)]

    @registry.register("HardSigmoid", since_version=6)
    def convert_hardsigmoid(b: Builder, node: Node) -> list[Value]:
        alpha, beta = float(node.attr("alpha", 0.2)), float(node.attr("beta", 0.5))
        return [ops.unary(b, "ggml_clamp", ops.scale(b, b.tensor(node, 0), alpha, beta), 0.0, 1.0)]

    @registry.register("PRelu", since_version=7)
    def convert_prelu(b: Builder, node: Node) -> list[Value]:
        x, slope = b.tensor(node, 0), b.tensor(node, 1)
        positive = ops.unary(b, "ggml_relu", x)
        negative = ops.unary(b, "ggml_neg", ops.unary(b, "ggml_relu", ops.unary(b, "ggml_neg", x)))
        return [ops.binary(b, "ggml_add", positive, ops.binary(b, "ggml_mul", negative, slope))]

    @registry.register("Reciprocal", since_version=6)
    def convert_reciprocal(b: Builder, node: Node) -> list[Value]:
        x = b.tensor(node, 0)
        return [ops.binary(b, "ggml_div", b.constant(np.ones((1,) * max(x.rank, 1), np.float32)), x)]

    @registry.register("Clip", since_version=6)
    def convert_clip(b: Builder, node: Node) -> list[Value]:
        x = b.tensor(node, 0)
        if node.opset < 11:
            low, high = float(node.attr("min", -np.inf)), float(node.attr("max", np.inf))
        else:
            low = float(np.asarray(b.const(node, 1, "min")).reshape(-1)[0]) if node.has(1) else -np.inf
            high = float(np.asarray(b.const(node, 2, "max")).reshape(-1)[0]) if node.has(2) else np.inf
        low = min(low, high)  # ONNX: min > max sets everything to max
        return [ops.unary(b, "ggml_clamp", x, low, high)]

    @registry.register("Pow", since_version=7)
    def convert_pow(b: Builder, node: Node) -> list[Value]:
        x = b.tensor(node, 0)
        exponent = np.asarray(b.const(node, 1, "exponent (ggml has no pow kernel)"))
        if exponent.size != 1:
            raise Unsupported("Pow with a non-scalar exponent: ggml has no pow kernel")
        e = float(exponent.reshape(()))
        out_shape = ops.broadcast_shape(x.shape, exponent.shape)
        if e == 0.5:
            result = ops.unary(b, "ggml_sqrt", x)
        elif e == int(e) and 0 < abs(e) <= 8:
            result = x
            for _ in range(int(abs(e)) - 1):
                result = ops.binary(b, "ggml_mul", result, x)
            if e < 0:
                result = ops.binary(b, "ggml_div", b.constant(np.ones((1,) * max(x.rank, 1), np.float32)), result)
        elif e == 0:
            result = ops.scale(b, x, 0.0, 1.0)
        else:
            raise Unsupported(f"Pow with exponent {e}: ggml has no pow kernel (integers up to 8 and 0.5 are lowered)")
        return [ops.reshape(b, result, out_shape) if result.shape != out_shape else result]

    @registry.register("Erf", since_version=9)
    def convert_erf(b: Builder, node: Node) -> list[Value]:
        return [erf(b, b.tensor(node, 0))]

    @registry.register("Gelu", since_version=20)
    def convert_gelu(b: Builder, node: Node) -> list[Value]:
        x = b.tensor(node, 0)
        if node.attr("approximate", "none") == "tanh":
            inner = ops.scale(
                b,
                ops.binary(
                    b, "ggml_add", x, ops.scale(b, ops.binary(b, "ggml_mul", ops.unary(b, "ggml_sqr", x), x), 0.044715)
                ),
                float(np.sqrt(2 / np.pi)),
            )
            return [
                ops.binary(
                    b, "ggml_mul", ops.scale(b, x, 0.5), ops.scale(b, ops.unary(b, "ggml_tanh", inner), 1.0, 1.0)
                )
            ]
        # 0.5 * x * (1 + erf(x / sqrt(2))), with the accurate erf below
        e = erf(b, ops.scale(b, x, float(1 / np.sqrt(2))))
        return [ops.binary(b, "ggml_mul", ops.scale(b, x, 0.5), ops.scale(b, e, 1.0, 1.0))]

    @registry.register(["Max", "Min"], since_version=8)
    def convert_minmax(b: Builder, node: Node) -> list[Value]:
        tensors = [b.tensor(node, i) for i in range(len(node.inputs))]
        result = tensors[0]
        for other in tensors[1:]:
            result = select_max(b, result, other, node.op == "Max")
        return [result]

    @registry.register("Sum", since_version=8)
    def convert_sum(b: Builder, node: Node) -> list[Value]:
        result = b.tensor(node, 0)
        for i in range(1, len(node.inputs)):
            result = ops.binary(b, "ggml_add", result, b.tensor(node, i))
        return [result]

    @registry.register("Mean", since_version=8)
    def convert_mean(b: Builder, node: Node) -> list[Value]:
        result = b.tensor(node, 0)
        for i in range(1, len(node.inputs)):
            result = ops.binary(b, "ggml_add", result, b.tensor(node, i))
        return [ops.binary(b, "ggml_div", result, b.constant(np.full((1,), len(node.inputs), np.float32)))]

    @registry.register("Cast", since_version=6, check=check_cast)
    def convert_cast(b: Builder, node: Node) -> list[Value]:
        from onnx import helper

        x = b.tensor(node, 0)
        target = np.dtype(helper.tensor_dtype_to_np_dtype(int(node.attr("to"))))
        return [cast(b, x, target)]

    _register_castlike(registry)


def _register_castlike(registry: ConverterRegistry) -> None:
    @registry.register("CastLike", since_version=15)
    def convert_castlike(b: Builder, node: Node) -> list[Value]:
        like = node.value(1)
        return [cast(b, b.tensor(node, 0), np.dtype(like.dtype))]


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


def select_max(b: Builder, x: Tensor, y: Tensor, want_max: bool) -> Tensor:
    """max/min without rounding: m = step(y - x) picks y exactly where it is larger."""
    diff = ops.binary(b, "ggml_sub", y, x) if want_max else ops.binary(b, "ggml_sub", x, y)
    pick_y = ops.unary(b, "ggml_step", diff)
    keep_x = ops.scale(b, pick_y, -1.0, 1.0)
    return ops.binary(b, "ggml_add", ops.binary(b, "ggml_mul", x, keep_x), ops.binary(b, "ggml_mul", y, pick_y))


def cast(b: Builder, x: Tensor, target: np.dtype[np.generic]) -> Tensor:
    """Cast between the dtypes ggml stores: floats (F32), float16 (F32 rounded through F16),
    bools (F32 0/1) and integers (I32)."""
    if target == x.dtype:
        return x
    if target not in SUPPORTED_DTYPES:
        raise Unsupported(f"Cast to {target}: ggml has no such tensors")
    if target == BOOL:
        if x.ggml_type != L.GGML_TYPE_F32:
            x = ops.cast(b, x, L.GGML_TYPE_F32, np.dtype(np.float32))
        return ops.retype(ops.unary(b, "ggml_step", ops.unary(b, "ggml_abs", x)), BOOL)
    if target.kind in "iu":
        if x.ggml_type == L.GGML_TYPE_I32:
            info = np.iinfo(str(target))
            fits = x.bounds is not None and info.min <= x.bounds[0] and x.bounds[1] <= info.max
            if target.itemsize < 4 and not fits:
                # Storage is I32: a narrowing Cast would have to wrap values, which ggml cannot do.
                raise Unsupported(
                    f"Cast from {x.dtype} to {target}: values are not proven to fit, and ggml cannot wrap"
                )
            return ops.retype(x, target)
        if x.dtype != BOOL:
            raise Unsupported(
                f"Cast from {x.dtype} to {target}: ggml's float->int conversion rounding differs from ONNX"
            )
        return ops.cast(b, x, L.GGML_TYPE_I32, target)
    # target is a float type
    if x.ggml_type == L.GGML_TYPE_I32:
        x = ops.cast(b, x, L.GGML_TYPE_F32, np.dtype(np.float32))
    if target == np.float16:
        half = ops.cast(b, x, L.GGML_TYPE_F16, np.dtype(np.float16))
        return ops.cast(b, half, L.GGML_TYPE_F32, np.dtype(np.float16))
    return ops.retype(x, target)
