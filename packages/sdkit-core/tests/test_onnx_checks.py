"""What core refuses in any ONNX model, for every backend: opsets newer than it knows, external
data at special locations (``*/_ORT_MEM_ADDR_/*`` reads process memory in onnxruntime and
OpenVINO) or outside the model's folder, and tensors still external after loading."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import sdkit
from sdkit.errors import ModelFormatError
from sdkit.model import Model
from sdkit.onnx_checks import all_tensors, newest_opsets

MEMORY = "*/_ORT_MEM_ADDR_/*"


def _external(name: str, location: str, count: int = 2, offset: int = 4096) -> TensorProto:
    tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=[count])
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(4 * count))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return tensor


def _sparse(values: TensorProto) -> onnx.SparseTensorProto:
    return helper.make_sparse_tensor(values, numpy_helper.from_array(np.array([0, 3], np.int64), "i"), [4])


def _model(nodes: list[onnx.NodeProto], initializers=(), sparse=(), opset: int = 17) -> onnx.ModelProto:  # type: ignore[no-untyped-def]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        list(initializers),
        sparse_initializer=list(sparse),
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _add_constant(**attrs) -> list[onnx.NodeProto]:  # type: ignore[no-untyped-def]
    return [helper.make_node("Constant", [], ["c"], **attrs), helper.make_node("Add", ["x", "c"], ["y"])]


def _cases(location: str) -> dict[str, onnx.ModelProto]:
    """The same special location in every kind of tensor a model can hold."""
    add_w = [helper.make_node("Add", ["x", "w"], ["y"])]
    then = helper.make_graph(
        [helper.make_node("Constant", [], ["t"], value=_external("tv", location, 4))],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [4])],
    )
    branch = [
        helper.make_node("Constant", [], ["cond"], value=numpy_helper.from_array(np.array(True))),
        helper.make_node("If", ["cond"], ["c"], then_branch=then, else_branch=then),
        helper.make_node("Add", ["x", "c"], ["y"]),
    ]
    return {
        "dense initializer": _model(add_w, [_external("w", location, 4)]),
        "sparse initializer": _model(add_w, sparse=[_sparse(_external("w", location))]),
        "dense Constant": _model(_add_constant(value=_external("c", location, 4))),
        "sparse Constant": _model(_add_constant(sparse_value=_sparse(_external("c", location)))),
        "Constant in a subgraph": _model(branch),
    }


@pytest.fixture
def memory_file(tmp_path: Path) -> Path:
    """A file at the special path itself, so onnx's checker finds "the external data"."""
    special = tmp_path / "*" / "_ORT_MEM_ADDR_"
    special.mkdir(parents=True)
    (special / "*").write_bytes(bytes(64))
    return tmp_path


@pytest.mark.parametrize("case", list(_cases(MEMORY)))
def test_memory_address_location_refused_on_load(memory_file: Path, case: str) -> None:
    path = memory_file / "model.onnx"
    onnx.save(_cases(MEMORY)[case], path)
    with pytest.raises(ModelFormatError, match=r"refused location '\*/_ORT_MEM_ADDR_/\*'"):
        sdkit.load_model(path)


@pytest.mark.parametrize("case", list(_cases(MEMORY)))
def test_memory_address_location_refused_in_memory(case: str) -> None:
    """A ModelProto built in code never reaches a backend with an external tensor."""
    with pytest.raises(ModelFormatError, match="still points at external data"):
        Model.from_proto(_cases(MEMORY)[case])


@pytest.mark.parametrize("location", ["*/x", "*", "sdkit:weightset", "a\0b", ""])
def test_other_special_locations_refused(tmp_path: Path, location: str) -> None:
    path = tmp_path / "model.onnx"
    onnx.save(_model([helper.make_node("Add", ["x", "w"], ["y"])], [_external("w", location, 4, 0)]), path)
    with pytest.raises(ModelFormatError, match="refused location"):
        sdkit.load_model(path)


def test_absolute_and_escaping_locations_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside.bin"
    outside.write_bytes(np.arange(4, dtype=np.float32).tobytes())
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "link.bin").symlink_to(outside)
    for location, message in ((str(outside), "absolute path"), ("../outside.bin", "outside"), ("link.bin", "outside")):
        path = folder / "model.onnx"
        onnx.save(_model([helper.make_node("Add", ["x", "w"], ["y"])], [_external("w", location, 4, 0)]), path)
        with pytest.raises(ModelFormatError, match=message):
            sdkit.load_model(path)


def test_plain_external_data_still_loads(tmp_path: Path) -> None:
    data = np.arange(4, dtype=np.float32)
    (tmp_path / "w.bin").write_bytes(data.tobytes())
    sub = tmp_path / "weights"
    sub.mkdir()
    (sub / "w.bin").write_bytes((data * 2).tobytes())
    for location, expected in (("w.bin", data), ("weights/w.bin", data * 2), ("./weights/../w.bin", data)):
        path = tmp_path / "model.onnx"
        onnx.save(_model([helper.make_node("Add", ["x", "w"], ["y"])], [_external("w", location, 4, 0)]), path)
        model = sdkit.load_model(path)
        np.testing.assert_array_equal(model.weights["w"], expected)
    # onnx itself refuses a symlinked data file even when it points inside: one clear error
    (tmp_path / "inside-link.bin").symlink_to(sub / "w.bin")
    onnx.save(_model([helper.make_node("Add", ["x", "w"], ["y"])], [_external("w", "inside-link.bin", 4, 0)]), path)
    with pytest.raises(ModelFormatError, match="symbolic link"):
        sdkit.load_model(path)


def test_all_tensors_finds_every_kind() -> None:
    found = [where for where, _ in all_tensors(_cases("x")["sparse Constant"])]
    assert found == ["node 'Constant' attribute 'sparse_value' (sparse values)",
                     "node 'Constant' attribute 'sparse_value' (sparse indices)"]  # fmt: skip
    nested = [where for where, _ in all_tensors(_cases("x")["Constant in a subgraph"])]
    assert any("then_branch" in w and "'tv'" not in w for w in nested)


@pytest.mark.parametrize("domain", ["", "ai.onnx", "ai.onnx.ml"])
def test_opset_newer_than_onnx_refused(tmp_path: Path, domain: str) -> None:
    """onnxruntime refuses opset 99 too: an operator's meaning there is unknown."""
    proto = _model([helper.make_node("Relu", ["x"], ["y"])])
    proto.opset_import.append(helper.make_opsetid(domain, 99)) if domain == "ai.onnx.ml" else None
    if domain != "ai.onnx.ml":
        del proto.opset_import[:]
        proto.opset_import.append(helper.make_opsetid(domain, 99))
    path = tmp_path / "new.onnx"
    onnx.save(proto, path)
    newest = newest_opsets()["ai.onnx.ml" if domain == "ai.onnx.ml" else ""]
    with pytest.raises(ModelFormatError, match=f"opset 99 of {domain or 'ai.onnx'}.*newest: {newest}"):
        sdkit.load_model(path)
    with pytest.raises(ModelFormatError, match="opset 99"):
        Model.from_proto(proto)


def test_newest_opset_and_custom_domains_load() -> None:
    newest = newest_opsets()[""]
    assert newest == onnx.defs.onnx_opset_version()
    Model.from_proto(_model([helper.make_node("Relu", ["x"], ["y"])], opset=newest))
    proto = _model([helper.make_node("Relu", ["x"], ["y"])])
    proto.opset_import.append(helper.make_opsetid("com.example", 999))  # its own versioning
    Model.from_proto(proto)


def test_negative_declared_dims_refused() -> None:
    proto = _model([helper.make_node("Relu", ["x"], ["y"])])
    proto.graph.input[0].type.tensor_type.shape.dim[0].dim_value = -3
    with pytest.raises(ModelFormatError, match=r"'x' declares a negative dimension \[-3\]"):
        Model.from_proto(proto)


def _conv(group: int) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], group=group)],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])],
        [numpy_helper.from_array(np.ones((2, 2, 1, 1), np.float32), "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("group", [0, -1])
def test_a_convolution_group_below_one_is_refused(group: int) -> None:
    """Issue 30, item 11: OpenVINO computed Conv group=0 as group=1; the checker accepts it."""
    onnx.checker.check_model(_conv(group))
    with pytest.raises(ModelFormatError, match=f"has group={group}; it must be at least 1"):
        Model.from_proto(_conv(group))
    Model.from_proto(_conv(1))


def _nested_if(depth: int) -> onnx.ModelProto:
    """``y = x`` through ``depth`` If nodes, each in the previous one's then-branch."""

    def branch(level: int) -> onnx.GraphProto:
        out = helper.make_tensor_value_info(f"y{level}", TensorProto.FLOAT, [1])
        if level == depth:
            return helper.make_graph([helper.make_node("Identity", ["x"], [f"y{level}"])], f"g{level}", [], [out])
        inner = branch(level + 1)
        node = helper.make_node("If", ["c"], [f"y{level}"], then_branch=inner, else_branch=inner)
        return helper.make_graph([node], f"g{level}", [], [out])

    main = branch(1).node[0] if depth else helper.make_node("Identity", ["x"], ["y1"])
    graph = helper.make_graph(
        [main],
        "nested",
        [
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1]),
        ],
        [helper.make_tensor_value_info("y1", TensorProto.FLOAT, [1])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_control_flow_nested_too_deep_is_refused() -> None:
    """Issue 30, item 11: OpenVINO's compile time doubles with each level of If (50 s at 21)."""
    Model.from_proto(_nested_if(12))  # 11 subgraph levels below the main graph's If
    with pytest.raises(ModelFormatError, match=r"sits 13 subgraphs deep .* at most 12"):
        Model.from_proto(_nested_if(14))
    x = np.array([3.0], np.float32)
    out = sdkit.compile(Model.from_proto(_nested_if(3)), backend="reference").run({"c": np.array(True), "x": x})
    np.testing.assert_array_equal(out["y1"], x)
