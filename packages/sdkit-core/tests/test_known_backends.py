"""First-party backends whose plugin is missing: listed with their install command, and asking
for one says what to install; a third-party name stays unknown, with a did-you-mean."""

from __future__ import annotations

import importlib.metadata
import json
import re
from pathlib import Path

import numpy as np
import pytest

import sdkit
from sdkit import known_backends
from sdkit import plugins as plugins_module
from sdkit.api import pipeline_engines
from sdkit.cli.main import main
from sdkit.errors import BackendUnavailableError, UnknownBackendError
from sdkit.known_backends import (
    KNOWN_BACKENDS,
    PIPELINE_ENGINES,
    InstallSource,
    install_command,
    known_backend,
    requirement,
)
from sdkit.plugins import Plugins
from sdkit.selection import choose
from sdkit.testing import one_node_model

SIX = ["tensorrt", "migraphx", "coreml", "openvino", "ggml", "reference"]
ENGINES = ["sdcpp"]  # pipeline engines (stable-diffusion.cpp), listed after the graph backends


@pytest.fixture
def core_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine where only sdkit-core is installed: no plugin loads, no plugin distribution."""
    monkeypatch.setattr(plugins_module.manager, "_plugins", Plugins([]))
    real = known_backends.installed_version
    monkeypatch.setattr(known_backends, "installed_version", lambda d: real(d) if d == "sdkit-core" else None)


def _model() -> sdkit.Model:
    return one_node_model("Relu", {"x": np.zeros((2, 3), np.float32)})


def test_the_table_names_every_first_party_backend() -> None:
    assert [k.name for k in KNOWN_BACKENDS] == SIX
    assert requirement("cpu") == f'"sdkit[cpu]>={sdkit.__version__}"'
    assert known_backend("openvino").install_command == install_command("intel")  # type: ignore[union-attr]
    assert known_backend("coreml").install_command == install_command("apple") + " (on macOS)"  # type: ignore[union-attr]
    assert known_backend("TRT") is known_backend("tensorrt")
    assert known_backend("onnxruntime") is None


@pytest.mark.usefixtures("core_only")
def test_backends_lists_missing_plugins_with_their_install_command() -> None:
    infos = {b.name: b for b in [*sdkit.backends(), *pipeline_engines()]}
    assert sorted(infos) == sorted(SIX + ENGINES)
    assert [b.name for b in pipeline_engines()] == ENGINES and "sdcpp" not in {b.name for b in sdkit.backends()}
    assert infos["reference"].available and infos["reference"].installed
    for known in (*KNOWN_BACKENDS[:-1], *PIPELINE_ENGINES):
        info = infos[known.name]
        assert not info.available and not info.installed
        assert info.reason == f"plugin {known.distribution} is not installed"
        assert info.install_hint == known.install_command
        assert install_command(known.extra) in info.install_hint


@pytest.mark.usefixtures("core_only")
def test_cli_lists_all_six_in_text_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["backends", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [b["name"] for b in data["backends"]] == ["reference", *SIX[:-1], *ENGINES]
    assert {tuple(sorted(b)) for b in data["backends"]} == {tuple(sorted(data["backends"][0]))}  # one schema
    assert main(["backends"]) == 0
    lines = capsys.readouterr().out.splitlines()
    openvino = next(line for line in lines if line.startswith("openvino "))
    assert f"plugin sdkit-openvino is not installed; {install_command('intel')}" in openvino


@pytest.mark.usefixtures("core_only")
def test_asking_for_a_missing_first_party_backend_says_what_to_install(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with pytest.raises(BackendUnavailableError, match=re.escape(f"not installed ({install_command('intel')})")) as info:
        sdkit.compile(_model(), backend="openvino")
    assert info.value.install_hint == known_backend("openvino").install_command  # type: ignore[union-attr]
    with pytest.raises(BackendUnavailableError, match=re.escape(install_command("nvidia"))):
        choose(None, backend="trt")
    model = tmp_path / "relu.onnx"
    relu = _model()
    relu.graph.save(model, relu.weights)
    assert main(["run", str(model), "--random", "x=2x3", "--backend", "openvino"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("sdkit: error: backend 'openvino' is unavailable: plugin sdkit-openvino is not installed")
    assert "\n" not in err


@pytest.mark.usefixtures("core_only")
def test_a_third_party_name_stays_unknown_with_did_you_mean() -> None:
    with pytest.raises(UnknownBackendError, match="unknown backend 'onnxruntime'"):
        choose(None, backend="onnxruntime")
    with pytest.raises(UnknownBackendError, match="did you mean 'openvino'"):
        choose(None, backend="openvno")


@pytest.mark.usefixtures("core_only")
def test_a_preferred_but_missing_backend_is_skipped_with_its_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SDKIT_BACKEND", "openvino")
    choice = choose(_model().graph)
    assert choice.backend.name == "reference"
    assert choice.rejected[0][0] == "openvino" and install_command("intel") in choice.rejected[0][1]


def test_a_disabled_plugin_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SDKIT_DISABLE_PLUGINS", "openvino")
    monkeypatch.setattr(known_backends, "installed_version", lambda d: "3.0.0.dev0")
    entry_point = importlib.metadata.EntryPoint("openvino", "sdkit_openvino.hooks", "sdkit")  # never imported
    monkeypatch.setattr(plugins_module.manager, "_plugins", Plugins([entry_point]))
    info = {b.name: b for b in sdkit.backends()}["openvino"]
    assert not info.available and info.installed
    assert info.reason == "sdkit-openvino 3.0.0.dev0 is installed but its plugin is disabled by SDKIT_DISABLE_PLUGINS"
    with pytest.raises(BackendUnavailableError, match="disabled by SDKIT_DISABLE_PLUGINS"):
        choose(None, backend="openvino")


def _installed_as(monkeypatch: pytest.MonkeyPatch, direct_url: dict[str, object], version: str) -> InstallSource:
    monkeypatch.setattr(known_backends, "_direct_url", lambda d: direct_url)
    monkeypatch.setattr(known_backends, "installed_version", lambda d: version)
    return known_backends.install_source()


def test_hints_from_an_editable_checkout_install_its_package_folders(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """pip's direct_url.json (PEP 610) of an editable sdkit-core: hints install from its checkout."""
    (tmp_path / "packages" / "sdkit-core").mkdir(parents=True)
    url = (tmp_path / "packages" / "sdkit-core").as_uri()
    source = _installed_as(monkeypatch, {"url": url, "dir_info": {"editable": True}}, "3.0.0.dev0")
    assert source == InstallSource("checkout", str(tmp_path), editable=True)
    packages = tmp_path / "packages"
    assert install_command("intel", source=source) == f'pip install -e "{packages}/sdkit-openvino"'
    assert install_command("serve", source=source) == f'pip install -e "{packages}/sdkit-serve"'
    assert install_command("ray", source=source) == f'pip install -e "{packages}/sdkit-serve[ray]"'
    assert install_command("control", "sdkit-core", source) == f'pip install -e "{packages}/sdkit-core[control]"'
    assert install_command("tensorrt", "sdkit-trt", source) == f'pip install -e "{packages}/sdkit-trt[tensorrt]"'
    copied = _installed_as(monkeypatch, {"url": url, "dir_info": {}}, "3.0.0.dev0")  # pip install packages/...
    assert install_command("cpu", source=copied) == f'pip install "{packages}/sdkit-ggml"'


def test_hints_from_wheel_files_find_links_their_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    wheel = tmp_path / "my dist" / "sdkit_core-3.0.0.dev0-py3-none-any.whl"
    source = _installed_as(monkeypatch, {"url": wheel.as_uri(), "archive_info": {}}, "3.0.0.dev0")
    assert source == InstallSource("wheels", str(wheel.parent))
    expected = f"pip install --find-links '{wheel.parent}' \"sdkit[intel]>={sdkit.__version__}\""
    assert install_command("intel", source=source) == expected


def test_hints_for_a_dev_release_of_unknown_origin_build_the_wheels_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Installed by --find-links (pip records no direct_url.json then): a dev release is on no index."""
    source = _installed_as(monkeypatch, {}, "3.0.0.dev0")
    assert source == InstallSource("unpublished")
    assert install_command("cpu", source=source) == (
        "python3 dev.py wheels && pip install --find-links dist "
        f'"sdkit[cpu]>={sdkit.__version__}" (in the sdkit checkout)'
    )


def test_hints_for_a_published_release_name_the_index(monkeypatch: pytest.MonkeyPatch) -> None:
    for direct_url in ({}, {"url": "https://example.org/sdkit_core-3.0.0-py3-none-any.whl", "archive_info": {}}):
        source = _installed_as(monkeypatch, direct_url, "3.0.0")
        assert source == InstallSource("index")
        assert install_command("nvidia", source=source) == f'pip install "sdkit[nvidia]>={sdkit.__version__}"'
    assert install_command(source=source) == f'pip install "sdkit>={sdkit.__version__}"'
