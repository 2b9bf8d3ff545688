"""``TrtCompiledModel``'s orchestration without a GPU: caching, per-signature engines,
profiles, refit ordering and baked weights.

TensorRT's part is replaced at sdkit-trt's own seams (``build_plan``, ``TrtEngine``, the CUDA
stream): the "plan" is the exact ONNX the parser would have received, and the "engine"
runs, on onnxruntime CPU, the exact ONNX the parser-refitter received at its last refit. So
these tests check what sdkit-trt hands to TensorRT (graph, fp16 conversion, weights, refit
sets) and how it manages engines; TensorRT's own numbers are checked by the gpu tests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from trt_helpers import run_ort

from sdkit.errors import InputError
from sdkit.model import Model, load_onnx
from sdkit.options import make_options
from sdkit_trt import compiled as compiled_module
from sdkit_trt.backend import TensorRTBackend
from sdkit_trt.compiled import TrtCompiledModel
from sdkit_trt.driver import Gpu
from sdkit_trt.onnx_source import OnnxSource
from sdkit_trt.runtime import RuntimeInfo
from sdkit_trt.shapes import parse_profiles

GPU = Gpu(0, "NVIDIA GeForce RTX 3060", (8, 6), 12 * 2**30)
RTX = RuntimeInfo("tensorrt_rtx", "1.7.1.116")


def _model_bytes(source: OnnxSource) -> bytes:
    if source.path:
        return onnx.load(source.path, load_external_data=True).SerializeToString()
    return source.data


class OrtEngine:
    """Stands in for TensorRT's engine: float initializers are "refittable" (as TensorRT
    exposes Conv/MatMul weights), integer ones are folded in (as shape constants are).
    ``refittable_types`` is patched to model an engine that does or does not expose fp8 weights."""

    refittable_types: tuple[int, ...] = (TensorProto.FLOAT, TensorProto.FLOAT16)

    def __init__(self, trt: Any, plan: bytes, is_rtx: bool, runtime_cache: Path | None) -> None:
        self.plan = onnx.load_from_string(plan)
        self.model: onnx.ModelProto | None = None
        self.refits = 0

    def refittable_names(self) -> list[str]:
        return [t.name for t in self.plan.graph.initializer if t.data_type in self.refittable_types]

    def refit(self, source: OnnxSource, stream: Any) -> list[str]:
        self.model = onnx.load_from_string(_model_bytes(source))
        self.refits += 1
        return self.refittable_names()

    def execute(self, feeds: dict[str, np.ndarray], stream: Any) -> dict[str, np.ndarray]:
        assert self.model is not None, "executed before any refit: a stripped plan has no weights"
        outputs = run_ort(self.model, feeds)
        return {o.name: r for o, r in zip(self.model.graph.output, outputs, strict=True)}

    def save_runtime_cache(self) -> None:
        pass

    def close(self) -> None:
        pass


class NoStream:
    ptr = 0

    def synchronize(self) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.fixture
def ort_engine(monkeypatch: pytest.MonkeyPatch, sdkit_isolated: Path) -> list[bytes]:
    built: list[bytes] = []

    def build_plan(trt: Any, source: OnnxSource, **kwargs: Any) -> bytes:
        data = _model_bytes(source)
        built.append(data)
        return data

    monkeypatch.setattr(compiled_module, "build_plan", build_plan)
    monkeypatch.setattr(compiled_module, "TrtEngine", OrtEngine)
    monkeypatch.setattr(compiled_module, "Stream", NoStream)
    monkeypatch.setattr(compiled_module, "set_device", lambda ordinal: None)
    return built


def conv_reshape_model(weight: float = 1.0, target: tuple[int, int] = (1, -1)) -> Model:
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node("Reshape", ["c", "shape"], ["y"])]
    inits = {
        "w": np.full((2, 3, 1, 1), weight, np.float32),
        "b": np.array([0.5, -0.5], np.float32),
        "shape": np.array(target, np.int64),
    }
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(a, n) for n, a in inits.items()],
    )
    return Model.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def compile_with(model: Model, **options: Any) -> TrtCompiledModel:
    opts = make_options(options, TensorRTBackend.extra_options)
    profiles = parse_profiles(opts.extra.get("profiles", {}), model.graph.inputs)
    return TrtCompiledModel(
        trt=None, runtime=RTX, gpu=GPU, graph=model.graph, weights=model.weights, options=opts, profiles=profiles
    )  # type: ignore[arg-type]


def reference(model: Model, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return run_ort(model.graph.to_onnx(model.weights), feeds)[0]


def test_engines_per_signature_cached_and_refit_on_load(ort_engine: list[bytes]) -> None:
    model = conv_reshape_model()
    feeds = {n: {"x": np.random.default_rng(n).standard_normal((n, 3, 4, 4)).astype(np.float32)} for n in (1, 2)}
    first = compile_with(model)
    assert first.engines == {}  # dynamic batch and no profiles: built on first use
    for f in feeds.values():
        np.testing.assert_allclose(first.run(f)["y"], reference(model, f), atol=1e-6)
    assert first.cache_hits == [False, False]
    assert len(first.engines) == len(ort_engine) == 2
    # The same graph with other (refittable) weights: same engines from the cache, refit.
    other = conv_reshape_model(weight=-2.0)
    second = compile_with(other)
    np.testing.assert_allclose(second.run(feeds[2])["y"], reference(other, feeds[2]), atol=1e-6)
    assert second.cache_hits == [True]
    assert len(ort_engine) == 2
    # The plans handed to TensorRT are weight-stripped in spirit: the refit set decides.
    assert not np.allclose(reference(other, feeds[2]), reference(model, feeds[2]))


def test_changed_baked_constant_rebuilds_instead_of_using_a_stale_plan(ort_engine: list[bytes]) -> None:
    x = np.ones((1, 3, 4, 4), np.float32)
    compile_with(conv_reshape_model()).run({"x": x})
    flat = conv_reshape_model(target=(-1, 8))  # a shape constant TensorRT folds into the plan
    compiled = compile_with(flat)
    out = compiled.run({"x": x})["y"]
    assert compiled.cache_hits == [False]
    assert out.shape == (4, 8)
    np.testing.assert_allclose(out, reference(flat, {"x": x}), atol=1e-6)


def test_refit_validates_first_then_swaps_every_weight(ort_engine: list[bytes]) -> None:
    model = conv_reshape_model()
    fixed = Model(model.graph.with_input_shapes({"x": (1, 3, 4, 4)}), model.weights)
    compiled = compile_with(fixed)
    assert list(compiled.engines) == [None]  # static: built at compile time
    engine = compiled.engines[None][0]
    x = {"x": np.random.default_rng(0).standard_normal((1, 3, 4, 4)).astype(np.float32)}
    lora = fixed.with_weights({"w": np.full((2, 3, 1, 1), 3.0, np.float32)})
    compiled.refit(lora.weights)
    np.testing.assert_allclose(compiled.run(x)["y"], reference(lora, x), atol=1e-5)
    compiled.refit(fixed.weights)  # the full original set: nothing of the first refit remains
    np.testing.assert_allclose(compiled.run(x)["y"], reference(fixed, x), atol=1e-5)
    refits = engine.refits  # type: ignore[attr-defined]
    with pytest.raises(InputError, match="missing"):
        compiled.refit({"w": fixed.weights["w"]})  # type: ignore[arg-type]
    with pytest.raises(InputError, match="refit cannot change 'shape'"):
        compiled.refit(fixed.weights.updated({"shape": np.array([-1, 16], np.int64)}))
    assert engine.refits == refits  # type: ignore[attr-defined]  # rejected before touching the engine


def test_fp16_engines_get_the_converted_graph_and_weights(ort_engine: list[bytes], taef2: Path) -> None:
    model = load_onnx(taef2 / "taef2_decoder.onnx")
    model = Model(model.graph.with_input_shapes({"latent": (1, 32, 8, 8)}), model.weights)
    feeds = {"latent": np.ascontiguousarray(np.load(taef2 / "dog_latent_torch.npy")[:, :, :8, :8])}
    compiled = compile_with(model, precision="fp16")
    got = compiled.run(feeds)["image"]
    handed = onnx.load_from_string(ort_engine[-1])
    conv_weight = next(n.input[1] for n in handed.graph.node if n.op_type == "Conv")
    assert next(t for t in handed.graph.initializer if t.name == conv_weight).data_type == TensorProto.FLOAT16
    assert handed.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, reference(model, feeds), atol=2e-3)


def test_profiles_build_one_engine_and_refuse_shapes_outside(ort_engine: list[bytes]) -> None:
    model = conv_reshape_model()
    compiled = compile_with(model, profiles={"x": ((1, 3, 4, 4), (2, 3, 4, 4), (4, 3, 4, 4))})
    assert list(compiled.engines) == [None]
    for n in (1, 3):
        x = {"x": np.ones((n, 3, 4, 4), np.float32)}
        np.testing.assert_allclose(compiled.run(x)["y"], reference(model, x), atol=1e-6)
    with pytest.raises(InputError, match="outside the compiled profile"):
        compiled.run({"x": np.ones((8, 3, 4, 4), np.float32)})
    assert len(ort_engine) == 1


def linear_model(scale: float = 1.0) -> Model:
    """Two transformer-style linears (MatMul [32, 64], Gemm [32, 64] transB) with a GELU-ish
    Tanh between them: the weights fp8 quantizes."""
    rng = np.random.default_rng(3)
    inits = {
        "w1": (rng.standard_normal((32, 64)) * scale).astype(np.float32),
        "w2": rng.standard_normal((32, 64)).astype(np.float32) / 8,
        "b2": rng.standard_normal(32).astype(np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Tanh", ["h"], ["t"]),
        helper.make_node("Gemm", ["t", "w2", "b2"], ["y"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 32])],
        initializer=[numpy_helper.from_array(a, n) for n, a in inits.items()],
    )
    return Model.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def rel_l2(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def test_fp8_engines_get_fp8_weights_and_refit_requantizes(
    ort_engine: list[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(OrtEngine, "refittable_types", (*OrtEngine.refittable_types, TensorProto.FLOAT8E4M3FN))
    model = linear_model()
    x = {"x": np.random.default_rng(4).standard_normal((4, 32)).astype(np.float32)}
    compiled = compile_with(model, precision="fp8")
    handed = onnx.load_from_string(ort_engine[-1])
    types = {t.name: t.data_type for t in handed.graph.initializer}
    assert types["w1"] == types["w2"] == TensorProto.FLOAT8E4M3FN
    assert compiled.engines[None][1] == {}  # every source weight refittable: nothing baked
    first = compiled.run(x)["y"]
    assert first.dtype == np.float32 and rel_l2(first, reference(model, x)) < 2.0**-4
    lora = linear_model(scale=-2.0)  # another checkpoint: new fp8 values and new scales
    compiled.refit(lora.weights)
    assert len(ort_engine) == 1  # refit, not rebuilt
    refit = compiled.run(x)["y"]
    assert rel_l2(refit, reference(lora, x)) < 2.0**-4
    fresh = compile_with(lora, precision="fp8", cache=False).run(x)["y"]
    np.testing.assert_array_equal(refit, fresh)  # the same quantization as a fresh compile


def test_fp8_refit_is_refused_where_the_engine_folds_the_fp8_weights(ort_engine: list[bytes]) -> None:
    model = linear_model()
    compiled = compile_with(model, precision="fp8")  # OrtEngine exposes no FLOAT8E4M3FN weight
    assert set(compiled.engines[None][1]) == {"w1", "w2"}  # recorded as baked into the plan
    compiled.refit(model.weights.updated({"b2": np.zeros(32, np.float32)}))  # fp16 bias: fine
    with pytest.raises(InputError, match=r"refit cannot change 'w1'.*fp8 weight scales"):
        compiled.refit(linear_model(scale=0.5).weights)
    second = compile_with(linear_model(scale=0.5), precision="fp8")
    assert second.cache_hits == [False]  # a cached plan with other fp8 weights is rebuilt
