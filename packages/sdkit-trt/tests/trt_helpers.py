"""Helpers shared by sdkit-trt's tests (a uniquely named module: tests of several packages
run in one pytest session with --import-mode=importlib, where ``conftest`` is not importable)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from sdkit.model import Model
from sdkit_trt import backend as backend_module
from sdkit_trt import runtime
from sdkit_trt.driver import DriverReport, Gpu

REPO = Path(__file__).resolve().parents[3]


def run_ort(proto: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run a complete ModelProto on onnxruntime's CPU provider (2 threads)."""
    import onnxruntime as ort

    model = onnx.ModelProto()
    model.CopyFrom(proto)
    model.ir_version = min(model.ir_version, 10)  # onnxruntime 1.31 reads IR <= 13; onnx 1.23 writes 14
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return [np.asarray(r) for r in session.run(None, feeds)]


def small_model() -> Model:
    """Conv (float weights TensorRT can refit) + Reshape (an int64 shape constant it folds)."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node("Reshape", ["c", "shape"], ["y"])]
    inits = {
        "w": np.ones((2, 3, 1, 1), np.float32),
        "b": np.zeros(2, np.float32),
        "shape": np.array([1, -1], np.int64),
    }
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(a, n) for n, a in inits.items()],
    )
    return Model.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


RTX_3060 = Gpu(0, "NVIDIA GeForce RTX 3060", (8, 6), 12 * 2**30)
H100 = Gpu(1, "NVIDIA H100 80GB HBM3", (9, 0), 80 * 2**30)
RTX_4090 = Gpu(0, "NVIDIA GeForce RTX 4090", (8, 9), 24 * 2**30)
GTX_1080 = Gpu(0, "NVIDIA GeForce GTX 1080", (6, 1), 8 * 2**30)


def fake_install(  # the probe's own lookup functions, replaced
    monkeypatch: pytest.MonkeyPatch, modules: set[str], report: DriverReport, versions: dict[str, str] | None = None
) -> None:
    monkeypatch.setattr(runtime, "module_available", lambda name: name in modules)
    monkeypatch.setattr(runtime, "distribution_version", lambda name: (versions or {}).get(name, "1.7.1.116"))
    monkeypatch.setattr(backend_module, "probe_driver", lambda: report)
    monkeypatch.setattr(backend_module, "import_runtime", lambda info: None)
