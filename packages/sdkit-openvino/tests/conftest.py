from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[3]

if importlib.util.find_spec("openvino") is None:  # the whole suite needs the runtime
    collect_ignore_glob = ["test_*.py"]


def taef2_dir() -> Path | None:
    """``<repo>/models/taef2``, else ``../shared/models/taef2`` beside the checkout."""
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
def sd_graphs() -> ModuleType:
    """``fixtures/sd_graphs.py`` (real SD architectures with seeded random weights)."""
    if not (REPO / "fixtures" / "sd_graphs.py").exists():
        pytest.skip("fixtures/sd_graphs.py not in this checkout")
    sys.path.insert(0, str(REPO / "fixtures"))
    import sd_graphs

    return sd_graphs
