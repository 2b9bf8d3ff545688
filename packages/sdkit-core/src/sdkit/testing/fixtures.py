"""pytest fixtures for plugin authors (auto-registered through the ``pytest11`` entry point)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sdkit.model import Model
from sdkit.testing.models import compare_with_reference, one_node_model


@pytest.fixture
def sdkit_isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh plugin set, probe results and artifact cache (in ``tmp_path``) for one test.
    Clears SDKIT_BACKEND / SDKIT_DISABLE_PLUGINS / SDKIT_STRICT_PLUGINS from the environment."""
    from sdkit.plugins import reset_plugins
    from sdkit.selection import forget_probes

    cache = tmp_path / "sdkit-cache"
    monkeypatch.setenv("SDKIT_CACHE_DIR", str(cache))
    monkeypatch.setenv("SDKIT_CONFIG", str(tmp_path / "no-config.toml"))
    for var in ("SDKIT_BACKEND", "SDKIT_DISABLE_PLUGINS", "SDKIT_STRICT_PLUGINS"):
        monkeypatch.delenv(var, raising=False)
    reset_plugins()
    forget_probes()
    yield cache
    reset_plugins()
    forget_probes()


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
