"""``sdkit devices``: the devices of every available backend."""

from __future__ import annotations

import argparse

import sdkit
from sdkit.selection import get_backend

HELP = "list the devices each available backend can use"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    return None


def run(args: argparse.Namespace) -> int:
    for info in sdkit.backends():
        if not info.available:
            continue
        for device in get_backend(info.name).devices():
            note = f"  {device.description}" if device.description else ""
            print(f"{info.name:<12} {device!s:<10}{note}")
    return 0
