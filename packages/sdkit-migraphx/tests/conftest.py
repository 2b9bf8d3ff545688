"""Markers and helper path of sdkit-migraphx's tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # ``import migraphx_fake`` under importlib mode

from migraphx_fake import fake_migraphx  # noqa: F401 - the fixture, for every test here


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "rocm: needs ROCm's MIGraphX and an AMD GPU")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from sdkit_migraphx.backend import MigraphxBackend

    availability = MigraphxBackend().probe()
    if availability.ok:
        return
    skip = pytest.mark.skip(reason=f"needs MIGraphX on an AMD GPU: {availability.reason}")
    for item in items:
        if "rocm" in item.keywords:
            item.add_marker(skip)
