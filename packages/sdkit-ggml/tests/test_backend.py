"""Backend behaviour: plugin loading, check(), errors that never abort, refit, options, fp16."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper

import sdkit
from sdkit.errors import InputError, OptionError, SdkitError, UnsupportedModelError
from sdkit.model import Model
from sdkit.testing import compare_with_reference, one_node_model


def test_hooks_do_not_load_ggml() -> None:
    code = (
        "import sys; from sdkit.plugins import get_plugins; get_plugins(); "
        "print('libggml' in sys.modules, 'sdkit_ggml.runtime.lib' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_registered_and_available() -> None:
    info = {b.name: b for b in sdkit.backends()}["ggml"]
    assert info.available, info.reason
    assert info.priority == 55
    assert "cpu" in info.devices


def test_check_reports_every_unsupported_node() -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Det", ["a"], ["b"]),
        helper.make_node("Hardmax", ["b"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
    )
    model = Model.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    report = sdkit.check(model, backend="ggml")["ggml"]
    assert sorted(u.op_type for u in report.unsupported) == ["Det", "Hardmax"]
    with pytest.raises(UnsupportedModelError, match="Det"):
        sdkit.compile(model, backend="ggml")


def test_bad_shapes_raise_instead_of_aborting() -> None:
    x = np.zeros((1, 3, 4, 4), np.float32)
    w = np.zeros((8, 3, 7, 7), np.float32)  # kernel larger than the input
    with pytest.raises(SdkitError):
        sdkit.compile(one_node_model("Conv", {"x": x}, initializers={"w": w}), backend="ggml")
    add = one_node_model("Add", {"a": np.zeros((2, 3), np.float32), "b": np.zeros((2, 3), np.float32)})
    compiled = sdkit.compile(add, backend="ggml")
    with pytest.raises(InputError):
        compiled.run({"a": np.zeros((2, 4), np.float32), "b": np.zeros((2, 3), np.float32)})


def test_gather_index_out_of_range_is_an_input_error() -> None:
    table = np.random.default_rng(0).random((10, 4), dtype=np.float32)
    model = one_node_model("Gather", {"ids": np.zeros((3,), np.int64)}, initializers={"table": table})
    # one_node_model puts inputs first: reorder so data comes first
    node = model.graph.proto.graph.node[0]
    node.input[:] = ["table", "ids"]
    compiled = sdkit.compile(Model(model.graph, model.weights), backend="ggml")
    out = compiled.run({"ids": np.array([1, 9, 0])})
    np.testing.assert_array_equal(out["out0"], table[[1, 9, 0]])
    with pytest.raises(InputError):
        compiled.run({"ids": np.array([1, 10, 0])})


def test_broadcasting_both_ways_matches_reference() -> None:
    feeds = {
        "a": np.random.default_rng(1).random((3, 1, 5), dtype=np.float32),
        "b": np.random.default_rng(2).random((4, 1), dtype=np.float32),
    }
    for op in ("Add", "Sub", "Mul", "Div"):
        model = one_node_model(op, feeds)
        out = sdkit.compile(model, backend="ggml").run(feeds)
        assert max(compare_with_reference(out, model, feeds).values()) <= 1e-6


def test_refit_reuploads_weights_and_dynamic_shapes_compile_per_signature() -> None:
    rng = np.random.default_rng(3)
    w1, w2 = rng.random((4, 3), dtype=np.float32), rng.random((4, 3), dtype=np.float32)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [x],
        [y],
        initializer=[helper.make_tensor("w", TensorProto.FLOAT, [4, 3], w1.ravel())],
    )
    model = Model.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    compiled = sdkit.compile(model, backend="ggml")
    a, b = rng.random((2, 4), dtype=np.float32), rng.random((5, 4), dtype=np.float32)
    np.testing.assert_allclose(compiled.run({"x": a})["y"], a @ w1, rtol=1e-5)
    np.testing.assert_allclose(compiled.run({"x": b})["y"], b @ w1, rtol=1e-5)
    compiled.refit(model.weights.updated({"w": w2}))
    np.testing.assert_allclose(compiled.run({"x": a})["y"], a @ w2, rtol=1e-5)
    np.testing.assert_allclose(compiled.run({"x": b})["y"], b @ w2, rtol=1e-5)


def test_options() -> None:
    model = one_node_model("Relu", {"x": np.zeros((2, 2), np.float32)})
    with pytest.raises(OptionError):
        sdkit.compile(model, backend="ggml", precision="bf16")
    compiled = sdkit.compile(model, backend="ggml", threads=1)
    assert compiled.threads == 1  # type: ignore[attr-defined]


def test_fp16_conv_error_is_small() -> None:
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 8, 16, 16), dtype=np.float32)
    w = rng.standard_normal((8, 8, 3, 3), dtype=np.float32) * 0.1
    model = one_node_model("Conv", {"x": x}, {"pads": [1, 1, 1, 1]}, initializers={"w": w})
    exact = sdkit.compile(model, backend="ggml").run({"x": x})["out0"]
    half = sdkit.compile(model, backend="ggml", precision="fp16").run({"x": x})["out0"]
    assert max(compare_with_reference({"out0": exact}, model, {"x": x}).values()) <= 1e-5
    assert 0 < float(np.abs(half - exact).max()) <= 2e-2


def test_refit_recomputes_folded_weight_preprocessing() -> None:
    rng = np.random.default_rng(5)
    w1, w2 = rng.random((3, 4), dtype=np.float32), rng.random((3, 4), dtype=np.float32)
    nodes = [helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]), helper.make_node("MatMul", ["x", "wt"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        initializer=[helper.make_tensor("w", TensorProto.FLOAT, [3, 4], w1.ravel())],
    )
    model = Model.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    compiled = sdkit.compile(model, backend="ggml")
    x = rng.random((2, 4), dtype=np.float32)
    np.testing.assert_allclose(compiled.run({"x": x})["y"], x @ w1.T, rtol=1e-5)
    compiled.refit(model.weights.updated({"w": w2}))
    np.testing.assert_allclose(compiled.run({"x": x})["y"], x @ w2.T, rtol=1e-5)


def test_check_reports_attribute_values_and_dtypes() -> None:
    nodes = [
        helper.make_node("MaxPool", ["x"], ["a"], kernel_shape=[2, 2], dilations=[2, 2]),
        helper.make_node("Resize", ["a", "", "scales"], ["b"], mode="cubic"),
        helper.make_node("Cast", ["b"], ["y"], to=TensorProto.DOUBLE),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)],
        initializer=[
            helper.make_tensor("scales", TensorProto.FLOAT, [4], [1, 1, 2, 2]),
        ],
    )
    model = Model.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]))
    report = sdkit.check(model, backend="ggml")["ggml"]
    reasons = {u.op_type: u.reason for u in report.unsupported}
    assert set(reasons) == {"MaxPool", "Resize", "Cast"}
    assert "dilated" in reasons["MaxPool"]
    assert "cubic" in reasons["Resize"]
    assert "float64" in reasons["Cast"]


def test_unknown_device_and_bad_library_dir_are_clear_errors(tmp_path: object) -> None:
    from sdkit.errors import DeviceError

    model = one_node_model("Relu", {"x": np.zeros((2, 2), np.float32)})
    with pytest.raises(DeviceError):
        sdkit.compile(model, backend="ggml", device="cuda:7")
    code = (
        "from sdkit_ggml.backend import GgmlBackend; a = GgmlBackend().probe(); "
        "print(a.ok, 'no libggml' in a.reason, bool(a.install_hint))"
    )
    env = {**os.environ, "SDKIT_GGML_LIB_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert out.split() == ["False", "True", "True"]


def test_concurrent_runs_are_serialised() -> None:
    from concurrent.futures import ThreadPoolExecutor

    a = np.random.default_rng(6).random((64, 64), dtype=np.float32)
    model = one_node_model("MatMul", {"a": a, "b": a})
    compiled = sdkit.compile(model, backend="ggml")
    inputs = [np.full((64, 64), i, np.float32) for i in range(8)]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda x: compiled.run({"a": x, "b": a})["out0"], inputs))
    for x, got in zip(inputs, results, strict=True):
        np.testing.assert_allclose(got, x @ a, rtol=1e-5)
