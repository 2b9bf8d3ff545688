"""The import contracts (.importlinter) can fail: the packages' sources and the contracts are
copied to a temporary folder, one deliberately wrong import (or an unplaced module) is put into
the copy, and ``lint-imports`` run there (PYTHONPATH at the copy) must fail naming the contract
that forbids it; the untouched copy passes. A contract that cannot fail (a module
no layer names, a package import-linter cannot see) would make one of these cases pass."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / ".importlinter"
# lint-imports, run by this interpreter (its console script may not be on PATH)
LINT_IMPORTS = [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()"]

pytest.importorskip("importlinter")


def _names() -> dict[str, str]:
    """Contract id -> its name, from the real config."""
    ids = re.findall(r"^\[importlinter:contract:([\w-]+)\]\nname = (.+)$", CONFIG.read_text(encoding="utf-8"), re.M)
    return dict(ids)


def _sources_only(folder: str, names: list[str]) -> set[str]:
    """shutil.copytree's ignore: Python sources only (no shipped graphs, caches, data)."""
    return {n for n in names if n == "__pycache__" or (Path(folder, n).is_file() and not n.endswith(".py"))}


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of every root package's sources and of .importlinter."""
    dest = tmp_path_factory.mktemp("contracts")
    for package in sorted(ROOT.glob("packages/*/src/*/__init__.py")):
        shutil.copytree(package.parent, dest / "src" / package.parent.name, ignore=_sources_only)
    shutil.copy(CONFIG, dest / ".importlinter")
    return dest


def _broken(copy: Path) -> set[str]:
    """The names of the contracts lint-imports reports broken in ``copy``."""
    env = {**os.environ, "PYTHONPATH": str(copy / "src"), "COLUMNS": "1000"}
    run = subprocess.run(
        [*LINT_IMPORTS, "--no-cache", "--no-logo"],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    kept_or_broken = re.findall(r"^(.+) (KEPT|BROKEN)$", run.stdout, re.M)
    assert kept_or_broken, run.stdout + run.stderr  # it analysed the copy and checked contracts
    broken = {name for name, verdict in kept_or_broken if verdict == "BROKEN"}
    assert (run.returncode != 0) == bool(broken), run.stdout
    return broken


def test_the_untouched_copy_passes(copy: Path) -> None:
    assert _broken(copy) == set()


CASES = {
    # a low layer of core reaching up, lazily inside a function
    "core-layer-up": (
        "sdkit/errors.py",
        "def _wrong():\n    from sdkit.pipelines.loaders import loading\n",
        {"core-layers"},
    ),
    # one backend plugin importing another
    "plugin-to-plugin": ("sdkit_openvino/tensors.py", "import sdkit_ggml.compiled\n", {"plugins-independent"}),
    # a backend plugin on core's upper layers
    "plugin-to-api": ("sdkit_trt/shapes.py", "import sdkit.api\n", {"plugins-use-the-contract"}),
    # a plugin's low module reaching up inside the plugin (lazily)
    "plugin-layer-up": ("sdkit_trt/runtime.py", "def _wrong():\n    from sdkit_trt import compiled\n", {"trt-layers"}),
    # core importing a plugin
    "core-to-plugin": ("sdkit/selection.py", "import sdkit_migraphx.backend\n", {"core-knows-no-plugin"}),
    # the coreml registry importing a converter back: a circle, and upward
    "coreml-circle": (
        "sdkit_coreml/translate/registry.py",
        "from sdkit_coreml.translate import nn\n",
        {"coreml-acyclic", "coreml-translate-layers"},
    ),
    # a new module that no layer names (the layers contracts are exhaustive)
    "unplaced-module": ("sdkit/pipelines/unplaced.py", "X = 1\n", {"pipelines-layers"}),
    "unplaced-pipelines-stage": ("sdkit/pipelines/stages/unplaced.py", "X = 1\n", {"pipelines-stages-layers"}),
    # a shared stage reaching up into the pipeline classes (lazily)
    "pipelines-stage-up": (
        "sdkit/pipelines/stages/rng.py",
        "def _wrong():\n    from sdkit.pipelines.models import base\n",
        {"pipelines-layers"},
    ),
    "unplaced-ggml-module": ("sdkit_ggml/unplaced.py", "X = 1\n", {"ggml-layers"}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_wrong_import_breaks_its_contract(copy: Path, case: str) -> None:
    path, added, expected = CASES[case]
    target = copy / "src" / path
    original = target.read_text(encoding="utf-8") if target.exists() else None
    target.write_text((original or "") + "\n" + added, encoding="utf-8")
    try:
        broken = _broken(copy)
    finally:
        if original is None:
            target.unlink()
        else:
            target.write_text(original, encoding="utf-8")
    names = _names()
    # Others may break too (an upward import also closes circles, and import-linter follows
    # indirect chains: a plugin reaches the edited core module), never fewer.
    assert {names[c] for c in expected} <= broken
