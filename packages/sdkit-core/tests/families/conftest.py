"""Shared paths: the family fixtures committed under ``<repo root>/fixtures/families`` (made by
its dev-only scripts with torch/diffusers/transformers; the tests only read them). The tiny
families themselves are registered by the ``tiny_families`` fixture of ``tests/conftest.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

FAMILIES = Path(__file__).resolve().parents[4] / "fixtures" / "families"
TINY = FAMILIES / "tiny"


@pytest.fixture(scope="session")
def tiny_families_dir() -> Path:
    if not (TINY / "sd1" / "goldens.json").is_file():
        pytest.skip(f"the tiny family fixtures are missing ({TINY})")
    return TINY


@pytest.fixture(scope="session")
def families_dir() -> Path:
    if not (FAMILIES / "VERSIONS.json").is_file():
        pytest.skip(f"the family fixtures are missing ({FAMILIES})")
    return FAMILIES
