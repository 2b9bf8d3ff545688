"""sdkit-core's tiny model families (``packages/sdkit-core/tests/conftest.py``: the tiny SD 1.x
checkpoint its LoRA, LyCORIS and embedding fixtures are for) registered as a plugin, here and in
an ``sdkit serve`` child process: ``python tiny_families.py serve ...`` is ``sdkit serve ...``
with them."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from pathlib import Path
from typing import Any

CORE_TESTS = Path(__file__).resolve().parents[2] / "sdkit-core" / "tests"
MODULE = "sdkit_tests_tiny_families"  # the name core's conftest publishes itself under
SD1 = Path(__file__).resolve().parents[3] / "fixtures" / "families" / "tiny" / "sd1"


def tiny_family_plugins() -> Any:
    """The installed plugins plus the tiny families (``sdkit.plugins.Plugins``)."""
    from sdkit.plugins import Plugins

    if MODULE not in sys.modules:
        spec = importlib.util.spec_from_file_location(MODULE, CORE_TESTS / "conftest.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[MODULE] = module
        spec.loader.exec_module(module)
    entry = importlib.metadata.EntryPoint(name="tiny-families", value=MODULE, group="sdkit")
    return Plugins([*importlib.metadata.entry_points(group="sdkit"), entry])


if __name__ == "__main__":
    from sdkit.cli.main import main
    from sdkit.plugins import manager

    manager._plugins = tiny_family_plugins()
    sys.exit(main(sys.argv[1:]))
