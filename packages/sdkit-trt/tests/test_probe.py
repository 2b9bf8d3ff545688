"""The probe: every missing piece named, on this machine and with simulated installs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from trt_helpers import GTX_1080, H100, RTX_3060, fake_install

from sdkit.device import Device
from sdkit.errors import BackendUnavailableError
from sdkit.known_backends import install_command
from sdkit.options import Options
from sdkit_trt import driver, runtime
from sdkit_trt.backend import TensorRTBackend
from sdkit_trt.driver import DriverReport


def test_real_probe_on_this_machine_says_why() -> None:
    availability = TensorRTBackend().probe()
    if availability.ok:  # a GPU machine: the GPU tests cover it
        pytest.skip(f"TensorRT is usable here: {availability.reason}")
    assert availability.reason
    if not runtime.module_available("tensorrt_rtx") and not runtime.module_available("tensorrt"):
        assert "tensorrt_rtx" in availability.reason
        assert availability.install_hint == install_command("nvidia")
    if driver.probe_driver().error:
        assert "NVIDIA driver" in availability.reason
    assert TensorRTBackend().devices() == []


def test_missing_runtime_module(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_install(monkeypatch, {"cuda.bindings"}, DriverReport((13, 0), (RTX_3060,)))
    availability = TensorRTBackend().probe()
    assert not availability.ok
    assert "neither tensorrt_rtx" in availability.reason
    assert availability.install_hint == install_command("nvidia")


def test_missing_cuda_bindings(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_install(monkeypatch, {"tensorrt_rtx"}, DriverReport((13, 0), (RTX_3060,)))
    availability = TensorRTBackend().probe()
    assert not availability.ok
    assert availability.reason == "cuda-bindings is not installed"


def test_missing_driver_is_named_with_the_library(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_driver() -> Any:
        raise OSError("libcuda.so.1: cannot open shared object file")

    monkeypatch.setattr(driver, "load_libcuda", no_driver)
    report = driver.probe_driver()
    assert report.gpus == ()
    assert "NVIDIA driver is not installed" in report.error
    assert driver.driver_library_name() in report.error
    fake_install(monkeypatch, {"tensorrt_rtx", "cuda.bindings"}, report)
    availability = TensorRTBackend().probe()
    assert not availability.ok
    assert "NVIDIA driver is not installed" in availability.reason
    assert "driver" in availability.install_hint


class FakeLibcuda:
    """A driver whose cuInit fails: enough of libcuda's surface for ``query_driver``."""

    def __init__(self, init_code: int) -> None:
        def cu_init(flags: int) -> int:
            return init_code

        self.cuInit = cu_init


@pytest.mark.parametrize(("code", "words"), [(100, "sees no GPU"), (35, "too old"), (999, "failed to initialise")])
def test_driver_init_errors(code: int, words: str) -> None:
    report = driver.query_driver(FakeLibcuda(code))  # type: ignore[arg-type]
    assert words in report.error
    assert f"CUDA error {code}" in report.error


def test_unsupported_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_install(monkeypatch, {"tensorrt_rtx", "cuda.bindings"}, DriverReport((13, 0), (GTX_1080,)))
    availability = TensorRTBackend().probe()
    assert not availability.ok
    assert "unsupported GPU: cuda:0 NVIDIA GeForce GTX 1080" in availability.reason
    assert "not 6.1" in availability.reason


def test_rtx_preferred_and_tensorrt_takes_what_rtx_cannot_build_for(monkeypatch: pytest.MonkeyPatch) -> None:
    versions = {"tensorrt_rtx": "1.7.1.116", "tensorrt": "10.13.0.35"}
    fake_install(
        monkeypatch, {"tensorrt_rtx", "tensorrt", "cuda.bindings"}, DriverReport((13, 0), (RTX_3060, H100)), versions
    )
    backend = TensorRTBackend()
    availability = backend.probe()
    assert availability.ok, availability.reason
    assert availability.version == "TensorRT 10.13.0.35 + TensorRT-RTX 1.7.1.116"
    devices = backend.devices()
    assert devices == [Device("cuda", 0), Device("cuda", 1)]
    assert "TensorRT-RTX" in devices[0].description
    assert "TensorRT 10" in devices[1].description


def test_hopper_with_only_rtx_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_install(monkeypatch, {"tensorrt_rtx", "cuda.bindings"}, DriverReport((13, 0), (H100,)))
    availability = TensorRTBackend().probe()
    assert not availability.ok
    assert "builds for compute capability 7.5, 8.0, 8.6, 8.9, 12.0, 12.1, not 9.0" in availability.reason


def test_old_tensorrt_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_install(monkeypatch, {"tensorrt", "cuda.bindings"}, DriverReport((12, 2), (RTX_3060,)), {"tensorrt": "8.6.1"})
    availability = TensorRTBackend().probe()
    assert not availability.ok
    assert "TensorRT 8.6.1 is too old" in availability.reason


def test_tensorrt_with_the_known_refit_bug_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_install(
        monkeypatch, {"tensorrt", "cuda.bindings"}, DriverReport((13, 0), (RTX_3060,)), {"tensorrt": "11.3.0.1"}
    )
    availability = TensorRTBackend().probe()
    assert not availability.ok
    assert "known refit bug" in availability.reason


def test_compile_when_unavailable_raises_the_probe_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_install(monkeypatch, set(), DriverReport(None, (), "the NVIDIA driver is not installed (test)"))
    with pytest.raises(BackendUnavailableError, match="NVIDIA driver is not installed"):
        TensorRTBackend().compile(None, None, Device("cuda", 0), Options())  # type: ignore[arg-type]


def test_registered_and_hooks_import_no_vendor_sdk() -> None:
    code = (
        "import sys\n"
        "from sdkit.plugins import get_plugins\n"
        "plugins = get_plugins()\n"
        "assert plugins.backends.get('tensorrt') is not None, plugins.failures\n"
        "cls = plugins.backends.get('tensorrt')\n"
        "assert cls.priority == 90 and not getattr(cls, 'aliases', ())\n"
        "cls().check.__call__\n"
        "import sdkit_trt.backend, sdkit_trt.compiled, sdkit_trt.engine, sdkit_trt.build\n"
        "vendor = ('tensorrt', 'tensorrt_rtx', 'tensorrt_rtx_bindings', 'cuda', 'torch')\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in vendor]\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parent, check=False
    )
    assert result.returncode == 0, result.stderr


def test_sdkit_compile_names_the_missing_pieces(sdkit_isolated: Path) -> None:
    from trt_helpers import small_model

    import sdkit

    if TensorRTBackend().probe().ok:
        pytest.skip("TensorRT is usable here")
    with pytest.raises(BackendUnavailableError) as error:
        sdkit.compile(small_model(), backend="tensorrt")
    assert error.value.backend == "tensorrt"
    assert error.value.reason == TensorRTBackend().probe().reason
    info = next(b for b in sdkit.backends() if b.name == "tensorrt")
    assert not info.available
    assert info.priority == 90
    assert info.devices == []


def test_hopper_without_any_tensorrt_says_the_nvidia_extra_would_not_help(monkeypatch: pytest.MonkeyPatch) -> None:
    # An H100/H200 (compute capability 9.0): TensorRT-RTX, what `pip install sdkit[nvidia]` brings, cannot
    # build for it, so `sdkit backends` names the GPU and its compute capability instead of suggesting it.
    fake_install(monkeypatch, {"cuda.bindings"}, DriverReport((13, 0), (driver.Gpu(0, "NVIDIA H200", (9, 0), 2**37),)))
    availability = TensorRTBackend().probe()
    assert not availability.ok
    assert "TensorRT-RTX (the [nvidia] extra) does not support cuda:0 NVIDIA H200 (compute capability 9.0" in (
        availability.reason
    )
    assert "builds for compute capability 7.5, 8.0, 8.6, 8.9, 12.0, 12.1" in availability.reason
    assert "ggml" in availability.install_hint and "[nvidia]" not in availability.install_hint


def test_a_supported_gpu_without_tensorrt_gets_the_nvidia_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_install(monkeypatch, {"cuda.bindings"}, DriverReport((13, 0), (RTX_3060,)))
    availability = TensorRTBackend().probe()
    assert "does not support" not in availability.reason
    assert availability.install_hint == install_command("nvidia")
