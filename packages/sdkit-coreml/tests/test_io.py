"""Graph I/O dtypes as Core ML declares them, name sanitizing, and feeds narrowed for it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from coreml_helpers import graph_model, needs_coremltools
from onnx import TensorProto, helper

from sdkit.errors import InputError
from sdkit_coreml import export_mlpackage
from sdkit_coreml.compiled import narrow
from sdkit_coreml.package import NAMES


def test_dtypes_core_ml_declares(tmp_path: Path) -> None:
    """int64 -> int32 (ranged here), bool -> float32 (cast inside), float16 kept."""
    needs_coremltools()
    nodes = [
        helper.make_node("Where", ["flag", "x", "x"], ["picked"]),
        helper.make_node("Cast", ["ids"], ["ids_f"], to=TensorProto.FLOAT16),
        helper.make_node("Add", ["ids_f", "half"], ["y"]),
    ]
    model = graph_model(
        nodes,
        [
            ("flag", TensorProto.BOOL, [2, 3]),
            ("x", TensorProto.FLOAT, [2, 3]),
            ("ids", TensorProto.INT64, ["n", 3]),
            ("half", TensorProto.FLOAT16, ["n", 3]),
        ],
        [("picked", TensorProto.FLOAT, [2, 3]), ("y", TensorProto.FLOAT16, ["n", 3])],
    )
    info = export_mlpackage(
        model, tmp_path / "io.mlpackage", shape_ranges={"ids": ((1, 3), (4, 3)), "half": ((1, 3), (4, 3))}
    )
    got = {f["name"]: f["dtype"] for f in info["inputs"] + info["outputs"]}
    assert got == {"flag": "float32", "x": "float32", "ids": "int32", "half": "float16", "picked": "float32",
                   "y": "float16"}  # fmt: skip
    assert info["inputs"][2]["ranges"] == [(1, 4), (3, 3)]


def test_names_that_are_not_identifiers_are_mapped(tmp_path: Path) -> None:
    needs_coremltools()
    from sdkit.cache import ArtifactCache
    from sdkit.device import Device
    from sdkit.options import make_options
    from sdkit_coreml.backend import CoremlBackend
    from sdkit_coreml.package import cached_package
    from sdkit_coreml.settings import settings_for

    nodes = [helper.make_node("Relu", ["input:0"], ["out/put.1"]), helper.make_node("Neg", ["input:0"], ["2nd"])]
    model = graph_model(
        nodes,
        [("input:0", TensorProto.FLOAT, [1, 2])],
        [("out/put.1", TensorProto.FLOAT, [1, 2]), ("2nd", TensorProto.FLOAT, [1, 2])],
    )
    settings = settings_for(make_options({}, CoremlBackend.extra_options), Device("cpu"), model.graph.inputs)
    package = cached_package(model.graph, model.weights, settings, None, ArtifactCache(tmp_path), tmp_path / "s")
    assert package.names.inputs == {"input:0": "input_0"}
    assert package.names.outputs == {"out/put.1": "out_put_1", "2nd": "v_2nd"}
    assert json.loads((package.path.parent / NAMES).read_text())["outputs"]["2nd"] == "v_2nd"


def test_feeds_are_narrowed_for_core_ml() -> None:
    ids = narrow("ids", np.array([[1, 2**31 - 1]], np.int64))
    assert ids.dtype == np.int32 and ids.tolist() == [[1, 2**31 - 1]]
    assert narrow("flag", np.array([True, False])).dtype == np.float32
    half = np.ones(3, np.float16)
    assert narrow("half", half) is half
    with pytest.raises(InputError, match="outside int32"):
        narrow("ids", np.array([2**31], np.int64))
