"""The CPU thread policy and thread pool (runtime/threads.py): how many threads a compute gets,
the settings' errors, and that threading never changes a result (bit for bit)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import sdkit
from sdkit.errors import OptionError
from sdkit.model import Model
from sdkit_ggml.runtime import threads

ort = pytest.importorskip("onnxruntime")


@pytest.mark.parametrize(
    ("policy", "cpus", "others", "requested", "expected"),
    [
        ("idle", 2, 0, 2, 2),  # quiet machine: what was asked
        ("idle", 2, 1, 2, 1),
        ("idle", 2, 5, 2, 1),  # oversubscribed: one thread, never zero
        ("idle", 16, 3, 8, 8),
        ("idle", 16, 12, 8, 4),
        ("idle", 2, None, 2, 2),  # /proc/stat unreadable: as fixed
        ("fixed", 2, 5, 2, 2),
        ("", 2, 5, 2, 1),  # the default is idle
    ],
)
def test_compute_threads(
    monkeypatch: pytest.MonkeyPatch, policy: str, cpus: int, others: int | None, requested: int, expected: int
) -> None:
    monkeypatch.setenv(threads.POLICY_ENV, policy)
    monkeypatch.setattr(threads.os, "cpu_count", lambda: cpus)
    monkeypatch.setattr(threads, "running_elsewhere", lambda: others)
    assert threads.compute_threads(requested) == expected


def test_running_elsewhere_reads_proc_stat(monkeypatch: pytest.MonkeyPatch) -> None:
    others = threads.running_elsewhere()
    assert others is None or others >= 0
    assert threads._own_running() >= 1  # the caller, running
    reads = iter([5, 2, 4])  # the caller counts itself; a passing thread is not a busy core
    monkeypatch.setattr(threads, "_procs_running", lambda: next(reads))
    monkeypatch.setattr(threads, "_own_running", lambda: 1)
    assert threads.running_elsewhere() == 1
    monkeypatch.setattr(threads, "_procs_running", lambda: None)
    assert threads.running_elsewhere() is None


@pytest.mark.parametrize(
    ("name", "value"), [(threads.POLICY_ENV, "spin"), (threads.POLL_ENV, "101"), (threads.POLL_ENV, "x")]
)
def test_bad_settings_are_option_errors(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(OptionError, match=name):
        threads.compute_threads(2) if name == threads.POLICY_ENV else threads.pool_poll()


def test_threads_do_not_change_results(monkeypatch: pytest.MonkeyPatch, sd_graphs: Any) -> None:
    # the tiny UNet (convs, attention, norms, softmax): 1 thread, 2 threads with ggml's
    # per-compute workers and with a persistent pool, all equal bit for bit, and near onnxruntime
    proto = sd_graphs.load_model("tiny_unet")
    feeds = sd_graphs.example_inputs("tiny_unet")
    model = Model.from_proto(proto)
    monkeypatch.setenv(threads.POLICY_ENV, "fixed")
    one = sdkit.compile(model, backend="ggml", device="cpu", threads=1)
    want = one.run(feeds)
    two = sdkit.compile(model, backend="ggml", device="cpu", threads=2)
    for poll in ("", "0"):
        monkeypatch.setenv(threads.POLL_ENV, poll)
        got = two.run(feeds)
        assert two.program_for(feeds).threads_used == 2
        for name, value in want.items():
            assert np.array_equal(got[name], value), (poll, name)
    monkeypatch.delenv(threads.POLL_ENV)
    ref = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for info, expected in zip(model.outputs, ref, strict=True):
        diff = np.linalg.norm(want[info.name] - expected) / np.linalg.norm(expected)
        assert diff <= 1e-5, info.name
