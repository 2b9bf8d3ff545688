"""Stored backend timings: what ``sdkit tune`` (or ``sdkit.compile(..., tune=True)``) measured,
kept beside the artifact cache so that ``backend="auto"`` can pick the measured fastest.

One JSON file per key, ``<cache root>/timings/<digest>.json``. The key holds what makes a
timing true only here and now: the graph hash (the artifact cache's model identity), the input
shapes, the requested device, the options (precision, threads, ...), the version of every
available backend, the CPU (name and the instruction-set features kernels depend on), every
accelerator the backends list (kind, index and the vendor's name for it: the GPU identity),
sdkit's version and the file format. Any of those changing gives another key, so a stale or
foreign timing is never looked up. A file that does not parse, does not have the expected
fields, or whose key is not the one asked for is ignored with a warning, never trusted; the
next tune writes over it. Writes go to a temporary file in the same folder renamed into place,
so a reader never sees half a file.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sdkit._version import __version__
from sdkit.errors import CacheError

FORMAT = 1
FOLDER = "timings"


def timings_key(
    *,
    graph_hash: str,
    input_shapes: Mapping[str, Sequence[int]],
    device: str,
    options: Mapping[str, Any],
    backend_versions: Mapping[str, str],
    cpu: str,
    accelerators: Sequence[str] = (),
) -> dict[str, Any]:
    """The fields that decide whether stored timings still describe this machine and model."""
    return {
        "format": FORMAT,
        "sdkit": __version__,
        "graph": graph_hash,
        "input_shapes": {k: [int(d) for d in v] for k, v in sorted(input_shapes.items())},
        "device": device,
        "options": json.loads(json.dumps(dict(options), sort_keys=True, default=str)),
        "backends": dict(sorted(backend_versions.items())),
        "cpu": cpu,
        "accelerators": sorted(accelerators),
    }


def _digest(key: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Measurement:
    """One backend's result: compile time, median and min run time over ``runs`` timed runs, and
    how far its outputs are from the first backend's (``rel_l2``, ``max_diff``). ``agrees`` is
    False when that error is over the record's tolerance; ``error`` says why it did not run."""

    backend: str
    device: str = ""
    version: str = ""
    compile_s: float | None = None
    median_s: float | None = None
    min_s: float | None = None
    runs: int = 0
    rel_l2: float | None = None
    max_diff: float | None = None
    agrees: bool = True
    error: str = ""

    @property
    def ok(self) -> bool:
        """Ran, and agreed with the first backend: a candidate for the measured choice."""
        return not self.error and self.agrees and self.median_s is not None

    def verdict(self, tolerance: float, first: str) -> str:
        """Why this backend can or cannot be chosen by measurement, in words."""
        if self.error:
            return f"failed: {self.error}"
        if not self.agrees:
            return f"outputs differ from {first}'s: rel-L2 {_num(self.rel_l2)} > {tolerance:g}"
        return "ok"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2e}"


@dataclass(frozen=True)
class TimingsRecord:
    """A tune's results for one key. ``first`` is the backend the others were checked against,
    ``tolerance`` the rel-L2 bound; ``when`` (ISO 8601, UTC), ``machine`` and ``load`` (the load
    average when it ran) say where the numbers come from; ``model`` names the model file (for
    people; the key's graph hash is what counts)."""

    key: dict[str, Any]
    results: tuple[Measurement, ...]
    first: str
    tolerance: float
    when: str
    machine: str
    repeat: int
    warmup: int
    load: tuple[float, ...] = field(default=())
    model: str = ""

    def result(self, backend: str) -> Measurement | None:
        return next((m for m in self.results if m.backend == backend), None)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["results"] = [asdict(m) for m in self.results]
        data["load"] = list(self.load)
        return data

    @classmethod
    def from_json(cls, data: Any) -> TimingsRecord:
        """Parse and validate; ``ValueError`` for anything not shaped as ``to_json`` writes it."""
        if not isinstance(data, dict) or not isinstance(data.get("key"), dict):
            raise ValueError("not a timings record")
        results = data.get("results")
        if not isinstance(results, list):
            raise ValueError("results is not a list")
        try:
            record = cls(
                key=data["key"],
                results=tuple(_measurement(r) for r in results),
                first=_typed(data["first"], str),
                tolerance=float(_typed(data["tolerance"], (int, float))),
                when=_typed(data["when"], str),
                machine=_typed(data["machine"], str),
                repeat=_typed(data["repeat"], int),
                warmup=_typed(data["warmup"], int),
                load=tuple(float(_typed(x, (int, float))) for x in data.get("load", [])),
                model=_typed(data.get("model", ""), str),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed timings record: {exc}") from None
        if not math.isfinite(record.tolerance) or len({m.backend for m in record.results}) != len(record.results):
            raise ValueError("malformed timings record")
        return record


def _typed(value: Any, kind: type | tuple[type, ...]) -> Any:
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TypeError(f"{value!r} is not {kind}")
    return value


_OPTIONAL_FLOATS = ("compile_s", "median_s", "min_s", "rel_l2", "max_diff")


def _measurement(data: Any) -> Measurement:
    if not isinstance(data, dict) or set(data) != set(Measurement.__dataclass_fields__):
        raise TypeError("a result has other fields than a Measurement")
    for name in _OPTIONAL_FLOATS:
        value = data[name]
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0):
            raise TypeError(f"{name} is {value!r}")
    if data["median_s"] is not None and not math.isfinite(data["median_s"]):
        raise TypeError("median_s is not finite")
    for name in ("backend", "device", "version", "error"):
        _typed(data[name], str)
    _typed(data["runs"], int)
    if not isinstance(data["agrees"], bool):
        raise TypeError("agrees is not a boolean")
    return Measurement(**data)


class TimingsStore:
    """The timings files under ``root/timings``; ``root`` is the cache root (``cache_root()``)."""

    def __init__(self, root: Path) -> None:
        self.folder = root / FOLDER

    def path(self, key: Mapping[str, Any]) -> Path:
        return self.folder / f"{_digest(key)}.json"

    def lookup(self, key: Mapping[str, Any]) -> TimingsRecord | None:
        """The stored record for ``key``, or None when there is none; a corrupt file, or one
        holding another key, is ignored with a warning (never an error: the choice then falls
        back to priority, and the next tune rewrites the file)."""
        path = self.path(key)
        if not path.exists():
            return None
        try:
            record = load_record(path)
        except (OSError, ValueError) as exc:
            warnings.warn(f"sdkit: ignoring the corrupt timings file {path} ({exc})", stacklevel=3)
            return None
        if record.key != json.loads(json.dumps(key, default=str)):
            warnings.warn(f"sdkit: ignoring the timings file {path}: it holds another key", stacklevel=3)
            return None
        return record

    def store(self, record: TimingsRecord) -> Path:
        """Write ``record`` atomically (a temporary file renamed over the old one)."""
        path = self.path(record.key)
        text = json.dumps(record.to_json(), indent=1, sort_keys=True)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=self.folder)
        except OSError as exc:
            raise CacheError(f"cannot write timings under {self.folder}: {exc}") from None
        tmp = Path(name)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            tmp.replace(path)
        except OSError as exc:
            raise CacheError(f"cannot write timings file {path}: {exc}") from None
        finally:
            tmp.unlink(missing_ok=True)
        return path

    def entries(self) -> list[tuple[Path, TimingsRecord | None]]:
        """Every timings file, parsed (None: unreadable or malformed), by name."""
        if not self.folder.is_dir():
            return []
        return [(path, read_record(path)) for path in sorted(self.folder.glob("*.json"))]


def load_record(path: Path) -> TimingsRecord:
    """A timings file's record; ``OSError`` when it cannot be read, ``ValueError`` (JSON,
    UTF-8 or the record's shape) when it is malformed."""
    return TimingsRecord.from_json(json.loads(path.read_text(encoding="utf-8")))


def read_record(path: Path) -> TimingsRecord | None:
    """A timings file's record, or None when it is missing, unreadable or malformed."""
    try:
        return load_record(path)
    except (OSError, ValueError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None
