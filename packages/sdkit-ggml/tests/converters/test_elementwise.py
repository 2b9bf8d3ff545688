"""converters/elementwise.py: arithmetic with two-way broadcasting, activations, Clip, Pow,
Erf, Gelu, Min/Max/Sum/Mean, against onnx.reference."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from sdkit_ggml.converters.elementwise import UNARY

Check = Callable[..., Any]


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
def test_binary_broadcasts_both_ways(op: str, like_reference: Check, f32: Check) -> None:
    # exact: one float32 op per element, as onnx.reference computes it
    like_reference(op, [("a", f32(3, 1, 5)), ("b", f32(4, 1))], atol=0.0)


def test_binary_with_a_constant_operand(like_reference: Check, f32: Check) -> None:
    like_reference("Sub", [("c", f32(2, 3), "const"), ("x", f32(2, 3))], atol=0.0)


@pytest.mark.parametrize(("op", "value"), [("Add", 0.0), ("Mul", 1.0), ("Add", 2.5), ("Div", 4.0)])
def test_uniform_constant_operand_is_not_materialised(op: str, value: float, like_reference: Check, f32: Check) -> None:
    # torch's baddbmm exports add a constant tensor of one repeated value
    like_reference(op, [("x", f32(2, 3, 4)), ("c", np.full((2, 3, 4), value, np.float32), "const")], atol=0.0)


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary(op: str, like_reference: Check, rng: np.random.Generator) -> None:
    x = rng.uniform(0.1, 3.0, (2, 3, 4)).astype(np.float32)  # in every op's domain (Log, Sqrt)
    if op not in ("Log", "Sqrt"):
        x = x * np.where(rng.random(x.shape) < 0.5, -1, 1).astype(np.float32)
    # ggml's transcendental kernels round differently from numpy: a few ulps
    like_reference(op, [("x", x)], atol=2e-6 * max(1.0, float(np.exp(np.abs(x)).max())) if op == "Exp" else 2e-6)


@pytest.mark.parametrize(
    ("op", "attributes"),
    [
        ("LeakyRelu", {"alpha": 0.2}),
        ("Elu", {}),
        ("Elu", {"alpha": 0.5}),
        ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}),
        ("Reciprocal", {}),
        ("Erf", {}),
        ("Gelu", {}),
        ("Gelu", {"approximate": "tanh"}),
    ],
)
def test_activations(op: str, attributes: dict[str, Any], like_reference: Check, f32: Check) -> None:
    # Erf/Gelu use A&S 7.1.26 (|erf error| <= 1.5e-7) composed from ggml ops
    opset = 20 if op == "Gelu" else 17
    like_reference(op, [("x", f32(3, 7))], attributes, atol=1e-6, opset=opset)


def test_prelu_with_per_channel_slope(like_reference: Check, f32: Check) -> None:
    like_reference("PRelu", [("x", f32(2, 3, 4)), ("slope", f32(3, 1), "const")], atol=0.0)


@pytest.mark.parametrize("bounds", [(-0.5, 0.5), (None, 0.2), (0.3, None), (1.0, -1.0)])
def test_clip(bounds: tuple[float | None, float | None], like_reference: Check, f32: Check) -> None:
    low, high = bounds
    operands: list[Any] = [("x", f32(4, 5))]
    operands.append(("min", np.array(low, np.float32), "const") if low is not None else None)
    if high is not None:
        operands.append(("max", np.array(high, np.float32), "const"))
    like_reference("Clip", operands, atol=0.0)


def test_clip_before_opset_11_takes_attributes(like_reference: Check, f32: Check) -> None:
    like_reference("Clip", [("x", f32(4, 5))], {"min": -0.1, "max": 0.3}, atol=0.0, opset=6)


@pytest.mark.parametrize("exponent", [2.0, 3.0, -2.0, 0.5, 0.0])
def test_pow_with_a_constant_scalar_exponent(exponent: float, like_reference: Check, rng: np.random.Generator) -> None:
    x = rng.uniform(0.5, 2.0, (3, 4)).astype(np.float32)
    like_reference("Pow", [("x", x), ("e", np.array(exponent, np.float32), "const")], atol=2e-6)


def test_pow_refusals(refuses: Check, f32: Check) -> None:
    x = np.abs(f32(3, 4)) + 0.5
    refuses("Pow", [("x", x), ("e", np.array(2.5, np.float32), "const")], match="ggml has no pow kernel")
    # a non-scalar exponent is refused from its shape alone: check() sees it too
    refuses("Pow", [("x", x), ("e", f32(3, 4))], match="non-scalar exponent")


@pytest.mark.parametrize("op", ["Max", "Min", "Sum", "Mean"])
def test_variadic(op: str, like_reference: Check, f32: Check) -> None:
    like_reference(op, [("a", f32(2, 3)), ("b", f32(1, 3)), ("c", f32(2, 1))], atol=1e-6)


def test_identity_and_inference_dropout(like_reference: Check, f32: Check) -> None:
    like_reference("Identity", [("x", f32(2, 3))], atol=0.0)
    got = like_reference("Dropout", [("x", f32(2, 3))], atol=0.0, outputs=2)
    assert got["out1"].dtype == np.bool_ and got["out1"].all()


def test_training_dropout_is_refused(refuses: Check, f32: Check) -> None:
    training = ("t", np.array(True), "const")
    refuses("Dropout", [("x", f32(2, 3)), ("r", np.array(0.5, np.float32), "const"), training], match="training")


_SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.5, -2.0, 3.4e38, -3.4e38], np.float32)


def _same_or_both_nan(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    return (got == want) | (np.isnan(got) & np.isnan(want))


@pytest.mark.parametrize(
    ("op", "extra"),
    [
        ("Max", "pairs"),
        ("Min", "pairs"),
        ("Relu", None),
        ("Clip", (-1.0, 1.0)),
    ],
)
def test_nan_and_infinities_pass_through_as_onnx_says(op: str, extra: Any, one_node_graph: Check) -> None:
    """Issue 15 finding 6: Max/Min with +-inf gave NaN (the ``x*(1-m)+y*m`` select) and Relu/Clip
    turned NaN into numbers; onnx.reference keeps both exactly."""
    from onnx.reference import ReferenceEvaluator

    import sdkit

    a, b = np.repeat(_SPECIAL, _SPECIAL.size), np.tile(_SPECIAL, _SPECIAL.size)
    operands: list[Any] = [("a", a)]
    if extra == "pairs":
        operands.append(("b", b))
    elif extra is not None:
        operands += [("lo", np.array(extra[0], np.float32), "const"), ("hi", np.array(extra[1], np.float32), "const")]
    model = one_node_graph(op, operands)
    feeds = {o[0]: o[1] for o in operands if len(o) == 2}
    got = sdkit.compile(model, backend="ggml").run(feeds)["out0"]
    want = ReferenceEvaluator(model.graph.to_onnx(model.weights)).run(None, feeds)[0]
    wrong = ~_same_or_both_nan(got, want)
    assert not wrong.any(), list(zip(a[wrong], b[wrong], got[wrong], want[wrong], strict=True))[:5]
