"""Pass ``conv_concat``: a Conv of a channel Concat read only by Convs (ESRGAN's dense blocks)
lowered as one product per part, summed, each part's im2col built once
(``converters/conv_concat.py``), against onnxruntime on the CPU backend; where the split does
not apply (batch 2, asymmetric pads, the device refusing the sum) the exact Concat + Conv."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import sdkit
from sdkit.model import Model
from sdkit_ggml.backend import GgmlBackend
from sdkit_ggml.compiler.pass_graph import FUSED_DOMAIN
from sdkit_ggml.compiler.passes import OFF_ENV, apply_passes
from sdkit_ggml.runtime import lib as L
from sdkit_ggml.runtime.profile import TensorNode, profile_program

ort = pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(0)


def conv(x: str, w: str, out: str, bias: str | None = None, **attrs: object) -> onnx.NodeProto:
    attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], **attrs}
    return helper.make_node("Conv", [x, w] + ([bias] if bias else []), [out], **attrs)


def dense_block(batch: int = 1, last: dict[str, object] | None = None, extra_reader: bool = False) -> Model:
    """RRDB's pattern: a1 = lrelu(conv(x)), a2 = lrelu(conv(cat(x, a1))), out = conv(cat(x, a1, a2))."""
    c, g = 8, 4
    nodes = [
        conv("x", "w1", "c1", "b1"),
        helper.make_node("LeakyRelu", ["c1"], ["a1"], alpha=0.2),
        helper.make_node("Concat", ["x", "a1"], ["cat1"], axis=1),
        conv("cat1", "w2", "c2", "b2"),
        helper.make_node("LeakyRelu", ["c2"], ["a2"], alpha=0.2),
        helper.make_node("Concat", ["x", "a1", "a2"], ["cat2"], axis=1),
        conv("cat2", "w3", "c3" if extra_reader else "out", "b3", **(last or {})),
    ]
    if extra_reader:  # the concat is needed as a tensor too: left alone
        nodes += [helper.make_node("Relu", ["cat2"], ["r"]), helper.make_node("ReduceSum", ["r"], ["s"], keepdims=1)]
        nodes += [helper.make_node("Add", ["c3", "s"], ["out"])]
    shapes = {"w1": (g, c, 3, 3), "w2": (g, c + g, 3, 3), "w3": (c, c + 2 * g, 3, 3)}
    inits = {k: RNG.standard_normal(s) * 0.2 for k, s in shapes.items()}
    inits |= {"b1": RNG.standard_normal(g), "b2": RNG.standard_normal(g), "b3": RNG.standard_normal(c)}
    graph = helper.make_graph(
        nodes,
        "dense",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (batch, c, 11, 13))],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()],
    )
    return Model.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10))


def run_both(model: Model) -> tuple[np.ndarray, np.ndarray, Counter[str]]:
    """(ggml's output, onnxruntime's, the ggml op kinds computed)."""
    batch = model.graph.proto.graph.input[0].type.tensor_type.shape.dim[0].dim_value
    feeds = {"x": np.random.default_rng(1).standard_normal((batch, 8, 11, 13)).astype(np.float32)}
    want = ort.InferenceSession(model.graph.to_onnx(model.weights).SerializeToString()).run(None, feeds)[0]
    assert GgmlBackend().check(model.graph).ok
    compiled = sdkit.compile(model, backend="ggml", threads=1)
    got = compiled.run(feeds)["out"]
    nodes = profile_program(compiled.program_for(feeds), feeds, 1).nodes
    kinds = Counter(n.op for n in nodes)
    split = compiled.info["conv_concat"]  # each ConvConcat counted once, split or not
    assert split["split"] + split["concat_conv"] == fused(model)["ConvConcat"]
    kinds["split"] = split["split"]
    return got, want, kinds


def fused(model: Model) -> Counter[str]:
    return Counter(n.op_type for n in apply_passes(model.graph.proto).graph.node)


def test_dense_block_split_matches_onnxruntime(monkeypatch: pytest.MonkeyPatch) -> None:
    model = dense_block()
    ops = fused(model)
    assert ops["ConvConcat"] == 2 and ops["Concat"] == 0
    got, want, kinds = run_both(model)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)
    # x is im2col'd once for its three convs, a1 once for its two: 3 im2cols, no concat
    assert kinds["IM2COL"] == 3 and kinds["CONCAT"] == 0 and kinds["split"] == 2
    monkeypatch.setenv(OFF_ENV, "conv_concat")  # the pass off: Concat + Conv as exported
    assert fused(model)["ConvConcat"] == 0
    off, same, kinds = run_both(model)
    np.testing.assert_array_equal(same, want)
    np.testing.assert_allclose(off, want, rtol=0, atol=2e-5)
    assert kinds["IM2COL"] == 3 and kinds["CONCAT"] == 3  # cat(x, a1); cat(x, a1, a2) in two


@pytest.mark.parametrize(
    ("batch", "last"),
    [
        (2, None),  # batch 2: Concat + Conv
        (1, {"pads": [1, 0, 0, 1]}),  # asymmetric pads: Concat + Conv
        (1, {"strides": [2, 2], "dilations": [2, 1], "pads": [2, 1, 2, 1]}),  # split, another window
    ],
)
def test_other_shapes_match_onnxruntime(batch: int, last: dict[str, object] | None) -> None:
    got, want, kinds = run_both(dense_block(batch, last))
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)
    # three binary concats where both convs fall back, two where only the last does
    assert kinds["CONCAT"] == (0 if batch == 1 and last and "strides" in last else 2 if batch == 1 else 3)


def test_concat_read_elsewhere_is_left_alone() -> None:
    model = dense_block(extra_reader=True)
    assert fused(model)["ConvConcat"] == 1 and fused(model)["Concat"] == 1  # cat1 only
    got, want, _ = run_both(model)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-4)


def test_device_refusing_the_sum_gets_concat_and_conv(monkeypatch: pytest.MonkeyPatch) -> None:
    """A device whose supports_op refuses an ADD of two products (as a GPU backend may refuse
    an operand layout): the split is asked, declined, and the exact lowering is taken."""
    lib = L.load_library()
    real = lib.functions["ggml_backend_supports_op"]
    asked: list[str] = []

    def supports(backend: int, node: int) -> bool:
        op = (lib.ggml_op_desc(node) or b"").decode()
        src = TensorNode.from_address(node).src
        sources = [(lib.ggml_op_desc(s) or b"").decode() for s in src[:2] if s]
        if op == "ADD" and sources == ["MUL_MAT", "MUL_MAT"]:
            asked.append(op)
            return False
        return bool(real(backend, node))

    monkeypatch.setitem(lib.functions, "ggml_backend_supports_op", supports)
    got, want, kinds = run_both(dense_block())
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)
    assert asked and kinds["CONCAT"] == 3 and kinds["split"] == 0  # refused: Concat + Conv


def test_fused_node_domain() -> None:
    node = next(n for n in apply_passes(dense_block().graph.proto).graph.node if n.op_type == "ConvConcat")
    assert node.domain == FUSED_DOMAIN and list(node.input[:3]) == ["x", "w2", "b2"] and node.input[3] == "a1"


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_refit_reslices_the_kernels(precision: str) -> None:
    """The parts' kernel slices are weight transforms: a refit re-slices the new kernel (fp16:
    the F16 slices, against onnxruntime at fp16's tolerance)."""
    model = dense_block()
    x = np.random.default_rng(1).standard_normal((1, 8, 11, 13)).astype(np.float32)
    compiled = sdkit.compile(model, backend="ggml", threads=1, precision=precision)
    compiled.run({"x": x})
    new = {
        k: np.asarray(v) * np.float32(-0.5) if k.startswith("w") else np.asarray(v) for k, v in model.weights.items()
    }
    updated = model.weights.updated(new)
    compiled.refit(updated)
    want = ort.InferenceSession(model.graph.to_onnx(updated).SerializeToString()).run(None, {"x": x})[0]
    got = compiled.run({"x": x})["out"]
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 if precision == "fp32" else 2e-2)
