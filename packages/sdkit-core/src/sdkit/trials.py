"""One round of a tune: each backend compiled once and timed (``sdkit.measure``), its outputs
judged against a baseline's, the fastest agreeing backend's compiled model kept for the caller.
``sdkit.tuning`` decides what to measure, and stores and uses the results.

A backend that fails (an ``SdkitError`` or a plugin's bug) is recorded with why, never raised:
one broken backend must not end a tune. Where some backend disagrees with the baseline, the
baseline itself may be the wrong one, so a fallback (the exact reference backend) judges them all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sdkit.backend import CompiledModel
from sdkit.device import Device
from sdkit.errors import SdkitError
from sdkit.measure import Clock, max_abs_diff, rel_l2, time_runs
from sdkit.model import Graph, Model, WeightSet
from sdkit.selection import (
    candidates,
    compile_choice,
    fallback,
    get_backend,
    probe,
    qualify,
    requested_precision,
)
from sdkit.timings import Measurement


def _describe(exc: Exception) -> str:
    """An SdkitError's own words; anything else (a plugin's bug) with its type."""
    return str(exc) if isinstance(exc, SdkitError) else f"{type(exc).__name__}: {exc}"


@dataclass
class Trial:
    """How to measure: the feeds, the run counts, the clock, the options."""

    feeds: dict[str, np.ndarray]
    repeat: int
    warmup: int
    clock: Clock
    options: Mapping[str, Any]
    steps: Callable[[list[str]], Iterable[str]] = iter  # wraps the backends measured (a progress bar)


def _measure_one(
    name: str, graph: Graph, weights: WeightSet, device: str | Device | None, how: Trial
) -> tuple[Measurement, CompiledModel | None, dict[str, np.ndarray] | None]:
    """Compile once, warm up, time; a backend that fails is recorded with why, never raised."""
    choice, why = qualify(name, graph, device, requested_precision(how.options))
    if choice is None:
        return Measurement(name, error=why), None, None
    version, where = probe(choice.backend).version, str(choice.device)
    repeat, warmup = (1, 0) if fallback(choice.backend) else (how.repeat, how.warmup)
    compiled = None
    try:
        start = how.clock()
        compiled = compile_choice(choice, graph, weights, how.options)
        compile_s = how.clock() - start
        timed = time_runs(lambda: compiled.run(how.feeds), repeat, warmup, how.clock)
    except Exception as exc:  # one backend failing (an SdkitError or a plugin's bug) must not end the tune
        if compiled is not None:
            compiled.close()
        return Measurement(name, where, version, error=_describe(exc)), None, None
    result = Measurement(name, where, version, compile_s, timed.median, timed.min, len(timed.times))
    return result, compiled, timed.outputs


Outputs = dict[str, np.ndarray]
Kept = tuple[str, CompiledModel, float]  # the fastest backend so far: name, compiled, median


def measure_backends(
    model: Model, graph: Graph, names: Sequence[str], device: str | Device | None, how: Trial, tolerance: float
) -> tuple[list[Measurement], str, tuple[str, CompiledModel] | None]:
    """Each backend measured in turn, then checked against the first that ran (the baseline).
    Where some backend disagrees with the baseline, the baseline itself may be the wrong one:
    then a fallback (the exact reference backend) is run once, when there is one and it was not
    measured, and every backend is judged against it instead. Returns the results, the baseline,
    and the fastest agreeing non-fallback backend's compiled model (the others are closed as soon
    as they lose)."""
    results: dict[str, Measurement] = {}
    outputs: dict[str, Outputs] = {}
    best: Kept | None = None
    for name in how.steps(list(names)):
        result, compiled, out = _measure_one(name, graph, model.weights, device, how)
        results[name] = result
        if out is not None:
            outputs[name] = out
        if compiled is not None:
            best = _faster(best, name, result, compiled)
    first = next(iter(outputs), "")
    if first and any(rel_l2(out, outputs[first]) > tolerance for out in outputs.values()):
        arbiter = _arbiter(graph, model.weights, device, how, exclude=results)
        if arbiter is not None:
            results, outputs, first = (
                {arbiter[0].backend: arbiter[0], **results},
                {arbiter[0].backend: arbiter[1], **outputs},
                arbiter[0].backend,
            )
    checked = [
        _judged(m, outputs.get(m.backend), outputs.get(first), tolerance, m.backend == first) for m in results.values()
    ]
    if best is not None and not next(m for m in checked if m.backend == best[0]).ok:
        best[1].close()
        best = None
    return checked, first, (best[0], best[1]) if best is not None else None


def _faster(best: Kept | None, name: str, result: Measurement, compiled: CompiledModel) -> Kept | None:
    """The faster of ``best`` and this backend's compiled model (a fallback never); the loser
    is closed."""
    usable = result.ok and result.median_s is not None and not fallback(get_backend(name))
    if usable and result.median_s is not None and (best is None or result.median_s < best[2]):
        if best is not None:
            best[1].close()
        return name, compiled, result.median_s
    compiled.close()
    return best


def _arbiter(
    graph: Graph, weights: WeightSet, device: str | Device | None, how: Trial, exclude: Mapping[str, Measurement]
) -> tuple[Measurement, Outputs] | None:
    """The first fallback backend that runs here and was not measured yet, run once."""
    precision = requested_precision(how.options)
    for name in candidates():
        if name in exclude or not fallback(get_backend(name)) or qualify(name, graph, device, precision)[0] is None:
            continue
        result, compiled, out = _measure_one(name, graph, weights, device, how)
        if compiled is not None:
            compiled.close()
        if out is not None:
            return result, out
    return None


def _judged(
    m: Measurement, mine: Outputs | None, baseline: Outputs | None, tolerance: float, first: bool
) -> Measurement:
    """``m`` with its error against the baseline's outputs (the baseline itself unchanged)."""
    if first or mine is None or baseline is None:
        return m
    error = rel_l2(mine, baseline)
    return _with_check(m, error, max_abs_diff(mine, baseline), error <= tolerance)


def _with_check(result: Measurement, error: float, diff: float, agrees: bool) -> Measurement:
    fields = {**result.__dict__, "rel_l2": error, "max_diff": diff, "agrees": agrees}
    return Measurement(**fields)
