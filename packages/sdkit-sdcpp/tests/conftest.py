"""sdkit-sdcpp's fixtures; helpers live in ``sdcpp_helpers`` (importable under importlib mode)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # ``import sdcpp_helpers`` under importlib mode

from sdcpp_checkpoints import cached_checkpoint

from sdkit_sdcpp import binding


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The full-size no-drift checks (GBs written, minutes on 2 cores) run only when asked for
    (``-m slow``): ``python3 dev.py test`` runs every other test, and would install a cached
    binding (``dev.py sdcpp``) without asking for them."""
    if "slow" in (config.option.markexpr or ""):
        return
    here = Path(__file__).parent
    skip = pytest.mark.skip(reason="full-size SD 1.5/SDXL check: pytest packages/sdkit-sdcpp/tests -m slow")
    for item in items:
        if item.get_closest_marker("slow") is not None and here in Path(str(item.path)).parents:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def fresh_build_info() -> Iterator[None]:
    binding.build_info.cache_clear()
    yield
    binding.build_info.cache_clear()


@pytest.fixture(scope="session")
def sd15(request: pytest.FixtureRequest) -> Path:
    """A full-size SD 1.5 single file of random fp16 weights (2.1 GB, written once per checkout)."""
    return cached_checkpoint(request, "sd15")
