"""The builder configuration sdkit-trt asks TensorRT for, and compile's argument checks.

``configure`` is driven with a recorder standing in for the TensorRT module, and ``build_plan``
with a fake module whose parser reads the ONNX it is given (the names are TensorRT's documented
Python API: ``Builder``, ``NetworkDefinitionCreationFlag``, ``OnnxParser``, ``BuilderFlag``,
``DataType``, ``ILogger``); the engine it produces is checked by the gpu tests.
"""

from __future__ import annotations

import enum
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from trt_helpers import H100, RTX_3060, RTX_4090, fake_install, small_model

from sdkit.device import Device
from sdkit.errors import DeviceError, OptionError
from sdkit.model import Model
from sdkit.options import Options
from sdkit.selection import offers
from sdkit_trt import backend as backend_module
from sdkit_trt.backend import TensorRTBackend
from sdkit_trt.build import build_plan, configure, fp8_problem, network_flags
from sdkit_trt.driver import DriverReport
from sdkit_trt.fp8 import convert_graph_fp8
from sdkit_trt.onnx_source import onnx_source
from sdkit_trt.shapes import Profile


class BuilderFlag(enum.IntEnum):
    FP16 = 0
    TF32 = 1
    REFIT = 5
    FP8 = 12  # TensorRT 10's weakly typed flag; strongly typed Q/DQ networks must not set it
    STRIP_PLAN = 21
    REFIT_IDENTICAL = 22


class DataType(enum.IntEnum):
    FLOAT = 0
    HALF = 1
    INT8 = 2
    FP8 = 9


class ComputeCapability(enum.IntEnum):
    CURRENT = 1
    SM86 = 4


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.num_compute_capabilities = 0

    def __getattr__(self, name: str) -> Any:
        def record(*args: Any) -> Recorder:
            self.calls.append((name, *args))
            return self

        return record


def fake_trt(*, fp8: bool = True, strongly_typed: bool = True) -> SimpleNamespace:
    data_types = DataType if fp8 else enum.IntEnum("DataType", {"FLOAT": 0, "HALF": 1, "INT8": 2})
    return SimpleNamespace(
        BuilderFlag=BuilderFlag,
        ComputeCapability=ComputeCapability,
        DataType=data_types,
        NetworkDefinitionCreationFlag=SimpleNamespace(STRONGLY_TYPED=0) if strongly_typed else SimpleNamespace(),
    )


def network_with(*names: str) -> SimpleNamespace:
    inputs = [SimpleNamespace(name=n) for n in names]
    return SimpleNamespace(num_inputs=len(inputs), get_input=lambda i: inputs[i])


@pytest.mark.parametrize("is_rtx", [True, False])
def test_weight_stripped_refittable_strongly_typed_fp32(is_rtx: bool) -> None:
    builder = Recorder()
    config = configure(fake_trt(), builder, network_with("x"), is_rtx=is_rtx, profiles={}, precision="fp32")
    calls = builder.calls
    assert ("set_flag", BuilderFlag.STRIP_PLAN) in calls
    assert ("set_flag", BuilderFlag.REFIT) in calls
    assert ("set_flag", BuilderFlag.REFIT_IDENTICAL) not in calls  # users bring other weights
    assert ("clear_flag", BuilderFlag.TF32) in calls  # fp32 means fp32
    assert network_flags(fake_trt()) == 1  # 1 << STRONGLY_TYPED
    if is_rtx:
        assert config.num_compute_capabilities == 1
        assert ("set_compute_capability", ComputeCapability.CURRENT, 0) in calls
    else:
        assert not any(c[0] == "set_compute_capability" for c in calls)


def test_fp16_keeps_tf32_and_profiles_become_one_optimization_profile() -> None:
    builder = Recorder()
    profile = Profile((1, 4, 32, 32), (1, 4, 64, 64), (1, 4, 128, 128))
    configure(
        fake_trt(), builder, network_with("latent", "t"), is_rtx=True, profiles={"latent": profile}, precision="fp16"
    )
    calls = builder.calls
    assert ("clear_flag", BuilderFlag.TF32) not in calls
    assert ("set_shape", "latent", profile.min, profile.opt, profile.max) in calls
    assert sum(1 for c in calls if c[0] == "add_optimization_profile") == 1


def test_compile_checks_device_precision_and_profiles_first(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_install(monkeypatch, {"tensorrt_rtx", "cuda.bindings"}, DriverReport((13, 0), (RTX_3060,)))
    backend = TensorRTBackend()
    model = small_model()
    with pytest.raises(DeviceError, match="cuda devices, not cpu"):
        backend.compile(model.graph, model.weights, Device("cpu"), Options())
    with pytest.raises(DeviceError, match="no device cuda:3; its devices: cuda:0"):
        backend.compile(model.graph, model.weights, Device("cuda", 3), Options())
    with pytest.raises(OptionError, match="fp32, fp16 or fp8, not bf16"):
        backend.compile(model.graph, model.weights, Device("cuda", 0), Options(precision="bf16"))
    bad = Options(extra={"profiles": {"y": ((1,), (1,), (1,))}})
    with pytest.raises(OptionError, match="'y' is not an input"):
        backend.compile(model.graph, model.weights, Device("cuda", 0), bad)


def test_fp8_sets_no_precision_flag_on_a_strongly_typed_network() -> None:
    """TensorRT's explicit-quantization guide: Q/DQ networks are strongly typed and take no
    precision-control flags, so fp8 is configured as fp16 is (TF32 left as it is)."""
    builder = Recorder()
    configure(fake_trt(), builder, network_with("x"), is_rtx=False, profiles={}, precision="fp8")
    flags = [c for c in builder.calls if c[0] in ("set_flag", "clear_flag")]
    assert flags == [("set_flag", BuilderFlag.STRIP_PLAN), ("set_flag", BuilderFlag.REFIT)]


def test_fp8_problem_names_what_the_module_lacks() -> None:
    assert fp8_problem(fake_trt(), "TensorRT 10.13") == ""
    assert fp8_problem(fake_trt(fp8=False), "TensorRT 10.13") == (
        "TensorRT 10.13 has no FP8 data type (tensorrt.DataType.FP8)"
    )
    assert "cannot build strongly typed networks" in fp8_problem(fake_trt(strongly_typed=False), "TensorRT 8.6")


class FakeLogger:
    class Severity(enum.IntEnum):
        INTERNAL_ERROR = 0
        ERROR = 1
        WARNING = 2
        INFO = 3
        VERBOSE = 4

    def __init__(self) -> None:
        pass


class FakeBuilder:
    """``tensorrt.Builder``: records the network flags and the config it builds with."""

    built: ClassVar[list[FakeBuilder]] = []

    def __init__(self, logger: Any) -> None:
        self.flags = -1
        self.config = Recorder()
        self.network: SimpleNamespace | None = None
        FakeBuilder.built.append(self)

    def create_network(self, flags: int) -> SimpleNamespace:
        self.flags = flags
        self.network = SimpleNamespace(num_inputs=0, model=None)
        return self.network

    def create_builder_config(self) -> Recorder:
        return self.config

    def build_serialized_network(self, network: Any, config: Any) -> bytes:
        return b"plan"


class FakeParser:
    """``tensorrt.OnnxParser``: reads the ONNX bytes it is given (as the real parser would)."""

    num_errors = 0

    def __init__(self, network: Any, logger: Any) -> None:
        self.network = network

    def parse(self, data: bytes) -> bool:
        self.network.model = onnx.load_from_string(data)
        return True


def fake_module(**kwargs: bool) -> SimpleNamespace:
    module = fake_trt(**kwargs)
    module.ILogger, module.Builder, module.OnnxParser = FakeLogger, FakeBuilder, FakeParser
    return module


def matmul_model() -> Model:
    w = np.random.default_rng(0).standard_normal((32, 16)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16])],
        initializer=[numpy_helper.from_array(w, "w")],
    )
    return Model.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_build_plan_hands_the_parser_fp8_weights_on_a_strongly_typed_network() -> None:
    model = matmul_model()
    plan = convert_graph_fp8(model.graph)
    FakeBuilder.built.clear()
    with onnx_source(plan.graph, plan.convert_weights(model.weights)) as source:
        blob = build_plan(fake_module(), source, is_rtx=False, profiles={}, timing_cache=None, precision="fp8")
    assert blob == b"plan"
    (builder,) = FakeBuilder.built
    assert builder.flags == 1  # 1 << STRONGLY_TYPED
    assert [c for c in builder.config.calls if c[0].endswith("_flag")] == [
        ("set_flag", BuilderFlag.STRIP_PLAN),
        ("set_flag", BuilderFlag.REFIT),
    ]
    assert builder.network is not None
    parsed = builder.network.model
    assert {t.name: t.data_type for t in parsed.graph.initializer} == {
        "w": TensorProto.FLOAT8E4M3FN,
        "w__fp8_scale": TensorProto.FLOAT16,
    }
    assert [n.op_type for n in parsed.graph.node] == ["DequantizeLinear", "Cast", "MatMul", "Cast"]
    weights = plan.convert_weights(model.weights)
    with onnx_source(plan.graph, weights) as source, pytest.raises(OptionError, match="'fp8' needs a strongly typed"):
        build_plan(
            fake_module(strongly_typed=False), source, is_rtx=False, profiles={}, timing_cache=None, precision="fp8"
        )


def test_fp8_is_refused_below_ada_and_without_fp8_in_tensorrt(monkeypatch: pytest.MonkeyPatch) -> None:
    model = small_model()
    fake_install(monkeypatch, {"tensorrt_rtx", "cuda.bindings"}, DriverReport((13, 0), (RTX_3060,)))
    with pytest.raises(DeviceError, match=r"'fp8' needs compute capability 8.9 \(Ada\) or newer; cuda:0 is .*3060"):
        TensorRTBackend().compile(model.graph, model.weights, Device("cuda", 0), Options(precision="fp8"))
    fake_install(monkeypatch, {"tensorrt", "cuda.bindings"}, DriverReport((13, 0), (H100,)), {"tensorrt": "10.13.0"})
    monkeypatch.setattr(backend_module, "import_runtime", lambda info: fake_trt(fp8=False))
    with pytest.raises(OptionError, match=r"^precision 'fp8': TensorRT 10\.13\.0 has no FP8 data type"):
        TensorRTBackend().compile(model.graph, model.weights, Device("cuda", 1), Options(precision="fp8"))


def test_fp8_is_not_declared_so_auto_never_picks_tensorrt_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_install(monkeypatch, {"tensorrt_rtx", "cuda.bindings"}, DriverReport((13, 0), (RTX_4090,)))
    assert offers(TensorRTBackend, "fp16")
    assert not offers(TensorRTBackend, "fp8")  # asked for by name only: the GPU decides
