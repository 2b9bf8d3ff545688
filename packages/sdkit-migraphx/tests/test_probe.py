from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sdkit.errors import BackendUnavailableError
from sdkit_migraphx.backend import MigraphxBackend, amd_gpus


def test_probe_says_why_and_what_to_install() -> None:
    availability = MigraphxBackend().probe()
    assert not availability.ok  # no compiler yet, wherever this runs
    assert availability.reason
    if "migraphx" not in sys.modules:
        assert "rocm" in availability.install_hint.lower()


def test_compile_refuses_instead_of_faking() -> None:
    with pytest.raises(BackendUnavailableError):
        MigraphxBackend().compile(None, None, None, None)  # type: ignore[arg-type]


def test_gpus_from_kfd_topology(tmp_path: Path) -> None:
    cpu, gpu = tmp_path / "0", tmp_path / "1"
    for node, simd in ((cpu, 0), (gpu, 256)):
        node.mkdir()
        (node / "properties").write_text(f"cpu_cores_count 8\nsimd_count {simd}\ngfx_target_version 110000\n")
    (gpu / "name").write_text("gfx1100\n")
    devices = amd_gpus(str(tmp_path))
    assert [str(d) for d in devices] == ["rocm:0"]
    assert devices[0].description == "gfx1100"
