"""Checks of the repository itself (README, install lines). Tests marked ``slow`` here run only
when asked for (``pytest tests -m slow``): they run whole README examples."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "slow" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="runs the README's examples end to end: pytest tests -m slow")
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(skip)
