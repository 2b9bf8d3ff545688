"""fp16 and bf16 weights (initializers stored half-width, widened by a Cast to the float32 the
graph computes in): OpenVINO's results, and what the compiled model holds on to.

At precision="fp32" the CPU plugin computes in f32; MatMul weights stay f16/bf16 in the
compiled model (``half_weights.py`` marks their Converts as decompressions; other weights, e.g.
Conv's, are folded to f32): results within 1e-5 of onnxruntime. precision="fp16"/"bf16" runs in
that dtype only where the CPU has the instructions (AVX512-FP16/BF16, AMX), else in f32 with a
``PrecisionFallbackWarning``; either way within 3e-2 (``sdkit.tuning.TOLERANCES``). The ONNX
frontend copies the weights into its own constants (``frontend_copies_memory``), so the
compiled model keeps no reference to the caller's arrays.
"""

from __future__ import annotations

import gc
import warnings
import weakref
from typing import Any

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import sdkit
from sdkit.model import Model, WeightSet
from sdkit.tuning import TOLERANCES
from sdkit_openvino.convert import convert, frontend_copies_memory

STORED = {"fp16": np.float16, "bf16": ml_dtypes.bfloat16}
STORED_NUMPY = STORED


def half_weight_model(op: str, stored: str) -> tuple[Model, dict[str, np.ndarray]]:
    """``x -> op(x, Cast(w_stored))`` with ``w`` stored as ``stored`` (large enough to be passed
    by memory reference, not inlined)."""
    rng = np.random.default_rng(3)
    if op == "MatMul":
        weight = (rng.standard_normal((64, 96), dtype=np.float32) / 8).astype(STORED[stored])
        x = rng.standard_normal((4, 64), dtype=np.float32)
        node = helper.make_node("MatMul", ["x", "w"], ["y"])
    else:
        weight = (rng.standard_normal((16, 16, 3, 3), dtype=np.float32) / 8).astype(STORED[stored])
        x = rng.standard_normal((1, 16, 12, 12), dtype=np.float32)
        node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    graph = helper.make_graph(
        [helper.make_node("Cast", ["w_stored"], ["w"], to=TensorProto.FLOAT), node],
        "half",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(weight, "w_stored")],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    return Model.from_proto(proto), {"x": x}


def onnxruntime_result(model: Model, feeds: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(model.graph.to_onnx(model.weights).SerializeToString())
    return np.asarray(session.run(None, feeds)[0])


@pytest.mark.parametrize("op", ["MatMul", "Conv"])
@pytest.mark.parametrize("stored", ["fp16", "bf16"])
def test_half_weights_at_fp32_are_exact(op: str, stored: str) -> None:
    model, feeds = half_weight_model(op, stored)
    got = sdkit.compile(model, backend="openvino", threads=1, cache=False).run(feeds)["y"]
    assert float(np.abs(got - onnxruntime_result(model, feeds)).max()) <= 1e-5


@pytest.mark.parametrize("stored", ["fp16", "bf16"])
def test_half_weights_at_their_own_precision(stored: str) -> None:
    model, feeds = half_weight_model("MatMul", stored)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PrecisionFallbackWarning on CPUs without the dtype
        compiled = sdkit.compile(model, backend="openvino", threads=1, cache=False, precision=stored)
        got = compiled.run(feeds)["y"]
    assert float(np.abs(got - onnxruntime_result(model, feeds)).max()) <= TOLERANCES[stored]


def test_compiled_model_does_not_hold_the_callers_weights() -> None:
    """The frontend copies in-memory weights (checked on the installed OpenVINO), so neither the
    conversion nor the compiled model keeps the caller's arrays: a component that drops its
    Model after compiling frees them, and the compiled model still computes the same."""
    assert frontend_copies_memory()
    model, feeds = half_weight_model("MatMul", "bf16")
    expected = onnxruntime_result(model, feeds)
    weights = WeightSet({"w_stored": np.array(model.weights["w_stored"], copy=True)})
    watched = weakref.ref(weights["w_stored"])
    assert convert(model.graph, weights).keepalive == []
    compiled = sdkit.compile(Model(model.graph, weights), backend="openvino", threads=1, cache=False)
    del weights
    gc.collect()
    assert watched() is None
    assert float(np.abs(compiled.run(feeds)["y"] - expected).max()) <= 1e-5


@pytest.mark.parametrize("stored", ["fp16", "bf16"])
def test_matmul_weights_stay_in_their_dtype_in_the_compiled_model(stored: str) -> None:
    """``half_weights.keep_half_weights``: the CPU plugin's runtime graph holds the MatMul weight
    (and its transposed copy) as f16/bf16, not widened to f32, and computes the same."""
    model, feeds = half_weight_model("MatMul", stored)
    compiled = sdkit.compile(model, backend="openvino", threads=1, cache=False)
    assert float(np.abs(compiled.run(feeds)["y"] - onnxruntime_result(model, feeds)).max()) <= 1e-5
    [engine] = compiled._engines.values()  # type: ignore[attr-defined]
    runtime = engine.compiled.get_runtime_model()
    big = [
        str(op.get_output_element_type(0).get_type_name())
        for op in runtime.get_ordered_ops()
        if op.get_rt_info()["layerType"].astype(str) in ("Const", "Transpose")
        and int(np.prod(op.get_output_shape(0))) == 64 * 96
    ]
    assert big and set(big) == {"f16" if stored == "fp16" else "bf16"}


def test_fp32_weights_are_not_compressed() -> None:
    rng = np.random.default_rng(4)
    weight = rng.standard_normal((64, 96), dtype=np.float32)
    x = rng.standard_normal((4, 64), dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "fp32",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(weight, "w")],
    )
    model = Model.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10))
    got = sdkit.compile(model, backend="openvino", threads=1, cache=False).run({"x": x})["y"]
    assert float(np.abs(got - x @ weight).max()) <= 1e-4  # f16 weights would be ~1e-2 off


@pytest.mark.parametrize("name", ["tiny_unet", "tiny_clip_text"])
@pytest.mark.parametrize("stored", ["fp16", "bf16"])
def test_sd_graphs_with_half_weights_match_onnxruntime(sd_graphs: Any, name: str, stored: str) -> None:
    """The SD architectures with their big weights stored half-width behind Casts
    (``sd_graphs.stored_as``, as the Flux benchmark's bf16 transformer), every output within
    1e-5 of onnxruntime on the same file (measured <= 2.2e-6)."""
    path = sd_graphs.model_path(name, weight_dtype=stored)
    feeds = sd_graphs.example_inputs(name)
    model = sdkit.load_model(path)
    assert any(np.asarray(model.weights[k]).dtype == STORED_NUMPY[stored] for k in model.weights)
    got = sdkit.compile(model, backend="openvino", threads=1, cache=False).run(feeds)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    for info, expected in zip(model.outputs, want, strict=True):
        assert float(np.abs(got[info.name] - expected).max()) <= 1e-5, info.name
