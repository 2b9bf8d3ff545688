"""``sdkit.measure``: the timing loop with an injected clock, and output comparisons where NaN,
inf or a shape mismatch never read as a match."""

from __future__ import annotations

import numpy as np
import pytest

from sdkit.errors import InputError
from sdkit.measure import max_abs_diff, random_feeds, rel_l2, time_runs
from sdkit.types import TensorInfo


def test_time_runs_warms_up_untimed_and_takes_the_median() -> None:
    now = [0.0]
    costs = iter([100.0, 1.0, 5.0, 2.0])  # the warm-up run's 100 s is not counted
    calls = []

    def run() -> dict[str, np.ndarray]:
        now[0] += next(costs)
        calls.append(now[0])
        return {"y": np.array([len(calls)])}

    timed = time_runs(run, repeat=3, warmup=1, clock=lambda: now[0])
    assert timed.times == (1.0, 5.0, 2.0) and timed.median == 2.0 and timed.min == 1.0
    assert int(timed.outputs["y"][0]) == 4  # the last run's outputs
    with pytest.raises(InputError):
        time_runs(run, repeat=0)


def test_comparisons() -> None:
    a = {"y": np.array([3.0, 4.0])}
    assert rel_l2(a, a) == 0.0 and max_abs_diff(a, a) == 0.0
    b = {"y": np.array([3.0, 4.5])}
    assert rel_l2(b, a) == pytest.approx(0.5 / 5.0) and max_abs_diff(b, a) == pytest.approx(0.5)
    zero = {"y": np.zeros(2)}
    assert rel_l2(a, zero) == pytest.approx(5.0)  # an all-zero baseline: absolute
    for bad in ({"y": np.array([np.nan, 4.0])}, {"y": np.array([np.inf, 4.0])}, {"y": np.zeros(3)}, {"z": a["y"]}):
        assert rel_l2(bad, a) == float("inf") and max_abs_diff(bad, a) == float("inf")


def test_random_feeds_are_seeded_and_need_fixed_shapes() -> None:
    inputs = [TensorInfo("x", np.dtype(np.float32), (1, 4)), TensorInfo("ids", np.dtype(np.int64), (1, 7))]
    one, two = random_feeds(inputs, seed=3), random_feeds(inputs, seed=3)
    np.testing.assert_array_equal(one["x"], two["x"])
    assert one["x"].dtype == np.float32 and one["ids"].dtype == np.int64 and one["ids"].max() < 10
    with pytest.raises(InputError, match="no fixed shape"):
        random_feeds([TensorInfo("x", np.dtype(np.float32), ("batch", 4))])
