"""The plugin guide's example, tested the way a plugin author would: with sdkit.testing."""

from __future__ import annotations

import importlib.metadata
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import sdkit
from sdkit import plugins as plugins_module
from sdkit.plugins import Plugins
from sdkit.testing import run_conformance

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
pytest.importorskip("onnxruntime")


@pytest.fixture(autouse=True)
def with_plugin(sdkit_isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # As if `pip install` had put the entry point in place.
    ep = importlib.metadata.EntryPoint("onnxruntime", "sdkit_onnxruntime", "sdkit")
    monkeypatch.setattr(plugins_module.manager, "_plugins", Plugins([ep]))


def test_registered_and_available() -> None:
    info = {b.name: b for b in sdkit.backends()}["onnxruntime"]
    assert info.available and info.devices == ["cpu"]


def test_gelu_like_reference(one_node: Callable[..., sdkit.Model], assert_like_reference: Callable[..., None]) -> None:
    feeds = {"x": np.linspace(-3, 3, 24, dtype=np.float32).reshape(2, 3, 4)}
    model = one_node("Gelu", feeds, opset=20)
    outputs = sdkit.compile(model, backend="onnxruntime").run(feeds)
    assert_like_reference(outputs, model, feeds, atol=1e-5)


def test_node_suite_subset() -> None:
    result = run_conformance("onnxruntime", include=[r"^test_(conv_|gemm|softmax|resize_upsample)"])
    assert result.failed == {}
    assert len(result.passed) >= 30, result.summary()
