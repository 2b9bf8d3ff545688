"""The probe: this machine (no ROCm), and simulated installs through the fake module."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from migraphx_fake import FakeMigraphx
from onnx import TensorProto, helper

import sdkit
from sdkit.device import Device
from sdkit.errors import BackendUnavailableError
from sdkit.known_backends import install_command
from sdkit.model import Model
from sdkit.options import Options
from sdkit_migraphx import backend
from sdkit_migraphx.backend import MigraphxBackend
from sdkit_migraphx.runtime import amd_gpus, gfx_name


def relu() -> Model:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    return Model.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_real_probe_on_this_machine_says_why() -> None:
    availability = MigraphxBackend().probe()
    if availability.ok:
        pytest.skip(f"MIGraphX runs here: {availability.reason}")
    assert availability.reason
    if "migraphx" not in sys.modules:
        assert "the migraphx Python module is not importable" in availability.reason
        assert "PYTHONPATH" in availability.reason
        assert "ROCm" in availability.install_hint and install_command("amd") in availability.install_hint
    assert MigraphxBackend().devices() == []


def test_installed_without_gpu(fake_migraphx: FakeMigraphx, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backend, "amd_gpus", list)
    availability = MigraphxBackend().probe()
    assert not availability.ok
    assert availability.reason == "MIGraphX 2.16.0.fake is installed but no AMD GPU is visible (/dev/kfd, KFD topology)"


def test_installed_without_gpu_target(fake_migraphx: FakeMigraphx) -> None:
    fake_migraphx.targets = {"ref"}
    availability = MigraphxBackend().probe()
    assert not availability.ok
    assert "has no gpu target: Requested target 'gpu' is not loaded" in availability.reason


def test_installed_with_gpu(fake_migraphx: FakeMigraphx) -> None:
    availability = MigraphxBackend().probe()
    assert availability.ok
    assert availability.reason == "MIGraphX 2.16.0.fake (rocm:0 gfx1100)"
    assert MigraphxBackend().devices() == [Device("rocm", 0)]


def test_other_platforms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "win32")
    assert MigraphxBackend().probe().reason == "MIGraphX runs on Linux with ROCm, not win32"


def test_compile_refuses_instead_of_faking() -> None:
    if MigraphxBackend().probe().ok:
        pytest.skip("MIGraphX runs here")
    with pytest.raises(BackendUnavailableError, match="migraphx"):
        MigraphxBackend().compile(relu().graph, relu().weights, Device("rocm", 0), Options())


def test_gpus_from_kfd_topology(tmp_path: Path) -> None:
    cpu, gpu, unnamed = tmp_path / "0", tmp_path / "1", tmp_path / "2"
    for node, simd in ((cpu, 0), (gpu, 256), (unnamed, 128)):
        node.mkdir()
        (node / "properties").write_text(f"cpu_cores_count 8\nsimd_count {simd}\ngfx_target_version 110000\n")
    (gpu / "name").write_text("gfx1100\n")
    devices = amd_gpus(str(tmp_path))
    assert [str(d) for d in devices] == ["rocm:0", "rocm:1"]
    assert [d.description for d in devices] == ["gfx1100", "gfx1100"]
    assert gfx_name("90010") == "gfx90a" and gfx_name("0") == "gfx?"


def test_listed_with_reason_and_never_auto_chosen(sdkit_isolated: Path) -> None:
    info = next(b for b in sdkit.backends() if b.name == "migraphx")
    if info.available:
        pytest.skip("MIGraphX runs here")
    assert info.reason == MigraphxBackend().probe().reason
    assert info.priority == 85 and info.devices == []
    compiled = sdkit.compile(relu(), backend="auto")
    assert compiled.backend_name != "migraphx"
    out = compiled.run({"x": np.array([[-1, 0, 2, -3]], np.float32)})["y"]
    np.testing.assert_array_equal(out, [[0, 0, 2, 0]])
    result = subprocess.run(
        [sys.executable, "-m", "sdkit.cli.main", "backends", "--json"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    entry = next(b for b in json.loads(result.stdout)["backends"] if b["name"] == "migraphx")
    assert not entry["available"] and entry["reason"] == info.reason


def test_hooks_import_no_migraphx() -> None:
    code = (
        "import sys\n"
        "from sdkit.plugins import get_plugins\n"
        "cls = get_plugins().backends.get('migraphx')\n"
        "assert cls is not None and cls.priority == 85\n"
        "import sdkit_migraphx.backend, sdkit_migraphx.compiled, sdkit_migraphx.support\n"
        "assert 'migraphx' not in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120)
    assert result.returncode == 0, result.stderr
