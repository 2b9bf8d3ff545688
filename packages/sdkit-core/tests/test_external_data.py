"""External-data initializers are memory-mapped on load (``sdkit.external_data``), not copied
into the protobuf and again into numpy; what cannot be mapped is loaded as before."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from sdkit.errors import ModelFormatError
from sdkit.model import load_onnx

RNG = np.random.default_rng(0)
WEIGHTS = {
    "w32": RNG.standard_normal((16, 8), dtype=np.float32),
    "w16": RNG.standard_normal((8, 8), dtype=np.float32).astype(np.float16),
    "wbf": RNG.standard_normal((8, 8), dtype=np.float32).astype(ml_dtypes.bfloat16),
}


def _save(path: Path, location: str | None = "model.onnx_data", extra: list[TensorProto] | None = None) -> None:
    nodes = [
        helper.make_node("MatMul", ["x", "w32"], ["a"]),
        helper.make_node("Cast", ["w16"], ["w16f"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["wbf"], ["wbff"], to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["a", "w16f"], ["b"]),
        helper.make_node("MatMul", ["b", "wbff"], ["y"]),
    ]
    inits = [numpy_helper.from_array(v, k) for k, v in WEIGHTS.items()] + (extra or [])
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
        inits,
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    onnx.save_model(
        proto,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=location is not None,
        location=location,
        size_threshold=0,
    )


@pytest.mark.parametrize("location", ["model.onnx_data", "weights.pb", None])
def test_external_initializers_are_mapped_not_copied(tmp_path: Path, location: str | None) -> None:
    _save(tmp_path / "model.onnx", location)
    model = load_onnx(tmp_path / "model.onnx")
    for name, expected in WEIGHTS.items():
        assert model.weights.is_lazy(name)
        assert model.weights.spec(name) == (expected.shape, expected.dtype)
        array = model.weights[name]
        assert not array.flags.writeable
        assert array.dtype == expected.dtype
        np.testing.assert_array_equal(array.view(np.uint8), expected.view(np.uint8))  # bit for bit


def test_packed_types_are_loaded_eagerly(tmp_path: Path) -> None:
    packed = helper.make_tensor("unused4", TensorProto.INT4, [4], [1, -2, 3, -4])
    _save(tmp_path / "model.onnx", extra=[packed])
    model = load_onnx(tmp_path / "model.onnx")
    assert not model.weights.is_lazy("unused4")
    np.testing.assert_array_equal(np.asarray(model.weights["unused4"], dtype=np.int8), [1, -2, 3, -4])
    assert model.weights.is_lazy("w32")


def test_short_data_file_is_one_clear_error(tmp_path: Path) -> None:
    _save(tmp_path / "model.onnx")
    data = tmp_path / "model.onnx_data"
    data.write_bytes(data.read_bytes()[:-64])
    with pytest.raises(ModelFormatError, match=r"model\.onnx"):
        load_onnx(tmp_path / "model.onnx")
