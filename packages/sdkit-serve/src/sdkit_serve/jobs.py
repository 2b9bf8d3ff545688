"""One job at a time per model instance, behind a bounded queue.

A worker thread runs jobs in arrival order; HTTP handlers wait on each job's future without
blocking the event loop. A full queue refuses at once (``QueueFullError``: HTTP 429 with
``Retry-After``) instead of letting requests pile up in memory. A job is cancelled while it waits
(it is dropped) or while it runs: the pipeline's step callback raises ``JobCancelled`` at the next
step boundary, which unwinds ``generate`` like any exception (components release what they hold).
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np


class JobCancelled(Exception):
    """Raised inside a job's work to stop it: by ``/interrupt``, a client that went away, shutdown."""


class QueueFullError(Exception):
    def __init__(self, waiting: int, retry_after: int) -> None:
        self.waiting = waiting
        self.retry_after = retry_after
        super().__init__(f"the queue is full ({waiting} requests waiting); retry in {retry_after} s")


class Job:
    """One unit of work for the worker, with its progress for ``/sdapi/v1/progress``."""

    def __init__(self, work: Callable[[Job], Any], kind: str = "txt2img", task_id: str | None = None) -> None:
        self.id = uuid.uuid4().hex
        # A1111's task id (a client's force_task_id, or made here), for /internal/progress
        self.task_id = task_id or f"task({self.id[:15]})"
        self.kind = kind
        self.work = work
        self.future: Future[Any] = Future()
        self._cancel = threading.Event()
        self.cancel_reason = ""
        self.queued_at = time.monotonic()
        self.started_at: float | None = None
        # Progress, written by the worker thread between steps; readers tolerate a torn view.
        self.step = 0
        self.steps = 0
        self.batch_no = 0
        self.batch_count = 1
        self.latents: np.ndarray | None = None

    def cancel(self, reason: str) -> None:
        if not self._cancel.is_set():
            self.cancel_reason = reason
            self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def check(self) -> None:
        """Raise ``JobCancelled`` if the job was cancelled; the work calls it at safe points."""
        if self._cancel.is_set():
            raise JobCancelled(self.cancel_reason)

    def on_step(self, step: int, total: int, latents: np.ndarray) -> None:
        """The pipeline's step callback: record progress, then stop here if cancelled."""
        self.step, self.steps, self.latents = step + 1, total, latents
        self.check()

    @property
    def preview_id(self) -> int:
        """Grows with every step (A1111's ``id_live_preview``): a client that sends back the one
        it saw gets no image until a newer step."""
        return self.batch_no * max(1, self.steps) + self.step

    def fraction(self) -> float:
        """How much of the job is done, in [0, 1]."""
        per_batch = self.step / self.steps if self.steps else 0.0
        return min(1.0, (self.batch_no + per_batch) / max(1, self.batch_count))


class JobQueue:
    """A bounded FIFO in front of one worker thread."""

    def __init__(self, max_waiting: int, name: str = "sdkit-serve-worker") -> None:
        self.max_waiting = max_waiting
        self._waiting: deque[Job] = deque()
        self._lock = threading.Condition()
        self._current: Job | None = None
        self.finished: deque[str] = deque(maxlen=16)  # recent task ids, as A1111's finished_tasks
        self._closed = False
        self._seconds_per_job = 5.0  # running estimate for Retry-After
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def current(self) -> Job | None:
        return self._current

    def waiting(self) -> int:
        with self._lock:
            return len(self._waiting)

    def task_state(self, task_id: str) -> tuple[Job | None, bool, bool]:
        """``(running job, queued, completed)`` for an A1111 task id."""
        current = self._current
        with self._lock:
            queued = any(job.task_id == task_id for job in self._waiting)
        running = current if current is not None and current.task_id == task_id else None
        return running, queued, task_id in self.finished

    def submit(self, job: Job) -> Future[Any]:
        with self._lock:
            if self._closed:
                raise JobCancelled("the server is shutting down")
            # with no job running, the first waiting one is the next to run, not one queued
            # behind it: it must not take a place of the queue while the worker picks it up
            capacity = self.max_waiting + (0 if self._current is not None else 1)
            if len(self._waiting) >= capacity:
                raise QueueFullError(len(self._waiting), self._retry_after())
            self._waiting.append(job)
            self._lock.notify()
        return job.future

    def _retry_after(self) -> int:
        return max(1, math.ceil(self._seconds_per_job * (len(self._waiting) + 1)))

    def cancel(self, job: Job, reason: str) -> None:
        """Drop ``job`` if it still waits; stop it at its next step if it runs."""
        with self._lock:
            if job in self._waiting:
                self._waiting.remove(job)
                job.cancel(reason)
                job.future.set_exception(JobCancelled(reason))
                return
        job.cancel(reason)

    def interrupt(self) -> bool:
        """Stop the running job (A1111's ``/interrupt``: waiting jobs still run)."""
        job = self._current
        if job is None:
            return False
        job.cancel("interrupted")
        return True

    def close(self, timeout: float = 30.0) -> None:
        """Cancel everything and stop the worker."""
        with self._lock:
            self._closed = True
            pending = list(self._waiting)
            self._waiting.clear()
            self._lock.notify_all()
        for job in pending:
            job.cancel("the server is shutting down")
            job.future.set_exception(JobCancelled(job.cancel_reason))
        if self._current is not None:
            self._current.cancel("the server is shutting down")
        self._thread.join(timeout)

    def _next(self) -> Job | None:
        with self._lock:
            while True:
                while not self._waiting and not self._closed:
                    self._lock.wait()
                if self._closed:
                    return None
                job = self._waiting.popleft()
                if job.future.set_running_or_notify_cancel():  # False: its waiter cancelled the future
                    self._current = job
                    return job

    def _run(self) -> None:
        while (job := self._next()) is not None:
            job.started_at = time.monotonic()
            try:
                job.future.set_result(job.work(job))
            except Exception as exc:  # handed to the waiting request, which answers with it
                job.future.set_exception(exc)
            finally:
                elapsed = time.monotonic() - job.started_at
                with self._lock:
                    self.finished.append(job.task_id)
                    self._current = None
                    self._seconds_per_job = 0.7 * self._seconds_per_job + 0.3 * elapsed
