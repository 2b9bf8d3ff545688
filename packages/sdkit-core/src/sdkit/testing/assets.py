"""Test assets that live beside a checkout rather than in a wheel: the real TAEF2 model
(``models/taef2``) and the SD architecture graphs (``fixtures/sd_graphs.py``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def find_test_asset(relative: str, start: Path | None = None) -> Path | None:
    """The nearest ``<ancestor>/<relative>``, or ``<ancestor>/shared/<relative>`` (a shared
    folder beside the checkout), walking up from ``start`` (default: the working folder)."""
    here = (start or Path.cwd()).resolve()
    for ancestor in (here, *here.parents):
        for candidate in (ancestor / relative, ancestor / "shared" / relative):
            if candidate.exists():
                return candidate
    return None


def load_module_file(path: Path, name: str) -> ModuleType:
    """The Python file ``path`` (a fixture script's seeded-values helpers, say) imported as a
    fresh module called ``name``, not registered in ``sys.modules``."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def taef2_dir(start: Path | None = None) -> Path | None:
    """The TAEF2 encoder/decoder folder (real weights), or None."""
    folder = find_test_asset("models/taef2", start)
    return folder if folder is not None and (folder / "taef2_decoder.onnx").is_file() else None


def sd_graphs_module(start: Path | None = None) -> ModuleType | None:
    """``fixtures/sd_graphs.py`` imported (SD architectures with seeded random weights), or None."""
    path = find_test_asset("fixtures/sd_graphs.py", start)
    if path is None:
        return None
    name = "sdkit_fixtures_sd_graphs"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            return None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]
