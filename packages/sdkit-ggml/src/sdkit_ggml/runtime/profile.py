"""Where a compiled ggml graph spends its time: per-node timing through ggml's scheduler.

ggml's own facility for looking at each node is the scheduler's eval callback
(``ggml_backend_sched_set_eval_callback``): asked ``ask=true`` for a node, a callback that
answers yes makes the scheduler compute the graph up to and including that node as one
sub-graph, then call back with ``ask=false``. Answering yes for every node that computes
something times each node on its own; view-only nodes (reshape, view, permute, transpose)
cost nothing and are folded into the next timed node. The scheduler runs on a
``Program``'s graph as already allocated (its tensors have memory, so the scheduler's own
allocator leaves them in place), on the program's own backend, with the same thread count.

Per-node timing adds one backend dispatch per node (tens of microseconds, worker wake-up
included), so the profile's total is a little above a plain run's: ``overhead`` reports the
difference against an untimed compute of the same graph.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from sdkit.errors import SdkitError
from sdkit_ggml.runtime.lib import EVAL_CALLBACK, GGML_STATUS_SUCCESS
from sdkit_ggml.runtime.program import Program, to_storage

_FREE_OPS = {"NONE", "VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"}


class TensorNode(ctypes.Structure):
    """struct ggml_tensor up to its sources (ggml 0.20: GGML_MAX_OP_PARAMS 64, GGML_MAX_SRC 10)."""

    _fields_ = (
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * 16),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * 10),
    )


@dataclass
class NodeTime:
    index: int
    op: str  # ggml_op_desc: the op name, or the unary op's name for GGML_OP_UNARY
    name: str
    shape: tuple[int, ...]  # ggml order (ne0 innermost)
    seconds: float
    flop: float  # multiply-adds x 2 for MUL_MAT, else 0


@dataclass
class OpKind:
    op: str
    count: int = 0
    seconds: float = 0.0
    flop: float = 0.0


@dataclass
class Profile:
    nodes: list[NodeTime]
    total_s: float  # sum of the timed nodes
    plain_s: float  # the same graph computed untimed, for the overhead
    kinds: dict[str, OpKind] = field(default_factory=dict)

    def by_kind(self) -> list[OpKind]:
        return sorted(self.kinds.values(), key=lambda k: k.seconds, reverse=True)

    def table(self, top: int = 15) -> str:
        lines = [f"{'op':<16} {'nodes':>6} {'seconds':>9} {'share':>7} {'GFLOP/s':>8}"]
        for kind in self.by_kind()[:top]:
            rate = f"{kind.flop / kind.seconds / 1e9:8.1f}" if kind.flop and kind.seconds else f"{'':>8}"
            share = kind.seconds / self.total_s if self.total_s else 0.0
            lines.append(f"{kind.op:<16} {kind.count:>6} {kind.seconds:9.3f} {share:7.1%} {rate}")
        lines.append(f"{'total':<16} {len(self.nodes):>6} {self.total_s:9.3f}  (untimed run {self.plain_s:.3f} s)")
        return "\n".join(lines)


def _mul_mat_flop(node: TensorNode) -> float:
    """2 x the multiply-adds of a MUL_MAT: K (src0's ne0) for each of the result's elements."""
    if not node.src[0]:
        return 0.0
    k = int(TensorNode.from_address(node.src[0]).ne[0])
    return 2.0 * k * float(np.prod([int(node.ne[i]) for i in range(4)]))


def _set_inputs(program: Program, feeds: Mapping[str, np.ndarray]) -> None:
    lib = program.lib
    for name, tensor in program.built.inputs.items():
        data = to_storage(feeds[name], tensor, f"input {name!r}")
        lib.ggml_backend_tensor_set(tensor.ptr, data.ctypes.data, 0, data.nbytes)


def _timed_compute(program: Program) -> list[NodeTime]:
    lib = program.lib
    nodes: list[NodeTime] = []
    state = {"start": 0.0, "index": 0}

    def callback(tensor: int, ask: bool, _user: int) -> bool:
        if ask:
            desc = (lib.ggml_op_desc(tensor) or b"").decode()
            wanted = desc not in _FREE_OPS
            if wanted:
                state["start"] = time.perf_counter()
            return wanted
        seconds = time.perf_counter() - state["start"]
        node = TensorNode.from_address(tensor)
        op = (lib.ggml_op_desc(tensor) or b"").decode()
        nodes.append(
            NodeTime(
                index=len(nodes),
                op=op,
                name=(lib.ggml_get_name(tensor) or b"").decode(errors="replace"),
                shape=tuple(int(node.ne[i]) for i in range(4)),
                seconds=seconds,
                flop=_mul_mat_flop(node) if op == "MUL_MAT" else 0.0,
            )
        )
        return True

    backends = (ctypes.c_void_p * 1)(program.backend)
    capacity = max(program.built.context.graph_size, program.nodes + 16)
    sched = lib.ggml_backend_sched_new(backends, None, 1, capacity, False, False)
    if not sched:
        raise SdkitError("ggml could not create a scheduler for profiling")
    keep = EVAL_CALLBACK(callback)  # referenced until the compute returns
    try:
        lib.ggml_backend_sched_set_eval_callback(sched, keep, None)
        status = lib.ggml_backend_sched_graph_compute(sched, program.graph)
        if status != GGML_STATUS_SUCCESS:
            raise SdkitError(f"ggml graph compute failed while profiling (status {status})")
    finally:
        lib.ggml_backend_sched_free(sched)
    return nodes


def profile_program(program: Program, feeds: Mapping[str, np.ndarray], threads: int, repeat: int = 1) -> Profile:
    """Time every node of ``program`` on ``feeds``; with ``repeat`` > 1 each node keeps its
    fastest time (the machine is shared: the minimum is the least disturbed)."""
    lib = program.lib
    if lib.has_cpu and lib.ggml_backend_is_cpu(program.backend):
        lib.ggml_backend_cpu_set_n_threads(program.backend, int(threads))  # as asked: no thread policy
        if lib.has("ggml_backend_cpu_set_threadpool"):
            lib.ggml_backend_cpu_set_threadpool(program.backend, None)
    _set_inputs(program, feeds)
    start = time.perf_counter()
    if lib.ggml_backend_graph_compute(program.backend, program.graph) != GGML_STATUS_SUCCESS:
        raise SdkitError("ggml graph compute failed")
    plain = time.perf_counter() - start
    best: list[NodeTime] | None = None
    for _ in range(max(1, repeat)):
        _set_inputs(program, feeds)  # the allocator may reuse input memory for later nodes
        nodes = _timed_compute(program)
        if best is None:
            best = nodes
        else:
            for kept, new in zip(best, nodes, strict=True):
                kept.seconds = min(kept.seconds, new.seconds)
    assert best is not None
    profile = Profile(best, total_s=sum(n.seconds for n in best), plain_s=plain)
    for node in best:
        kind = profile.kinds.setdefault(node.op, OpKind(node.op))
        kind.count += 1
        kind.seconds += node.seconds
        kind.flop += node.flop
    return profile
