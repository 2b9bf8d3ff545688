"""Checks of the repository itself (README, install lines). Tests marked ``slow`` in this folder
run only when asked for (``pytest tests -m slow``): they run whole README examples."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # This hook sees every item of the session: touch only this folder's, leaving the packages'
    # slow tests as they are.
    if "slow" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="runs the README's examples end to end: pytest tests -m slow")
    for item in items:
        if item.get_closest_marker("slow") is not None and HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(skip)
