"""converters/conv.py and conv_transpose.py: 1-D and 2-D (grouped, strided, dilated, padded)
convolutions as exact F32 im2col + mul_mat."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import sdkit
from sdkit.errors import ModelFormatError, SdkitError
from sdkit.model import Model
from sdkit_ggml.backend import GgmlBackend
from sdkit_ggml.compiler.build import capacity_for
from sdkit_ggml.converters import conv

Check = Callable[..., Any]
# float32 sums over C*KH*KW products in another order than onnx.reference
ATOL = 1e-5


@pytest.mark.parametrize(
    "attributes",
    [
        {},
        {"pads": [1, 1, 1, 1]},
        {"pads": [0, 1, 2, 1], "strides": [2, 1]},
        {"dilations": [2, 2], "auto_pad": "SAME_UPPER"},
        {"auto_pad": "SAME_LOWER", "strides": [2, 2]},
        {"group": 2},
    ],
)
def test_conv2d(attributes: dict[str, Any], like_reference: Check, f32: Check) -> None:
    groups = attributes.get("group", 1)
    operands = [("x", f32(1, 4, 7, 6)), ("w", f32(6, 4 // groups, 3, 3), "const"), ("b", f32(6), "const")]
    like_reference("Conv", operands, attributes, atol=ATOL)


@pytest.mark.parametrize(
    "attributes",
    [
        {"pads": [1, 1, 1, 1]},
        {"pads": [0, 1, 2, 1], "strides": [2, 1]},
        {"dilations": [2, 1], "pads": [2, 1, 2, 1]},
        {"auto_pad": "SAME_LOWER", "strides": [2, 2]},
        {"pads": [1, 1, 1, 1], "strides": [2, 2]},
        {"pads": [3, 1, 3, 1], "strides": [2, 1]},  # a slab's padding cannot line up: padded once
    ],
)
def test_conv2d_in_im2col_chunks(
    attributes: dict[str, Any], like_reference: Check, f32: Check, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a budget of ~2 output rows' im2col: 3 to 6 chunks, the last one shorter
    monkeypatch.setenv(conv.CHUNK_ENV, str(2 * 6 * 4 * 9 * 4 / (1 << 20)))
    operands = [("x", f32(1, 4, 11, 6)), ("w", f32(5, 4, 3, 3), "const"), ("b", f32(5), "const")]
    like_reference("Conv", operands, attributes, atol=ATOL, oracle="onnxruntime")


def test_a_conv_of_more_chunks_than_its_node_allowance_compiles(
    f32: Check, one_node_graph: Check, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One output row per im2col chunk, 1200 rows: a few tensors per chunk, well past the tensors
    ``capacity_for`` allows one node. The compute contexts grow (no refusal, no ggml abort), the
    graph is sized for what was made, and check() agrees that it compiles."""
    monkeypatch.setenv(conv.CHUNK_ENV, str(3 * 2 * 9 * 4 / (1 << 20)))  # one row: ow * C*KH*KW * 4 B
    x = f32(1, 2, 1200, 3)
    operands = [("x", x), ("w", f32(2, 2, 3, 3), "const"), ("b", f32(2), "const")]
    model = one_node_graph("Conv", operands, {"pads": [1, 1, 1, 1]})
    report = GgmlBackend().check(model.graph)
    assert report.ok, report.unsupported
    compiled = sdkit.compile(model, backend="ggml", threads=1)
    got = compiled.run({"x": x})["out0"]
    program = compiled.program_for({"x": x})  # type: ignore[attr-defined]
    assert program.built.context.tensor_count() > capacity_for(model.graph.proto)
    assert len(program.built.context.blocks) > 1
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(model.graph.to_onnx(model.weights).SerializeToString())
    (want,) = session.run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)


def test_conv1d_batched_with_a_runtime_kernel(like_reference: Check, f32: Check) -> None:
    like_reference("Conv", [("x", f32(2, 3, 9)), ("w", f32(4, 3, 3))], {"pads": [1, 2]}, atol=ATOL)


GROUPED = [
    # (groups, in channels, out channels, attributes): per-group lowering up to 64 groups,
    # batched beyond, depthwise (groups == in == out channels) through GGML_OP_CONV_2D_DW
    (1, 3, 4, {"pads": [1, 1, 1, 1]}),
    (2, 4, 6, {"strides": [2, 1], "pads": [0, 1, 2, 1]}),
    (64, 128, 64, {"pads": [1, 1, 1, 1]}),
    (65, 130, 195, {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    (112, 224, 112, {"dilations": [2, 1], "pads": [2, 1, 2, 1]}),
    (112, 112, 112, {"pads": [1, 1, 1, 1]}),  # depthwise, multiplier 1
    (96, 96, 96, {"strides": [2, 2], "dilations": [2, 2], "pads": [0, 1, 2, 1]}),  # depthwise, asymmetric pads
    (96, 96, 192, {"strides": [1, 2], "pads": [1, 0, 1, 0]}),  # depthwise, multiplier 2
    # depthwise at 64 groups or fewer (MobileNet0.25's 8-64) takes GGML_OP_CONV_2D_DW too
    (8, 8, 8, {"pads": [1, 1, 1, 1]}),
    (32, 32, 32, {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    (64, 64, 64, {"dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    (16, 16, 16, {"strides": [2, 1], "pads": [0, 1, 2, 1]}),  # asymmetric pads
]


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize(("groups", "cin", "cout", "attributes"), GROUPED)
def test_grouped_conv2d_any_group_count(
    groups: int, cin: int, cout: int, attributes: dict[str, Any], batch: int, like_reference: Check, f32: Check
) -> None:
    operands = [("x", f32(batch, cin, 7, 6)), ("w", f32(cout, cin // groups, 3, 3), "const"), ("b", f32(cout), "const")]
    like_reference("Conv", operands, {"group": groups, **attributes}, atol=ATOL, oracle="onnxruntime")


def test_grouped_conv1d_over_64_groups(like_reference: Check, f32: Check) -> None:
    operands = [("x", f32(1, 130, 9)), ("w", f32(130, 2, 3), "const")]
    like_reference("Conv", operands, {"group": 65, "pads": [1, 2]}, atol=ATOL, oracle="onnxruntime")


def test_grouped_conv_with_a_runtime_kernel(like_reference: Check, f32: Check) -> None:
    operands = [("x", f32(1, 80, 5, 5)), ("w", f32(80, 1, 3, 3))]
    like_reference("Conv", operands, {"group": 80}, atol=ATOL, oracle="onnxruntime")


def test_conv_refusals(refuses: Check, f32: Check) -> None:
    refuses("Conv", [("x", f32(1, 2, 4, 4, 4)), ("w", f32(2, 2, 1, 1, 1), "const")], match="only 1-D and 2-D")
    refuses("Conv", [("x", f32(1, 3, 4, 4)), ("w", f32(4, 1, 1, 1), "const")], {"group": 2}, match="groups")


def test_kernel_larger_than_the_input_is_refused(one_node_graph: Check, f32: Check) -> None:
    # shape inference gives the output [1, 8, -2, -2]: core refuses that declared dim on load,
    # before ggml's own "does not fit" check is reached
    with pytest.raises(ModelFormatError, match="negative dimension"):
        one_node_graph("Conv", [("x", f32(1, 3, 4, 4)), ("w", f32(8, 3, 7, 7), "const")])


@pytest.mark.parametrize(
    "attributes",
    [
        {},
        {"strides": [2, 2]},
        {"strides": [2, 3], "pads": [1, 0, 1, 1], "output_padding": [1, 0]},
        {"strides": [2, 2], "output_shape": [8, 10]},
        {"strides": [2, 2], "auto_pad": "SAME_UPPER"},
        {"group": 2},
        {"dilations": [2, 1]},
    ],
)
def test_conv_transpose2d(attributes: dict[str, Any], like_reference: Check, f32: Check) -> None:
    groups = attributes.get("group", 1)
    operands = [("x", f32(1, 4, 4, 5)), ("w", f32(4, 6 // groups, 3, 3), "const"), ("b", f32(6), "const")]
    # onnx.reference's ConvTranspose fails on output_shape and groups: onnxruntime is the oracle
    like_reference("ConvTranspose", operands, attributes, atol=ATOL, oracle="onnxruntime")


def test_conv_transpose1d(like_reference: Check, f32: Check) -> None:
    like_reference("ConvTranspose", [("x", f32(1, 2, 5)), ("w", f32(2, 3, 4), "const")], {"strides": [3]}, atol=ATOL)


def test_conv_transpose_refusals(refuses: Check, f32: Check) -> None:
    refuses("ConvTranspose", [("x", f32(1, 2, 3, 3, 3)), ("w", f32(2, 2, 1, 1, 1), "const")], match="only 1-D and 2-D")


@pytest.mark.parametrize(
    ("groups", "cout", "per_group", "expected"),
    [(112, 112, 1, {"CONV_2D_DW"}), (112, 224, 1, {"IM2COL", "MUL_MAT"}), (112, 112, 2, {"IM2COL", "MUL_MAT"}),
     (16, 16, 1, {"CONV_2D_DW"})],  # depthwise below MAX_GROUPS too
)  # fmt: skip
def test_many_group_convs_take_a_fixed_number_of_nodes(
    groups: int, cout: int, per_group: int, expected: set[str], one_node_graph: Check, f32: Check
) -> None:
    x = f32(1, groups * per_group, 6, 5)
    model = one_node_graph("Conv", [("x", x), ("w", f32(cout, per_group, 3, 3), "const")], {"group": groups})
    compiled = sdkit.compile(model, backend="ggml", device="cpu")
    program = compiled.program_for({"x": x})
    lib = program.lib
    ops = {lib.ggml_op_desc(lib.ggml_graph_node(program.graph, i)).decode() for i in range(program.nodes)}
    assert ops - {"RESHAPE", "VIEW", "CONT", "PERMUTE"} == expected


@pytest.mark.parametrize(
    ("groups", "weight", "x"),
    [
        (8, (8, 1, 3, 3), (1, 8, 2, 2)),  # depthwise, the kernel larger than the input
        (2, (2, 2, 3, 3), (1, 2, 5, 5)),  # groups == channels == outputs, 2 channels a group
    ],
)
def test_depthwise_shapes_that_do_not_fit_are_errors(groups: int, weight: tuple[int, ...], x: tuple[int, ...]) -> None:
    # symbolic input dims: the shapes are known only at run time, where ggml would abort
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).standard_normal(weight).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], group=groups)],
        "depthwise",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "c", "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w")],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    compiled = sdkit.compile(Model.from_proto(proto), backend="ggml", device="cpu")
    with pytest.raises(SdkitError):
        compiled.run({"x": np.zeros(x, np.float32)})
