from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def taef2_dir() -> Path | None:
    for candidate in (REPO / "models" / "taef2", REPO.parent / "shared" / "models" / "taef2"):
        if (candidate / "taef2_decoder.onnx").exists():
            return candidate
    return None


@pytest.fixture
def taef2() -> Path:
    found = taef2_dir()
    if found is None:
        pytest.skip("TAEF2 models not found (models/taef2 or ../shared/models/taef2)")
    return found


@pytest.fixture
def sd_fixtures() -> object:
    if not (REPO / "fixtures" / "sd_graphs.py").exists():
        pytest.skip("fixtures/sd_graphs.py not in this checkout")
    sys.path.insert(0, str(REPO))
    import fixtures.sd_graphs as module

    return module
