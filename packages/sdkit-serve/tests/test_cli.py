"""``sdkit serve`` as a subcommand of core's CLI: found through the ``sdkit.cli`` entry point,
imported without the server stack, one-line errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sdkit.cli.main import main


def test_serve_is_a_subcommand_of_sdkit(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "serve" in capsys.readouterr().out


def test_building_the_cli_imports_no_server_library() -> None:
    code = (
        "import sys; from sdkit.cli.main import build_parser; build_parser(); "
        "print(sorted(m for m in ('fastapi', 'uvicorn', 'starlette', 'ray', 'pydantic') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_public_host_without_key_is_refused(
    capsys: pytest.CaptureFixture[str], tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SDKIT_API_KEY", "")  # empty: no key (an empty --api-key is refused: test_web_security)
    assert main(["serve", "--model", str(tiny), "--host", "0.0.0.0"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("sdkit: error: refusing to listen on 0.0.0.0 without --api-key") and err.count("\n") == 1


def test_bad_model_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["serve", "--model", str(tmp_path / "missing"), "--port", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("sdkit: error:") and err.count("\n") == 1


def test_ray_options_are_checked() -> None:
    from sdkit.errors import OptionError
    from sdkit_serve.ray_serve import ReplicaSpec

    assert ReplicaSpec(replicas=2).deployment_options(8)["num_replicas"] == 2
    options = ReplicaSpec(min_replicas=1, max_replicas=4, gpus_per_replica=1).deployment_options(8)
    assert options["autoscaling_config"]["max_replicas"] == 4 and "num_replicas" not in options
    assert options["ray_actor_options"]["num_gpus"] == 1 and options["max_ongoing_requests"] == 16
    with pytest.raises(OptionError):
        ReplicaSpec(min_replicas=3, max_replicas=2).deployment_options(8)
