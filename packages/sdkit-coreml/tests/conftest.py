"""Markers and helper path of sdkit-coreml's tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # ``import coreml_helpers`` under importlib mode


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "macos: needs macOS with the Core ML runtime (prediction)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from coreml_helpers import runtime_missing

    why = runtime_missing()
    if why:
        skip = pytest.mark.skip(reason=f"needs the Core ML runtime: {why}")
        for item in items:
            if "macos" in item.keywords:
                item.add_marker(skip)
