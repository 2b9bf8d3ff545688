from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _isolated(sdkit_isolated: Path) -> Path:
    """Every core test runs with fresh plugins, probes and a private artifact cache."""
    return sdkit_isolated
