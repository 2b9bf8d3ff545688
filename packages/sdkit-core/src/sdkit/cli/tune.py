"""``sdkit tune MODEL [--backends a,b] [--input/--random ...] [--repeat N]``: time each backend on
the model at these shapes, check each one's outputs against the first backend's, store the
timings beside the artifact cache, and say what ``backend="auto"`` picks with them.

MODEL may be a pipeline (a diffusers/optimum ONNX folder): one txt2img step at ``--width`` x
``--height`` runs it with ``tune``, so each component is measured at the shapes a generation
at that size runs it at, with the inputs it really gets."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from sdkit.api import as_model
from sdkit.cli.common import add_input_arguments, add_option_arguments, collect_inputs, options_from, print_columns
from sdkit.cli.progress import progress
from sdkit.cli.timings_view import fallback_name
from sdkit.errors import CacheError, InputError, NoBackendError, OptionError
from sdkit.measure import random_feeds
from sdkit.model import Model
from sdkit.pipelines.loaders.engine_timings import engine_loaders, own_loader_reads
from sdkit.pipelines.loaders.engine_tuning import EngineTuneResult, WholeImage, tune_engines
from sdkit.tuned import ShapeDeferred
from sdkit.tuning import TOLERANCES, TuneResult, TuneSettings, tune

HELP = "time each backend on a model (or each component of a pipeline) and store the timings auto chooses with"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="an .onnx file, or a pipeline folder (each component is tuned)")
    parser.add_argument(
        "--backends",
        default=None,
        help="comma-separated backends; the others are checked against the first "
        "(default: every backend auto could use here, in priority order; name reference first "
        "for an exact baseline)",
    )
    add_input_arguments(parser)
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per backend (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs first (default: %(default)s)")
    bounds = ", ".join(f"{v:g} for {k}" for k, v in TOLERANCES.items())
    parser.add_argument(
        "--tolerance", type=float, default=None, help=f"rel-L2 bound against the first backend (default: {bounds})"
    )
    parser.add_argument("--device", default=None, help="device, e.g. cpu, cuda:0 (default: each backend's first)")
    parser.add_argument("--width", type=int, default=None, help="pipeline: image width (default: the model's)")
    parser.add_argument("--height", type=int, default=None, help="pipeline: image height (default: the model's)")
    parser.add_argument("--cfg", type=float, default=7.5, help="pipeline: guidance scale (default: %(default)s)")
    parser.add_argument(
        "--steps",
        type=int,
        default=4,
        help="a single file stable-diffusion.cpp also reads: steps of the whole image timed on each engine "
        "(default: %(default)s)",
    )
    add_option_arguments(parser)


def feeds_for(args: argparse.Namespace, model: Model) -> dict[str, np.ndarray]:
    """The ``--input``/``--random`` feeds; inputs not given get seeded random values where their
    shape is fixed."""
    given = collect_inputs(args, model.inputs) if args.input or args.random else {}
    rest = [info for info in model.inputs if info.name not in given]
    return {**random_feeds(rest, args.seed), **given}


def settings_from(args: argparse.Namespace) -> TuneSettings:
    if args.repeat < 1 or args.warmup < 0:
        raise InputError("--repeat must be at least 1 and --warmup at least 0")
    if args.tolerance is not None and not args.tolerance >= 0:
        raise InputError("--tolerance must be a number >= 0")
    names = tuple(b.strip() for b in args.backends.split(",") if b.strip()) if args.backends else None
    return TuneSettings(
        backends=names,
        repeat=args.repeat,
        warmup=args.warmup,
        tolerance=args.tolerance,
        force=True,  # the command measures again; compile(tune=True) reuses
        steps=lambda items: progress(items, total=len(items), desc="tune"),
        warn=False,
    )


def is_pipeline(path: Path) -> bool:
    return path.is_dir() or path.suffix.lower() not in (".onnx", "")


def run(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    path = Path(args.model).expanduser()
    if is_pipeline(path):
        return tune_pipeline(args, settings)
    model = as_model(path)
    feeds, options = feeds_for(args, model), options_from(args)
    result = tune(model, feeds=feeds, device=args.device, options=options, settings=settings)
    print_result(result)
    return _status([result])


def tune_pipeline(args: argparse.Namespace, settings: TuneSettings) -> int:
    """One txt2img step with ``tune``: each component measured where the generation runs it."""
    import sdkit

    if args.input or args.random:
        raise InputError("--input/--random are for one model; a pipeline's components get the inputs a txt2img gives")
    path = Path(args.model).expanduser()
    if path.is_file() and not own_loader_reads(path):
        raise OptionError(
            f"{path.name} runs only on a pipeline engine (stable-diffusion.cpp for GGUF): there is nothing to "
            "compare it with; sdkit tune compares engines on files sdkit's own pipelines read too"
        )
    pipe = sdkit.load_pipeline(args.model, device=args.device, tune=settings, **options_from(args))
    results: list[TuneResult] = []
    size = pipe.config.default_size
    try:
        request = pipe.request_class.create(
            "a photo", width=args.width, height=args.height, steps=1, seed=args.seed, guidance_scale=args.cfg
        )
        pipe.run(request)
        for name, component in pipe.components.items():
            compiled = component.compiled
            tuned = compiled.results if isinstance(compiled, ShapeDeferred) else []
            print(f"{name}:" if tuned else f"{name}: not run by a txt2img, not tuned")
            for result in tuned:
                print_result(result)
            results += tuned
    finally:
        pipe.close()
    status = _status(results)
    if own_loader_reads(path) and engine_loaders(path):
        image = WholeImage(args.width or size, args.height or size, args.steps, args.cfg, args.seed)
        print_engines(tune_engines(path, image, args.device, options_from(args), settings))
    return status


def print_engines(result: EngineTuneResult) -> None:
    """sdkit's own pipeline against the engines, per whole image, and what auto loads now."""
    record = result.record
    height, width = record.key["input_shapes"]["image"]
    print(f"{record.model}: whole image, {width}x{height}, {record.key['options']['steps']} steps")
    timed = [m.median_s for m in record.results if m.ok and m.median_s is not None]
    fastest = min(timed) if timed else float("nan")
    lines = []
    for m in record.results:
        if m.median_s is None or m.compile_s is None or m.min_s is None:
            lines.append((m.backend, "-", "-", "-", "-", "-", f"failed: {m.error}"))
            continue
        times = (f"{m.compile_s:.2f}", f"{m.median_s:.3f}", f"{m.min_s:.3f}", f"{m.median_s / fastest:.2f}")
        lines.append((m.backend, m.device, *times, ""))
    print_columns(("engine", "ran on", "load s", "median s", "min s", "x fastest", ""), lines)
    if result.store_error:
        raise CacheError(f"the timings were not stored: {result.store_error}")
    print(f"stored: {result.path}")
    if result.choice is not None:
        print(f'backend="auto" now loads {result.choice.engine}: {result.choice.reason}')


def _status(results: list[TuneResult]) -> int:
    for result in results:
        if result.store_error:
            raise CacheError(f"the timings were not stored: {result.store_error}")
        if result.choice is None:
            raise NoBackendError(result.rejected)
    return 0


def _verdict(backend: str, result: TuneResult) -> str:
    measurement = result.record.result(backend)
    if result.choice is not None and backend == (result.choice.name or result.choice.backend.name):
        return f"chosen: {result.choice.reason}"
    if measurement is not None and not measurement.ok:
        return measurement.verdict(result.record.tolerance, result.record.first)
    if fallback_name(backend):
        return "fallback: 1 run, never chosen for speed"
    return "slower"


def print_result(result: TuneResult) -> None:
    """The table: backend, device, compile s, median s, min s, ratio to the fastest backend
    ``auto`` may choose, rel-L2 against the baseline, and the verdict."""
    record = result.record
    timed = [m.median_s for m in record.results if m.ok and m.median_s is not None and not fallback_name(m.backend)]
    fastest = min(timed) if timed else float("nan")
    shapes = ", ".join(f"{k}={'x'.join(str(d) for d in v)}" for k, v in record.key["input_shapes"].items())
    print(f"{record.model or 'model'} ({shapes})")
    header = ("backend", "device", "compile s", "median s", "min s", "x fastest", f"rel-L2 vs {record.first or '-'}")
    lines = []
    for m in record.results:
        verdict = _verdict(m.backend, result)
        if m.median_s is None or m.compile_s is None or m.min_s is None:
            lines.append((m.backend, m.device or "-", "-", "-", "-", "-", "-", verdict))
            continue
        error = "-" if m.rel_l2 is None else f"{m.rel_l2:.2e}"
        ratio = f"{m.median_s / fastest:.2f}" if m.ok else "-"
        times = (f"{m.compile_s:.3f}", f"{m.median_s:.4f}", f"{m.min_s:.4f}")
        lines.append((m.backend, m.device, *times, ratio, error, verdict))
    print_columns((*header, "verdict"), lines)
    load = " ".join(f"{x:.2f}" for x in record.load) or "unknown"
    print(
        f"{record.repeat} timed run(s) after {record.warmup} warm-up per backend; baseline {record.first or 'none'}, "
        f"tolerance rel-L2 {record.tolerance:g}; {record.machine}, load average {load}"
        + ("" if result.measured_now else "; read from the store")
    )
    if result.path is not None:
        print(f"stored: {result.path}")
    if result.choice is not None:
        print(f'backend="auto" now picks {result.choice.backend.name} on {result.choice.device}')
