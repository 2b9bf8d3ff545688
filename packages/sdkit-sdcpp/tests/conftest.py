"""sdkit-sdcpp's fixtures; helpers live in ``sdcpp_helpers`` (importable under importlib mode)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # ``import sdcpp_helpers`` under importlib mode

from sdkit_sdcpp import binding


@pytest.fixture(autouse=True)
def fresh_build_info() -> Iterator[None]:
    binding.build_info.cache_clear()
    yield
    binding.build_info.cache_clear()
