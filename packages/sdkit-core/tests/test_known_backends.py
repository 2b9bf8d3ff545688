"""First-party backends whose plugin is missing: listed with their install command, and asking
for one says what to install; a third-party name stays unknown, with a did-you-mean."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import numpy as np
import pytest

import sdkit
from sdkit import known_backends
from sdkit import plugins as plugins_module
from sdkit.cli.main import main
from sdkit.errors import BackendUnavailableError, UnknownBackendError
from sdkit.known_backends import KNOWN_BACKENDS, known_backend, requirement
from sdkit.plugins import Plugins
from sdkit.selection import choose
from sdkit.testing import one_node_model

SIX = ["tensorrt", "migraphx", "coreml", "openvino", "ggml", "reference"]


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
    assert known_backend("openvino").install_command == f'pip install "sdkit[intel]>={sdkit.__version__}"'  # type: ignore[union-attr]
    assert known_backend("TRT") is known_backend("tensorrt")
    assert known_backend("onnxruntime") is None


@pytest.mark.usefixtures("core_only")
def test_backends_lists_missing_plugins_with_their_install_command() -> None:
    infos = {b.name: b for b in sdkit.backends()}
    assert sorted(infos) == sorted(SIX)
    assert infos["reference"].available and infos["reference"].installed
    for known in KNOWN_BACKENDS[:-1]:
        info = infos[known.name]
        assert not info.available and not info.installed
        assert info.reason == f"plugin {known.distribution} is not installed"
        assert info.install_hint == known.install_command
        assert f'"sdkit[{known.extra}]>=' in info.install_hint


@pytest.mark.usefixtures("core_only")
def test_cli_lists_all_six_in_text_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["backends", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [b["name"] for b in data["backends"]] == ["reference", *SIX[:-1]]
    assert {tuple(sorted(b)) for b in data["backends"]} == {tuple(sorted(data["backends"][0]))}  # one schema
    assert main(["backends"]) == 0
    lines = capsys.readouterr().out.splitlines()
    openvino = next(line for line in lines if line.startswith("openvino "))
    assert "plugin sdkit-openvino is not installed; pip install" in openvino and '"sdkit[intel]>=' in openvino


@pytest.mark.usefixtures("core_only")
def test_asking_for_a_missing_first_party_backend_says_what_to_install(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with pytest.raises(BackendUnavailableError, match=r'not installed \(pip install "sdkit\[intel\]>=') as info:
        sdkit.compile(_model(), backend="openvino")
    assert info.value.install_hint == known_backend("openvino").install_command  # type: ignore[union-attr]
    with pytest.raises(BackendUnavailableError, match=r"sdkit\[nvidia\]"):
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
    assert choice.rejected[0][0] == "openvino" and "sdkit[intel]" in choice.rejected[0][1]


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
