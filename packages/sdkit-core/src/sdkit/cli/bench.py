"""``sdkit bench MODEL --backends a,b``: one table of median/min time, ratio to the fastest and
max |diff| against an oracle backend (``reference`` by default), all measured in one run."""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np

import sdkit
from sdkit.api import as_model
from sdkit.cli.common import (
    add_input_arguments,
    add_option_arguments,
    collect_inputs,
    input_shapes,
    options_from,
    print_columns,
)
from sdkit.cli.progress import progress
from sdkit.errors import InputError, SdkitError
from sdkit.measure import max_abs_diff, time_runs

HELP = "time a model on several backends side by side, with accuracy against the reference"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="an .onnx file")
    parser.add_argument("--backends", default=None, help="comma-separated backends (default: every available one)")
    add_input_arguments(parser)
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per backend (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs first (default: %(default)s)")
    parser.add_argument(
        "--oracle", default="reference", help="backend whose outputs the others are compared with, or 'none'"
    )
    add_option_arguments(parser)


@dataclass
class Row:
    backend: str
    device: str = ""
    compile_s: float = float("nan")
    median_s: float = float("nan")
    min_s: float = float("nan")
    max_diff: float | None = None
    error: str = ""
    outputs: dict[str, np.ndarray] | None = None


def measure(
    model: sdkit.Model, backend: str, feeds: dict[str, np.ndarray], args: argparse.Namespace, repeat: int, warmup: int
) -> Row:
    row = Row(backend)
    try:
        start = time.perf_counter()
        compiled = sdkit.compile(model, backend=backend, input_shapes=input_shapes(feeds), **options_from(args))
        row.compile_s = time.perf_counter() - start
        row.device = str(compiled.device)
        timed = time_runs(
            lambda: compiled.run(feeds), repeat, warmup, steps=lambda r: progress(r, total=repeat, desc=backend)
        )
        row.outputs, row.median_s, row.min_s = timed.outputs, timed.median, timed.min
        compiled.close()
    except SdkitError as exc:
        row.error = str(exc)
    return row


def run(args: argparse.Namespace) -> int:
    if args.repeat < 1 or args.warmup < 0:
        raise InputError("--repeat must be at least 1 and --warmup at least 0")
    model = as_model(args.model)
    feeds = collect_inputs(args, model.inputs)
    names = (
        [b.strip() for b in args.backends.split(",") if b.strip()]
        if args.backends
        else [b.name for b in sdkit.backends() if b.available]
    )
    for name in names:  # fail fast on a typo, before minutes of timing
        sdkit.selection.get_backend(name)
    rows = [measure(model, name, feeds, args, args.repeat, args.warmup) for name in names]
    oracle = next((r for r in rows if r.backend == args.oracle and r.outputs is not None), None)
    if oracle is None and args.oracle != "none":
        oracle = measure(model, args.oracle, feeds, args, repeat=1, warmup=0)
        if oracle.outputs is None:
            print(f"oracle {args.oracle!r} failed: {oracle.error}")
    for row in rows:
        if oracle is not None and oracle.outputs is not None and row.outputs is not None:
            row.max_diff = max_abs_diff(row.outputs, oracle.outputs)
    print_table(rows, args.oracle)
    return 0 if all(not r.error for r in rows) else 1


def print_table(rows: list[Row], oracle: str) -> None:
    timed = [r.median_s for r in rows if not r.error]
    fastest = min(timed) if timed else float("nan")
    header = ("backend", "device", "compile s", "median s", "min s", "x fastest", f"max|diff| vs {oracle}")
    lines = []
    for r in rows:
        if r.error:
            lines.append((r.backend, r.device or "-", "-", "-", "-", "-", f"error: {r.error}"))
            continue
        diff = "-" if r.max_diff is None else f"{r.max_diff:.2e}"
        ratio = f"{r.median_s / fastest:.2f}"
        lines.append((r.backend, r.device, f"{r.compile_s:.3f}", f"{r.median_s:.4f}", f"{r.min_s:.4f}", ratio, diff))
    print_columns(header, lines)
