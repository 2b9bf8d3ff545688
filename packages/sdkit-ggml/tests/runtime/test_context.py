"""runtime/context.py: the ggml type each op returns, as check()'s shape-only builder assumes
it, matches what ggml returns."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sdkit_ggml.runtime import lib as L
from sdkit_ggml.runtime.context import GgmlContext, result_type
from sdkit_ggml.runtime.lib import load_library


@pytest.fixture
def context() -> Iterator[GgmlContext]:
    context = GgmlContext(load_library(), capacity=64)
    yield context
    context.free()


def test_result_types_match_ggml(context: GgmlContext) -> None:
    f32 = context.new_tensor(L.GGML_TYPE_F32, (4, 3, 1, 1), weight=False)
    i32 = context.new_tensor(L.GGML_TYPE_I32, (3, 1, 1, 1), weight=False)
    f16 = context.new_tensor(L.GGML_TYPE_F16, (4, 3, 1, 1), weight=True)
    calls = [
        ("ggml_relu", f32),
        ("ggml_cast", f32, L.GGML_TYPE_I32),
        ("ggml_cast", i32, L.GGML_TYPE_F32),
        ("ggml_argmax", f32),
        ("ggml_get_rows", f32, i32),
        ("ggml_get_rows", f16, i32),
        ("ggml_reshape_4d", i32, 1, 3, 1, 1),
        ("ggml_cont", i32),
        ("ggml_mul_mat", f16, f32),
    ]
    for fn, *args in calls:
        ptr, ne, ggml_type = context.call(fn, *args)  # raises if ggml disagrees with result_type
        assert ptr and ne is not None
        assert ggml_type == result_type(fn, L.tensor_head(args[0]).type, tuple(args))
