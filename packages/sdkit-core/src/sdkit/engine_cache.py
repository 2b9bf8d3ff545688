"""``EngineCache``: a compiled model's engines, one per input signature, built once each.

Every backend compiles a graph for the input shapes it is called with (ggml programs, OpenVINO
compiled models, TensorRT engines, MIGraphX programs, Core ML packages): a static graph gets its
engine at compile time, a graph with symbolic dims one per signature (the call's shapes, and for
ggml the values of shape-giving inputs) on first use. This is that table, written once:

- **Built once per signature.** ``get_or_build`` builds under the cache's lock, so two threads
  that call with a new signature at once build it once; the second waits and gets the first's
  engine. A build that raises stores nothing: the next call tries again.
- **No eviction, no limit.** An engine lives until ``clear`` (the compiled model's ``close``) or a
  ``rebuild`` replaces it: as many engines as signatures used, as every backend kept them before
  this class (none evicted). A caller that runs many shapes compiles with fixed shapes or
  profiles instead (each backend's README).
- **Refit by rebuilding.** ``rebuild`` builds every cached signature anew *outside* the lock
  (calls go on with the old engines meanwhile), then, under the lock, runs the owner's
  ``commit`` (switch to the new weights) and swaps all engines at once. An engine that a call
  added meanwhile was built from the old weights and is dropped. Backends that refit engines in
  place (ggml, TensorRT) iterate ``values()`` / ``items()`` instead.
- **Read as a mapping.** ``len``, ``in``, ``[key]``, iteration (over a snapshot of the keys),
  ``keys()`` / ``values()`` / ``items()``, and ``==`` with a dict.

Keys are whatever identifies an engine for that backend (a tuple of shapes; ``None`` for the one
engine of a static graph or of a profile set); they must be hashable.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class EngineCache(Mapping[K, V], Generic[K, V]):
    """Engines by input signature: built once each under a lock, kept until ``clear``."""

    def __init__(self) -> None:
        self._engines: dict[K, V] = {}
        # Reentrant: a build may look at the cache (or build another signature) itself.
        self._lock = threading.RLock()

    def get_or_build(self, key: K, build: Callable[[K], V]) -> V:
        """The engine for ``key``, built now by ``build(key)`` (under the lock) if it is new."""
        with self._lock:
            if key in self._engines:
                return self._engines[key]
            engine = build(key)
            self._engines[key] = engine
            return engine

    def rebuild(self, build: Callable[[K], V], commit: Callable[[], None] | None = None) -> None:
        """Build every cached signature anew with ``build`` (outside the lock), then under the lock
        call ``commit`` and replace all engines at once. If a build raises, nothing changes."""
        with self._lock:
            keys = list(self._engines)
        rebuilt = {key: build(key) for key in keys}
        with self._lock:
            if commit is not None:
                commit()
            self._engines = rebuilt

    def clear(self, close: Callable[[V], None] | None = None) -> None:
        """Forget every engine, calling ``close`` on each first (under the lock, so no build
        runs meanwhile)."""
        with self._lock:
            try:
                if close is not None:
                    for engine in self._engines.values():
                        close(engine)
            finally:
                self._engines.clear()

    def __getitem__(self, key: K) -> V:
        with self._lock:
            return self._engines[key]

    def __iter__(self) -> Iterator[K]:
        with self._lock:
            return iter(list(self._engines))

    def __len__(self) -> int:
        with self._lock:
            return len(self._engines)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._engines

    def __repr__(self) -> str:
        return f"EngineCache({len(self)} engine(s): {list(self)!r})"
