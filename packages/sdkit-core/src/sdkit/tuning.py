"""The backend choice grounded in measurement: ``sdkit tune`` and ``sdkit.compile(..., tune=True)``.

A tune compiles each candidate backend once for the model at its input shapes, runs it
``warmup`` times untimed and ``repeat`` times timed (the median counts), and checks its outputs
against the first backend's: a relative L2 error over ``tolerance`` (by precision, ``TOLERANCES``)
marks it as disagreeing, so a fast but wrong backend is never chosen. By default the backends are
every one the automatic choice could use here, in priority order (the first is the baseline);
``reference`` (exact, a fallback: run once, never chosen for speed) is measured when named. The
record is stored beside the artifact cache (``sdkit.timings``); from then on ``backend="auto"``
for the same graph, shapes, device, options and machine picks the measured fastest
(``stored_measured``), after any explicit backend or preference and before priority.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from sdkit.backend import CompiledModel
from sdkit.cache import cache_root
from sdkit.cpu_features import cpu_info
from sdkit.device import Device
from sdkit.errors import CacheError, InputError, NoBackendError
from sdkit.measure import Clock, random_feeds
from sdkit.model import Graph, Model, fixed_shapes, shaped
from sdkit.options import make_options
from sdkit.plugins import get_plugins
from sdkit.selection import (
    Choice,
    Measured,
    candidates,
    choose,
    compile_choice,
    fallback,
    get_backend,
    probe,
    qualify,
    requested_precision,
)
from sdkit.timings import TimingsRecord, TimingsStore, timings_key
from sdkit.trials import Trial, measure_backends

DEFAULT_REPEAT = 3
DEFAULT_WARMUP = 1
# rel-L2 bounds against the first backend: loose enough for another kernel order or reduced-
# precision accumulation, tight enough that a wrong kernel (a transposed weight, a bad
# broadcast) is caught.
TOLERANCES: dict[str, float] = {"fp32": 1e-3, "fp16": 1e-2, "bf16": 3e-2, "q8_0": 3e-2, "fp8": 6e-2}


def timings_store() -> TimingsStore:
    return TimingsStore(cache_root())


def options_key(options: Mapping[str, Any]) -> dict[str, Any]:
    """The compile options that change run time, as plain data (``cache`` does not)."""
    key = {"precision": options.get("precision", "fp32"), "threads": options.get("threads")}
    key.update({k: v for k, v in options.items() if k not in ("precision", "threads", "cache")})
    return {k: v if isinstance(v, (str, int, float, bool, type(None))) else repr(v) for k, v in sorted(key.items())}


def backend_versions() -> dict[str, str]:
    """The version of every registered backend whose probe succeeds here: installing, removing or
    upgrading one makes stored timings stale."""
    versions = {}
    for name in get_plugins().backends.names():
        availability = probe(get_backend(name))
        if availability.ok:
            versions[name] = availability.version
    return versions


def accelerators() -> list[str]:
    """Every non-CPU device the available backends list, with the vendor's name for it
    (``cuda:0 NVIDIA H100 80GB HBM3``): another GPU in the machine makes stored timings stale.
    The CPU is named in the key by ``cpu_info`` instead."""
    found: set[str] = set()
    for name, cls in get_plugins().backends.items():
        backend = get_backend(name)
        if not probe(backend).ok:
            continue
        try:
            devices = backend.devices()
        except Exception:  # a plugin's device listing failing only loses its devices here
            continue
        found.update(f"{cls.name} {d} {d.description}".rstrip() for d in devices if d.kind != "cpu")
    return sorted(found)


def timings_key_for(
    model: Model, graph: Graph, device: str | Device | None, options: Mapping[str, Any]
) -> dict[str, Any] | None:
    """The timings key of ``model`` compiled as ``graph`` (its inputs fixed); None when some input
    dim is still symbolic (no shapes, nothing to time)."""
    shapes = fixed_shapes(graph)
    if shapes is None:
        return None
    return timings_key(
        graph_hash=model.graph.hash,
        input_shapes=shapes,
        device="auto" if device is None else str(Device.parse(device)),
        options=options_key(options),
        backend_versions=backend_versions(),
        cpu=cpu_info().describe(),
        accelerators=accelerators(),
    )


def as_measured(record: TimingsRecord) -> Measured:
    """What the automatic choice takes from a record."""
    medians = {m.backend: m.median_s for m in record.results if m.ok and m.median_s is not None}
    failed = {m.backend: m.verdict(record.tolerance, record.first) for m in record.results if not m.ok}
    return Measured(medians, failed, f"tuned {record.when} on {record.machine}")


def stored_measured(
    model: Model, graph: Graph, device: str | Device | None, options: Mapping[str, Any]
) -> Measured | None:
    """The stored timings for this compile, if a tune left valid ones (cheap when none exist)."""
    store = timings_store()
    if not store.folder.is_dir():
        return None
    key = timings_key_for(model, graph, device, options)
    record = store.lookup(key) if key is not None else None
    return as_measured(record) if record is not None else None


def tuned_before(model: Model) -> bool:
    """Whether any stored record is for this model's graph (at any shapes or options): then a
    compile whose shapes are only known at run time looks the timings up per input signature."""
    store = timings_store()
    if not store.folder.is_dir():
        return False
    graph_hash = model.graph.hash
    return any(record is not None and record.key.get("graph") == graph_hash for _, record in store.entries())


def default_backends(device: str | Device | None, precision: str | None = None) -> list[str]:
    """What a tune measures when not told: every backend the automatic choice could use here
    (probe ok, has the device), in priority order, so the first (the baseline the others are
    checked against) is the one ``auto`` would take untuned. Fallbacks (the reference backend)
    are left out, as they can take hours on a real UNet; name ``reference`` first in
    ``backends`` for an exact baseline. Only where no other backend can run is the fallback
    measured. ``precision``: only the backends that offer it. Without a ``device``, a backend
    with several devices is measured on each (``per_device``)."""
    usable = [name for name in candidates() if qualify(name, None, device, precision)[0] is not None]
    fast = [name for name in usable if not fallback(get_backend(name))] or usable
    if device is not None:
        return fast
    return [entry for name in fast for entry in per_device(name)]


def per_device(name: str) -> list[str]:
    """``name@device`` for each device of a backend that lists several (ggml's ``cuda:0``,
    ``vulkan:0`` and ``cpu``: a tune without a device compares them, and ``auto`` then takes the
    fastest backend *and* device), else ``[name]``."""
    try:
        devices = get_backend(name).devices()
    except Exception:  # a plugin's device listing failing: measured on its first device, as before
        return [name]
    return [f"{name}@{d}" for d in devices] if len(devices) > 1 else [name]


@dataclass
class TuneResult:
    """A tune's record, the automatic choice made with it, where it was stored (None: not
    stored, ``store_error`` says why), whether it was measured now (False: read from the store),
    and the chosen backend's compiled model when one was asked for."""

    record: TimingsRecord
    choice: Choice | None  # None: no backend can run it (``rejected`` says why)
    measured_now: bool
    path: Path | None = None
    store_error: str = ""
    compiled: CompiledModel | None = None
    rejected: list[tuple[str, str]] = field(default_factory=list)


def _load() -> tuple[float, ...]:
    try:
        return tuple(round(x, 2) for x in os.getloadavg())
    except (OSError, AttributeError):  # not on Windows
        return ()


def _validate_options(names: Sequence[str], options: Mapping[str, Any]) -> None:
    """Refuse an option no measured backend knows before timing anything (one clear error)."""
    schema: dict[str, Any] = {}
    for name in names:
        cls = get_plugins().backends.get(name)
        if cls is not None:
            schema.update(cls.extra_options)
    make_options(options, schema)


@dataclass(frozen=True)
class TuneSettings:
    """How a tune measures (``sdkit.compile(..., tune=True)`` is ``TuneSettings()``):
    ``backends`` in order, the first the baseline (default: ``default_backends``); ``repeat``
    timed runs after ``warmup`` untimed ones; ``tolerance`` the rel-L2 bound against the
    baseline (default by precision, ``TOLERANCES``); ``force`` measures even where timings are
    stored (``compile`` reuses them otherwise); ``clock`` times (tests make it deterministic);
    ``steps`` wraps the backends as they are measured (a progress bar); ``warn`` warns when the
    record cannot be stored."""

    backends: tuple[str, ...] | None = None
    repeat: int = DEFAULT_REPEAT
    warmup: int = DEFAULT_WARMUP
    tolerance: float | None = None
    force: bool = False
    clock: Clock = time.perf_counter
    steps: Callable[[list[str]], Iterable[str]] = iter
    warn: bool = True

    def bound(self, options: Mapping[str, Any]) -> float:
        if self.tolerance is not None:
            return self.tolerance
        return TOLERANCES.get(str(options.get("precision", "fp32")), TOLERANCES["fp32"])


def tune(
    model: Model,
    *,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    feeds: Mapping[str, np.ndarray] | None = None,
    device: str | Device | None = None,
    options: Mapping[str, Any] | None = None,
    settings: TuneSettings | None = None,
    reuse: bool = False,
    keep: bool = False,
) -> TuneResult:
    """Measure ``settings.backends`` on ``model`` at its shapes (from ``input_shapes``, ``feeds``
    or the graph; random inputs unless ``feeds``), store the record and choose with it.
    ``reuse``: take a valid stored record instead of measuring. ``keep``: return the chosen
    backend's compiled model (the one measured where it is the same). Raises ``InputError`` when
    some input dim is not fixed, ``UnknownBackendError`` for a backend name not registered."""
    settings = settings or TuneSettings()
    options = dict(options or {})
    shapes = input_shapes or ({k: np.shape(v) for k, v in feeds.items()} if feeds else None)
    graph = shaped(model.graph, shapes)
    key = timings_key_for(model, graph, device, options)
    if key is None:
        wanted = ", ".join(i.describe() for i in model.inputs)
        raise InputError(f"tuning needs every input's shape; give input shapes or inputs ({wanted})")
    store = timings_store()
    record = store.lookup(key) if reuse else None
    if record is not None:
        return _finish(_chosen(record, graph, device, options, measured_now=False), graph, model, options, keep)
    names = list(settings.backends) if settings.backends else default_backends(device, requested_precision(options))
    for name in names:  # fail fast on a typo, before minutes of timing
        get_backend(name)
    _validate_options(names, options)
    inputs = dict(feeds) if feeds else random_feeds(graph.inputs)
    how = Trial(inputs, settings.repeat, settings.warmup, settings.clock, options, settings.steps)
    bound = settings.bound(options)
    results, first, best = measure_backends(model, graph, names, device, how, bound)
    where = (cpu_info().name, settings.repeat, settings.warmup, _load())
    record = TimingsRecord(key, tuple(results), first, bound, _now(), *where, model=_label(model))
    result = _chosen(record, graph, device, options, measured_now=True)
    try:
        result.path = store.store(record)
    except CacheError as exc:
        result.store_error = str(exc)
        if settings.warn:
            warnings.warn(f"sdkit: the timings were not stored: {exc}", stacklevel=2)
    if keep and best is not None and result.choice is not None and best[0] == result.choice.name:
        result.compiled = best[1]
    elif best is not None:
        best[1].close()
    return _finish(result, graph, model, options, keep)


def _label(model: Model) -> str:
    """The model file's name, where it came from a file (a pipeline's component: its folder too)."""
    if model.path is None:
        return ""
    path = Path(model.path)
    return f"{path.parent.name}/{path.name}" if path.parent.name else path.name


def _chosen(
    record: TimingsRecord,
    graph: Graph,
    device: str | Device | None,
    options: Mapping[str, Any],
    measured_now: bool,
) -> TuneResult:
    """The record with the automatic choice made from it (None when nothing can run the model)."""
    try:
        choice = choose(graph, "auto", device, as_measured(record), requested_precision(options))
        return TuneResult(record, choice, measured_now)
    except NoBackendError as exc:
        return TuneResult(record, None, measured_now, rejected=list(exc.rejected))


def _finish(result: TuneResult, graph: Graph, model: Model, options: Mapping[str, Any], keep: bool) -> TuneResult:
    """Compile the chosen backend when asked to and the measured one was not kept."""
    if keep and result.choice is None:
        raise NoBackendError(result.rejected)
    if keep and result.compiled is None and result.choice is not None:
        result.compiled = compile_choice(result.choice, graph, model.weights, options)
    return result


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
