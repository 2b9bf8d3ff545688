"""converters/norm.py: Instance, Group, Layer and inference Batch normalization on ggml_norm."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import sdkit

Check = Callable[..., Any]
ATOL = 2e-5  # mean and variance summed in another order than onnx.reference


def test_instance_norm(like_reference: Check, f32: Check) -> None:
    like_reference(
        "InstanceNormalization", [("x", f32(2, 3, 4, 5)), ("s", f32(3), "const"), ("b", f32(3), "const")], atol=ATOL
    )


@pytest.mark.parametrize(("opset", "per_group"), [(21, False), (18, True)])
def test_group_norm(opset: int, per_group: bool, like_reference: Check, f32: Check) -> None:
    # opset 18 scales per group, opset 21 per channel
    n = 2 if per_group else 4
    operands = [("x", f32(2, 4, 3, 3)), ("s", f32(n), "const"), ("b", f32(n), "const")]
    like_reference("GroupNormalization", operands, {"num_groups": 2}, atol=ATOL, opset=opset)


@pytest.mark.parametrize("axis", [-1, 1])
def test_layer_norm_with_statistics(axis: int, like_reference: Check, f32: Check) -> None:
    scale_shape = (4,) if axis == -1 else (3, 4)
    operands = [("x", f32(2, 3, 4)), ("s", f32(*scale_shape), "const"), ("b", f32(*scale_shape), "const")]
    like_reference("LayerNormalization", operands, {"axis": axis}, atol=ATOL, outputs=3)


def test_batch_norm(like_reference: Check, f32: Check, rng: np.random.Generator) -> None:
    var = rng.uniform(0.5, 2.0, 3).astype(np.float32)
    operands = [
        ("x", f32(2, 3, 4)),
        ("s", f32(3), "const"),
        ("b", f32(3), "const"),
        ("m", f32(3), "const"),
        ("v", var, "const"),
    ]
    like_reference("BatchNormalization", operands, atol=ATOL)


def test_batch_norm_refusals(refuses: Check, f32: Check) -> None:
    stats = [
        ("s", f32(3), "const"),
        ("b", f32(3), "const"),
        ("m", f32(3), "const"),
        ("v", np.ones(3, np.float32), "const"),
    ]
    refuses("BatchNormalization", [("x", f32(2, 3, 4)), *stats], {"training_mode": 1}, match="training mode", outputs=3)


def test_group_norm_channels_must_split(refuses: Check, f32: Check) -> None:
    operands = [("x", f32(1, 3, 2, 2)), ("s", f32(3), "const"), ("b", f32(3), "const")]
    refuses("GroupNormalization", operands, {"num_groups": 2}, match="do not split", opset=21, strict=False)


@pytest.mark.parametrize(
    ("shape", "attrs"),
    [
        ((2, 7, 5, 4), {"size": 5, "alpha": 1e-2, "beta": 0.75, "bias": 1.0}),  # AlexNet style
        ((1, 3, 4, 2), {"size": 7}),  # window wider than the channels, default attributes
    ],
)
def test_lrn(shape: tuple[int, ...], attrs: dict[str, float], like_reference: Check, f32: Check) -> None:
    like_reference("LRN", [("x", f32(*shape))], attrs, atol=2e-5, oracle="onnxruntime")


def test_lrn_even_window(one_node_graph: Check, f32: Check) -> None:
    """An even window reaches one channel further after than before. onnxruntime refuses even
    sizes and onnx.reference loops over the batch instead of the channels, so the oracle is the
    ONNX spec's formula in numpy."""
    x = f32(1, 6, 3, 3)
    attrs = {"size": 2, "alpha": 0.5, "beta": 0.5, "bias": 2.0}
    got = sdkit.compile(one_node_graph("LRN", [("x", x)], attrs), backend="ggml").run({"x": x})["out0"]
    square_sum = np.stack([np.sum(x[:, c : c + 2] ** 2, axis=1) for c in range(6)], axis=1)
    np.testing.assert_allclose(got, x / (2.0 + 0.25 * square_sum) ** 0.5, rtol=1e-5, atol=1e-6)


def test_lrn_needs_a_channel_axis(refuses: Check, f32: Check) -> None:
    refuses("LRN", [("x", f32(4, 5))], {"size": 3}, match="LRN of size 3 on a rank-2 input", strict=False)
