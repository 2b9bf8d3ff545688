"""converters/matmul.py: MatMul (vectors, batches, broadcasting), Gemm, and Einsum forms that
are a transpose or a matrix product."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

Check = Callable[..., Any]
ATOL = 1e-5  # float32 dot products summed in another order


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ((3, 4), (4, 5)),
        ((4,), (4, 5)),
        ((3, 4), (4,)),
        ((2, 3, 4), (4, 5)),
        ((2, 1, 3, 4), (5, 4, 2)),
        ((5, 2, 3, 4), (5, 2, 4, 3)),
    ],
)
def test_matmul(a: tuple[int, ...], b: tuple[int, ...], like_reference: Check, f32: Check) -> None:
    like_reference("MatMul", [("a", f32(*a)), ("b", f32(*b))], atol=ATOL)
    like_reference("MatMul", [("a", f32(*a)), ("w", f32(*b), "const")], atol=ATOL)  # transposed at compile time


@pytest.mark.parametrize("attributes", [{}, {"transA": 1}, {"transB": 1}, {"alpha": 0.5, "beta": 2.0}, {"beta": 0.0}])
def test_gemm(attributes: dict[str, Any], like_reference: Check, f32: Check) -> None:
    a = f32(4, 3) if attributes.get("transA") else f32(3, 4)
    b = f32(5, 4) if attributes.get("transB") else f32(4, 5)
    like_reference("Gemm", [("a", a), ("b", b, "const"), ("c", f32(5), "const")], attributes, atol=ATOL)


@pytest.mark.parametrize(
    ("equation", "shapes"),
    [
        ("ij->ji", [(3, 4)]),
        ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
        ("bhqd,bhkd->bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)]),
        ("ik,jk->ij", [(3, 4), (5, 4)]),
    ],
)
def test_einsum(equation: str, shapes: list[tuple[int, ...]], like_reference: Check, f32: Check) -> None:
    operands = [(f"x{i}", f32(*s)) for i, s in enumerate(shapes)]
    like_reference("Einsum", operands, {"equation": equation}, atol=ATOL)


def test_einsum_refusals(refuses: Check, f32: Check) -> None:
    refuses("Einsum", [("x", f32(2, 3))], {"equation": "...i->...i"}, match="without ellipsis")
    refuses("Einsum", [("x", f32(3, 3))], {"equation": "ii->i"}, match="repeated indices")
    refuses("Einsum", [("x", f32(3, 4))], {"equation": "ij->i"}, match="single-operand reductions")
