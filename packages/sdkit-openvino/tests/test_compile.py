"""compile(), run(), refit() and the model cache, checked against onnx.reference."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import sdkit
from sdkit.errors import InputError, UnsupportedOperatorError
from sdkit.model import Model
from sdkit.testing import compare_with_reference, one_node_model
from sdkit_openvino.convert import MEMORY_LOCATION, memory_onnx


def conv_relu_model(symbolic: bool = True) -> Model:
    """Conv -> Relu -> Reshape(flatten by a shape initializer) with batch/height/width symbolic."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    dims: list[int | str] = ["n", 3, "h", "w"] if symbolic else [1, 3, 16, 16]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Reshape", ["r", "shape"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "conv_relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(b, "b"),
            numpy_helper.from_array(np.array([0, 8, -1], np.int64), "shape"),
        ],
    )
    return Model.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_matches_reference_and_compiles_once_per_signature(sdkit_isolated: Path) -> None:
    model = conv_relu_model()
    compiled = sdkit.compile(model, backend="openvino")
    rng = np.random.default_rng(1)
    for shape in [(1, 3, 16, 16), (2, 3, 8, 24), (1, 3, 16, 16)]:
        feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
        out = compiled.run(feeds)
        assert out["y"].shape == (shape[0], 8, shape[2] * shape[3])
        assert max(compare_with_reference(out, model, feeds).values()) < 1e-4
    assert len(compiled.signatures) == 2  # type: ignore[attr-defined]


def test_static_graph_compiles_at_once(sdkit_isolated: Path) -> None:
    compiled = sdkit.compile(conv_relu_model(), backend="openvino", input_shapes={"x": (1, 3, 16, 16)})
    assert [c["shapes"] for c in compiled.info["compiles"]] == [{"x": [1, 3, 16, 16]}]  # type: ignore[attr-defined]


def test_bad_inputs_are_input_errors(sdkit_isolated: Path) -> None:
    compiled = sdkit.compile(conv_relu_model(), backend="openvino")
    good = np.zeros((1, 3, 8, 8), np.float32)
    with pytest.raises(InputError, match="dtype"):
        compiled.run({"x": good.astype(np.float64)})
    with pytest.raises(InputError, match="rank"):
        compiled.run({"x": good[0]})
    with pytest.raises(InputError, match="axis 1"):
        compiled.run({"x": np.zeros((1, 4, 8, 8), np.float32)})
    with pytest.raises(InputError, match="missing"):
        compiled.run({})
    with pytest.raises(InputError, match="unknown input"):
        compiled.run({"x": good, "z": good})


def test_shape_the_graph_rejects_is_an_input_error(sdkit_isolated: Path) -> None:
    """Reshape to [-1, 5] fits 10 elements but not 12: OpenVINO's shape inference refuses."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "s"], ["y"])],
        "reshape",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([-1, 5], np.int64), "s")],
    )
    model = Model.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    compiled = sdkit.compile(model, backend="openvino")
    assert compiled.run({"x": np.arange(10, dtype=np.float32)})["y"].shape == (2, 5)
    with pytest.raises(InputError):
        compiled.run({"x": np.arange(12, dtype=np.float32)})


def test_weights_that_do_not_fit_are_input_errors(sdkit_isolated: Path) -> None:
    model = conv_relu_model()
    backend = sdkit.selection.get_backend("openvino")
    bad = dict(model.weights)
    bad["w"] = np.zeros((8, 3, 5, 5), np.float32)
    with pytest.raises(InputError, match="'w'"):
        backend.compile(model.graph, sdkit.WeightSet(bad), sdkit.Device("cpu"), sdkit.Options())
    del bad["w"]
    with pytest.raises(InputError, match="missing"):
        backend.compile(model.graph, sdkit.WeightSet(bad), sdkit.Device("cpu"), sdkit.Options())


def test_unsupported_operators_are_all_reported(sdkit_isolated: Path) -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Frobnicate", ["a"], ["b"], name="frob", domain="example.custom"),
        helper.make_node("Wobble", ["b"], ["y"], name="wobble", domain="example.custom"),
    ]
    graph = helper.make_graph(
        nodes,
        "custom",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    proto = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("example.custom", 1)]
    )
    with pytest.raises(UnsupportedOperatorError) as caught:
        sdkit.compile(Model.from_proto(proto), backend="openvino")
    assert {(p.node, p.op_type) for p in caught.value.problems} == {("frob", "Frobnicate"), ("wobble", "Wobble")}  # type: ignore[union-attr]
    assert "Traceback" not in str(caught.value)


def test_weights_are_referenced_not_serialized() -> None:
    """Large initializers become in-memory references: the protobuf holds only the topology,
    so a model past protobuf's 2 GiB limit converts the same way (and no file is written)."""
    model = conv_relu_model()
    big = np.ones((1024, 1024), np.float32)
    weights = {**model.weights, "w": model.weights["w"]}
    blob, keepalive = memory_onnx(model.graph, weights)
    assert len(blob) < 4096 + 2 * 1024
    proto = onnx.ModelProto.FromString(blob)
    assert all(t.data_location == TensorProto.EXTERNAL or t.raw_data for t in proto.graph.initializer)
    gather = one_node_model("Gather", {"i": np.array([0, 1048575], np.int64)}, initializers={"table": big.reshape(-1)})
    blob, keepalive = memory_onnx(gather.graph, gather.weights)
    (table,) = onnx.ModelProto.FromString(blob).graph.initializer
    location = {e.key: e.value for e in table.external_data}
    assert location["location"] == MEMORY_LOCATION
    assert int(location["length"]) == big.nbytes
    assert len(blob) < 1024
    assert keepalive[0].ctypes.data == int(location["offset"])


def test_no_temporary_files_are_left(sdkit_isolated: Path) -> None:
    before = set(Path(tempfile.gettempdir()).iterdir())
    model = conv_relu_model()
    sdkit.compile(model, backend="openvino", cache=False).run({"x": np.zeros((1, 3, 8, 8), np.float32)})
    created = {
        p for p in set(Path(tempfile.gettempdir()).iterdir()) - before if "openvino" in p.name or p.suffix == ".onnx"
    }
    assert not created


def test_refit_swaps_weights(sdkit_isolated: Path) -> None:
    model = conv_relu_model()
    feeds = {"x": np.random.default_rng(3).standard_normal((1, 3, 8, 8)).astype(np.float32)}
    compiled = sdkit.compile(model, backend="openvino")
    before = compiled.run(feeds)["y"]
    changed = model.with_weights({"w": -model.weights["w"], "b": -model.weights["b"]})
    compiled.refit(changed.weights)
    after = compiled.run(feeds)["y"]
    assert not np.allclose(before, after)
    assert max(compare_with_reference({"y": after}, changed, feeds).values()) < 1e-4
    assert compiled.info["refit_seconds"] > 0  # type: ignore[attr-defined]
    with pytest.raises(InputError):
        compiled.refit(sdkit.WeightSet({"w": model.weights["w"]}))


def test_second_compile_loads_from_the_cache(sdkit_isolated: Path) -> None:
    model = conv_relu_model()
    shapes = {"x": (1, 3, 16, 16)}
    first = sdkit.compile(model, backend="openvino", input_shapes=shapes)
    second = sdkit.compile(model, backend="openvino", input_shapes=shapes)
    assert first.info["compiles"][0]["from_cache"] is False  # type: ignore[attr-defined]
    assert second.info["compiles"][0]["from_cache"] is True  # type: ignore[attr-defined]
    blobs = list((sdkit_isolated / "openvino").rglob("*.blob"))
    assert len(blobs) == 1
    other = sdkit.compile(model, backend="openvino", input_shapes={"x": (1, 3, 8, 8)})
    assert other.info["compiles"][0]["from_cache"] is False  # type: ignore[attr-defined]
    uncached = sdkit.compile(model, backend="openvino", input_shapes=shapes, cache=False)
    assert uncached.info["compiles"][0]["from_cache"] is False  # type: ignore[attr-defined]


def test_cache_blob_depends_on_weights(sdkit_isolated: Path) -> None:
    """OpenVINO's blob embeds the weights and its hash covers them: new weights, new blob."""
    model = conv_relu_model()
    shapes = {"x": (1, 3, 16, 16)}
    feeds = {"x": np.ones((1, 3, 16, 16), np.float32)}
    sdkit.compile(model, backend="openvino", input_shapes=shapes)
    changed = model.with_weights({"w": 2 * model.weights["w"]})
    compiled = sdkit.compile(changed, backend="openvino", input_shapes=shapes)
    assert compiled.info["compiles"][0]["from_cache"] is False  # type: ignore[attr-defined]
    assert max(compare_with_reference(compiled.run(feeds), changed, feeds).values()) < 1e-4
    assert len(list((sdkit_isolated / "openvino").rglob("*.blob"))) == 2


def test_large_int4_weights_are_packed(sdkit_isolated: Path) -> None:
    """A 4-bit initializer is embedded packed (ml_dtypes keeps one value per byte)."""
    import ml_dtypes

    values = (np.arange(20000) % 15 - 7).astype(ml_dtypes.int4)
    graph = helper.make_graph(
        [helper.make_node("Cast", ["w"], ["y"], to=TensorProto.INT8)],
        "int4",
        [],
        [helper.make_tensor_value_info("y", TensorProto.INT8, [20000])],
        [numpy_helper.from_array(values, "w")],
    )
    model = Model.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    out = sdkit.compile(model, backend="openvino").run({})["y"]
    np.testing.assert_array_equal(out, values.astype(np.int8))
