"""The builder configuration sdkit-trt asks TensorRT for, and compile's argument checks.

``configure`` is driven with a recorder standing in for the TensorRT module (the names
are TensorRT's documented Python API); the engine it produces is checked by the gpu tests.
"""

from __future__ import annotations

import enum
from types import SimpleNamespace
from typing import Any

import pytest
from trt_helpers import RTX_3060, fake_install, small_model

from sdkit.device import Device
from sdkit.errors import DeviceError, OptionError
from sdkit.options import Options
from sdkit_trt.backend import TensorRTBackend
from sdkit_trt.build import configure, network_flags
from sdkit_trt.driver import DriverReport
from sdkit_trt.shapes import Profile


class BuilderFlag(enum.IntEnum):
    TF32 = 1
    REFIT = 5
    STRIP_PLAN = 21
    REFIT_IDENTICAL = 22


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


def fake_trt() -> SimpleNamespace:
    return SimpleNamespace(
        BuilderFlag=BuilderFlag,
        ComputeCapability=ComputeCapability,
        NetworkDefinitionCreationFlag=SimpleNamespace(STRONGLY_TYPED=0),
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
