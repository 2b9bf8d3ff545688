"""``sdkit doctor``: everything needed to understand why a backend is or is not used here."""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sys
from pathlib import Path

import sdkit
from sdkit.cache import cache_root
from sdkit.cli.timings_view import stored_timings_lines
from sdkit.config import config_path
from sdkit.cpu_features import cpu_info
from sdkit.errors import SdkitError
from sdkit.plugins import get_plugins

HELP = "diagnose this installation: plugins, backends, cache, configuration"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    return None


def _folder_size(path: Path) -> int:
    total = 0
    for file in path.rglob("*"):
        with contextlib.suppress(OSError):
            total += file.stat().st_size if file.is_file() else 0
    return total


def run(args: argparse.Namespace) -> int:
    plugins = get_plugins()
    print(f"sdkit {sdkit.__version__} on Python {platform.python_version()} ({sys.executable})")
    print(f"platform: {platform.platform()} {platform.machine()}")
    # The features that change which kernels a CPU backend runs (and so its bf16/fp16 results).
    print(f"cpu: {cpu_info().describe()}")
    print("plugins:")
    print("  core (sdkit-core, built in)")
    for info in plugins.loaded:
        print(f"  {info.name} ({info.distribution} {info.version})")
    for failure in plugins.failures:
        print(f"  {failure.name} ({failure.distribution}): FAILED to {failure.stage}: {failure.error}")
    for name in plugins.disabled:
        print(f"  {name}: disabled by SDKIT_DISABLE_PLUGINS")
    print("backends:")
    for b in [*sdkit.backends(), *sdkit.pipeline_engines()]:
        if b.available:
            print(f"  {b.name}: ok {b.version} devices: {', '.join(b.devices)}")
        else:
            hint = f"; fix: {b.install_hint}" if b.install_hint else ""
            print(f"  {b.name}: unavailable: {b.reason}{hint}")
    try:
        choice = sdkit.choose_backend()
        print(f"automatic choice: {choice.backend} on {choice.device} ({choice.reason})")
        for name, why in choice.rejected:
            print(f"  passed over {name}: {why}")
    except SdkitError as exc:
        print(f"automatic choice: none ({exc})")
    root = cache_root()
    size = _folder_size(root) if root.exists() else 0
    print(f"cache: {root} ({size / 1e6:.1f} MB)")
    print("\n".join(stored_timings_lines()))
    path = config_path()
    print(f"config: {path} ({'present' if path.is_file() else 'absent'})")
    env = {k: v for k, v in os.environ.items() if k.startswith("SDKIT_")}
    print("environment: " + (", ".join(f"{k}={v}" for k, v in sorted(env.items())) or "no SDKIT_* variables"))
    return 0
