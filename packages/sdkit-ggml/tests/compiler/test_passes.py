"""compiler/passes.py: each pass finds the exported pattern, the rewritten graph runs on ggml
within tolerance of onnxruntime on the original graph (the oracle), check() accepts it, and
SDKIT_GGML_PASSES_OFF switches passes off."""

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
from sdkit_ggml.compiler.passes import OFF_ENV, PASS_NAMES, apply_passes, disabled_passes

ort = pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(0)


def const(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value), name + "_v"))


def model_of(nodes: list[onnx.NodeProto], inputs: dict[str, tuple[int, ...]], inits: dict[str, np.ndarray]) -> Model:
    graph = helper.make_graph(
        nodes,
        "pattern",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()],
    )
    return Model.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10))


def group_norm_silu() -> tuple[Model, dict[str, np.ndarray]]:
    """torch's GroupNorm(4, 8) + SiLU export, diffusers' ``/ output_scale_factor`` (1.0), a Relu."""
    nodes = [
        const("shape", np.array([0, 4, -1], np.int64)),
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        const("ones", np.ones(4, np.float32)),
        const("zeros", np.zeros(4, np.float32)),
        helper.make_node("InstanceNormalization", ["r", "ones", "zeros"], ["n"], epsilon=1e-6),
        helper.make_node("Shape", ["x"], ["xs"]),
        helper.make_node("Reshape", ["n", "xs"], ["back"]),
        helper.make_node("Mul", ["back", "gamma"], ["scaled"]),
        helper.make_node("Add", ["scaled", "beta"], ["affine"]),
        helper.make_node("Sigmoid", ["affine"], ["sig"]),
        helper.make_node("Mul", ["affine", "sig"], ["act"]),
        const("one", np.array([1.0], np.float32)),
        helper.make_node("Div", ["act", "one"], ["d"]),
        helper.make_node("Relu", ["d"], ["out"]),
    ]
    inits = {"gamma": RNG.standard_normal((8, 1, 1)), "beta": RNG.standard_normal((8, 1, 1))}
    model = model_of(nodes, {"x": (2, 8, 5, 6)}, inits)
    return model, {"x": RNG.standard_normal((2, 8, 5, 6)).astype(np.float32)}


def attention(rank: int) -> tuple[Model, dict[str, np.ndarray]]:
    """diffusers' baddbmm attention as exported: scores * scale + zeros * 0, Softmax, MatMul."""
    batch = (2, 3) if rank == 4 else (6,)
    q_shape, kv_shape = (*batch, 10, 8), (*batch, 7, 8)
    perm = [0, 1, 3, 2] if rank == 4 else [0, 2, 1]
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=perm),
        helper.make_node("MatMul", ["q", "kt"], ["scores"]),
        const("scale", np.array(8**-0.5, np.float32)),
        helper.make_node("Mul", ["scores", "scale"], ["scaled"]),
        const("zshape", np.array([*batch, 10, 7], np.int64)),
        helper.make_node("ConstantOfShape", ["zshape"], ["empty"]),
        const("beta", np.array(0.0, np.float32)),
        helper.make_node("Mul", ["empty", "beta"], ["zero"]),
        helper.make_node("Add", ["scaled", "zero"], ["biased"]),
        helper.make_node("Cast", ["biased"], ["c1"], to=TensorProto.FLOAT),
        helper.make_node("Softmax", ["c1"], ["probs"], axis=-1),
        helper.make_node("Cast", ["probs"], ["c2"], to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["c2", "v"], ["out"]),
    ]
    shapes = {"q": q_shape, "k": kv_shape, "v": kv_shape}
    feeds = {n: RNG.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    return model_of(nodes, shapes, {}), feeds


def fused_ops(model: Model) -> Counter[str]:
    return Counter(n.op_type for n in apply_passes(model.graph.proto).graph.node if n.domain == FUSED_DOMAIN)


def rel_l2(model: Model, feeds: dict[str, np.ndarray]) -> float:
    session = ort.InferenceSession(model.graph.to_onnx(model.weights).SerializeToString())
    want = session.run(None, feeds)[0]
    assert GgmlBackend().check(model.graph).ok
    got = sdkit.compile(model, backend="ggml", threads=1).run(feeds)["out"]
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def test_group_norm_silu_fused_and_exact() -> None:
    model, feeds = group_norm_silu()
    assert fused_ops(model) == {"GroupNorm": 1}
    kept = [n.op_type for n in apply_passes(model.graph.proto).graph.node if n.op_type != "Constant"]
    assert kept == ["GroupNorm", "Relu"]  # the Div by 1, Shape and the rest are gone
    assert rel_l2(model, feeds) <= 1e-5


@pytest.mark.parametrize("rank", [3, 4])
def test_attention_fused_to_flash_attention(rank: int) -> None:
    model, feeds = attention(rank)
    assert fused_ops(model) == {"Attention": 1}
    fused = next(n for n in apply_passes(model.graph.proto).graph.node if n.op_type == "Attention")
    assert list(fused.input) == ["q", "k", "v"]  # the Transpose of K is folded in
    assert rel_l2(model, feeds) <= 1e-5


def test_attention_left_alone_when_scores_are_read_elsewhere() -> None:
    model, _ = attention(3)
    proto = model.graph.proto
    proto.graph.output.append(helper.make_tensor_value_info("probs", TensorProto.FLOAT, None))
    assert "Attention" not in Counter(n.op_type for n in apply_passes(proto).graph.node)


def test_transposes_cancel_and_dead_nodes_go() -> None:
    nodes = [
        helper.make_node("Transpose", ["x"], ["t1"], perm=[0, 2, 3, 1]),
        helper.make_node("Transpose", ["t1"], ["t2"], perm=[0, 3, 1, 2]),
        helper.make_node("Relu", ["t2"], ["out"]),
        helper.make_node("Sigmoid", ["x"], ["unused"]),
    ]
    model = model_of(nodes, {"x": (1, 2, 3, 4)}, {})
    assert [n.op_type for n in apply_passes(model.graph.proto).graph.node] == ["Relu"]
    assert rel_l2(model, {"x": RNG.standard_normal((1, 2, 3, 4)).astype(np.float32)}) == 0.0


def test_composed_transpose_kept_when_not_identity() -> None:
    nodes = [
        helper.make_node("Transpose", ["x"], ["t1"], perm=[0, 2, 3, 1]),
        helper.make_node("Transpose", ["t1"], ["out"], perm=[0, 2, 1, 3]),
    ]
    model = model_of(nodes, {"x": (1, 2, 3, 4)}, {})
    (node,) = apply_passes(model.graph.proto).graph.node
    assert list(node.attribute[0].ints) == [0, 3, 2, 1]
    assert rel_l2(model, {"x": RNG.standard_normal((1, 2, 3, 4)).astype(np.float32)}) == 0.0


def test_passes_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    model, feeds = group_norm_silu()
    monkeypatch.setenv(OFF_ENV, "all")
    assert disabled_passes() == frozenset(PASS_NAMES)
    assert apply_passes(model.graph.proto) is model.graph.proto
    assert rel_l2(model, feeds) <= 1e-5
    monkeypatch.setenv(OFF_ENV, "group_norm, silu")
    assert fused_ops(model) == {}
    monkeypatch.setenv(OFF_ENV, "group_norm")
    assert fused_ops(model) == {"SiLU": 1}
