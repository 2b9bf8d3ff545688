"""converters/logic.py: comparisons, boolean logic and Where on bools stored as F32 0/1."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

Check = Callable[..., Any]


@pytest.mark.parametrize("op", ["Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Equal"])
def test_comparisons(op: str, like_reference: Check, rng: np.random.Generator) -> None:
    a = rng.integers(-2, 3, (3, 4)).astype(np.float32)  # ties exercise the OrEqual forms
    b = rng.integers(-2, 3, (1, 4)).astype(np.float32)
    like_reference(op, [("a", a), ("b", b)], atol=0.0)


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_boolean_logic(op: str, like_reference: Check, rng: np.random.Generator) -> None:
    like_reference(op, [("a", rng.random((3, 4)) < 0.5), ("b", rng.random((3, 4)) < 0.5)], atol=0.0)
    like_reference("Not", [("a", rng.random((3, 4)) < 0.5)], atol=0.0)


def test_where(like_reference: Check, f32: Check, rng: np.random.Generator) -> None:
    like_reference("Where", [("c", rng.random((3, 4)) < 0.5), ("x", f32(3, 4)), ("y", f32(1, 4))], atol=0.0)


def test_where_with_a_constant_minus_infinity_branch(
    like_reference: Check, f32: Check, rng: np.random.Generator
) -> None:
    # attention masks: -inf must not become NaN through -inf * 0
    minus_inf = ("m", np.full((3, 4), -np.inf, np.float32), "const")
    like_reference("Where", [("c", rng.random((3, 4)) < 0.5), ("x", f32(3, 4)), minus_inf], atol=0.0)


def test_integer_selection_beyond_f32s_exact_range_is_refused(refuses: Check) -> None:
    # integer comparisons and Where run in F32 where exact (converters/test_integer.py)
    a = np.array([1, 2, 3], np.int64)
    far = ("far", np.array(1 << 40, np.int64), "const")
    refuses("Where", [("c", np.array([True, False, True])), ("x", a), far], match=r"2\*\*24", by_check=False)
