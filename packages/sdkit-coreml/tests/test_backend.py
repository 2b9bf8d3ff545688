"""The backend on this machine: probe reason, devices, refusal to compile, registration."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from coreml_helpers import REPO, graph_model, runtime_missing
from onnx import TensorProto, helper

import sdkit
from sdkit.device import Device
from sdkit.errors import BackendUnavailableError
from sdkit.known_backends import install_command
from sdkit.options import Options
from sdkit_coreml.backend import CoremlBackend
from sdkit_coreml.runtime import apple_devices, coremltools_version

TAEF2_DECODER = REPO / "models" / "taef2" / "taef2_decoder.onnx"


def _relu() -> sdkit.Model:
    return graph_model(
        [helper.make_node("Relu", ["x"], ["y"])], [("x", TensorProto.FLOAT, [1, 4])], [("y", TensorProto.FLOAT, [1, 4])]
    )


def test_probe_says_why_and_what_to_install() -> None:
    availability = CoremlBackend().probe()
    if not runtime_missing():
        pytest.skip(f"Core ML runs here: {availability.reason}")
    assert not availability.ok
    assert availability.install_hint == f"on a Mac: {install_command('apple')}"
    if sys.platform != "darwin":
        assert availability.reason.startswith(f"Core ML runs on macOS only (this is {sys.platform})")
        if coremltools_version():
            assert f"coremltools {coremltools_version()} is installed and converts" in availability.reason
    assert CoremlBackend().devices() == []


def test_compile_refuses_instead_of_faking() -> None:
    if not runtime_missing():
        pytest.skip("Core ML runs here")
    with pytest.raises(BackendUnavailableError, match=r"Core ML runs on macOS only|coremltools"):
        CoremlBackend().compile(_relu().graph, _relu().weights, Device("ane"), Options())


def test_compute_units() -> None:
    assert [str(d) for d in apple_devices("arm64")] == ["ane", "gpu:0", "cpu"]
    assert [str(d) for d in apple_devices("x86_64")] == ["cpu"]


def test_listed_with_reason_and_never_auto_chosen(sdkit_isolated: Path) -> None:
    info = next(b for b in sdkit.backends() if b.name == "coreml")
    assert info.available == (not runtime_missing())
    if not info.available:
        assert info.reason == CoremlBackend().probe().reason
        compiled = sdkit.compile(_relu(), backend="auto")
        assert compiled.backend_name != "coreml"
        out = compiled.run({"x": np.array([[-1, 0, 2, -3]], np.float32)})["y"]
        np.testing.assert_array_equal(out, [[0, 0, 2, 0]])
        with pytest.raises(BackendUnavailableError):
            sdkit.compile(_relu(), backend="coreml")


def test_cli_backends_shows_the_reason(sdkit_isolated: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sdkit.cli.main", "backends", "--json"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    entry = next(b for b in json.loads(result.stdout)["backends"] if b["name"] == "coreml")
    assert entry["available"] == (not runtime_missing())
    assert entry["reason"] == CoremlBackend().probe().reason


def test_hooks_and_backend_import_no_coremltools() -> None:
    code = (
        "import sys\n"
        "from sdkit.plugins import get_plugins\n"
        "cls = get_plugins().backends.get('coreml')\n"
        "assert cls is not None\n"
        "backend = cls(); backend.probe(); backend.devices()\n"
        "import sdkit_coreml, sdkit_coreml.compiled, sdkit_coreml.package, sdkit_coreml.program\n"
        "from sdkit.model import load_onnx\n"
        f"report = backend.check(load_onnx({str(TAEF2_DECODER)!r}).graph)\n"
        "assert report.ok, report.unsupported\n"
        "bad = [m for m in sys.modules if m.split('.')[0] == 'coremltools']\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120)
    assert result.returncode == 0, result.stderr
