from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def taef2_dir() -> Path | None:
    """The TAEF2 model: the repo's copy, else ../shared beside the checkout."""
    for candidate in (REPO / "models" / "taef2", REPO.parent / "shared" / "models" / "taef2"):
        if (candidate / "taef2_decoder.onnx").is_file():
            return candidate
    return None


@pytest.fixture
def taef2() -> Path:
    folder = taef2_dir()
    if folder is None:
        pytest.skip("TAEF2 model not found (models/taef2 or ../shared/models/taef2)")
    return folder


@pytest.fixture(autouse=True)
def _isolated(sdkit_isolated: Path) -> Path:
    """Every core test runs with fresh plugins, probes and a private artifact cache."""
    return sdkit_isolated
