"""pytest fixtures for plugin authors (auto-registered through the ``pytest11`` entry point)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from sdkit.model import Model
from sdkit.testing.assets import sd_graphs_module, taef2_dir
from sdkit.testing.models import compare_with_reference, one_node_model


@pytest.fixture
def sdkit_isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh plugin set, probe results and artifact cache (in ``tmp_path``) for one test.
    Clears SDKIT_BACKEND / SDKIT_DISABLE_PLUGINS / SDKIT_STRICT_PLUGINS from the environment."""
    from sdkit.plugins import reset_plugins

    cache = tmp_path / "sdkit-cache"
    monkeypatch.setenv("SDKIT_CACHE_DIR", str(cache))
    monkeypatch.setenv("SDKIT_CONFIG", str(tmp_path / "no-config.toml"))
    for var in ("SDKIT_BACKEND", "SDKIT_DISABLE_PLUGINS", "SDKIT_STRICT_PLUGINS"):
        monkeypatch.delenv(var, raising=False)
    reset_plugins()
    yield cache
    reset_plugins()


@pytest.fixture
def one_node() -> Callable[..., Model]:
    """Factory: ``one_node("Relu", {"x": array})`` -> a one-node Model (see ``one_node_model``)."""
    return one_node_model


@pytest.fixture
def assert_like_reference() -> Callable[..., None]:
    """``assert_like_reference(outputs, model, feeds, atol=1e-5)``: compare with onnx.reference."""

    def check(
        outputs: dict[str, np.ndarray], model: Model, feeds: dict[str, np.ndarray], atol: float = 1e-5, **_: Any
    ) -> None:
        diffs = compare_with_reference(outputs, model, feeds)
        worst = {k: v for k, v in diffs.items() if not v <= atol}
        assert not worst, f"outputs differ from onnx.reference by more than {atol}: {worst}"

    return check


@pytest.fixture
def taef2(request: pytest.FixtureRequest) -> Path:
    """The real TAEF2 model folder (``models/taef2`` of the checkout, or a ``shared/`` copy
    beside it); skips when neither exists."""
    folder = taef2_dir(request.config.rootpath)
    if folder is None:
        pytest.skip("TAEF2 model not found (models/taef2 or shared/models/taef2 above the test root)")
    return folder


@pytest.fixture
def sd_graphs(request: pytest.FixtureRequest) -> ModuleType:
    """The ``fixtures/sd_graphs`` module of the checkout; skips when absent."""
    module = sd_graphs_module(request.config.rootpath)
    if module is None:
        pytest.skip("fixtures/sd_graphs.py not found above the test root")
    return module
