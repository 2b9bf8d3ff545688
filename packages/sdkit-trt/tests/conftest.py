"""Fixtures of sdkit-trt's tests; helpers live in ``trt_helpers`` (importable by name)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # for ``import trt_helpers`` under importlib mode

from trt_helpers import taef2_dir


@pytest.fixture
def taef2() -> Path:
    folder = taef2_dir()
    if folder is None:
        pytest.skip("TAEF2 model files not found (models/taef2 or ../shared/models/taef2)")
    return folder
