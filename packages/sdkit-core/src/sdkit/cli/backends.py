"""``sdkit backends [--json]``: every backend, available or why not, with devices, version and
the precisions it offers (what ``backend="auto"`` filters on).

First-party backends whose plugin is not installed are listed too, with the command that
installs them (``sdkit.known_backends``)."""

from __future__ import annotations

import argparse
import dataclasses
import json

import sdkit
from sdkit.api import pipeline_engines
from sdkit.plugins import get_plugins

HELP = "list every backend: available or why not, devices, version"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def report() -> dict[str, object]:
    plugins = get_plugins()
    return {
        "sdkit": sdkit.__version__,
        # the graph backends, then the engines that run whole pipelines (stable-diffusion.cpp)
        "backends": [dataclasses.asdict(b) for b in [*sdkit.backends(), *pipeline_engines()]],
        "plugins": [dataclasses.asdict(p) for p in plugins.loaded],
        "plugin_failures": [dataclasses.asdict(f) for f in plugins.failures],
        "disabled_plugins": list(plugins.disabled),
    }


def run(args: argparse.Namespace) -> int:
    data = report()
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    rows = [("backend", "plugin", "available", "version", "precisions", "devices / reason")]
    for b in data["backends"]:  # type: ignore[attr-defined]
        # Available: its devices, then what it found; unavailable: why, then what to do.
        first, then = (", ".join(b["devices"]), b["reason"]) if b["available"] else (b["reason"], b["install_hint"])
        detail = f"{first}; {then}" if first and then else first or then
        precisions = ",".join(b["precisions"]) if b["precisions"] is not None else "-"
        available = "yes" if b["available"] else "no"
        rows.append((b["name"], b["plugin"], available, b["version"] or "-", precisions, detail))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for row in rows:
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:5])) + "  " + row[5])
    for failure in data["plugin_failures"]:  # type: ignore[attr-defined]
        print(
            f"plugin {failure['name']!r} ({failure['distribution']}) failed to {failure['stage']}: {failure['error']}"
        )
    for name in data["disabled_plugins"]:  # type: ignore[attr-defined]
        print(f"plugin {name!r} disabled by SDKIT_DISABLE_PLUGINS")
    return 0
