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


def test_compute_tensors_past_the_capacity_open_new_blocks() -> None:
    """A graph may make more compute tensors than ``capacity`` (a chunked conv): new blocks are
    opened before one is full (a full ggml context aborts) and the graph is sized to fit."""
    lib = load_library()
    context = GgmlContext(lib, capacity=16)
    try:
        x = context.new_tensor(L.GGML_TYPE_F32, (4, 1, 1, 1), weight=False)
        for _ in range(100):
            x, _, _ = context.call("ggml_relu", x)
        assert len(context.blocks) > 100 // 16
        assert context.tensor_count() == 101
        graph = context.new_graph()
        lib.ggml_build_forward_expand(graph, x)
        assert lib.ggml_graph_n_nodes(graph) == 100
        assert context.graph_size >= 101
    finally:
        context.free()
