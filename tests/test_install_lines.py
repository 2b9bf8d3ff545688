"""The README's install lines: one per extra, in the pre-release-correct form that
``sdkit.known_backends`` (and so every install hint) uses, and resolving to this checkout's
sdkit 3 where a bare ``"sdkit[cpu]"`` resolves to PyPI's sdkit 2.1.1.

The resolution check is pip's own resolver, offline: ``pip install --dry-run --no-index`` over a
folder holding the meta wheel built from this checkout and a stand-in for PyPI's sdkit 2.1.1;
the plugin distributions the extras pin are the ones installed (editable) in this environment.
``tools/check_extras.py`` (tox ``meta-extras``, ``python3 dev.py extras``) does the full install
in a fresh environment per extra.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import json
import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import sdkit
from sdkit import known_backends
from sdkit.known_backends import KNOWN_BACKENDS, requirement

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r'^pip install --find-links dist ("sdkit(?:\[(\w+)\])?>=[^"]+")\s+# (.+)$')

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - sdkit-core depends on tomli there
    import tomli as tomllib


def readme_section(title: str) -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def install_lines() -> dict[str, str]:
    """extra -> the quoted requirement of each install line in the README's Install section."""
    lines: dict[str, str] = {}
    for line in readme_section("Install").splitlines():
        match = LINE.match(line.strip())
        if match:
            lines[match.group(2) or ""] = match.group(1)
    return lines


def test_every_extra_has_its_line_in_the_pre_release_form() -> None:
    lines = install_lines()
    extras = {k.extra for k in KNOWN_BACKENDS if k.extra}
    assert set(lines) == extras, lines
    for extra, quoted in lines.items():
        assert quoted == requirement(extra) == f'"sdkit[{extra}]>={sdkit.__version__}"'


def test_the_extras_install_the_known_distributions() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["version"] == sdkit.__version__
    extras = project["optional-dependencies"]
    for known in KNOWN_BACKENDS:
        if not known.extra:
            assert project["dependencies"] == [f"{known.distribution}=={sdkit.__version__}"]
            continue
        pins = [re.split(r"[=;\s]", req)[0] for req in extras[known.extra]]
        assert pins == [known.distribution], (known.extra, extras[known.extra])


def _fake_wheel(folder: Path, name: str, version: str) -> Path:
    """A metadata-only wheel: what pip's resolver reads of PyPI's sdkit 2.1.1."""
    dist_info = f"{name}-{version}.dist-info"
    files = {
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{dist_info}/RECORD"] = "\n".join([*record, f"{dist_info}/RECORD,,"]) + "\n"
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel


@pytest.fixture(scope="module")
def links(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("hatchling", reason="building the meta wheel offline needs hatchling (dev.py test has it)")
    try:
        importlib.metadata.version("sdkit")
        pytest.skip("the meta-distribution sdkit is installed here: a dry run would find it satisfied")
    except importlib.metadata.PackageNotFoundError:
        pass
    folder = tmp_path_factory.mktemp("links")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "-q", "--no-build-isolation", "--no-deps", "-w", folder, ROOT], check=True)
    _fake_wheel(folder, "sdkit", "2.1.1")
    return folder


def _resolve(links: Path, spec: str) -> dict[str, str]:
    """What ``pip install spec`` would install here, offline: {name: version}."""
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "install", "--dry-run", "--quiet"]
    done = subprocess.run(
        [*pip, "--no-index", "--find-links", links, "--report", "-", spec], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    return {item["metadata"]["name"]: item["metadata"]["version"] for item in report["install"]}


@pytest.mark.parametrize("extra", ["", "cpu", "intel"])
def test_the_readme_line_resolves_this_sdkit_3(links: Path, extra: str) -> None:
    known = next(k for k in KNOWN_BACKENDS if k.extra == extra or (not extra and k.name == "reference"))
    if known_backends.installed_version(known.distribution) != sdkit.__version__:
        pytest.skip(f"{known.distribution} {sdkit.__version__} is not installed here")
    assert _resolve(links, install_lines().get(extra, requirement(extra)).strip('"')) == {"sdkit": sdkit.__version__}


def test_a_bare_line_would_pick_sdkit_2(links: Path) -> None:
    """Why the floor: pip skips pre-releases unless a requirement names one."""
    assert _resolve(links, "sdkit[cpu]") == {"sdkit": "2.1.1"}


@pytest.mark.parametrize("extra", ["cpu", "intel"])
def test_the_printed_hint_runs_against_the_wheels(links: Path, extra: str) -> None:
    """The hint sdkit prints when it was installed from wheel files, run as printed (pip's argv,
    offline and as a dry run: ``--dry-run --no-index --report -`` appended) over those wheels."""
    known = next(k for k in KNOWN_BACKENDS if k.extra == extra)
    if known_backends.installed_version(known.distribution) != sdkit.__version__:
        pytest.skip(f"{known.distribution} {sdkit.__version__} is not installed here")
    hint = known_backends.install_command(extra, source=known_backends.InstallSource("wheels", str(links)))
    argv = shlex.split(hint)
    assert argv[:2] == ["pip", "install"]
    dry_run = ["--dry-run", "--quiet", "--no-index", "--report", "-"]
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", *argv[1:], *dry_run],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    installs = {i["metadata"]["name"]: i["metadata"]["version"] for i in json.loads(done.stdout)["install"]}
    assert installs == {"sdkit": sdkit.__version__}


def test_the_cpu_advice_quotes_the_measured_ratios() -> None:
    """The Install section's per-machine advice ([intel] on x86, [cpu] elsewhere) quotes the ggml
    ratios the backends table records from benchmarks/run.py, and OpenVINO at onnxruntime's speed."""
    install = " ".join(readme_section("Install").split())
    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert "on an x86 CPU (Intel or AMD) `[intel]`, OpenVINO, is the fast one" in install
    assert "2.7-4x onnxruntime's time, or 1.4-2.5x once" in install
    assert "1.4-2.5x onnxruntime's time with the machine build (`native_build`), 2.7-4x with the prebuilt wheel" in text
    assert "it runs at onnxruntime's speed" in install and "at onnxruntime's speed on this CPU" in text


def size_table() -> dict[str, str]:
    """install line -> installed-size cell of the README's size table (``tools/check_extras.py
    --write-readme`` writes it between the ``extras-table`` markers)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    table = text.split("<!-- extras-table:begin -->", 1)[1].split("<!-- extras-table:end -->", 1)[0]
    rows = [row.split(" | ") for row in table.splitlines() if row.startswith("| `pip install")]
    return {cells[0].strip("| `"): cells[1] for cells in rows}


@pytest.mark.parametrize("extra", ["", "cpu"])
def test_core_and_cpu_install_under_200_mib(extra: str) -> None:
    """The seeds' line: a fresh venv's site-packages grows by under 200 MB and under 200 MiB
    (``du -sm``) with core or ``sdkit[cpu]``, as check_extras last measured it (the on-disk
    measure: a row carried over from an earlier run's file sizes does not count)."""
    cell = size_table()[f"pip install {requirement(extra)}"]
    match = re.fullmatch(r"(\d+) MB \((\d+) MiB\)", cell)
    assert match, f"{cell!r}: not a size check_extras measured on disk; run python3 dev.py extras --write-readme"
    assert int(match.group(1)) < 200, cell
    assert int(match.group(2)) < 200, cell


def test_the_size_table_is_not_stale_for_sdkit_core() -> None:
    """The table records sdkit-core's package files when it was measured; a checkout whose files
    differ by a megabyte or more (a graph or vocabulary added, the graphs' compression dropped)
    needs ``python3 dev.py extras --extras core,cpu --write-readme`` again. Third-party releases
    change the sizes too; only a run with the package index sees those."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(r"sdkit-core's package files at the time: ([\d.]+) MB\.", text)
    assert match, "the README's size table does not record sdkit-core's files; run check_extras --write-readme"
    src = ROOT / "packages" / "sdkit-core" / "src" / "sdkit"
    now = sum(f.stat().st_size for f in src.rglob("*") if f.is_file() and "__pycache__" not in f.parts)
    assert abs(now / 1e6 - float(match.group(1))) < 1.0, (now, match.group(1))
