"""``sdkit devices``: the devices of every available backend."""

from __future__ import annotations

import argparse

import sdkit

HELP = "list the devices each available backend can use"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    return None


def run(args: argparse.Namespace) -> int:
    for name, devices in sdkit.devices().items():
        for device in devices:
            note = f"  {device.description}" if device.description else ""
            print(f"{name:<12} {device!s:<10}{note}")
    return 0
