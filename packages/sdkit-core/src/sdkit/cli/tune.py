"""``sdkit tune MODEL [--backends a,b] [--input/--random ...] [--repeat N]``: time each backend on
the model at these shapes, check each one's outputs against the first backend's, store the
timings beside the artifact cache, and say what ``backend="auto"`` picks with them."""

from __future__ import annotations

import argparse

import numpy as np

from sdkit._version import __version__
from sdkit.api import as_model
from sdkit.cli.common import add_input_arguments, add_option_arguments, collect_inputs, options_from, print_columns
from sdkit.cli.progress import progress
from sdkit.cpu_features import cpu_info
from sdkit.errors import CacheError, InputError, NoBackendError, SdkitError
from sdkit.measure import random_feeds
from sdkit.model import Model
from sdkit.selection import fallback, get_backend
from sdkit.timings import FORMAT, Measurement, TimingsRecord
from sdkit.tuning import TOLERANCES, TuneResult, backend_versions, timings_store, tune

HELP = "time each backend on a model at its input shapes and store the timings backend=auto chooses with"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="an .onnx file")
    parser.add_argument(
        "--backends",
        default=None,
        help="comma-separated backends; the others are checked against the first "
        "(default: reference, then every backend auto could use here)",
    )
    add_input_arguments(parser)
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per backend (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs first (default: %(default)s)")
    bounds = ", ".join(f"{v:g} for {k}" for k, v in TOLERANCES.items())
    parser.add_argument(
        "--tolerance", type=float, default=None, help=f"rel-L2 bound against the first backend (default: {bounds})"
    )
    parser.add_argument("--device", default=None, help="device, e.g. cpu, cuda:0 (default: each backend's first)")
    add_option_arguments(parser)


def feeds_for(args: argparse.Namespace, model: Model) -> dict[str, np.ndarray]:
    """The ``--input``/``--random`` feeds; inputs not given get seeded random values where their
    shape is fixed."""
    given = collect_inputs(args, model.inputs) if args.input or args.random else {}
    rest = [info for info in model.inputs if info.name not in given]
    return {**random_feeds(rest, args.seed), **given}


def run(args: argparse.Namespace) -> int:
    if args.repeat < 1 or args.warmup < 0:
        raise InputError("--repeat must be at least 1 and --warmup at least 0")
    if args.tolerance is not None and not args.tolerance >= 0:
        raise InputError("--tolerance must be a number >= 0")
    model = as_model(args.model)
    feeds = feeds_for(args, model)
    names = [b.strip() for b in args.backends.split(",") if b.strip()] if args.backends else None
    result = tune(
        model,
        feeds=feeds,
        device=args.device,
        backends=names,
        repeat=args.repeat,
        warmup=args.warmup,
        tolerance=args.tolerance,
        options=options_from(args),
        steps=lambda items: progress(items, total=len(items), desc="tune"),
        warn=False,
    )
    print_result(result)
    if result.store_error:
        raise CacheError(f"the timings were not stored: {result.store_error}")
    if result.choice is None:
        raise NoBackendError(result.rejected)
    return 0


def _verdict(m: Measurement, result: TuneResult) -> str:
    if result.choice is not None and m.backend == result.choice.backend.name:
        return f"chosen: {result.choice.reason}"
    if not m.ok:
        return m.verdict(result.record.tolerance, result.record.first)
    if fallback(get_backend(m.backend)):
        return "fallback: 1 run, never chosen for speed"
    return "slower"


def print_result(result: TuneResult) -> None:
    record = result.record
    timed = [m.median_s for m in record.results if m.ok and m.median_s is not None and not fallback_name(m.backend)]
    fastest = min(timed) if timed else float("nan")  # of those auto may choose
    versus = f"rel-L2 vs {record.first or '-'}"
    header = ("backend", "device", "compile s", "median s", "min s", "x fastest", versus, "verdict")
    lines = []
    for m in record.results:
        if m.median_s is None or m.compile_s is None or m.min_s is None:
            lines.append((m.backend, m.device or "-", "-", "-", "-", "-", "-", _verdict(m, result)))
            continue
        error = "-" if m.rel_l2 is None else f"{m.rel_l2:.2e}"
        ratio = f"{m.median_s / fastest:.2f}" if m.ok else "-"
        cells = (f"{m.compile_s:.3f}", f"{m.median_s:.4f}", f"{m.min_s:.4f}", ratio, error)
        lines.append((m.backend, m.device, *cells, _verdict(m, result)))
    print_columns(header, lines)
    load = " ".join(f"{x:.2f}" for x in record.load) or "unknown"
    print(
        f"{record.repeat} timed run(s) after {record.warmup} warm-up per backend; baseline {record.first or 'none'}, "
        f"tolerance rel-L2 {record.tolerance:g}; {record.machine}, load average {load}"
    )
    if result.path is not None:
        print(f"stored: {result.path}")
    if result.choice is not None:
        print(f'backend="auto" now picks {result.choice.backend.name} on {result.choice.device}')


def _staleness(key: dict[str, object]) -> str:
    """``current``, or why a record no longer applies here (it is then ignored)."""
    why = []
    if key.get("sdkit") != __version__ or key.get("format") != FORMAT:
        why.append("another sdkit version")
    if key.get("backends") != backend_versions():
        why.append("backends installed or upgraded since")
    if key.get("cpu") != cpu_info().describe():
        why.append("another CPU")
    return "stale, ignored: " + ", ".join(why) if why else "current"


def _result_line(m: Measurement, fastest: float | None, record: TimingsRecord) -> str:
    if not m.ok or m.median_s is None:
        return f"{m.backend}: {m.verdict(record.tolerance, record.first)}"
    if fallback_name(m.backend):
        note = "(a fallback, never chosen for speed)"
    else:
        note = f"{m.median_s / fastest:.2f}x the fastest" if fastest else ""
    return f"{m.backend}: {m.median_s:.4g} s median of {m.runs} on {m.device} {note}".rstrip()


def stored_timings_lines() -> list[str]:
    """``sdkit doctor``'s view of the stored timings: per model hash and shapes, each backend's
    median, when and on which machine, and whether the record still applies here."""
    store = timings_store()
    entries = store.entries()
    lines = [f"timings: {store.folder} ({len(entries)} record(s); `sdkit tune MODEL` adds one)"]
    for path, record in entries:
        if record is None:
            lines.append(f"  {path.name}: unreadable or malformed, ignored (the next tune rewrites it)")
            continue
        key = record.key
        shapes = " ".join(f"{k}={'x'.join(str(d) for d in v)}" for k, v in dict(key.get("input_shapes", {})).items())
        options = dict(key.get("options", {}))
        lines.append(
            f"  model {str(key.get('graph', ''))[:12]} ({shapes}; device {key.get('device')}; "
            f"{options.get('precision', 'fp32')}): tuned {record.when} on {record.machine}, "
            f"load {' '.join(f'{x:.2f}' for x in record.load) or 'unknown'}; {_staleness(key)}"
        )
        ok = sorted((m for m in record.results if m.ok and m.median_s), key=lambda m: m.median_s or 0.0)
        fastest = next((m.median_s for m in ok if not fallback_name(m.backend)), None)
        lines += [f"    {_result_line(m, fastest, record)}" for m in [*ok, *(m for m in record.results if m not in ok)]]
    return lines


def fallback_name(name: str) -> bool:
    try:
        return fallback(get_backend(name))
    except SdkitError:  # a backend measured then but not installed now
        return False
