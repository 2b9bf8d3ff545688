"""Check built distributions: one wheel and one sdist per first-party distribution, all at
the shared version, each wheel carrying py.typed and (for plugins) an ``sdkit`` entry point
(``sdkit.cli`` for sdkit-serve), the meta wheel carrying no importable code."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

EXPECTED = {
    "sdkit": None,
    "sdkit_core": "sdkit",
    "sdkit_ggml": "sdkit_ggml",
    "sdkit_openvino": "sdkit_openvino",
    "sdkit_trt": "sdkit_trt",
    "sdkit_migraphx": "sdkit_migraphx",
    "sdkit_coreml": "sdkit_coreml",
    "sdkit_serve": "sdkit_serve",
}
# The entry-point group each distribution must register in: backends plug into `sdkit`, the
# server adds a CLI subcommand through `sdkit.cli`.
ENTRY_GROUP = {"sdkit_serve": "sdkit.cli"}


def main(dist: Path) -> int:
    problems: list[str] = []
    wheels = {w.name.split("-")[0]: w for w in dist.glob("*.whl")}
    sdists = {s.name.rsplit("-", 1)[0].replace("-", "_") for s in dist.glob("*.tar.gz")}
    versions = {w.name.split("-")[1] for w in wheels.values()}
    if len(versions) != 1:
        problems.append(f"wheels disagree on the version: {sorted(versions)}")
    for name, package in EXPECTED.items():
        if name not in wheels:
            problems.append(f"no wheel for {name}")
            continue
        if name not in sdists:
            problems.append(f"no sdist for {name}")
        files = zipfile.ZipFile(wheels[name]).namelist()
        code = [f for f in files if f.endswith(".py")]
        if package is None:
            if code:
                problems.append(f"the meta wheel {name} carries code: {code[:3]}")
            continue
        if f"{package}/py.typed" not in files:
            problems.append(f"{name}: no {package}/py.typed")
        if name not in ("sdkit_core",):
            entry = next((f for f in files if f.endswith("entry_points.txt")), None)
            text = zipfile.ZipFile(wheels[name]).read(entry).decode() if entry else ""
            group = ENTRY_GROUP.get(name, "sdkit")
            if f"[{group}]" not in text:
                problems.append(f"{name}: no entry point in group {group}")
    for problem in problems:
        print("check_dists:", problem)
    print(f"check_dists: {len(wheels)} wheels, {len(sdists)} sdists, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
