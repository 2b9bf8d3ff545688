"""Shared paths: the family fixtures committed under ``<repo root>/fixtures/families`` (made by
its dev-only scripts with torch/diffusers/transformers; the tests only read them)."""

from __future__ import annotations

from pathlib import Path

import pytest

FAMILIES = Path(__file__).resolve().parents[4] / "fixtures" / "families"


@pytest.fixture(scope="session")
def families_dir() -> Path:
    if not (FAMILIES / "VERSIONS.json").is_file():
        pytest.skip(f"the family fixtures are missing ({FAMILIES})")
    return FAMILIES
