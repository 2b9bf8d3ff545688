"""A tensor factory that creates no ggml tensors: ``check()`` runs the converters over it, so
shapes, dtypes and every precondition are decided by the code that compiles, without the
ggml library and without weights."""

from __future__ import annotations

from typing import Any

from sdkit_ggml.runtime import lib as L
from sdkit_ggml.runtime.context import result_type

Ne = tuple[int, int, int, int]


class ShapeOnlyContext:
    """Hands out distinct fake tensor handles and tracks each one's ggml type."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._types: dict[int, int] = {}
        self._next = 0

    def _new(self, ggml_type: int) -> int:
        self._next += 1
        self._types[self._next] = ggml_type
        return self._next

    def call(self, fn: str, *args: Any) -> tuple[int, Ne | None, int]:
        first = self._types.get(int(args[0]), L.GGML_TYPE_F32) if args else L.GGML_TYPE_F32
        ggml_type = result_type(fn, first, args)
        return self._new(ggml_type), None, ggml_type

    def new_tensor(self, ggml_type: int, ne: Ne, *, weight: bool) -> int:
        return self._new(ggml_type)

    def set_prec_f32(self, ptr: int) -> None:
        pass

    def set_mul_mat_prec_f32(self, ptr: int) -> None:
        pass

    def free(self) -> None:
        self._types.clear()
