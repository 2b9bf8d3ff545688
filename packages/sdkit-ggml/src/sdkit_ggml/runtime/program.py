"""A built graph made runnable: weights in a backend buffer, intermediates from gallocr,
the ggml graph created once and computed again on every run.

The runtime knows nothing of ONNX nodes or converters: the compiler hands it a ``BuiltGraph``
(its contexts, the input, output and weight tensors, and the index inputs to range-check)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sdkit.errors import InputError, SdkitError, UnsupportedModelError
from sdkit_ggml.runtime.context import GgmlContext
from sdkit_ggml.runtime.lib import GGML_STATUS_SUCCESS, GgmlLib
from sdkit_ggml.runtime.quantize import quantize
from sdkit_ggml.runtime.tensors import BOOL, QUANTIZED, Tensor, WeightEntry, storage_numpy
from sdkit_ggml.runtime.threads import set_cpu_threads

_I32_MIN, _I32_MAX = np.iinfo(np.int32).min, np.iinfo(np.int32).max


def to_storage(array: np.ndarray, tensor: Tensor, what: str) -> np.ndarray:
    """Convert a numpy array to the ggml storage of ``tensor`` (F32, F16 or I32), checked."""
    target = storage_numpy(tensor.ggml_type)
    array = np.asarray(array)
    out_of_range = array.dtype.kind in "iu" and array.size and (array.min() < _I32_MIN or array.max() > _I32_MAX)
    if target == np.int32 and out_of_range:
        raise InputError(f"{what}: integer values outside the int32 range ggml stores")
    converted = np.ascontiguousarray(array, dtype=target)
    if converted.size != tensor.size:
        raise InputError(f"{what}: {array.size} elements, expected {tensor.size} ({list(tensor.shape)})")
    return converted


def from_storage(raw: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    if dtype == BOOL:
        return np.asarray(raw != 0)
    return np.asarray(raw.astype(dtype, copy=False))


def unsupported_nodes(lib: GgmlLib, backend: int, graph: int) -> list[str]:
    """The graph's nodes the backend cannot compute, grouped by ggml op: computing one would
    abort the process inside ggml (a CPU build runs every op sdkit emits; a GPU backend may not)."""
    refused: dict[str, list[str]] = {}
    for i in range(lib.ggml_graph_n_nodes(graph)):
        node = lib.ggml_graph_node(graph, i)
        if not lib.ggml_backend_supports_op(backend, node):
            op = (lib.ggml_op_desc(node) or b"?").decode()
            refused.setdefault(op, []).append((lib.ggml_get_name(node) or b"").decode())
    device = (lib.ggml_backend_name(backend) or b"?").decode()
    return [
        f"ggml's {device} backend cannot compute {op} ({len(names)} node(s), e.g. {names[0] or 'unnamed'!r})"
        for op, names in sorted(refused.items())
    ]


@dataclass
class BuiltGraph:
    """What the compiler built for one input signature, ready to allocate."""

    context: GgmlContext
    inputs: dict[str, Tensor]
    outputs: dict[str, Tensor | np.ndarray]  # a numpy constant for outputs folded at compile time
    weights: list[WeightEntry]
    # Runtime index inputs to range-check before compute (ggml asserts on a bad index):
    # input name -> size of the indexed dim.
    index_bounds: dict[str, int] = field(default_factory=dict)
    # Those whose negative indices count from the end (ONNX), wrapped before upload: inputs
    # that index one dim size only (another size would wrap them differently).
    index_wraps: set[str] = field(default_factory=set)
    # Integer inputs computed in F32: input name -> the interval their values must lie in.
    value_ranges: dict[str, tuple[int, int]] = field(default_factory=dict)


class Program:
    """One shape signature, allocated on one ggml backend. Owns the graph's contexts."""

    def __init__(self, lib: GgmlLib, backend: int, graph: BuiltGraph, threads: int | None) -> None:
        self.lib = lib
        self.backend = backend
        self.built = graph
        self.threads = threads
        self.weight_buffer: int | None = None
        self.gallocr: int | None = None
        # Seconds each stage of this constructor took (graph, weights, allocate), and the
        # runs so far with the first one's seconds: where a signature's first call goes.
        self.seconds: dict[str, float] = {}
        self.runs = 0
        self.threads_used: int | None = None  # the CPU threads of the last compute
        self.first_run_s: float | None = None
        start = time.perf_counter()
        context = graph.context
        self.graph = context.new_graph()
        for tensor in graph.outputs.values():
            if isinstance(tensor, Tensor):
                lib.ggml_set_output(tensor.ptr)
                lib.ggml_build_forward_expand(self.graph, tensor.ptr)
        # Inputs nothing reads still need memory for tensor_set.
        for tensor in graph.inputs.values():
            lib.ggml_build_forward_expand(self.graph, tensor.ptr)
        refused = unsupported_nodes(lib, backend, self.graph)
        if refused:
            raise UnsupportedModelError("ggml", refused)
        self.seconds["graph"] = time.perf_counter() - start
        start = time.perf_counter()
        if graph.weights:
            self.weight_buffer = lib.ggml_backend_alloc_ctx_tensors(context.wctx, backend)
            if not self.weight_buffer:
                raise SdkitError("ggml could not allocate the weight buffer (out of device memory?)")
            self.upload(graph.weights)
        self.seconds["weights"] = time.perf_counter() - start
        start = time.perf_counter()
        self.gallocr = lib.ggml_gallocr_new(lib.ggml_backend_get_default_buffer_type(backend))
        if not lib.ggml_gallocr_alloc_graph(self.gallocr, self.graph):
            self.close()
            raise SdkitError("ggml could not allocate the compute buffer (out of device memory?)")
        self.seconds["allocate"] = time.perf_counter() - start

    @property
    def nodes(self) -> int:
        return int(self.lib.ggml_graph_n_nodes(self.graph))

    def memory(self) -> tuple[int, int]:
        """(weight bytes, compute bytes) held on the device."""
        weights = self.lib.ggml_backend_buffer_get_size(self.weight_buffer) if self.weight_buffer else 0
        compute = self.lib.ggml_gallocr_get_buffer_size(self.gallocr, 0) if self.gallocr else 0
        return int(weights), int(compute)

    def upload(self, entries: list[WeightEntry]) -> None:
        """Copy each constant into its tensor, transforming it now where that was deferred. The
        host array is then let go (only its shape is kept, for refit's checks): transformed
        weights (transposed, F16, one conv group...) would otherwise stay in memory twice."""
        for entry in entries:
            what = f"constant {entry.source or '<literal>'}"
            try:
                value = entry.value()
            except (ValueError, IndexError, TypeError) as exc:
                # a deferred transform (transpose, conv-group flip...) meeting a weight whose
                # shape disagrees with the node's attributes: what the build reports eagerly
                raise UnsupportedModelError(
                    "ggml", [f"{what}: its weight does not fit the node using it ({exc})"]
                ) from None
            if entry.tensor.ggml_type in QUANTIZED:  # quantized again on every refit
                data = quantize(self.lib, value, entry.tensor.ggml_type, what)
            else:
                data = to_storage(value, entry.tensor, what)
            self.lib.ggml_backend_tensor_set(entry.tensor.ptr, data.ctypes.data, 0, data.nbytes)
            del data
            entry.array = np.broadcast_to(np.zeros((), dtype=value.dtype), value.shape)
            entry.pending = False

    def checked_indices(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Feeds with every index input range-checked (ggml asserts on a bad index) and its
        negative indices wrapped, as ONNX's Gather defines them."""
        checked = dict(feeds)
        for name, (low, high) in self.built.value_ranges.items():
            values = np.asarray(feeds[name])
            if values.size and (values.min() < low or values.max() > high):
                raise InputError(
                    f"input {name!r}: values must lie in [{low}, {high}] (ggml compares integers in F32,"
                    f" exact there), got [{values.min()}, {values.max()}]"
                )
        for name, bound in self.built.index_bounds.items():
            values = np.asarray(feeds[name])
            low = -bound if name in self.built.index_wraps else 0
            if values.size and (values.min() < low or values.max() >= bound):
                raise InputError(
                    f"input {name!r}: indices must lie in [{low}, {bound}), got [{values.min()}, {values.max()}]"
                )
            if low and values.size and values.min() < 0:
                checked[name] = np.where(values < 0, values + bound, values)
        return checked

    def run(self, feeds: Mapping[str, np.ndarray], threads: int) -> dict[str, np.ndarray]:
        start = time.perf_counter()
        results = self._run(feeds, threads)
        if self.first_run_s is None:
            self.first_run_s = time.perf_counter() - start
        self.runs += 1
        return results

    def _run(self, feeds: Mapping[str, np.ndarray], threads: int) -> dict[str, np.ndarray]:
        feeds = self.checked_indices(feeds)
        for name, tensor in self.built.inputs.items():
            data = to_storage(feeds[name], tensor, f"input {name!r}")
            self.lib.ggml_backend_tensor_set(tensor.ptr, data.ctypes.data, 0, data.nbytes)
        if self.lib.has_cpu and self.lib.ggml_backend_is_cpu(self.backend):
            self.threads_used = set_cpu_threads(self.lib, self.backend, threads)
        status = self.lib.ggml_backend_graph_compute(self.backend, self.graph)
        if status != GGML_STATUS_SUCCESS:
            raise SdkitError(f"ggml graph compute failed (status {status})")
        results: dict[str, np.ndarray] = {}
        for name, value in self.built.outputs.items():
            if isinstance(value, Tensor):
                raw = np.empty(value.shape, dtype=storage_numpy(value.ggml_type))
                self.lib.ggml_backend_tensor_get(value.ptr, raw.ctypes.data, 0, raw.nbytes)
                results[name] = from_storage(raw, value.dtype)
            else:
                results[name] = np.array(value, copy=True)
        return results

    def close(self) -> None:
        if self.gallocr:
            self.lib.ggml_gallocr_free(self.gallocr)
            self.gallocr = None
        if self.weight_buffer:
            self.lib.ggml_backend_buffer_free(self.weight_buffer)
            self.weight_buffer = None
        self.built.context.free()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: the library may be gone
            self.close()
