"""fp16 and bf16 weights (initializers stored half-width, widened by a Cast to the float32 the
graph computes in, as a bf16 checkpoint runs on a CPU): which dtype ggml keeps, and the results.

ggml computes MatMul/Conv in F32 at precision="fp32": the weights are kept widened to F32
(4 bytes each), results within 1e-5 of onnxruntime. At precision="fp16" they are kept as F16
(2 bytes each; bf16 values convert exactly within f16's range), results within 1e-2 (ggml
rounds the activations to f16 too). ggml has no bf16 compute here (precision="bf16" is refused).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import sdkit
from sdkit.model import Model

STORED = {"fp16": (TensorProto.FLOAT16, np.float16), "bf16": (TensorProto.BFLOAT16, ml_dtypes.bfloat16)}
K, N = 64, 96  # MatMul weight [K, N]; Conv weight [8, 8, 3, 3]
SLACK = 4096  # ggml aligns each tensor in its buffer
STORED_NUMPY = {k: v[1] for k, v in STORED.items()}


def half_weight_model(op: str, stored: str) -> tuple[Model, dict[str, np.ndarray], int]:
    """``x -> op(x, Cast(w_stored))`` with ``w`` stored as ``stored``; the weight's element count."""
    rng = np.random.default_rng(3)
    data_type, np_type = STORED[stored]
    if op == "MatMul":
        weight = (rng.standard_normal((K, N), dtype=np.float32) / 8).astype(np_type)
        x = rng.standard_normal((4, K), dtype=np.float32)
        node = helper.make_node("MatMul", ["x", "w"], ["y"])
    else:
        weight = (rng.standard_normal((8, 8, 3, 3), dtype=np.float32) / 8).astype(np_type)
        x = rng.standard_normal((1, 8, 12, 12), dtype=np.float32)
        node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    nodes = [helper.make_node("Cast", ["w_stored"], ["w"], to=TensorProto.FLOAT), node]
    initializer = numpy_helper.from_array(weight, "w_stored")
    assert initializer.data_type == data_type
    graph = helper.make_graph(
        nodes,
        "half",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [initializer],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    return Model.from_proto(proto), {"x": x}, int(weight.size)


def onnxruntime_result(model: Model, feeds: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(model.graph.to_onnx(model.weights).SerializeToString())
    return np.asarray(session.run(None, feeds)[0])


@pytest.mark.parametrize("op", ["MatMul", "Conv"])
@pytest.mark.parametrize("stored", ["fp16", "bf16"])
def test_fp32_keeps_the_widened_weight_and_is_exact(op: str, stored: str) -> None:
    model, feeds, size = half_weight_model(op, stored)
    assert model.weights["w_stored"].dtype == STORED[stored][1]  # loaded in its dtype, not widened
    compiled = sdkit.compile(model, backend="ggml", threads=1)
    got = compiled.run(feeds)["y"]
    assert float(np.abs(got - onnxruntime_result(model, feeds)).max()) <= 1e-5
    kept = compiled.memory()["weights"]  # type: ignore[attr-defined]
    assert 4 * size <= kept <= 4 * size + SLACK  # F32: ggml computes in it


@pytest.mark.parametrize("op", ["MatMul", "Conv"])
@pytest.mark.parametrize("stored", ["fp16", "bf16"])
def test_fp16_precision_keeps_half_weights(op: str, stored: str) -> None:
    model, feeds, size = half_weight_model(op, stored)
    compiled = sdkit.compile(model, backend="ggml", threads=1, precision="fp16")
    got = compiled.run(feeds)["y"]
    assert float(np.abs(got - onnxruntime_result(model, feeds)).max()) <= 1e-2
    kept = compiled.memory()["weights"]  # type: ignore[attr-defined]
    assert 2 * size <= kept <= 2 * size + SLACK  # F16


def test_refit_of_half_weights_uploads_the_new_values() -> None:
    """The deferred transform (transposed at upload, one weight at a time) on refit too."""
    model, feeds, _ = half_weight_model("MatMul", "bf16")
    compiled = sdkit.compile(model, backend="ggml", threads=1)
    compiled.run(feeds)
    doubled = (np.asarray(model.weights["w_stored"], dtype=np.float32) * 2).astype(ml_dtypes.bfloat16)
    other = model.with_weights({"w_stored": doubled})
    compiled.refit(other.weights)
    assert float(np.abs(compiled.run(feeds)["y"] - onnxruntime_result(other, feeds)).max()) <= 1e-5


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
    got = sdkit.compile(model, backend="ggml", threads=1, cache=False).run(feeds)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    for info, expected in zip(model.outputs, want, strict=True):
        assert float(np.abs(got[info.name] - expected).max()) <= 1e-5, info.name
