"""Model loading: ONNX with external data, weights apart from the graph, safetensors by
initializer name, symbolic dims, shape inference, refused and broken files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import sdkit
from sdkit.errors import InputError, ModelFormatError
from sdkit.model import Model, WeightSet


def _matmul_model(rows: int = 3) -> onnx.ModelProto:
    weight = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4) / 10
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Relu", ["y"], ["z"])],
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", rows])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", 4])],
        initializer=[numpy_helper.from_array(weight, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_load_splits_graph_and_weights(tmp_path: Path) -> None:
    path = tmp_path / "mm.onnx"
    onnx.save(_matmul_model(), path)
    model = sdkit.load_model(path)
    assert isinstance(model, Model)
    assert [i.name for i in model.inputs] == ["x"]
    assert model.inputs[0].shape == ("batch", 3)
    assert list(model.weights) == ["w"]
    assert all(not t.raw_data for t in model.graph.proto.graph.initializer)  # stripped
    # the graph hash ignores weight values: a refit keeps compiled artifacts valid
    other = Model.from_proto(_matmul_model())
    assert other.graph.hash == model.graph.hash


def test_the_checker_sees_the_graph_without_its_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``onnx.checker`` gets the graph with each initializer as a typed input, no weight bytes:
    checking (or sizing) the loaded model would serialize it, a copy of every weight on top of
    the model (what set ``memory="offload"``'s peak). A bad model is still refused by it."""
    seen: list[onnx.ModelProto] = []
    check = onnx.checker.check_model

    def recording(model: onnx.ModelProto, *args: object, **kwargs: object) -> None:
        seen.append(model)
        check(model, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(onnx.checker, "check_model", recording)
    path = tmp_path / "mm.onnx"
    onnx.save(_matmul_model(), path)
    model = sdkit.load_model(path)
    [checked] = seen
    assert not checked.graph.initializer
    assert [(i.name, i.type.tensor_type.elem_type) for i in checked.graph.input] == [
        ("x", TensorProto.FLOAT),
        ("w", TensorProto.FLOAT),
    ]
    assert list(model.weights) == ["w"]
    bad = _matmul_model()
    bad.graph.node[0].input[1] = "missing"  # an input nothing produces
    onnx.save(bad, path)
    with pytest.raises(ModelFormatError, match="not a valid ONNX model"):
        sdkit.load_model(path)


def test_initializer_bytes_that_do_not_fill_its_dims(tmp_path: Path) -> None:
    """The checker no longer sees the weight bytes; reading them finds the mismatch."""
    proto = _matmul_model()
    proto.graph.initializer[0].raw_data = proto.graph.initializer[0].raw_data[:-4]
    path = tmp_path / "short.onnx"
    onnx.save(proto, path)
    with pytest.raises(ModelFormatError, match="initializer 'w'"):
        sdkit.load_model(path)


def test_external_data_is_loaded(tmp_path: Path) -> None:
    path = tmp_path / "ext.onnx"
    onnx.save_model(_matmul_model(), path, save_as_external_data=True, location="ext.data", size_threshold=0)
    assert (tmp_path / "ext.data").is_file()
    model = sdkit.load_model(path)
    np.testing.assert_array_equal(model.weights["w"], numpy_helper.to_array(_matmul_model().graph.initializer[0]))


def test_missing_external_data_is_a_format_error(tmp_path: Path) -> None:
    path = tmp_path / "ext.onnx"
    onnx.save_model(_matmul_model(), path, save_as_external_data=True, location="ext.data", size_threshold=0)
    (tmp_path / "ext.data").unlink()
    with pytest.raises(ModelFormatError, match=r"ext\.onnx"):
        sdkit.load_model(path)


@pytest.mark.parametrize("suffix", [".ckpt", ".pt", ".pth", ".bin"])
def test_pickled_files_are_refused_unread(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"model{suffix}"
    path.write_bytes(b"\x80\x04this would be a pickle")
    with pytest.raises(ModelFormatError, match="pickled"):
        sdkit.load_model(path)
    with pytest.raises(ModelFormatError, match="pickled"):
        WeightSet.load_safetensors(path)


def test_truncated_and_garbage_files(tmp_path: Path) -> None:
    data = _matmul_model().SerializeToString()
    (tmp_path / "trunc.onnx").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFormatError):
        sdkit.load_model(tmp_path / "trunc.onnx")
    (tmp_path / "junk.onnx").write_bytes(b"not a model at all")
    with pytest.raises(ModelFormatError):
        sdkit.load_model(tmp_path / "junk.onnx")
    with pytest.raises(ModelFormatError, match="not found"):
        sdkit.load_model(tmp_path / "absent.onnx")
    with pytest.raises(ModelFormatError, match="no model loader"):
        sdkit.load_model(tmp_path)


def test_safetensors_round_trip_by_initializer_name(tmp_path: Path) -> None:
    model = Model.from_proto(_matmul_model())
    new = {"w": np.ones((3, 4), np.float32)}
    WeightSet(new).save_safetensors(tmp_path / "w.safetensors")
    loaded = WeightSet.load_safetensors(tmp_path / "w.safetensors")
    swapped = model.with_weights(loaded)
    np.testing.assert_array_equal(swapped.weights["w"], new["w"])
    assert swapped.weights.hash() != model.weights.hash()
    # onnxruntime (independent) runs the re-assembled model with the new weights
    import onnxruntime as ort

    session = ort.InferenceSession(swapped.graph.to_onnx(swapped.weights).SerializeToString())
    x = np.array([[1, -2, 3]], np.float32)
    np.testing.assert_allclose(session.run(None, {"x": x})[0], np.maximum(x @ new["w"], 0))
    (tmp_path / "bad.safetensors").write_bytes(b"\x00" * 10)
    with pytest.raises(ModelFormatError):
        WeightSet.load_safetensors(tmp_path / "bad.safetensors")


def test_weight_updates_are_checked() -> None:
    weights = Model.from_proto(_matmul_model()).weights
    with pytest.raises(InputError, match="not in the model"):
        weights.updated({"v": np.zeros((3, 4), np.float32)})
    with pytest.raises(InputError, match="shape"):
        weights.updated({"w": np.zeros((4, 3), np.float32)})
    with pytest.raises(InputError, match="float64"):
        weights.updated({"w": np.zeros((3, 4), np.float64)})


def test_fixing_symbolic_dims_and_inferring_shapes() -> None:
    model = Model.from_proto(_matmul_model())
    fixed = model.graph.with_input_shapes({"x": (2, 3)})
    assert fixed.inputs[0].shape == (2, 3)
    assert fixed.hash != model.graph.hash
    inferred = fixed.infer_shapes(model.weights)
    value_infos = {v.name: v for v in inferred.proto.graph.value_info}
    assert [d.dim_value for d in value_infos["y"].type.tensor_type.shape.dim] == [2, 4]
    with pytest.raises(InputError, match="rank"):
        model.graph.with_input_shapes({"x": (2, 3, 1)})
    with pytest.raises(InputError, match="does not fit"):
        model.graph.with_input_shapes({"x": (2, 5)})
    with pytest.raises(InputError, match="unknown input"):
        model.graph.with_input_shapes({"y": (2, 3)})


def test_save_writes_a_loadable_file(tmp_path: Path) -> None:
    model = Model.from_proto(_matmul_model())
    path = model.graph.save(tmp_path / "again.onnx", model.weights)
    again = sdkit.load_model(path)
    np.testing.assert_array_equal(again.weights["w"], model.weights["w"])


def test_weights_override_at_load(tmp_path: Path) -> None:
    onnx.save(_matmul_model(), tmp_path / "mm.onnx")
    WeightSet({"w": np.full((3, 4), 2, np.float32)}).save_safetensors(tmp_path / "w.safetensors")
    model = sdkit.load_model(tmp_path / "mm.onnx", weights=tmp_path / "w.safetensors")
    assert float(model.weights["w"].sum()) == 24.0


def test_weight_hash_is_deterministic_for_every_dtype() -> None:
    import ml_dtypes

    arrays = {
        "bf16": np.arange(6, dtype=np.float32).astype(ml_dtypes.bfloat16).reshape(2, 3),
        "empty": np.zeros((0, 3), np.float32),
        "f16": np.ones(4, np.float16),
        "scalar": np.array(3, np.int64),
    }
    first, second = WeightSet(arrays).hash(), WeightSet(dict(reversed(arrays.items()))).hash()
    assert first == second
    changed = dict(arrays, f16=np.full(4, 2, np.float16))
    assert WeightSet(changed).hash() != first


class _Lazy:
    """A LazyArray counting its reads (what a checkpoint-backed WeightSet holds)."""

    def __init__(self, array: np.ndarray) -> None:
        self.array, self.reads = array, 0
        self.shape, self.dtype = array.shape, array.dtype

    def load(self) -> np.ndarray:
        self.reads += 1
        return self.array.copy()


def test_lazy_weights_are_read_on_access_only() -> None:
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    lazy = _Lazy(w)
    weights = WeightSet({"w": lazy, "b": np.ones(4, np.float32)})
    assert weights.is_lazy("w") and not weights.is_lazy("b")
    assert weights.spec("w") == ((3, 4), np.dtype(np.float32)) and weights.nbytes == 64
    assert "1 read on access" in repr(weights) and lazy.reads == 0
    assert "w" in weights and "x" not in weights and lazy.reads == 0  # membership reads nothing
    # derived sets keep the entry unread: subset, a strict update of another name, entries()
    updated = weights.subset(["w", "missing"]).updated({"w": lazy}).updated({}, strict=True)
    assert updated.is_lazy("w") and set(updated) == {"w"} and lazy.reads == 0
    with pytest.raises(InputError, match=r"weight 'w' has shape \(4,\)"):
        weights.updated({"w": np.ones(4, np.float32)})
    assert lazy.reads == 0
    np.testing.assert_array_equal(weights["w"], w)
    assert lazy.reads == 1
    # the hash of a lazy set is the hash of the same values held in memory
    assert weights.hash() == WeightSet({"w": w, "b": np.ones(4, np.float32)}).hash()


def test_lazy_weights_compile_and_save(tmp_path: Path) -> None:
    model = Model.from_proto(_matmul_model())
    [name] = model.weights
    lazy = WeightSet({name: _Lazy(np.asarray(model.weights[name]))})
    out = sdkit.compile(Model(model.graph, lazy), backend="reference").run({"x": np.ones((2, 3), np.float32)})
    expected = sdkit.compile(model, backend="reference").run({"x": np.ones((2, 3), np.float32)})
    np.testing.assert_array_equal(out["z"], expected["z"])
    lazy.save_safetensors(tmp_path / "w.safetensors")
    np.testing.assert_array_equal(WeightSet.load_safetensors(tmp_path / "w.safetensors")[name], model.weights[name])


def test_unknown_load_options_are_refused(tmp_path: Path) -> None:
    from sdkit.errors import OptionError

    onnx.save(_matmul_model(), tmp_path / "mm.onnx")
    with pytest.raises(OptionError, match="weigths"):
        sdkit.load_model(tmp_path / "mm.onnx", weigths="typo.safetensors")


def test_stripped_graph_keeps_everything_but_the_weight_bytes() -> None:
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from sdkit.model import strip_weights

    weight = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "w")
    node = helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
        initializer=[weight],
        doc_string="kept",
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="p")
    stripped, weights = strip_weights(proto)
    assert stripped.proto.producer_name == "p" and stripped.proto.graph.doc_string == "kept"
    assert [n.name for n in stripped.proto.graph.node] == ["mm"]
    (meta,) = stripped.proto.graph.initializer
    assert (meta.name, list(meta.dims), meta.raw_data) == ("w", [2, 3], b"")
    np.testing.assert_array_equal(weights["w"], np.arange(6, dtype=np.float32).reshape(2, 3))
