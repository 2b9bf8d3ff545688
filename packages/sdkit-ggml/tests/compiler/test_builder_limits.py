"""Sizes ggml would get wrong are refused before ggml sees them (issue 15, finding 1).

ggml computes byte sizes in 64-bit ``size_t``: an Expand to [1,4,2^30,2^30] (2^64 bytes)
wrapped to a 32-byte buffer and the run wrote out of bounds (SIGSEGV, or a GGML_ASSERT abort);
negative dims through ``input_shapes`` compiled too. The builder now checks every tensor's size
in Python integers against the memory budget first. These run in a child process: a regression
would kill it, and the test reports that instead of taking the pytest run down with it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# Direct backend calls: no sdkit.compile (whose own checks would refuse first).
_SCRIPT = """
import numpy as np, onnx
from onnx import TensorProto, helper, numpy_helper
from sdkit.device import CPU
from sdkit.errors import SdkitError
from sdkit.model import Model
from sdkit.options import Options
from sdkit_ggml.backend import GgmlBackend

def expand(shape):
    graph = helper.make_graph(
        [helper.make_node("Expand", ["x", "shape"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(shape, np.int64), "shape")])
    return Model.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))

def relu(dims):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)])
    return Model.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))

def attempt(model, feeds=None, fixed=None):
    graph = model.graph if fixed is None else model.graph.__class__(model.graph.proto)
    if fixed is not None:  # static dims written straight into the proto, past core's checks
        for dim, size in zip(graph.proto.graph.input[0].type.tensor_type.shape.dim, fixed):
            dim.Clear()
            dim.dim_value = size
    try:
        compiled = GgmlBackend().compile(graph, model.weights, CPU, Options(threads=1))
        out = compiled.run(feeds) if feeds is not None else None
        print("RAN", None if out is None else {k: v.shape for k, v in out.items()})
    except SdkitError as exc:
        print(type(exc).__name__, str(exc)[:160])
"""


def _run(body: str) -> list[str]:
    code = _SCRIPT + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"child died with {done.returncode}: {done.stderr[-2000:]}"
    return done.stdout.splitlines()


@pytest.mark.parametrize("shape", [[1, 4, 2**30, 2**30], [1, 4, 2**17, 2**16], [2**40, 2**40]])
def test_expand_to_a_wrapping_size_is_refused(shape: list[int]) -> None:
    (line,) = _run(f"attempt(expand({shape}), {{'x': np.ones(1, np.float32)}})")
    assert line.startswith(("ResourceLimitError", "UnsupportedModelError")), line
    assert "RAN" not in line


@pytest.mark.parametrize("dims", [[2**31, 2**31], [2**30, 2**30, 4], [1, 2**62]])
def test_huge_static_input_dims_are_refused(dims: list[int]) -> None:
    (line,) = _run(f"attempt(relu(['a'] * {len(dims)}), fixed={dims})")
    assert line.startswith("ResourceLimitError"), line


@pytest.mark.parametrize("dims", [[-3, 4], [2, -1], [-(2**40), 2]])
def test_negative_dims_are_refused_by_the_builder(dims: list[int]) -> None:
    """The lowering itself, given a negative input shape (core refuses these earlier)."""
    (line,) = _run(f"""
        from sdkit_ggml.compiler.build import build_plan, capacity_for
        from sdkit_ggml.compiler.builder import Builder
        from sdkit_ggml.converter_plugins import default_registry
        from sdkit_ggml.runtime.context import GgmlContext
        from sdkit_ggml.runtime.lib import load_library
        context = GgmlContext(load_library(), 4096)
        try:
            build_plan(relu(['a', 'b']).graph.proto, {{}}, {{'x': ({tuple(dims)}, np.dtype(np.float32))}},
                       default_registry(), Builder(context))
            print("BUILT")
        except SdkitError as exc:
            print(type(exc).__name__, exc)
        finally:
            context.free()
    """)
    assert line.startswith("UnsupportedModelError"), line
    assert "negative dimension" in line


def test_a_small_expand_still_runs() -> None:
    (line,) = _run("attempt(expand([2, 3]), {'x': np.ones(1, np.float32)})")
    assert line == "RAN {'y': (2, 3)}"
