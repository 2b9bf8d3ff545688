"""A signature's graph is built once: the first run with new input shapes builds it (lowering,
weights, allocation; ``GgmlCompiledModel.builds`` logs each build), every later run with those
shapes reuses it. And the fold that made SD 1.5's first UNet build slow: baddbmm's
``ConstantOfShape * beta`` folds to broadcast views, with the values onnx.reference computes.
(Times are measured in ``benchmarks/ggml_first_call.py``, not here.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import sdkit
from sdkit.model import Model
from sdkit_ggml.compiler.fold import UNIFORM_MIN_ELEMENTS, evaluate_node, is_uniform
from sdkit_ggml.compiler.passes import OFF_ENV

TINY = Path(__file__).resolve().parents[3] / "fixtures" / "tiny_pipeline" / "model"
OPSETS = {"": 17}


def _baddbmm_attention() -> onnx.ModelProto:
    """diffusers' AttnProcessor as torch exports it: scores = zeros[B, q, k] * 0 + (Q @ Kt) * s,
    the zeros' shape taken from the inputs' shapes (so it folds per signature)."""
    shape_q, shape_k = helper.make_node("Shape", ["q"], ["sq"]), helper.make_node("Shape", ["k"], ["sk"])
    nodes = [
        shape_q,
        shape_k,
        helper.make_node("Slice", ["sq", "zero", "two"], ["bq"]),  # [B, q]
        helper.make_node("Slice", ["sk", "one", "two"], ["kn"]),  # [k]
        helper.make_node("Concat", ["bq", "kn"], ["zshape"], axis=0),
        helper.make_node(
            "ConstantOfShape", ["zshape"], ["zeros"], value=numpy_helper.from_array(np.zeros(1, np.float32))
        ),
        helper.make_node("Mul", ["zeros", "beta"], ["bias"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["qk"]),
        helper.make_node("Mul", ["qk", "scale"], ["scaled"]),
        helper.make_node("Add", ["scaled", "bias"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["out"]),
    ]
    inits = [
        numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("zero", [0]), ("one", [1]), ("two", [2]))
    ] + [
        numpy_helper.from_array(np.array(0.0, np.float32), "beta"),
        numpy_helper.from_array(np.array(0.125, np.float32), "scale"),
    ]
    dims = ["B", "Q", 8]
    inputs = [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, d)
        for n, d in (("q", dims), ("k", ["B", "K", 8]), ("v", ["B", "K", 8]))
    ]
    graph = helper.make_graph(
        nodes, "baddbmm", inputs, [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], inits
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _feeds(batch: int, q: int, k: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch * 1000 + q + k)
    return {n: rng.standard_normal((batch, s, 8)).astype(np.float32) for n, s in (("q", q), ("k", k), ("v", k))}


@pytest.mark.parametrize("passes_off", ["", "attention"])  # fused or not, the zeros fold either way
def test_each_signature_builds_once_and_matches_onnxruntime(passes_off: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(OFF_ENV, passes_off)
    proto = _baddbmm_attention()
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    compiled = sdkit.compile(Model.from_proto(proto), backend="ggml", device="cpu")
    big, small = _feeds(4, 64, 64), _feeds(2, 16, 24)  # big: zeros of 4*64*64 elements, a broadcast view
    assert UNIFORM_MIN_ELEMENTS <= 4 * 64 * 64
    for feeds, builds in ((big, 1), (big, 1), (small, 2), (big, 2), (small, 2)):
        out = compiled.run(feeds)["out"]
        assert len(compiled.builds) == builds
        expected = session.run(["out"], feeds)[0]
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    first, second = compiled.builds
    assert [{n: shape for n, shape, _ in b.signature}["q"] for b in (first, second)] == [(4, 64, 8), (2, 16, 8)]
    assert {"lower", "graph", "weights", "allocate"} <= set(first.seconds)
    assert first.nodes > 0
    compiled.close()


@pytest.mark.parametrize("fill", [0.0, -2.5])
def test_constant_of_shape_and_elementwise_fold_to_the_reference_values(fill: float) -> None:
    shape = np.array([4, 32, 64], np.int64)  # 8192 elements: folded as a broadcast view
    value = numpy_helper.from_array(np.array([fill], np.float32))
    zeros = helper.make_node("ConstantOfShape", ["shape"], ["c"], value=value)
    (c,) = evaluate_node(zeros, [shape], OPSETS)
    assert is_uniform(c) and c.shape == (4, 32, 64) and c.dtype == np.float32
    full = np.full((4, 32, 64), fill, np.float32)
    np.testing.assert_array_equal(c, full)
    beta = np.array(3.0, np.float32)
    cases = [
        (helper.make_node("Mul", ["c", "beta"], ["y"]), [c, beta], [full, beta]),
        (helper.make_node("Sub", ["beta", "c"], ["y"]), [beta, c], [beta, full]),
        (helper.make_node("Sqrt", ["c"], ["y"]), [c], [full]),
        (helper.make_node("Cast", ["c"], ["y"], to=TensorProto.FLOAT16), [c], [full]),
        (helper.make_node("Equal", ["c", "beta"], ["y"]), [c, beta], [full, beta]),
    ]
    for node, args, materialised in cases:
        (got,) = evaluate_node(node, args, OPSETS)
        feeds = dict(zip(node.input, materialised, strict=True))
        graph = helper.make_graph(
            [node],
            "oracle",
            [
                helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
                for n, a in feeds.items()
            ],
            [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)],
        )
        (expected,) = ReferenceEvaluator(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])).run(
            None, feeds
        )
        assert is_uniform(got), node.op_type
        assert got.dtype == expected.dtype and got.shape == expected.shape
        np.testing.assert_array_equal(got, expected)  # NaN (sqrt of a negative) equal to NaN


def test_small_and_mixed_constants_fold_as_arrays() -> None:
    small = helper.make_node("ConstantOfShape", ["shape"], ["c"])
    (c,) = evaluate_node(small, [np.array([2, 3], np.int64)], OPSETS)
    assert not is_uniform(c) and c.flags.writeable
    (big,) = evaluate_node(small, [np.array([64, 64, 2], np.int64)], OPSETS)
    ramp = np.arange(64 * 64 * 2, dtype=np.float32).reshape(64, 64, 2)
    (mixed,) = evaluate_node(helper.make_node("Add", ["c", "r"], ["y"]), [big, ramp], OPSETS)
    assert not is_uniform(mixed)
    np.testing.assert_array_equal(mixed, ramp)


@pytest.mark.skipif(not TINY.is_dir(), reason="fixtures/tiny_pipeline is not in this checkout")
def test_a_pipeline_builds_each_component_once_across_steps_cfg_and_calls() -> None:
    from sdkit.pipelines.loaders.loading import load_pipeline

    with load_pipeline(TINY, backend="ggml", device="cpu", threads=1) as pipe:
        for _ in range(2):
            pipe.generate(prompt="a photo of a cat", width=32, height=32, steps=3, seed=1, guidance_scale=7.5)
        builds = {name: len(c.compiled.builds) for name, c in pipe.components.items() if c.compiled is not None}
        assert builds == {"text_encoder": 1, "unet": 1, "vae_decoder": 1}
        unet = pipe.components["unet"].compiled
        assert unet is not None
        (signature,) = unet.signatures
        assert {name: shape for name, shape, _ in signature}["sample"][0] == 2  # CFG: one batch-2 run
        pipe.generate(prompt="a photo of a cat", width=48, height=32, steps=2, seed=1, guidance_scale=7.5)
        builds = {name: len(c.compiled.builds) for name, c in pipe.components.items() if c.compiled is not None}
        assert builds == {"text_encoder": 1, "unet": 2, "vae_decoder": 2}  # a new size: one build each


def test_nodes_differing_only_in_names_share_one_evaluator() -> None:
    from sdkit_ggml.compiler.fold import _evaluator

    x = np.arange(6, dtype=np.int64).reshape(2, 3)
    axes = np.array([0], np.int64)
    first = helper.make_node("Unsqueeze", ["a", "axes"], ["b"], name="first")
    second = helper.make_node("Unsqueeze", ["shape_17", "axes_3"], ["t912"], name="second")
    before = _evaluator.cache_info()
    (one,) = evaluate_node(first, [x, axes], OPSETS)
    (two,) = evaluate_node(second, [x + 1, axes], OPSETS)
    after = _evaluator.cache_info()
    assert after.hits + after.misses == before.hits + before.misses + 2 and after.hits >= before.hits + 1
    np.testing.assert_array_equal(one, np.expand_dims(x, 0))
    np.testing.assert_array_equal(two, np.expand_dims(x + 1, 0))
    # one value read twice, and an absent optional input
    (square,) = evaluate_node(helper.make_node("Mul", ["v", "v"], ["w"]), [x, x], OPSETS)
    np.testing.assert_array_equal(square, x * x)
    (clipped,) = evaluate_node(
        helper.make_node("Clip", ["v", "", "hi"], ["w"]), [x, None, np.array(3, np.int64)], OPSETS
    )
    np.testing.assert_array_equal(clipped, np.minimum(x, 3))


def test_prepare_builds_without_computing_and_the_first_run_reuses_it() -> None:
    from sdkit.errors import InputError

    proto = _baddbmm_attention()
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    compiled = sdkit.compile(Model.from_proto(proto), backend="ggml", device="cpu")
    assert compiled.prepare({"q": (2, 16, 8), "k": (2, 24, 8), "v": (2, 24, 8)}) is True
    assert len(compiled.builds) == 1
    program = compiled.program_for(_feeds(2, 16, 24))
    assert program.runs == 0  # built, never computed
    feeds = _feeds(2, 16, 24)
    np.testing.assert_allclose(compiled.run(feeds)["out"], session.run(["out"], feeds)[0], rtol=1e-5, atol=1e-6)
    assert len(compiled.builds) == 1 and program.runs == 1
    with pytest.raises(InputError, match="a shape for each input"):
        compiled.prepare({"q": (2, 16, 8)})
    with pytest.raises(InputError, match="rank"):
        compiled.prepare({"q": (2, 16), "k": (2, 24, 8), "v": (2, 24, 8)})
    compiled.close()


def test_a_constant_of_shape_over_the_memory_budget_is_still_refused() -> None:
    from sdkit.limits import set_memory_budget
    from sdkit_ggml.compiler.context import Unsupported

    node = helper.make_node("ConstantOfShape", ["shape"], ["c"])
    set_memory_budget("1M")
    try:
        (fits,) = evaluate_node(node, [np.array([256, 256], np.int64)], OPSETS)  # 256 KB
        assert is_uniform(fits)
        with pytest.raises(Unsupported, match="constant folding failed"):
            evaluate_node(node, [np.array([1 << 30, 1 << 30, 1 << 20], np.int64)], OPSETS)  # 2^80 elements
    finally:
        set_memory_budget(None)
