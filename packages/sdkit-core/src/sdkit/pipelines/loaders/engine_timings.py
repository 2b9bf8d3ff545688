"""Which engine runs a single file under ``backend="auto"``: sdkit's own pipeline (its components
on the graph backends ``auto`` picks) or a pipeline engine that also reads the file
(stable-diffusion.cpp), as a whole-image measurement stored by ``sdkit tune`` decided.

An engine runs the whole pipeline in its own code, so the two cannot be compared per component:
the measurement is per whole image (text encoding, every step, VAE decode) at one size and step
count. The record is a ``sdkit.timings`` record like a component's, kept in the same store, under a
key made of the file's identity (its size and first MiB: the header with every tensor's name,
shape and type), the size and steps, the device, the options (threads, precision), the version of
every graph backend and engine available, the CPU and the accelerators: change any and the record
no longer matches. Without a matching record ``auto`` keeps sdkit's own pipeline: an engine is
never chosen unmeasured. The choice is made when the pipeline loads, before the request's size is
known: it is the measured fastest where every matching record (each size and step count measured)
agrees; where they disagree, sdkit's own pipeline, and the reason says so.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sdkit.api import timings_stored
from sdkit.cpu_features import cpu_info
from sdkit.device import Device
from sdkit.loaders import loaders_by_priority
from sdkit.timings import TimingsRecord, timings_key

SDKIT = "sdkit"  # sdkit's own pipeline, in a record's results
WHOLE_IMAGE = "whole image"
IDENTITY_BYTES = 1 << 20
_PREFIX = "pipeline file "


def file_identity(path: Path) -> str:
    """The file's size and a hash of its first MiB (its header: every tensor's name, shape and
    type, which decide the speed; and the start of its weights)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        digest.update(f.read(IDENTITY_BYTES))
    return f"{_PREFIX}{path.stat().st_size}:{digest.hexdigest()[:32]}"


def engine_loaders(path: Path) -> list[Any]:
    """The pipeline engines' loaders that read ``path`` and can run here (probe ok)."""
    found = []
    for loader in loaders_by_priority("pipeline"):
        if getattr(loader, "engine", "") and loader.accepts(path) and engine_available(loader):
            found.append(loader)
    return found


def own_loader_reads(path: Path) -> bool:
    """Whether one of sdkit's own pipeline loaders (not an engine's) takes ``path``."""
    return path.is_file() and any(
        loader.sniff(path) and not getattr(loader, "engine", "") for loader in loaders_by_priority("pipeline")
    )


def engine_available(loader: Any) -> bool:
    try:
        return bool(loader.probe().ok)
    except Exception:  # a broken binding: not available
        return False


def engine_versions() -> dict[str, str]:
    """``{"engine:sdcpp": version}`` for every engine whose probe succeeds here."""
    versions = {}
    for loader in loaders_by_priority("pipeline"):
        engine = getattr(loader, "engine", "")
        if engine:
            try:
                availability = loader.probe()
            except Exception:
                continue
            if availability.ok:
                versions[f"engine:{engine}"] = availability.version
    return versions


def engine_key(
    path: Path,
    device: str | Device | None,
    options: Mapping[str, Any],
    width: int = 0,
    height: int = 0,
    steps: int = 0,
) -> dict[str, Any]:
    """The timings key of a whole-image measurement of ``path`` (``width``/``height``/``steps``
    0: the key's other fields, for ``measured_engine``). ``sdkit.tuning`` is imported here, not at
    module level: a plain load with no stored timings never imports the tuning code."""
    from sdkit.tuning import accelerators, backend_versions, options_key

    return timings_key(
        graph_hash=file_identity(path),
        input_shapes={"image": [height, width]},
        device="auto" if device is None else str(Device.parse(device)),
        options={**options_key(timed_options(options)), "steps": steps, "measured": WHOLE_IMAGE},
        backend_versions={**backend_versions(), **engine_versions()},
        cpu=cpu_info().describe(),
        accelerators=accelerators(),
    )


def timed_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The load options that belong in the key: not ``prepare`` (when components compile) nor
    ``isolate`` (a child process per compile or generation: on in ``sdkit serve``), which leave a
    generation's time as it is, or nearly."""
    return {k: v for k, v in options.items() if k not in ("prepare", "isolate")}


def _comparable(key: Mapping[str, Any]) -> dict[str, Any]:
    """A key without the size and steps: what must match for a record to count at load."""
    same = {k: v for k, v in key.items() if k != "input_shapes"}
    same["options"] = {k: v for k, v in dict(key.get("options", {})).items() if k != "steps"}
    return same


def fastest(record: TimingsRecord) -> tuple[str, float] | None:
    """The engine with the smallest median among those that ran (None: none did)."""
    ok = [(m.backend, m.median_s) for m in record.results if m.ok and m.median_s is not None]
    return min(ok, key=lambda item: item[1]) if ok else None


def where(record: TimingsRecord) -> str:
    height, width = record.key["input_shapes"]["image"]
    return f"{width}x{height}, {record.key['options']['steps']} steps"


@dataclass(frozen=True)
class EngineChoice:
    """``engine``: ``"sdkit"`` or an engine's name (``"sdcpp"``); ``reason``: the measurements."""

    engine: str
    reason: str


def measured_engine(path: Path, device: Any, options: Mapping[str, Any]) -> EngineChoice | None:
    """The engine stored whole-image timings pick for ``path`` here (None: no matching record)."""
    if not timings_stored():  # before importing the tuning code, as sdkit.compile does
        return None
    from sdkit.tuning import timings_store

    store = timings_store()
    records = [r for _, r in store.entries() if r is not None and str(r.key.get("graph", "")).startswith(_PREFIX)]
    if not records or (device is not None and not isinstance(device, (str, Device))):
        return None
    wanted = _comparable(engine_key(path, device, options))
    matching = [r for r in records if _comparable(r.key) == wanted]
    winners = [(where(r), best) for r in matching if (best := fastest(r)) is not None]
    if not winners:
        return None
    names = {name for _, (name, _) in winners}
    each = "; ".join(f"{at}: {name} {median:.3g} s" for at, (name, median) in winners)
    if len(names) > 1:
        return EngineChoice(SDKIT, f"whole-image timings disagree by size ({each}): sdkit's own pipeline")
    return EngineChoice(names.pop(), f"measured fastest per whole image ({each}; tuned {matching[0].when})")
