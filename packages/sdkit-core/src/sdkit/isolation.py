"""Isolation: a backend's compile, and its first run per input signature, tried in a child
process first, so that native code that aborts (ggml's ``GGML_ASSERT``) or segfaults ends as a
``BackendCrashedError`` naming the backend and the signal, and this process lives on.

    sdkit.compile(model, backend="ggml", isolate=True)     # or SDKIT_ISOLATE=1; on in `sdkit serve`

The child is a fresh interpreter (``spawn``: forking a process whose backend threads hold locks
is unsafe) that gets the graph, the weights, the backend's name, the device and the options,
compiles, runs the feeds once when given, and exits. Only when it exits cleanly does this process
compile (or run) for real: what the child survived, the parent runs the same way. A Python
exception in the child is not a crash: the parent then meets the same ``SdkitError`` itself.

The price is a second compile, and a child's start (about a second) per new input signature:
for servers and batch jobs that must not die, not for tight loops. Data goes to the child
through a pipe, a pickled header then the weights' raw bytes: sdkit's own objects, never a
user's file (those are never unpickled). Every wait is bounded: a child that dies at any point
(while it receives the weights too) is a ``BackendCrashedError``, and so is one that gives no
answer within ``SDKIT_ISOLATE_TIMEOUT`` seconds (default an hour).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import numpy as np

from sdkit.backend import CompiledModel
from sdkit.errors import BackendCrashedError, OptionError

ENV = "SDKIT_ISOLATE"
TIMEOUT_ENV = "SDKIT_ISOLATE_TIMEOUT"
DEFAULT_TIMEOUT_S = 3600.0
EXIT_GRACE_S = 30.0  # a child that answered exits at once; one that does not is killed
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"", "0", "false", "no", "off"}


def isolation_wanted(option: Any) -> bool:
    """``isolate=`` when given, else ``SDKIT_ISOLATE``."""
    if option is not None:
        if not isinstance(option, bool):
            raise OptionError(f"isolate must be true or false, not {option!r}")
        return option
    text = os.environ.get(ENV, "").strip().lower()
    if text not in _TRUE | _FALSE:
        raise OptionError(f"{ENV} must be 1 or 0, not {text!r}")
    return text in _TRUE


def _send_job(job: dict[str, Any], out: Connection) -> None:
    """The job down ``out``: a small pickled header (names, graph, options, and each weight's
    dtype and shape), then each weight's raw bytes, so no second copy of them is made. A child
    that dies meanwhile ends this with a broken pipe (its only reading end was the child's), which
    the parent's wait (``_await_answer``) reports; nothing here may block past the child's life."""
    weights = {k: np.ascontiguousarray(v) for k, v in job["weights"].items()}
    raw = {k: v for k, v in weights.items() if not v.dtype.hasobject}
    header = {key: value for key, value in job.items() if key != "weights"}
    header["pickled_weights"] = {k: v for k, v in weights.items() if k not in raw}
    header["raw_weights"] = [(k, v.dtype.str, v.shape) for k, v in raw.items()]
    try:
        out.send(header)
        for array in raw.values():
            out.send_bytes(array.reshape(-1).view(np.uint8).data)
    except OSError:  # the child died: its exit status, not this, is the news
        pass
    finally:
        out.close()


def _receive_job(source: Connection) -> dict[str, Any]:
    """The child's side of ``_send_job``: each weight read straight into its own array."""
    job: dict[str, Any] = source.recv()
    weights = dict(job.pop("pickled_weights"))
    for name, dtype, shape in job.pop("raw_weights"):
        array = np.empty(shape, np.dtype(dtype))
        if source.recv_bytes_into(array.reshape(-1).view(np.uint8).data) != array.nbytes:
            raise OSError(f"weight {name!r} arrived truncated")
        weights[name] = array
    source.close()
    job["weights"] = weights
    return job


def _child(source: Connection, stderr_path: str, answer: Connection) -> None:
    """The child: stderr to a file the parent reads (ggml's assert message), then receive the
    job, compile and maybe run. It answers ``None`` (done) or a Python error's (type name,
    message); dying answers nothing, and its exit status says how it died."""
    fd = os.open(stderr_path, os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 2)
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")  # ggml would attach gdb for a backtrace
    from sdkit.model import Graph, WeightSet
    from sdkit.options import make_options
    from sdkit.plugins import get_plugins

    job = _receive_job(source)
    try:  # what sdkit.compile does after its checks (made in the parent), with no isolation
        cls = get_plugins().backends.get(job["backend"])
        if cls is None:
            raise OptionError(f"backend {job['backend']!r} is not registered in the isolated child")
        backend = cls()
        options = make_options(job["options"], backend.extra_options)
        compiled = backend.compile(Graph(job["proto"]), WeightSet(job["weights"]), job["device"], options)
        if job["feeds"] is not None:
            compiled.run(job["feeds"])
    except Exception as exc:  # not a crash: the parent raises it as its own
        attributes = dict(vars(exc))
        try:
            pickle.dumps(attributes)
        except Exception:  # an attribute that cannot travel: the message does
            attributes = {}
        answer.send((type(exc).__name__, str(exc), attributes))
    else:
        answer.send(None)
    answer.close()
    sys.stderr.flush()
    os._exit(0)


def _raise_child_error(name: str, message: str, attributes: dict[str, Any]) -> None:
    """The child's Python error, as the same ``sdkit.errors`` class (message and attributes)
    when it is one, else an ``SdkitError`` naming its type."""
    from sdkit import errors

    cls = getattr(errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, errors.SdkitError)) or cls is BackendCrashedError:
        raise errors.SdkitError(f"{name}: {message}")
    error = cls.__new__(cls)  # its __init__ may take more than the message it already made
    Exception.__init__(error, message)
    error.__dict__.update(attributes)
    raise error


def _signal_name(code: int) -> str:
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit status {code}"


def _last_line(path: Path) -> str:
    """What the child said last before dying: an assert's line when there is one."""
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    asserts = [line for line in lines if "ASSERT" in line or "Assertion" in line]
    return (asserts or lines or [""])[-1][:300]


def isolation_timeout() -> float:
    """How long a child may take (``SDKIT_ISOLATE_TIMEOUT`` seconds, default an hour): a compile
    of a big graph takes minutes, but a child that hangs must not hold its caller forever."""
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not (0 < seconds < float("inf")):
        raise OptionError(f"{TIMEOUT_ENV} must be a positive number of seconds, not {text!r}")
    return seconds


def _await_answer(process: Any, receive: Connection, timeout: float) -> Any:
    """The child's answer, ``"died"`` when it died without one, ``"timed out"`` when it gave
    none within ``timeout`` seconds. Bounded either way: the child's death ends the wait even
    when something it started still holds the answer pipe open."""
    ready = wait([receive, process.sentinel], timeout)
    if not ready:
        return "timed out"
    if receive in ready or receive.poll(0):  # an answer sent just before the end still counts
        try:
            return receive.recv()
        except (EOFError, OSError):
            return "died"
    return "died"


def _stop(process: Any, sender: threading.Thread) -> int:
    """The child's exit code once it is gone: a short grace to exit on its own (it answered),
    then killed. Its death breaks the sender's pipe, so the sender ends too."""
    process.join(EXIT_GRACE_S)
    if process.exitcode is None:
        process.kill()
        process.join(EXIT_GRACE_S)
    sender.join(EXIT_GRACE_S)
    return process.exitcode if process.exitcode is not None else -signal.SIGKILL


def try_in_child(job: dict[str, Any], backend: str, what: str) -> None:
    """Run ``job`` (see ``_child``) in a fresh process. A death (by signal, or an exit without
    an answer, at any point: while it receives the weights too) or no answer within
    ``isolation_timeout()`` is a ``BackendCrashedError``; a Python error there is raised here."""
    context = multiprocessing.get_context("spawn")
    timeout = isolation_timeout()
    with tempfile.TemporaryDirectory(prefix="sdkit-isolate-") as scratch:
        stderr_path = Path(scratch) / "stderr.txt"
        stderr_path.touch()
        receive, send = context.Pipe(duplex=False)
        source, sink = context.Pipe(duplex=False)
        # The job goes down a pipe of its own, not as the Process's arguments: CPython writes
        # those while it still holds the reading end itself, so a child dying mid-read left
        # that write blocked forever.
        process = context.Process(target=_child, args=(source, str(stderr_path), send), daemon=True)
        process.start()
        send.close()  # the child holds the only sending end of answers,
        source.close()  # and the only reading end of the job: its death breaks both
        sender = threading.Thread(target=_send_job, args=(job, sink), name="sdkit-isolate-send", daemon=True)
        sender.start()
        answer = _await_answer(process, receive, timeout)
        if answer == "timed out":
            process.kill()
        code = _stop(process, sender)
        receive.close()
        if answer == "timed out":
            detail = f"no answer within {timeout:g} s ({TIMEOUT_ENV}); the child was killed"
            raise BackendCrashedError(backend, what, "timed out", detail)
        if answer == "died" or code != 0:
            raise BackendCrashedError(backend, what, _signal_name(code), _last_line(stderr_path))
        if answer is not None:
            _raise_child_error(*answer)


class IsolatedModel(CompiledModel):
    """A compiled model whose first run per input signature was tried in a child first."""

    def __init__(self, inner: CompiledModel, job: dict[str, Any]) -> None:
        self._inner, self._job = inner, job
        self.inputs, self.outputs, self.device = inner.inputs, inner.outputs, inner.device
        self.backend_name = inner.backend_name
        self._tried: set[tuple[tuple[str, str, tuple[int, ...]], ...]] = set()

    def __getattr__(self, name: str) -> Any:  # the backend's own extras (info, program_for...)
        return getattr(self._inner, name)

    def execute(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        signature = tuple(sorted((k, v.dtype.str, tuple(v.shape)) for k, v in feeds.items()))
        if signature not in self._tried:
            try_in_child({**self._job, "feeds": feeds}, self.backend_name, "its first run")
            self._tried.add(signature)
        return self._inner.execute(feeds)

    def refit(self, weights: Any) -> None:
        self._inner.refit(weights)
        self._job = {**self._job, "weights": dict(weights)}
        self._tried.clear()

    def close(self) -> None:
        self._inner.close()


def isolated_compile(
    compile_here: Callable[[], CompiledModel],
    job: dict[str, Any],
    backend: str,
) -> CompiledModel:
    """``compile_here()`` after the same compile survived in a child; the result runs each new
    input signature in a child first (``IsolatedModel``)."""
    try_in_child({**job, "feeds": None}, backend, "compile")
    return IsolatedModel(compile_here(), job)


def job_for(
    proto: Any, weights: Mapping[str, np.ndarray], backend: str, device: Any, options: dict[str, Any]
) -> dict[str, Any]:
    """What the child needs: plain data (the graph, the weights as arrays, names)."""
    return {
        "proto": proto,
        "weights": {k: np.asarray(v) for k, v in weights.items()},
        "backend": backend,
        "device": device,
        "options": dict(options),
    }
