"""check(): every node the translator cannot take, at once, without coremltools."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from coreml_helpers import FIXTURES, fixture_model, graph_model, needs_coremltools
from onnx import TensorProto, helper

from sdkit.errors import UnsupportedOperatorError
from sdkit.families import shipped
from sdkit_coreml.backend import CoremlBackend


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_graphs_are_supported(name: str, sd_graphs: ModuleType, taef2: Path) -> None:
    model, _ = fixture_model(name, sd_graphs, taef2)
    report = CoremlBackend().check(model.graph)
    assert report.ok, report.unsupported


def _bad_model():  # type: ignore[no-untyped-def]
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="fine"),
        helper.make_node("NonZero", ["a"], ["nz"], name="nonzero"),
        helper.make_node("Resize", ["a", "", "scales"], ["r"], name="cubic", mode="cubic"),
        helper.make_node("Cast", ["a"], ["s"], name="to_string", to=TensorProto.STRING),
        helper.make_node("MyOp", ["a"], ["m"], name="custom", domain="my.domain"),
        helper.make_node("Pad", ["a", "pads"], ["p"], name="wrap", mode="wrap"),
    ]
    return graph_model(
        nodes,
        [("x", TensorProto.FLOAT, [1, 1, 2, 2]), ("d", TensorProto.DOUBLE, [1])],
        [
            ("nz", TensorProto.INT64, None),
            ("r", TensorProto.FLOAT, None),
            ("s", TensorProto.STRING, None),
            ("m", TensorProto.FLOAT, None),
            ("p", TensorProto.FLOAT, None),
        ],
        {"scales": np.array([1, 1, 2, 2], np.float32), "pads": np.zeros(8, np.int64)},
        opset=19,
    )


def test_every_untranslatable_node_is_named() -> None:
    report = CoremlBackend().check(_bad_model().graph)
    found = {(u.node, u.op_type): u.reason for u in report.unsupported}
    assert set(found) == {
        ("nonzero", "NonZero"),
        ("cubic", "Resize"),
        ("to_string", "Cast"),
        ("custom", "MyOp"),
        ("wrap", "Pad"),
        ("d", "<graph input/output>"),
        ("s", "<graph input/output>"),
    }
    assert "no Core ML translation" in found[("nonzero", "NonZero")]
    assert "cubic" in found[("cubic", "Resize")]
    assert "string" in found[("to_string", "Cast")]
    assert "custom domain" in found[("custom", "MyOp")]
    assert "float64" in found[("d", "<graph input/output>")]
    assert report.summary().startswith("7 unsupported node(s)")


def test_conversion_names_them_all_too(tmp_path: Path) -> None:
    needs_coremltools()
    from sdkit_coreml import export_mlpackage

    with pytest.raises(UnsupportedOperatorError) as error:
        export_mlpackage(_bad_model(), tmp_path / "bad.mlpackage")
    assert len(error.value.problems) == 7
    assert "nonzero (NonZero, opset 19)" in str(error.value)


def test_old_opset_semantics_are_refused() -> None:
    model = graph_model(
        [helper.make_node("Slice", ["x"], ["y"], name="old_slice", starts=[0], ends=[1])],
        [("x", TensorProto.FLOAT, [4])],
        [("y", TensorProto.FLOAT, None)],
        opset=9,
    )
    (problem,) = CoremlBackend().check(model.graph).unsupported
    assert problem.node == "old_slice"
    assert "from opset 10 on" in problem.reason


def test_fractional_nearest_resize_is_refused_at_conversion(tmp_path: Path) -> None:
    """check() cannot see the scales (an input); conversion names the node."""
    needs_coremltools()
    from sdkit_coreml import export_mlpackage

    model = graph_model(
        [helper.make_node("Resize", ["x", "", "scales"], ["y"], name="up15", mode="nearest")],
        [("x", TensorProto.FLOAT, [1, 1, 4, 4])],
        [("y", TensorProto.FLOAT, None)],
        {"scales": np.array([1, 1, 1.5, 1.5], np.float32)},
    )
    with pytest.raises(UnsupportedOperatorError, match=r"up15 \(Resize, opset 17\): nearest Resize by 1.5x1.5"):
        export_mlpackage(model, tmp_path / "r.mlpackage")


@pytest.mark.parametrize("name", shipped.names())
def test_shipped_full_size_graphs_are_supported(name: str) -> None:
    """sdkit's weightless full-size graphs (Flux / Chroma / SD3 transformers, T5-XXL, the VAEs,
    CLIP, the UNets): every node has a Core ML translation (Einsum, Mod and Tile included)."""
    report = CoremlBackend().check(shipped.load_graph(name))
    assert report.ok, report.summary()


def test_the_transformer_ops_are_in_the_shipped_graphs() -> None:
    """The test above covers Einsum (patchify / RoPE), Mod and Tile: the graphs have them."""
    ops = {name: {n.op_type for n in shipped.load_graph(name).nodes} for name in shipped.names()}
    for name in ("flux_dev_transformer", "flux_schnell_transformer", "chroma_transformer"):
        assert {"Einsum", "Mod", "Tile"} <= ops[name]
    for name in ("sd3_medium_transformer", "sd35_medium_transformer"):
        assert "Einsum" in ops[name]


@pytest.mark.parametrize(
    ("equation", "inputs", "why"),
    [
        ("ii->i", 1, "repeated within 'ii'"),
        ("...ij->...ji", 1, "ellipsis"),
        ("ij,jk,kl->il", 3, "3 operands"),
        ("ij->ik", 1, "uses one no operand has"),
        ("ij,jk->ik", 1, "2 operand(s) for 1 input(s)"),
    ],
)
def test_untranslated_einsums_are_named_with_their_equation(equation: str, inputs: int, why: str) -> None:
    names = [f"x{i}" for i in range(inputs)]
    model = graph_model(
        [helper.make_node("Einsum", names, ["y"], name="e", equation=equation)],
        [(n, TensorProto.FLOAT, [2, 2]) for n in names],
        [("y", TensorProto.FLOAT, None)],
    )
    (problem,) = CoremlBackend().check(model.graph).unsupported
    assert (problem.node, problem.op_type) == ("e", "Einsum")
    assert f"Einsum {equation!r}" in problem.reason
    assert why in problem.reason
