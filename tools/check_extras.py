"""Install each extra of ``sdkit`` the way the README says, from the locally built wheels, in a
fresh virtual environment per extra; check that it yields sdkit 3 and that ``sdkit backends``
lists every first-party backend with an availability and a reason; measure the installed size.

    python tools/check_extras.py [--dist dist] [--extras core,cpu,...] [--write-readme]

Run it with a Python that has sdkit-core installed (``.venv/bin/python``, or ``python3 dev.py
extras``): the install lines come from ``sdkit.known_backends``, the source the README's lines
and the CLI's install hints are checked against. Wheels missing from ``--dist`` are built
(``pip wheel``). Third-party dependencies come from the package index, so this needs it.
``--write-readme`` rewrites the size table between the README's ``extras-table`` markers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import venv
from dataclasses import dataclass
from pathlib import Path

from sdkit import __version__
from sdkit.known_backends import KNOWN_BACKENDS, InstallSource, KnownBackend, install_command, requirement

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["sdkit-core", "sdkit-ggml", "sdkit-openvino", "sdkit-trt", "sdkit-migraphx", "sdkit-coreml"]
BEGIN, END = "<!-- extras-table:begin -->", "<!-- extras-table:end -->"
# The Hub client: a dependency sdkit never imports, reported when something pulls it in.
HUB = "huggingface-hub"

# Runs inside each fresh environment: every installed distribution, its size on disk and the
# names it requires (markers evaluated; extras only where the root asked for them).
INSPECT = r"""
import importlib.metadata as md, json, re, sys
from pip._vendor.packaging.requirements import Requirement
extras = set(sys.argv[1].split(",")) - {""}
out = {}
for dist in md.distributions():
    name = re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower()
    size = sum(f.locate().stat().st_size for f in dist.files or [] if f.locate().is_file())
    wanted = extras if name == "sdkit" else set()
    needs = []
    for text in dist.requires or []:
        req = Requirement(text)
        if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in (wanted or {""})):
            needs.append(re.sub(r"[-_.]+", "-", req.name).lower())
    out[name] = {"version": dist.version, "size": size, "requires": needs}
print(json.dumps(out))
"""


@dataclass
class Outcome:
    extra: str
    line: str
    sdkit_version: str
    size: int  # growth of site-packages on disk (``folder_size``)
    apparent: int  # the same growth as the sum of file sizes (``bytes_size``)
    dists: dict[str, dict[str, object]]
    backends_text: str
    problems: list[str]


def log(text: str) -> None:
    print(text, flush=True)


def run(*args: str | Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(map(str, args))}\n{done.stdout}\n{done.stderr}")
    return done.stdout


def ensure_wheels(dist: Path) -> None:
    """Build the wheels that ``dist`` lacks (the meta-distribution and every package)."""
    dist.mkdir(parents=True, exist_ok=True)
    for name, source in [("sdkit", ROOT), *((p, ROOT / "packages" / p) for p in PACKAGES)]:
        stem = name.replace("-", "_")
        if not list(dist.glob(f"{stem}-{__version__}-*.whl")):
            log(f"building the {name} wheel")
            run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", dist, source)


def folder_size(path: Path) -> int:
    """Bytes a folder takes on disk, as ``du -s --block-size=1`` counts them: allocated blocks
    (``st_blocks``, 512 bytes each), each hard-linked file once. This is the growth a user
    sees (``du`` on site-packages before and after ``pip install``); the sum of file sizes is
    a few percent less (thousands of small ``.py``/``.pyc`` files each fill a 4 KB block)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for f in path.rglob("*"):
        info = f.lstat()
        if (info.st_dev, info.st_ino) not in seen:
            seen.add((info.st_dev, info.st_ino))
            total += info.st_blocks * 512
    return total


def core_source_bytes() -> int:
    """The bytes of sdkit-core's package files in this checkout (what its wheel holds, no
    ``__pycache__``): the README records it with the table, and ``tests/test_install_lines.py``
    fails when the checkout's differs by a megabyte or more (the table is stale: measure again)."""
    src = ROOT / "packages" / "sdkit-core" / "src" / "sdkit"
    return sum(f.stat().st_size for f in src.rglob("*") if f.is_file() and "__pycache__" not in f.parts)


def bytes_size(path: Path) -> int:
    """The sum of the regular files' sizes (what ``du -s --apparent-size`` counts)."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def clean_env(cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SDKIT_") and k != "VIRTUAL_ENV"}
    env["SDKIT_CACHE_DIR"] = str(cache)
    env["SDKIT_CONFIG"] = str(cache / "no-config.toml")
    return env


def unpublished_hint(known: KnownBackend) -> str:
    """The hint a venv installed from dist/ prints: pip records no direct URL for a --find-links
    install, so sdkit sees a dev release of unknown origin (``sdkit.known_backends.install_source``)."""
    note = f" (on {known.platforms})" if known.platforms else ""
    return install_command(known.extra, source=InstallSource("unpublished")) + note


def check_backends(data: dict[str, object]) -> list[str]:
    """Every first-party backend listed, each with an availability and a reason or devices."""
    problems = []
    rows = {b["name"]: b for b in data["backends"]}  # type: ignore[attr-defined, index]
    for known in KNOWN_BACKENDS:
        row = rows.get(known.name)
        if row is None:
            problems.append(f"sdkit backends does not list {known.name}")
        elif not isinstance(row["available"], bool) or not (row["reason"] or row["devices"]):
            problems.append(f"{known.name}: no availability or reason: {row}")
        elif not row["installed"] and row["install_hint"] != unpublished_hint(known):
            problems.append(f"{known.name}: install hint {row['install_hint']!r} is not {unpublished_hint(known)!r}")
    return problems


def install(extra: str, dist: Path, work: Path) -> Outcome:
    line = f"pip install {requirement(extra)}"
    env_dir = work / f"venv-{extra or 'core'}"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    bindir = env_dir / ("Scripts" if os.name == "nt" else "bin")
    python = bindir / ("python.exe" if os.name == "nt" else "python")
    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
    before, before_bytes = folder_size(site), bytes_size(site)
    log(f"[{extra or 'core'}] {line}  (--find-links {dist})")
    start = time.perf_counter()
    spec = requirement(extra).strip('"')  # the README quotes it for the shell; here it is one argv item
    run(python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--find-links", dist, spec)
    log(f"[{extra or 'core'}] installed in {time.perf_counter() - start:.0f} s")
    dists = json.loads(run(python, "-c", INSPECT, extra))
    env = clean_env(work / "cache")
    data = json.loads(run(bindir / "sdkit", "backends", "--json", env=env))
    text = run(bindir / "sdkit", "backends", env=env)
    problems = check_backends(data)
    version = str(dists.get("sdkit", {}).get("version", "not installed"))
    if version != __version__:
        problems.append(f"the install line gave sdkit {version}, not {__version__}")
    # Measured after ``sdkit backends`` ran, as a user's site-packages is once sdkit has run.
    grown, grown_bytes = folder_size(site) - before, bytes_size(site) - before_bytes
    return Outcome(extra, line, version, grown, grown_bytes, dists, text, problems)


def closure(roots: list[str], dists: dict[str, dict[str, object]], without: str = "") -> set[str]:
    seen: set[str] = set()
    todo = [r for r in roots if r != without]
    while todo:
        name = todo.pop()
        if name in seen or name not in dists:
            continue
        seen.add(name)
        todo.extend(n for n in dists[name]["requires"] if n != without)  # type: ignore[attr-defined]
    return seen


def mb(size: float) -> str:
    return f"{size / 1e6:.0f} MB"


def dist_size(outcome: Outcome, name: str) -> int:
    return int(outcome.dists[name]["size"])  # type: ignore[call-overload]


def largest(outcome: Outcome, names: set[str]) -> str:
    big = sorted((n for n in names if dist_size(outcome, n) >= 3e6), key=lambda n: -dist_size(outcome, n))
    return ", ".join(f"{n} {mb(dist_size(outcome, n))}" for n in big)


def earlier_rows(readme: str) -> dict[str, str]:
    """The README table's rows by install line, each size cell marked with the run it came from
    (kept by ``--write-readme`` for the lines this run did not measure)."""
    if BEGIN not in readme:
        return {}
    old = readme.split(BEGIN, 1)[1].split(END, 1)[0]
    found = re.search(r"\((\d{4}-\d{2}-\d{2}),", old)
    when = found.group(1) if found else "an earlier run"
    rows = {}
    for row in old.splitlines():
        cells = row.split(" | ")
        if row.startswith("| `pip install") and len(cells) == 3:
            size = cells[1] if "measured" in cells[1] else f"{cells[1]} (measured {when})"
            rows[cells[0].strip("| `")] = " | ".join([cells[0], size, cells[2]])
    return rows


def table(outcomes: list[Outcome], order: list[str], earlier: dict[str, str]) -> str:
    """The README's table: one row per install line (``earlier``'s row for a line this run did
    not measure), then how much of core the Hub chain is."""
    core = next((o for o in outcomes if o.extra == ""), None)
    core_dists = closure(["sdkit"], core.dists) if core else set()
    by_line = dict(earlier)
    for o in outcomes:
        dists = closure(["sdkit"], o.dists)
        if not o.extra:
            parts = largest(o, dists)
        else:
            added = largest(o, dists - core_dists)
            parts = f"core + {added}" if added else "core (nothing over 3 MB added on this platform)"
        by_line[o.line] = f"| `{o.line}` | {mb(o.size)} ({o.size / 2**20:.0f} MiB) | {parts} |"
    lines = [f"pip install {requirement(e)}" for e in order]
    rows = [by_line[line] for line in lines if line in by_line]
    lines = ["| install line | installed size | largest parts |", "|---|---|---|", *rows, ""]
    if core and HUB in core_dists:
        hub = core_dists - closure(["sdkit"], core.dists, without=HUB)
        hub_size = sum(dist_size(core, d) for d in hub)
        lines.append(
            f"Of core's {mb(core.size)}, {mb(hub_size)} is {HUB} and what only it needs "
            f"({', '.join(sorted(hub - {HUB}))}): a dependency requires it; sdkit never imports it."
        )
    lines.append(
        f"Measured by `tools/check_extras.py` ({time.strftime('%Y-%m-%d')}, Linux {platform.machine()}, "
        f"Python {platform.python_version()}): a fresh venv per line; installed size is how much "
        "site-packages grew on disk, as `du -s` counts it (allocated blocks, the .pyc files pip compiles "
        "and the metadata included, pip itself excluded), in MB and in `du -sm`'s MiB; the parts are the "
        "sum of each distribution's file sizes, which is less (thousands of small files each fill a block). "
        "A size marked with a date is from that earlier run (the sum of file sizes then). "
        f"sdkit-core's package files at the time: {core_source_bytes() / 1e6:.2f} MB."
    )
    return "\n".join(lines)


def write_readme(text: str) -> None:
    readme = ROOT / "README.md"
    content = readme.read_text(encoding="utf-8")
    if BEGIN not in content or END not in content:
        raise SystemExit(f"README.md has no {BEGIN} ... {END} markers")
    head, rest = content.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}", encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dist", type=Path, default=ROOT / "dist", help="folder of built wheels (default: dist)")
    order = ["", "cpu", "intel", "nvidia", "amd", "apple"]
    assert set(order) - {""} == {k.extra for k in KNOWN_BACKENDS} - {""}, "a new extra: add it to the order"
    parser.add_argument("--extras", default=",".join(e or "core" for e in order), help="(default: %(default)s)")
    parser.add_argument("--write-readme", action="store_true", help="update the README's size table")
    parser.add_argument("--keep", action="store_true", help="keep the environments (printed)")
    args = parser.parse_args()
    ensure_wheels(args.dist.resolve())
    work = Path(tempfile.mkdtemp(prefix="sdkit-extras-"))
    outcomes = []
    try:
        for name in args.extras.split(","):
            outcome = install("" if name == "core" else name, args.dist.resolve(), work)
            log(
                f"[{name}] sdkit {outcome.sdkit_version}, site-packages grew {mb(outcome.size)} on disk "
                f"({mb(outcome.apparent)} of file sizes); sdkit backends:"
            )
            log("\n".join("    " + line for line in outcome.backends_text.splitlines()))
            outcomes.append(outcome)
    finally:
        if args.keep:
            log(f"environments kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    earlier = earlier_rows((ROOT / "README.md").read_text(encoding="utf-8"))
    result = table(outcomes, order, earlier)
    log(result)
    if args.write_readme:
        write_readme(result)
        log("README.md updated")
    problems = [f"[{o.extra or 'core'}] {p}" for o in outcomes for p in o.problems]
    for problem in problems:
        log(f"check_extras: {problem}")
    log(f"check_extras: {len(outcomes)} install line(s), {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
