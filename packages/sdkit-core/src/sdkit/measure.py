"""Timing and comparing runs: the loop ``sdkit bench`` and ``sdkit tune`` share.

``time_runs`` runs a callable ``warmup`` times untimed, then ``repeat`` times under a clock, and
keeps the last outputs; the clock is a parameter so tests can make time deterministic.
``max_abs_diff`` and ``rel_l2`` compare two runs' outputs; NaN or inf never reads as a match.
``random_feeds`` makes seeded inputs for a model whose input shapes are all fixed.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from sdkit.errors import InputError
from sdkit.types import TensorInfo

Outputs = Mapping[str, np.ndarray]
Clock = Callable[[], float]


@dataclass(frozen=True)
class Timed:
    """The timed runs of one compiled model: seconds per run, and the last run's outputs."""

    times: tuple[float, ...]
    outputs: dict[str, np.ndarray]

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def min(self) -> float:
        return min(self.times)


def time_runs(
    run: Callable[[], dict[str, np.ndarray]],
    repeat: int,
    warmup: int = 1,
    clock: Clock = time.perf_counter,
    steps: Callable[[range], Iterable[int]] = iter,
) -> Timed:
    """``run()`` ``warmup`` times untimed, then ``repeat`` times timed. ``steps`` wraps the timed
    range (a progress bar)."""
    if repeat < 1 or warmup < 0:
        raise InputError("repeat must be at least 1 and warmup at least 0")
    for _ in range(warmup):
        run()
    times = []
    outputs: dict[str, np.ndarray] = {}
    for _ in steps(range(repeat)):
        start = clock()
        outputs = run()
        times.append(clock() - start)
    return Timed(tuple(times), outputs)


def _pairs(a: Outputs, b: Outputs) -> Iterable[tuple[np.ndarray, np.ndarray] | None]:
    """Each output of ``a`` with ``b``'s of the same name as float64; None where they cannot
    be compared (missing, another shape)."""
    for name, value in a.items():
        if name not in b:
            yield None
            continue
        mine = np.asarray(value, dtype=np.float64)
        other = np.asarray(b[name], dtype=np.float64)
        yield (mine, other) if mine.shape == other.shape else None


def max_abs_diff(a: Outputs, b: Outputs) -> float:
    """The largest |a - b| over every output; inf for a shape mismatch or non-finite values."""
    worst = 0.0
    for pair in _pairs(a, b):
        if pair is None:
            return float("inf")
        mine, other = pair
        if mine.size:
            diff = float(np.max(np.abs(mine - other)))
            if not np.isfinite(diff):  # NaN or inf outputs must not read as exact
                return float("inf")
            worst = max(worst, diff)
    return worst


def rel_l2(a: Outputs, b: Outputs) -> float:
    """The worst relative L2 error ``||a - b|| / ||b||`` over every output (``b`` the baseline;
    an all-zero baseline is compared absolutely); inf for a mismatch or non-finite values."""
    worst = 0.0
    for pair in _pairs(a, b):
        if pair is None:
            return float("inf")
        mine, other = pair
        error = float(np.linalg.norm(mine - other))
        scale = float(np.linalg.norm(other))
        value = error / scale if scale > 0 else error
        if not np.isfinite(value):
            return float("inf")
        worst = max(worst, value)
    return worst


def random_feeds(inputs: Sequence[TensorInfo], seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs for fixed shapes: standard normal floats, integers in [0, 10) (token ids,
    timesteps), as ``sdkit run --random`` makes them."""
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for info in inputs:
        if info.kind != "tensor":
            raise InputError(f"input {info.name!r} is a {info.kind}: give it with --input")
        if not all(isinstance(d, int) and d >= 0 for d in info.shape):
            raise InputError(f"input {info.describe()} has no fixed shape: give it (e.g. --random NAME=1x4x32x32)")
        shape = tuple(int(d) for d in info.shape if isinstance(d, int))
        if np.issubdtype(info.dtype, np.floating):
            feeds[info.name] = rng.standard_normal(shape).astype(info.dtype)
        elif info.dtype == np.bool_:
            feeds[info.name] = rng.integers(0, 2, shape).astype(np.bool_)
        else:
            feeds[info.name] = rng.integers(0, 10, shape).astype(info.dtype)
    return feeds
