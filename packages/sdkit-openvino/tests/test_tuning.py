"""The measured choice with real backends (``sdkit tune``, ``sdkit.tuning``): OpenVINO, and ggml
where it is installed, timed for real on a tiny conv graph against the exact reference backend;
``auto`` then follows the stored medians, whichever way they point. Nothing asserts a speed."""

from __future__ import annotations

import dataclasses
import importlib.util

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import sdkit
from sdkit.model import Model
from sdkit.tuning import TuneSettings, timings_store, tune

pytestmark = pytest.mark.usefixtures("sdkit_isolated")
OPTIONS = {"threads": 1}


def _conv_relu() -> Model:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 4, 3, 3)).astype(np.float32) * 0.2, "w")
    b = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4, 16, 16])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8, 16, 16])
    graph = helper.make_graph(nodes, "conv_relu", [x], [y], initializer=[w, b])
    return Model.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10))


def test_openvino_measured_against_the_reference_and_chosen() -> None:
    result = tune(_conv_relu(), options=OPTIONS, settings=TuneSettings(backends=("reference", "openvino"), repeat=2))
    record = result.record
    assert record.first == "reference" and record.result("reference").runs == 1
    openvino = record.result("openvino")
    assert openvino.ok and openvino.runs == 2 and openvino.version
    assert openvino.rel_l2 is not None and openvino.rel_l2 < 1e-5  # fp32 vs onnx.reference
    assert result.choice is not None and result.choice.backend.name == "openvino"
    assert result.path is not None and result.path.is_file()
    choice = sdkit.choose_backend(_conv_relu(), **OPTIONS)
    assert choice.backend == "openvino" and choice.reason.startswith("measured fastest")


@pytest.mark.skipif(importlib.util.find_spec("sdkit_ggml") is None, reason="sdkit-ggml is not installed")
def test_auto_follows_the_stored_medians_between_two_real_backends() -> None:
    model = _conv_relu()
    x = np.random.default_rng(1).standard_normal((1, 4, 16, 16)).astype(np.float32)
    settings = TuneSettings(backends=("reference", "openvino", "ggml"), repeat=2)
    record = tune(model, feeds={"x": x}, options=OPTIONS, settings=settings).record
    assert all(record.result(name).ok for name in ("openvino", "ggml"))  # both agree with the reference
    medians = {name: float(record.result(name).median_s or 0.0) for name in ("openvino", "ggml")}
    measured_fastest = min(medians, key=medians.__getitem__)
    compiled = sdkit.compile(model, **OPTIONS)
    assert compiled.backend_name == measured_fastest
    # the other way round: the stored numbers decide, not the priority order
    swapped = tuple(
        dataclasses.replace(m, median_s=medians["ggml" if m.backend == "openvino" else "openvino"])
        if m.backend in medians
        else m
        for m in record.results
    )
    timings_store().store(dataclasses.replace(record, results=swapped))
    other = sdkit.compile(model, **OPTIONS)
    assert other.backend_name != measured_fastest and other.backend_name in medians
    for run in (compiled, other):
        np.testing.assert_allclose(
            run.run({"x": x})["y"], sdkit.compile(model, backend="reference").run({"x": x})["y"], rtol=1e-4, atol=1e-5
        )
