"""``sdkit check MODEL [--backend B]``: which backends can run a model, and every node they cannot."""

from __future__ import annotations

import argparse

import sdkit
from sdkit.api import as_model

HELP = "report the nodes of a model each backend cannot run"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="an .onnx file")
    parser.add_argument("--backend", default="auto", help="one backend, or auto for every available one")


def run(args: argparse.Namespace) -> int:
    model = as_model(args.model)
    reports = sdkit.check(model, backend=args.backend)
    usable = False
    for name, report in reports.items():
        usable = usable or report.ok
        print(f"{name}: {report.summary()}")
        for node in report.unsupported:
            print(f"  {node}")
        for note in report.notes:
            print(f"  note: {note}")
    return 0 if usable else 1
