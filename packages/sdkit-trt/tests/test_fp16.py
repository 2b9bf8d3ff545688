"""fp16 graph conversion, checked by running converted graphs on independent runtimes.

Oracles: onnxruntime CPU on the original fp32 graph, against onnxruntime CPU (which keeps
fp16 tensors between ops) and onnx.reference (numpy computing in float16) on the converted
graph. Tolerances are fp16's: half-precision epsilon is 9.8e-4, so a few 1e-3 on O(1) values.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from trt_helpers import run_ort

from sdkit.errors import UnsupportedModelError
from sdkit.model import Model, load_onnx
from sdkit_trt.fp16 import FP16_MAX, convert_graph, to_fp16

rng = np.random.default_rng(1234)


def model_of(
    nodes: list[onnx.NodeProto], inputs: dict[str, np.ndarray], outputs: list[str], inits: dict[str, np.ndarray]
) -> Model:
    graph = helper.make_graph(
        nodes,
        "t",
        [
            helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
            for n, a in inputs.items()
        ],
        [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None) for n in outputs],
        initializer=[numpy_helper.from_array(a, n) for n, a in inits.items()],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return Model.from_proto(onnx.shape_inference.infer_shapes(proto, strict_mode=True))


def converted(model: Model) -> tuple[onnx.ModelProto, object]:
    plan = convert_graph(model.graph)
    proto = plan.graph.to_onnx(plan.convert_weights(model.weights))
    onnx.checker.check_model(proto, full_check=True)
    return proto, plan


def dtypes_of(proto: onnx.ModelProto) -> dict[str, int]:
    inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=True)
    out = {t.name: t.data_type for t in inferred.graph.initializer}
    for vi in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        out[vi.name] = vi.type.tensor_type.elem_type
    return out


def test_conv_weights_become_fp16_and_io_stays_fp32() -> None:
    x = rng.standard_normal((1, 8, 12, 12)).astype(np.float32)
    w = (rng.standard_normal((16, 8, 3, 3)) * 0.2).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    model = model_of(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])], {"x": x}, ["y"], {"w": w, "b": b}
    )
    proto, _ = converted(model)
    types = dtypes_of(proto)
    assert types["w"] == types["b"] == TensorProto.FLOAT16
    assert proto.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert proto.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    want = run_ort(model.graph.to_onnx(model.weights), {"x": x})[0]
    got_ort = run_ort(proto, {"x": x})[0]
    got_ref = ReferenceEvaluator(proto).run(None, {"x": x})[0]
    assert got_ort.dtype == got_ref.dtype == np.float32
    scale = float(np.abs(want).max())  # ~10: a 72-term dot product of N(0, 0.2) weights
    np.testing.assert_allclose(got_ort, want, atol=2e-3 * scale)
    np.testing.assert_allclose(got_ref, want, atol=2e-3 * scale)


def test_resize_scales_stay_fp32() -> None:
    x = rng.standard_normal((1, 2, 4, 4)).astype(np.float32)
    w = rng.standard_normal((2, 2, 1, 1)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"]),
        helper.make_node("Resize", ["c", "roi", "scales"], ["y"], mode="nearest"),
    ]
    inits = {"w": w, "roi": np.array([], np.float32), "scales": np.array([1, 1, 2, 2], np.float32)}
    model = model_of(nodes, {"x": x}, ["y"], inits)
    proto, _ = converted(model)
    types = dtypes_of(proto)
    assert types["scales"] == TensorProto.FLOAT
    assert types["w"] == TensorProto.FLOAT16
    resize = next(n for n in proto.graph.node if n.op_type == "Resize")
    assert types[resize.input[0]] == TensorProto.FLOAT16  # the data itself is fp16
    want = run_ort(model.graph.to_onnx(model.weights), {"x": x})[0]
    np.testing.assert_allclose(run_ort(proto, {"x": x})[0], want, atol=5e-3)


def test_normalisation_runs_in_fp32_where_fp16_would_overflow() -> None:
    # Activations of magnitude ~300: the variance (~9e4) exceeds fp16's 65504.
    x = (rng.standard_normal((1, 4, 8, 8)) * 300).astype(np.float32)
    w = (rng.standard_normal((4, 4, 1, 1)) * 0.5).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"]),
        helper.make_node("InstanceNormalization", ["c", "scale", "bias"], ["n"]),
        helper.make_node("Relu", ["n"], ["y"]),
    ]
    inits = {"w": w, "scale": np.ones(4, np.float32), "bias": np.zeros(4, np.float32)}
    model = model_of(nodes, {"x": x}, ["y"], inits)
    proto, plan = converted(model)
    types = dtypes_of(proto)
    norm = next(n for n in proto.graph.node if n.op_type == "InstanceNormalization")
    assert [types[i] for i in norm.input] == [TensorProto.FLOAT] * 3
    assert plan.kept_fp32_nodes == [norm.name or "InstanceNormalization"]  # type: ignore[attr-defined]
    want = run_ort(model.graph.to_onnx(model.weights), {"x": x})[0]
    got = ReferenceEvaluator(proto).run(None, {"x": x})[0]
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, atol=3e-3)


def test_shape_arithmetic_stays_fp32() -> None:
    # Shape -> Cast(float) -> Mul(0.5) -> Cast(int64) -> Reshape target: exact integer math.
    x = rng.standard_normal((1, 4, 6, 8)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"]),
        helper.make_node("Shape", ["c"], ["s"]),
        helper.make_node("Cast", ["s"], ["sf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["sf", "factor"], ["half"]),
        helper.make_node("Cast", ["half"], ["target"], to=TensorProto.INT64),
        helper.make_node("ReduceProd", ["target"], ["n"], keepdims=1),
        helper.make_node("Reshape", ["c", "flat"], ["y"]),
    ]
    inits = {
        "w": rng.standard_normal((4, 4, 1, 1)).astype(np.float32),
        "factor": np.array([1, 1, 1, 1], np.float32),
        "flat": np.array([1, -1], np.int64),
    }
    model = model_of(nodes, {"x": x}, ["y", "n"], inits)
    proto, _ = converted(model)
    types = dtypes_of(proto)
    assert types["sf"] == types["half"] == TensorProto.FLOAT
    assert types["factor"] == TensorProto.FLOAT
    got = run_ort(proto, {"x": x})
    want = run_ort(model.graph.to_onnx(model.weights), {"x": x})
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_allclose(got[0], want[0], atol=5e-3)


def test_weight_read_at_both_precisions_gets_an_fp16_twin() -> None:
    x = rng.standard_normal((2, 3)).astype(np.float32)
    w = rng.standard_normal((3, 3)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),  # heavy: reads w in fp16
        helper.make_node("ReduceSum", ["w"], ["ws"], keepdims=0),  # keep-fp32: reads w in fp32
        helper.make_node("Add", ["m", "ws"], ["y"]),
    ]
    model = model_of(nodes, {"x": x}, ["y"], {"w": w})
    proto, plan = converted(model)
    assert plan.fp16_weights == {"w__fp16": "w"}  # type: ignore[attr-defined]
    types = dtypes_of(proto)
    assert types["w"] == TensorProto.FLOAT
    assert types["w__fp16"] == TensorProto.FLOAT16
    want = run_ort(model.graph.to_onnx(model.weights), {"x": x})[0]
    np.testing.assert_allclose(run_ort(proto, {"x": x})[0], want, atol=1e-2)


def producers_of(proto: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {o: n for n in proto.graph.node for o in n.output}


def test_transposed_linear_weight_becomes_fp16_without_a_cast() -> None:
    # torch's Linear exported: MatMul(x, Transpose(W)) + b, W in torch's [out, in] layout.
    x = rng.standard_normal((4, 32)).astype(np.float32)
    w = (rng.standard_normal((16, 32)) * 0.2).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    nodes = [
        helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
        helper.make_node("MatMul", ["x", "wt"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["y"]),
    ]
    model = model_of(nodes, {"x": x}, ["y"], {"w": w, "b": b})
    proto, plan = converted(model)
    assert plan.fp16_weights == {"w": "w", "b": "b"}  # type: ignore[attr-defined]
    types = dtypes_of(proto)
    assert types["w"] == types["wt"] == types["b"] == TensorProto.FLOAT16
    matmul = next(n for n in proto.graph.node if n.op_type == "MatMul")
    transpose = producers_of(proto)[matmul.input[1]]
    assert transpose.op_type == "Transpose" and list(transpose.input) == ["w"]  # no Cast on the way
    assert [n.input[0] for n in proto.graph.node if n.op_type == "Cast"] == ["x", "y__fp16"]
    want = run_ort(model.graph.to_onnx(model.weights), {"x": x})[0]
    scale = float(np.abs(want).max())  # ~4: a 32-term dot product of N(0, 0.2) weights
    np.testing.assert_allclose(run_ort(proto, {"x": x})[0], want, atol=2e-3 * scale)
    np.testing.assert_allclose(ReferenceEvaluator(proto).run(None, {"x": x})[0], want, atol=2e-3 * scale)
    # Refit: a new W, converted by name through the same plan, is what the graph computes with.
    new = model.weights.updated({"w": (rng.standard_normal((16, 32)) * 0.2).astype(np.float32)})
    engine_weights = plan.convert_weights(new)  # type: ignore[attr-defined]
    assert engine_weights["w"].dtype == np.float16 and plan.source_of("w") == "w"  # type: ignore[attr-defined]
    want = run_ort(model.graph.to_onnx(new), {"x": x})[0]
    np.testing.assert_allclose(run_ort(plan.graph.to_onnx(engine_weights), {"x": x})[0], want, atol=2e-3 * scale)  # type: ignore[attr-defined]


def test_weight_layout_chains_twins_and_shape_reads() -> None:
    # v: read through Transpose by a MatMul (fp16) and by a ReduceSum (float32): twin, and the
    # Transpose gets an fp16 twin node. p: Reshape -> Slice (SD3's cropped pos_embed), read by
    # an fp16 Add and by Shape (which needs no precision): fp16 in place, no twin.
    x = rng.standard_normal((4, 8)).astype(np.float32)
    inits: dict[str, np.ndarray] = {
        "v": (rng.standard_normal((8, 8)) * 0.3).astype(np.float32),
        "p": rng.standard_normal((1, 16, 8)).astype(np.float32),
        "shape": np.array([16, 8], np.int64),
        "start": np.array([2], np.int64),
        "end": np.array([6], np.int64),
    }
    nodes = [
        helper.make_node("Transpose", ["v"], ["vt"]),
        helper.make_node("MatMul", ["x", "vt"], ["m"]),
        helper.make_node("ReduceSum", ["vt"], ["s"], keepdims=0),
        helper.make_node("Reshape", ["p", "shape"], ["p2"]),
        helper.make_node("Slice", ["p2", "start", "end"], ["p3"]),
        helper.make_node("Shape", ["p3"], ["sh"]),
        helper.make_node("Add", ["m", "p3"], ["a"]),
        helper.make_node("Add", ["a", "s"], ["y"]),
    ]
    model = model_of(nodes, {"x": x}, ["y", "sh"], inits)
    proto, plan = converted(model)
    assert plan.fp16_weights == {"v__fp16": "v", "p": "p"}  # type: ignore[attr-defined]
    assert {plan.source_of(n) for n in plan.graph.initializer_names} == set(inits)  # type: ignore[attr-defined]
    types = dtypes_of(proto)
    assert types["v"] == types["vt"] == TensorProto.FLOAT
    assert types["v__fp16"] == types["vt__fp16"] == TensorProto.FLOAT16
    assert types["p"] == types["p2"] == types["p3"] == TensorProto.FLOAT16
    made = producers_of(proto)
    assert list(made["vt"].input) == ["v"] and list(made["vt__fp16"].input) == ["v__fp16"]
    assert next(n for n in proto.graph.node if n.op_type == "MatMul").input[1] == "vt__fp16"
    assert next(n for n in proto.graph.node if n.op_type == "ReduceSum").input[0] == "vt"
    assert next(n for n in proto.graph.node if n.op_type == "Shape").input[0] == "p3"
    assert {n.input[0] for n in proto.graph.node if n.op_type == "Cast"} == {"x", "s", "y__fp16"}  # activations
    want = run_ort(model.graph.to_onnx(model.weights), {"x": x})
    got = run_ort(proto, {"x": x})
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_allclose(got[0], want[0], atol=1e-2)  # |y| up to ~10 (s sums 64 weights)


SHIPPED_FP16 = [  # (graph, share of float parameters that must be fp16 under precision="fp16")
    ("flux_dev_transformer", 0.999),  # measured 100%: 11.90B params (was 27.6%: 8.62B float32)
    ("chroma_transformer", 0.999),  # measured 100%: 8.90B (was 0.02%: 8.90B float32)
    ("sd3_medium_transformer", 0.999),  # measured 100%: 2.09B (was 32.8%: 1.40B float32)
    # measured 97.24%: the 131.6M token embedding stays float32 (Gather into the float32
    # RMS norm); was 0.004% (4.76B float32)
    ("t5xxl_encoder", 0.97),
]


@pytest.mark.parametrize(("name", "share"), SHIPPED_FP16)
def test_shipped_graphs_linear_weights_become_fp16(name: str, share: float) -> None:
    """The full-size weightless graphs read torch-layout Linear weights as MatMul(x, Transpose(W)):
    those weights must reach TensorRT as fp16, with no Cast between weight and MatMul."""
    from sdkit.families.shipped import load_graph

    graph = load_graph(name)
    plan = convert_graph(graph)  # type-checks, or it raises
    out = {t.name: t.data_type for t in plan.graph.proto.graph.initializer}
    sizes = {t.name: int(np.prod(t.dims)) for t in graph.proto.graph.initializer if t.data_type == TensorProto.FLOAT}
    fp16 = sum(n for name_, n in sizes.items() if out[name_] == TensorProto.FLOAT16)
    print(f"{name}: {fp16 / sum(sizes.values()):.4%} of {sum(sizes.values()):,} float parameters fp16")
    assert fp16 / sum(sizes.values()) >= share
    nodes, made = plan.graph.proto.graph.node, producers_of(plan.graph.proto)
    linears = [n for n in nodes if n.op_type == "MatMul" and n.input[1] in made]
    weights = [made[n.input[1]].input[0] for n in linears if made[n.input[1]].op_type == "Transpose"]
    weights = [w for w in weights if w in sizes]  # not attention's K^T (an activation)
    assert len(weights) >= 100 and all(out[w] == TensorProto.FLOAT16 for w in weights)
    flips = {n.output[0] for n in nodes if n.op_type == "Transpose" and n.input[0] in sizes}
    assert not [n.name for n in nodes if n.op_type == "Cast" and n.input[0] in flips]  # no Cast on the way


def test_float_constants_and_pre_conv_math_follow_the_rules() -> None:
    # Mul by a Constant before the first Conv stays fp32 (graph input zone); after it, fp16.
    x = rng.standard_normal((1, 2, 5, 5)).astype(np.float32)
    half = numpy_helper.from_array(np.array(0.5, np.float32), "k")
    nodes = [
        helper.make_node("Constant", [], ["k"], value=half),
        helper.make_node("Mul", ["x", "k"], ["xs"]),
        helper.make_node("Conv", ["xs", "w"], ["c"]),
        helper.make_node("Mul", ["c", "k"], ["y"]),
    ]
    model = model_of(nodes, {"x": x}, ["y"], {"w": rng.standard_normal((2, 2, 3, 3)).astype(np.float32)})
    proto, _ = converted(model)
    types = dtypes_of(proto)
    assert types["xs"] == TensorProto.FLOAT
    assert types["k"] == TensorProto.FLOAT
    assert types["k__fp16"] == TensorProto.FLOAT16
    want = run_ort(model.graph.to_onnx(model.weights), {"x": x})[0]
    np.testing.assert_allclose(run_ort(proto, {"x": x})[0], want, atol=5e-3)


def test_control_flow_is_refused_clearly() -> None:
    then = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])],
    )
    other = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])],
    )
    nodes = [helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)]
    model = model_of(nodes, {"x": np.ones(2, np.float32), "cond": np.array(True)}, ["y"], {})
    with pytest.raises(UnsupportedModelError, match="control flow"):
        convert_graph(model.graph)


def test_a_conversion_that_does_not_type_check_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from sdkit_trt import fp16

    x = rng.standard_normal((1, 2, 4, 4)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Add", ["c", "x"], ["y"])]
    model = model_of(nodes, {"x": x}, ["y"], {"w": rng.standard_normal((2, 2, 1, 1)).astype(np.float32)})
    real = fp16._elem_types

    def blind(proto: onnx.ModelProto) -> dict[str, int]:  # as if inference could not type "x"
        types = real(proto)
        types.pop("x")
        return types

    monkeypatch.setattr(fp16, "_elem_types", blind)
    with pytest.raises(UnsupportedModelError, match="does not type-check"):
        convert_graph(model.graph)


def test_to_fp16_clips_to_range_and_keeps_inf_nan() -> None:
    out = to_fp16(np.array([1e6, -1e6, np.inf, np.nan, 1.0], np.float32))
    assert out.dtype == np.float16
    assert out[0] == FP16_MAX
    assert out[1] == -FP16_MAX
    assert np.isposinf(out[2])
    assert np.isnan(out[3])
    assert out[4] == 1


def test_taef2_decoder_fp16_matches_fp32(taef2: Path) -> None:
    model = load_onnx(taef2 / "taef2_decoder.onnx")
    latent = np.load(taef2 / "dog_latent_torch.npy")
    graph = model.graph.with_input_shapes({"latent": (1, 32, 16, 16)})
    plan = convert_graph(graph)
    proto = plan.graph.to_onnx(plan.convert_weights(model.weights))
    onnx.checker.check_model(proto, full_check=True)
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("Conv") == 41
    assert len(plan.kept_fp32_nodes) == ops.count("InstanceNormalization") == 3
    conv_weights = {n.input[1] for n in proto.graph.node if n.op_type == "Conv"}
    assert all(plan.fp16_weights.get(w) is not None for w in conv_weights)
    feeds = {"latent": np.ascontiguousarray(latent[:, :, :16, :16])}
    want = run_ort(graph.to_onnx(model.weights), feeds)[0]
    got = run_ort(proto, feeds)[0]
    assert got.dtype == np.float32
    assert got.shape == want.shape == (1, 3, 128, 128)
    # The weights were trained in fp16 (exact in fp16); measured max |diff| 1.8e-5 here.
    np.testing.assert_allclose(got, want, atol=2e-3)


def test_taef2_decoder_fp16_arithmetic_on_reference(taef2: Path) -> None:
    """onnx.reference computes every op in float16: the real rounding of an fp16 engine."""
    model = load_onnx(taef2 / "taef2_decoder.onnx")
    latent = np.ascontiguousarray(np.load(taef2 / "dog_latent_torch.npy")[:, :, 20:24, 20:24])
    graph = model.graph.with_input_shapes({"latent": (1, 32, 4, 4)})
    plan = convert_graph(graph)
    proto = plan.graph.to_onnx(plan.convert_weights(model.weights))
    want = run_ort(graph.to_onnx(model.weights), {"latent": latent})[0]
    got = ReferenceEvaluator(proto).run(None, {"latent": latent})[0]
    # Measured max |diff| 5.4e-4 at 8x8 latents (image values in [0, 1]); bound at 4e-3.
    np.testing.assert_allclose(got, want, atol=4e-3)


@pytest.mark.parametrize("name", ["tiny_unet", "tiny_clip_text"])
def test_sd_architectures_fp16_match_fp32(name: str) -> None:
    """Real SD graphs (random weights) from the repository's fixtures: timestep embedding
    (Sin/Cos), attention (MatMul/Softmax), GroupNorm/LayerNorm, int64 token ids, Range."""
    import sys

    from trt_helpers import REPO

    sys.path.insert(0, str(REPO / "fixtures"))
    try:
        import sd_graphs  # type: ignore[import-not-found]

        proto = sd_graphs.load_model(name, seed=0)
        feeds = sd_graphs.example_inputs(name)
    except Exception as exc:  # fixtures not in this checkout
        pytest.skip(f"fixture {name} unavailable: {exc}")
    finally:
        sys.path.remove(str(REPO / "fixtures"))
    model = Model.from_proto(proto)
    graph = model.graph.with_input_shapes({k: v.shape for k, v in feeds.items()})
    plan = convert_graph(graph)
    converted_proto = plan.graph.to_onnx(plan.convert_weights(model.weights))
    onnx.checker.check_model(converted_proto, full_check=True)
    want = run_ort(graph.to_onnx(model.weights), feeds)
    got = run_ort(converted_proto, feeds)
    for a, b in zip(want, got, strict=True):
        assert b.dtype == a.dtype
        # Measured: tiny_unet 1.5e-3 (outputs up to 1.5), tiny_clip_text 1.8e-3 (up to 2.5).
        np.testing.assert_allclose(b, a, atol=1e-2)
