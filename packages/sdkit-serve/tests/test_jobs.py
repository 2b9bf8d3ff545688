"""The bounded queue and cancellation, with plain Python work (no model)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Any

import numpy as np
import pytest

from sdkit_serve.jobs import Job, JobCancelled, JobQueue, QueueFullError


def blocking_job(gate: threading.Event, started: threading.Event | None = None) -> Job:
    def work(job: Job) -> str:
        if started is not None:
            started.set()
        while not gate.wait(0.01):
            job.check()
        return job.id

    return Job(work)


def stepping_job(steps: int, step_s: float) -> Job:
    def work(job: Job) -> int:
        latents = np.zeros((1, 4, 2, 2), np.float32)
        for i in range(steps):
            time.sleep(step_s)
            job.on_step(i, steps, latents)
        return steps

    return Job(work)


def result(future: Future[Any], timeout: float = 10) -> Any:
    return future.result(timeout)


def test_runs_in_order_and_refuses_past_the_bound() -> None:
    queue = JobQueue(max_waiting=2)
    gate, started = threading.Event(), threading.Event()
    try:
        running = blocking_job(gate, started)
        queue.submit(running)
        assert started.wait(5)
        waiting = [blocking_job(gate) for _ in range(2)]
        for job in waiting:
            queue.submit(job)
        with pytest.raises(QueueFullError) as refused:
            queue.submit(blocking_job(gate))
        assert refused.value.retry_after >= 1 and refused.value.waiting == 2
        gate.set()
        assert [result(j.future) for j in [running, *waiting]] == [running.id, *(j.id for j in waiting)]
    finally:
        gate.set()
        queue.close()


class LateWorker(JobQueue):
    """A queue whose worker has not yet picked up the first job (it waits for ``go``)."""

    def __init__(self, max_waiting: int) -> None:
        self.go = threading.Event()
        super().__init__(max_waiting)

    def _run(self) -> None:
        self.go.wait(30)
        super()._run()


def test_an_idle_queue_takes_one_to_run_and_max_waiting_behind_it() -> None:
    """Submitted before the idle worker picks it up, the first job is the one to run, not one
    of the queued: 1 + max_waiting are taken (50 concurrent requests made this 8 + 1 or 8)."""
    queue = LateWorker(max_waiting=2)
    gate = threading.Event()
    try:
        taken = [blocking_job(gate) for _ in range(3)]
        for job in taken:
            queue.submit(job)
        with pytest.raises(QueueFullError):
            queue.submit(blocking_job(gate))
        queue.go.set()
        gate.set()
        assert [result(j.future) for j in taken] == [j.id for j in taken]
    finally:
        queue.go.set()
        gate.set()
        queue.close()


def test_cancel_a_waiting_job_drops_it() -> None:
    queue = JobQueue(max_waiting=4)
    gate, started = threading.Event(), threading.Event()
    try:
        first = blocking_job(gate, started)
        queue.submit(first)
        assert started.wait(5)
        second = blocking_job(gate)
        queue.submit(second)
        queue.cancel(second, "the client disconnected")
        assert queue.waiting() == 0
        with pytest.raises(JobCancelled, match="disconnected"):
            result(second.future)
        gate.set()
        assert result(first.future) == first.id
    finally:
        gate.set()
        queue.close()


def test_interrupt_stops_the_running_job_at_its_next_step() -> None:
    queue = JobQueue(max_waiting=1)
    try:
        job = stepping_job(steps=100, step_s=0.02)
        queue.submit(job)
        while job.step < 3:
            time.sleep(0.005)
        assert queue.interrupt()
        with pytest.raises(JobCancelled, match="interrupted"):
            result(job.future)
        assert job.step < 10 and 0 < job.fraction() < 0.1
        after = stepping_job(steps=2, step_s=0)
        queue.submit(after)
        assert result(after.future) == 2  # the queue goes on
        assert not queue.interrupt()  # nothing running
    finally:
        queue.close()


def test_a_failing_job_reports_its_error_and_the_worker_survives() -> None:
    queue = JobQueue(max_waiting=1)

    def boom(job: Job) -> None:
        raise ValueError("bad input")

    try:
        failing = Job(boom)
        queue.submit(failing)
        with pytest.raises(ValueError, match="bad input"):
            result(failing.future)
        ok = Job(lambda job: 42)
        queue.submit(ok)
        assert result(ok.future) == 42
    finally:
        queue.close()


def test_close_cancels_running_and_waiting_jobs() -> None:
    queue = JobQueue(max_waiting=2)
    gate, started = threading.Event(), threading.Event()
    running = blocking_job(gate, started)
    queue.submit(running)
    assert started.wait(5)
    waiting = blocking_job(gate)
    queue.submit(waiting)
    queue.close()
    for job in (running, waiting):
        with pytest.raises(JobCancelled, match="shutting down"):
            result(job.future)
    with pytest.raises(JobCancelled):
        queue.submit(blocking_job(gate))
