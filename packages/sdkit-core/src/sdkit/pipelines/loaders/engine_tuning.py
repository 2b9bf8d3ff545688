"""``sdkit tune FILE`` for a single file a pipeline engine also reads (stable-diffusion.cpp): time
one whole image on sdkit's own pipeline and on each such engine, store the record
(``engine_timings``) and say which ``backend="auto"`` now loads.

Each candidate is loaded as ``load_pipeline`` would load it (sdkit's: ``backend="auto"`` for every
component, which takes the per-component timings a tune stored; an engine's: ``backend=NAME``),
with the same options, then runs ``warmup`` untimed and ``repeat`` timed txt2img generations of
the same request (the same prompt, size, steps, CFG, seed and sampler); the median counts, the
load time is recorded as its compile time. The images are not compared: each engine draws its own
noise (sd.cpp's generator is not sdkit's), so equal pixels are not expected; sdkit's pipelines are
checked against diffusers' goldens, and sdkit-sdcpp's against calling the binding directly.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sdkit._version import __version__
from sdkit.cpu_features import cpu_info
from sdkit.device import Device
from sdkit.errors import CacheError, OptionError, SdkitError
from sdkit.pipelines.loaders.engine_timings import (
    SDKIT,
    EngineChoice,
    engine_key,
    engine_loaders,
    measured_engine,
    own_loader_reads,
)
from sdkit.pipelines.loaders.loading import load_with_loaders
from sdkit.pipelines.models.base import Pipeline
from sdkit.timings import Measurement, TimingsRecord
from sdkit.tuning import TuneSettings, timings_store


@dataclass(frozen=True)
class WholeImage:
    """The request every candidate runs (txt2img; the request class's default sampler)."""

    width: int
    height: int
    steps: int = 4
    guidance_scale: float = 7.0
    seed: int = 0
    prompt: str = "a photo of a cat"


@dataclass
class EngineTuneResult:
    """The record, the choice ``auto`` makes with every matching record, where it was stored."""

    record: TimingsRecord
    choice: EngineChoice | None
    path: Path | None = None
    store_error: str = ""


def tune_engines(
    path: str | os.PathLike[str],
    image: WholeImage,
    device: str | Device | None = None,
    options: Mapping[str, Any] | None = None,
    settings: TuneSettings | None = None,
    engines: Sequence[str] | None = None,
) -> EngineTuneResult:
    """Measure sdkit's own pipeline and every engine that reads ``path`` here (or those named in
    ``engines``), per whole image; store and choose. ``OptionError`` when no engine reads the file
    (nothing to compare)."""
    file = Path(path).expanduser()
    settings = settings or TuneSettings()
    options = dict(options or {})
    found = engine_loaders(file) if own_loader_reads(file) else []
    chosen = [loader for loader in found if engines is None or loader.engine in engines]
    if not chosen:
        raise OptionError(f"no pipeline engine (stable-diffusion.cpp) reads {file.name} here: nothing to compare")

    def own() -> Pipeline:
        return load_with_loaders(file, "auto", device, "keep", dict(options))

    loads: list[tuple[str, str, Callable[[], Pipeline]]] = [(SDKIT, __version__, own)]
    for loader in chosen:
        version = loader.probe().version

        def engine(loader: Any = loader) -> Pipeline:
            loaded: Pipeline = loader.load(file, backend=loader.engine, device=device, memory="keep", **options)
            return loaded

        loads.append((loader.engine, version, engine))
    results = [_measure(name, version, load, image, settings, device) for name, version, load in loads]
    key = engine_key(file, device, options, image.width, image.height, image.steps)
    record = TimingsRecord(
        key, tuple(results), SDKIT, settings.bound(options), _now(), cpu_info().name, settings.repeat,
        settings.warmup, _load(), model=file.name,
    )  # fmt: skip
    result = EngineTuneResult(record, None)
    try:
        result.path = timings_store().store(record)
    except CacheError as exc:
        result.store_error = str(exc)
    result.choice = measured_engine(file, device, options)
    return result


def _measure(
    name: str,
    version: str,
    load: Callable[[], Pipeline],
    image: WholeImage,
    settings: TuneSettings,
    device: str | Device | None,
) -> Measurement:
    """One candidate: load (timed), ``warmup`` + ``repeat`` generations; an ``SdkitError`` is
    its result (``error``), never the tune's end."""
    clock = settings.clock
    try:
        start = clock()
        pipe = load()
        loaded = clock() - start
        try:
            request = pipe.request_class.create(
                image.prompt, width=image.width, height=image.height, steps=image.steps,
                guidance_scale=image.guidance_scale, seed=image.seed, output_type="np",
            )  # fmt: skip
            for _ in range(settings.warmup):
                pipe.run(request)
            times = []
            for _ in range(settings.repeat):
                begin = clock()
                pipe.run(request)
                times.append(clock() - begin)
            ran_on = ", ".join(sorted({str(b) for b in pipe.backends().values() if b}))
        finally:
            pipe.close()
    except SdkitError as exc:
        return Measurement(name, version=version, error=f"{type(exc).__name__}: {exc}")
    return Measurement(
        name, device=ran_on or ("auto" if device is None else str(device)), version=version, compile_s=loaded,
        median_s=statistics.median(times), min_s=min(times), runs=len(times),
    )  # fmt: skip


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _load() -> tuple[float, ...]:
    try:
        return tuple(round(x, 2) for x in os.getloadavg())
    except (OSError, AttributeError):  # not on Windows
        return ()
