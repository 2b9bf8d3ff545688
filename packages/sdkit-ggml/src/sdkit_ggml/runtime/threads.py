"""How many CPU threads a ggml compute uses, and which ggml thread pool runs them.

ggml's CPU workers meet at a barrier after every graph node, and wait there spinning: in ggml
0.20 (built without OpenMP, as libggml-python is) ``ggml_barrier`` is a busy loop with no sleep,
whatever the thread pool's ``poll`` level (which only sets how long idle workers spin *between*
graphs, before they sleep on a condition variable). On a machine whose cores are all busy, a
spinning worker holds a core the thread it waits for needs, so each barrier can cost a
scheduler time slice: on a 2-vCPU machine at load 5-6, 2 threads ran ESRGAN 2.5-3.6x slower
than 1 thread, and a tiny graph of many small nodes 150x slower.

Two settings, read at every compute:

- ``SDKIT_GGML_THREADS_POLICY``: ``idle`` (default) computes with at most as many threads as
  there are idle cores just before the compute (the machine's online CPUs less the runnable
  threads of other processes: /proc/stat's ``procs_running`` less this process's threads in
  state R, the fewest of 3 reads 0.5 ms apart), never fewer than 1;
  ``fixed`` always uses the ``threads`` option. On a quiet machine the two are the same. Where
  /proc/stat is not readable (not Linux), ``idle`` is ``fixed``.
- ``SDKIT_GGML_THREADPOOL_POLL``: unset (default) lets ggml create and join its workers at each
  compute; a number 0-100 keeps one persistent ggml thread pool per backend and thread count
  (``ggml_threadpool_new`` with that ``poll`` level, ``ggml_backend_cpu_set_threadpool``),
  whose workers sleep between computes at 0. ``benchmarks/ggml_threads.py`` measures both.

Neither changes results: each output element is computed by one thread in the same order
whatever the thread count (``tests/runtime/test_threads.py`` checks 1 and 2 threads bit for bit).
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from pathlib import Path

from sdkit.errors import OptionError, SdkitError
from sdkit_ggml.runtime.lib import GgmlLib, ThreadpoolParams

POLICY_ENV = "SDKIT_GGML_THREADS_POLICY"
POLICIES = ("idle", "fixed")
POLL_ENV = "SDKIT_GGML_THREADPOOL_POLL"
SAMPLES = 3

_pools: dict[tuple[int, int, int], int] = {}
_lock = threading.Lock()


def _procs_running() -> int | None:
    try:
        with open("/proc/stat", "rb") as f:
            for line in f:
                if line.startswith(b"procs_running "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def _own_running() -> int:
    """This process's runnable threads, the caller included (at least 1): idle workers of an
    earlier compute (OpenMP's, onnxruntime's) may still spin, and leave when ggml starts."""
    count = 0
    try:
        tasks = list(Path("/proc/self/task").iterdir())
    except OSError:
        return 1
    for task in tasks:
        try:
            state = (task / "stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        count += state == b"R"
    return max(1, count)


def running_elsewhere(samples: int = SAMPLES) -> int | None:
    """Runnable threads of other processes (/proc/stat's count less this process's), or None
    if unknown: the fewest of a few reads 0.5 ms apart, so that a thread runnable for an
    instant does not take a core from a whole compute."""
    counts = []
    for i in range(samples):
        if i:
            time.sleep(0.0005)
        count = _procs_running()
        if count is None:
            return None
        counts.append(count - _own_running())
    return max(0, min(counts))


def policy() -> str:
    value = os.environ.get(POLICY_ENV, "idle").strip().lower() or "idle"
    if value not in POLICIES:
        raise OptionError(f"{POLICY_ENV}={value!r}: expected one of {', '.join(POLICIES)}")
    return value


def compute_threads(requested: int) -> int:
    """The thread count for one compute under the policy (see the module docstring)."""
    requested = max(1, int(requested))
    if requested == 1 or policy() == "fixed":
        return requested
    others = running_elsewhere()
    if others is None:
        return requested
    # procs_running counts the whole machine (the host's, in most containers): compare it with
    # every online CPU, not only those this process may use
    return max(1, min(requested, (os.cpu_count() or 1) - others))


def pool_poll() -> int | None:
    raw = os.environ.get(POLL_ENV, "").strip()
    if not raw:
        return None
    try:
        poll = int(raw)
    except ValueError:
        poll = -1
    if not 0 <= poll <= 100:
        raise OptionError(f"{POLL_ENV}={raw!r}: expected an integer 0-100 (ggml's polling level)")
    return poll


def set_cpu_threads(lib: GgmlLib, backend: int, requested: int) -> int:
    """Set the CPU backend's threads (and thread pool) for the next compute; the count used."""
    threads = compute_threads(requested)
    lib.ggml_backend_cpu_set_n_threads(backend, threads)
    poll = pool_poll()
    if poll is None or not lib.has("ggml_threadpool_new"):
        if lib.has("ggml_backend_cpu_set_threadpool"):
            lib.ggml_backend_cpu_set_threadpool(backend, None)  # ggml's per-compute workers
        return threads
    key = (backend, threads, poll)
    with _lock:
        pool = _pools.get(key)
        if pool is None:
            params = ThreadpoolParams()
            lib.ggml_threadpool_params_init(ctypes.byref(params), threads)
            params.poll = poll
            pool = lib.ggml_threadpool_new(ctypes.byref(params))
            if not pool:
                raise SdkitError(f"ggml could not create a thread pool of {threads} threads")
            _pools[key] = pool
    lib.ggml_backend_cpu_set_threadpool(backend, pool)
    return threads
