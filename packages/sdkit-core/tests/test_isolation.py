"""Isolation's plumbing (issue 30, item 8): the child gets the weights intact, and every wait on
it is bounded: a child killed while it still receives the weights (the OOM killer's way) is a
``BackendCrashedError`` at once, and a child that hangs is killed after ``SDKIT_ISOLATE_TIMEOUT``.
The crashes inside a real backend are ``packages/sdkit-ggml/tests/test_isolation.py``."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import sdkit
from sdkit.errors import BackendCrashedError, OptionError
from sdkit.isolation import isolation_timeout, try_in_child
from sdkit.model import Model


class _Trap:
    """Unpickled only in the child, where it does what ``call`` says (the parent never loads it)."""

    def __init__(self, *call: Any) -> None:
        self.call = call

    def __reduce__(self) -> tuple[Any, ...]:
        return self.call


def _job(trap: _Trap) -> dict[str, Any]:
    # The trap goes first, so the child meets it before the weights, which are far larger than
    # a pipe's buffer: the parent is still sending them when the child dies.
    weights = {"w": np.ones(8 << 20, np.float32)}  # 32 MB
    return {
        "trap": trap,
        "proto": None,
        "weights": weights,
        "backend": "none",
        "device": None,
        "options": {},
        "feeds": None,
    }


def _bounded(job: dict[str, Any], seconds: float) -> BaseException | None:
    """``try_in_child(job)``'s error, failing the test if it still waits after ``seconds``."""
    caught: list[BaseException] = []

    def attempt() -> None:
        try:
            try_in_child(job, "none", "compile")
        except BaseException as exc:  # handed to the test
            caught.append(exc)

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"the parent still waits on its child after {seconds} s"
    return caught[0] if caught else None


def test_a_child_killed_while_receiving_the_weights_is_an_error_at_once() -> None:
    started = time.monotonic()
    error = _bounded(_job(_Trap(signal.raise_signal, (signal.SIGKILL,))), 60)
    assert isinstance(error, BackendCrashedError), error
    assert "'none' crashed during compile (SIGKILL)" in str(error)
    assert time.monotonic() - started < 30


def test_a_child_that_hangs_is_killed_after_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SDKIT_ISOLATE_TIMEOUT", "3")
    error = _bounded(_job(_Trap(time.sleep, (600,))), 60)
    assert isinstance(error, BackendCrashedError), error
    assert "timed out" in str(error) and "SDKIT_ISOLATE_TIMEOUT" in str(error)


def test_the_timeout_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SDKIT_ISOLATE_TIMEOUT", raising=False)
    assert isolation_timeout() == 3600
    monkeypatch.setenv("SDKIT_ISOLATE_TIMEOUT", "0.5")
    assert isolation_timeout() == 0.5
    for bad in ("soon", "0", "-1", "inf", "nan"):
        monkeypatch.setenv("SDKIT_ISOLATE_TIMEOUT", bad)
        with pytest.raises(OptionError, match="SDKIT_ISOLATE_TIMEOUT must be a positive number"):
            isolation_timeout()


def test_the_child_gets_every_weight_intact() -> None:
    """Weights of several dtypes and ranks, a 0-d one and a non-contiguous one, arrive as they
    are: the isolated compile's output equals onnx.reference's on the same model."""
    rng = np.random.default_rng(0)
    inits = {
        "a": rng.standard_normal((3, 4)).astype(np.float32).T.copy().T,  # Fortran order
        "b": np.float32(0.5).reshape(()),
        "c": rng.standard_normal(4).astype(np.float16),
        "d": np.array([1, 0, 1, 1], np.int64),
    }
    nodes = [
        helper.make_node("Mul", ["x", "a"], ["t0"]),
        helper.make_node("Add", ["t0", "b"], ["t1"]),
        helper.make_node("Cast", ["c"], ["c32"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["t1", "c32"], ["t2"]),
        helper.make_node("Cast", ["d"], ["d32"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["t2", "d32"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "weights",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    model = Model.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    x = rng.standard_normal((3, 4)).astype(np.float32)
    got = sdkit.compile(model, backend="reference", isolate=True).run({"x": x})["y"]
    a, b, c, d = (np.asarray(v) for v in inits.values())
    np.testing.assert_allclose(got, (x * a + b + c.astype(np.float32)) * d.astype(np.float32), rtol=1e-6)
