"""The bytes/file the TensorRT parser reads: in memory, or external data past 2 GB."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper
from trt_helpers import small_model

from sdkit_trt.onnx_source import onnx_source


def test_small_models_are_serialized_in_memory() -> None:
    model = small_model()
    with onnx_source(model.graph, model.weights) as source:
        assert source.path == ""
        proto = onnx.load_from_string(source.data)
    assert {t.name for t in proto.graph.initializer} == {"w", "b", "shape"}


def test_large_models_go_to_a_temporary_external_data_folder() -> None:
    model = small_model()
    with onnx_source(model.graph, model.weights, limit=0) as source:
        assert source.data == b""
        folder = Path(source.path).parent
        assert sorted(p.name for p in folder.iterdir()) == ["model.onnx", "weights.bin"]
        proto = onnx.load(source.path, load_external_data=True)
        loaded = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    assert not folder.exists()  # removed afterwards
    for name, array in model.weights.items():
        np.testing.assert_array_equal(loaded[name], array)
        assert loaded[name].dtype == array.dtype
