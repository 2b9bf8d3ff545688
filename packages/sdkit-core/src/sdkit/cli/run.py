"""``sdkit run MODEL --input NAME=FILE.npy ...``: compile once, run, save the outputs."""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

import sdkit
from sdkit.api import as_model
from sdkit.cli.common import add_backend_arguments, add_input_arguments, collect_inputs, input_shapes, options_from
from sdkit.cli.progress import progress
from sdkit.errors import InputError

HELP = "run a model on inputs from .npy files (or random ones) and save the outputs"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="an .onnx file")
    add_input_arguments(parser)
    parser.add_argument("--output", "-o", default=None, help="save the outputs to this .npz file")
    parser.add_argument("--repeat", type=int, default=1, help="run N times and report the median time")
    add_backend_arguments(parser)


def run(args: argparse.Namespace) -> int:
    if args.repeat < 1:
        raise InputError("--repeat must be at least 1")
    model = as_model(args.model)
    feeds = collect_inputs(args, model.inputs)
    start = time.perf_counter()
    compiled = sdkit.compile(
        model, backend=args.backend, device=args.device, input_shapes=input_shapes(feeds), **options_from(args)
    )
    compile_s = time.perf_counter() - start
    times = []
    outputs: dict[str, np.ndarray] = {}
    for _ in progress(range(args.repeat), total=args.repeat, desc="run"):
        start = time.perf_counter()
        outputs = compiled.run(feeds)
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    print(f"compiled in {compile_s:.3f} s on {compiled.device} ({compiled.backend_name}); ", end="")
    print(f"run: median {median:.4f} s over {len(times)}")
    for name, value in outputs.items():
        array = np.asarray(value)
        stats = (
            f"min {array.min():.4g} max {array.max():.4g} mean {array.mean():.4g}"
            if array.size and array.dtype.kind in "fiu"
            else ""
        )
        print(f"  {name}: {array.dtype}{list(array.shape)} {stats}")
    if args.output:
        path = Path(args.output)
        np.savez(path, **{k: np.asarray(v) for k, v in outputs.items()})  # type: ignore[arg-type]
        print(f"saved {path}")
    return 0
