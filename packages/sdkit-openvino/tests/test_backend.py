"""Probe, devices, registration, options and precision of the openvino backend."""

from __future__ import annotations

import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import openvino as ov
import pytest

import sdkit
from sdkit.device import Device
from sdkit.errors import BackendUnavailableError, DeviceError, OptionError
from sdkit.known_backends import install_command
from sdkit.options import Options, make_options
from sdkit.testing import one_node_model
from sdkit_openvino import OpenVinoBackend
from sdkit_openvino.compiled import OpenVinoCompiled
from sdkit_openvino.config import PrecisionFallbackWarning, compile_properties, effective_precision
from sdkit_openvino.runtime import OvDevice, list_devices, version_tuple


def test_registered_with_name_and_priority(sdkit_isolated: Path) -> None:
    info = {b.name: b for b in sdkit.backends()}["openvino"]
    assert info.available, info.reason
    assert info.priority == 60
    assert info.version == ov.get_version()
    assert "cpu" in info.devices


def test_hooks_import_no_openvino() -> None:
    code = (
        "import sys, sdkit_openvino.hooks, sdkit_openvino; "
        "from sdkit.plugins import get_plugins; get_plugins(); "
        "assert 'openvino' not in sys.modules, sorted(m for m in sys.modules if 'openvino' in m)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_probe_reports_version_and_devices() -> None:
    availability = OpenVinoBackend().probe()
    assert availability.ok
    assert version_tuple(availability.version) >= (2025, 0)
    assert "CPU" in availability.reason
    devices = OpenVinoBackend().devices()
    assert devices[0] == Device("cpu")


def test_probe_without_openvino(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "openvino", None)  # makes `import openvino` raise ImportError
    availability = OpenVinoBackend().probe()
    assert not availability.ok
    assert "not installed" in availability.reason
    assert availability.install_hint == install_command("intel")
    assert OpenVinoBackend().devices() == []


def test_vendor_device_names_map_to_sdkit_devices() -> None:
    assert Device.from_vendor("GPU.1") == Device("gpu", 1)
    assert Device.from_vendor("NPU") == Device("npu")
    assert next(d.vendor_name for d in list_devices()) == "CPU"


def test_unknown_device_is_a_device_error(sdkit_isolated: Path) -> None:
    model = one_node_model("Relu", {"x": np.zeros((2, 3), np.float32)})
    with pytest.raises(DeviceError, match="openvino"):
        sdkit.compile(model, backend="openvino", device="cuda:0")


def test_compile_properties_default_to_exact_fp32_latency_and_physical_cores() -> None:
    cpu = OvDevice("CPU", Device("cpu"), frozenset({"FP32"}))
    supported = ["INFERENCE_PRECISION_HINT", "PERFORMANCE_HINT", "INFERENCE_NUM_THREADS"]
    props = compile_properties(cpu, Options(), supported, None)
    assert props["INFERENCE_PRECISION_HINT"] == "f32"
    assert props["PERFORMANCE_HINT"] == "LATENCY"
    assert props["INFERENCE_NUM_THREADS"] >= 1
    assert compile_properties(cpu, make_options({"threads": 3, "precision": "bf16"}), supported, None) == {
        "INFERENCE_PRECISION_HINT": "bf16",
        "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_NUM_THREADS": 3,
    }


def test_effective_precision_detects_silent_f32() -> None:
    assert effective_precision("fp16", frozenset({"FP32", "FP16"}), "f16") == ("fp16", "")
    ran, note = effective_precision("fp16", frozenset({"FP32", "FP16"}), "f32")
    assert ran == "fp32"
    assert "fp16 was requested" in note
    ran, note = effective_precision("bf16", frozenset({"FP32"}), "bf16")  # no capability: f32
    assert ran == "fp32"
    assert note


def test_fp32_is_requested_explicitly(sdkit_isolated: Path) -> None:
    """The CPU plugin defaults to bf16 on AMX/AVX512-BF16 CPUs: fp32 must stay exact."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((64, 256)).astype(np.float32), rng.standard_normal((256, 64)).astype(np.float32)
    model = one_node_model("MatMul", {"a": a}, initializers={"b": b})
    compiled = sdkit.compile(model, backend="openvino")
    out = compiled.run({"a": a})["out0"]
    np.testing.assert_allclose(out, a.astype(np.float64) @ b.astype(np.float64), rtol=0, atol=2e-4)
    assert compiled.info["precision"] == "fp32"  # type: ignore[attr-defined]


def test_lower_precision_runs_or_warns(sdkit_isolated: Path) -> None:
    """fp16 where the device has it (info says so); else a PrecisionFallbackWarning."""
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    w = np.random.default_rng(2).standard_normal((64, 64)).astype(np.float32)
    model = one_node_model("MatMul", {"x": x}, initializers={"w": w})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = sdkit.compile(model, backend="openvino", precision="fp16")
    info = compiled.info  # type: ignore[attr-defined]
    fell_back = [w for w in caught if issubclass(w.category, PrecisionFallbackWarning)]
    if info["precision"] == "fp16":
        assert not fell_back
        out = compiled.run({"x": x})["out0"]
        np.testing.assert_allclose(out, x @ w, rtol=2e-2, atol=5e-2)  # fp16 arithmetic, not exact
    else:
        assert fell_back
        assert info["precision_note"]


@pytest.mark.parametrize(("precision", "hint"), [("fp32", "f32"), ("bf16", "bf16"), ("fp16", "f16")])
def test_info_reports_the_precision_openvino_compiled(sdkit_isolated: Path, precision: str, hint: str) -> None:
    model = one_node_model("Relu", {"x": np.zeros((2, 3), np.float32)})
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        compiled = sdkit.compile(model, backend="openvino", precision=precision)
    engine = next(iter(compiled._engines.values()))  # type: ignore[attr-defined]
    reported = engine.compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
    expected = {"f32": "fp32", "f16": "fp16", "bf16": "bf16"}[reported]
    assert compiled.info["precision"] == expected  # type: ignore[attr-defined]
    assert (compiled.info["precision_note"] == "") == (reported == hint)  # type: ignore[attr-defined]


def test_device_without_fp16_warns_and_records_it(sdkit_isolated: Path) -> None:
    model = one_node_model("Relu", {"x": np.zeros((2, 3), np.float32)})
    no_fp16 = OvDevice("CPU", Device("cpu"), frozenset({"FP32"}))
    with pytest.warns(PrecisionFallbackWarning, match="fp16 was requested"):
        compiled = OpenVinoCompiled(model.graph, model.weights, no_fp16, make_options({"precision": "fp16"}))
    assert compiled.info["precision"] == "fp32"
    assert "fp16" in compiled.info["precision_note"]


def test_compile_when_unavailable_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "openvino", None)
    model = one_node_model("Relu", {"x": np.zeros((2, 3), np.float32)})
    with pytest.raises(BackendUnavailableError, match=re.escape(install_command("intel"))):
        OpenVinoBackend().compile(model.graph, model.weights, Device("cpu"), Options())


def test_q8_0_is_one_option_error(sdkit_isolated: Path) -> None:
    model = one_node_model("Relu", {"x": np.zeros((2, 2), np.float32)})
    with pytest.raises(OptionError, match="q8_0"):
        sdkit.compile(model, backend="openvino", precision="q8_0")


def test_effective_precision_trusts_what_the_device_reports() -> None:
    """OpenVINO's CPU plugin answers an f16 hint with bf16 on AVX-512 BF16 CPUs without FP16
    (AMD Zen 4): bf16 is what ran, not f32."""
    ran, note = effective_precision("fp16", frozenset({"FP32", "BF16"}), "bf16")
    assert ran == "bf16"
    assert "fp16 was requested but the device runs bf16" in note
    ran, _ = effective_precision("fp16", frozenset({"FP32"}), "f16")  # no FP16 capability: f32
    assert ran == "fp32"
