"""Every first-party distribution shares one version, and none depends on a path."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import sdkit

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[3]


def test_one_shared_version() -> None:
    versions = {"sdkit-core": sdkit.__version__}
    for version_file in REPO.glob("packages/*/src/*/_version.py"):
        match = re.search(r'__version__ = "([^"]+)"', version_file.read_text())
        assert match, version_file
        versions[version_file.parents[2].name] = match.group(1)
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    versions["sdkit"] = meta["project"]["version"]
    assert len(set(versions.values())) == 1, versions


def test_no_path_dependencies_and_pinned_siblings() -> None:
    for pyproject in [REPO / "pyproject.toml", *REPO.glob("packages/*/pyproject.toml")]:
        project = tomllib.loads(pyproject.read_text())["project"]
        deps = list(project.get("dependencies", []))
        for extra in project.get("optional-dependencies", {}).values():
            deps += extra
        for dep in deps:
            assert "file:" not in dep and " @ " not in dep, f"{pyproject}: path dependency {dep}"
            if dep.startswith("sdkit-"):
                assert f"=={sdkit.__version__}" in dep, f"{pyproject}: {dep} is not pinned to the shared version"
