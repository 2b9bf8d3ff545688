"""What converters work with: ``Tensor`` (a ggml tensor with its ONNX shape and dtype),
compile-time constants (numpy arrays), ``Node`` (one ONNX node's inputs and attributes) and
``Builder`` (creates ggml tensors, checking every precondition ggml would assert on).

Layout convention: a Tensor is always contiguous, with ggml ``ne`` the reversed ONNX shape
(``ne[0]`` innermost). ONNX ranks above 4 keep their leading dims merged into ``ne[3]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import helper

from sdkit_ggml.runtime import lib as L

if TYPE_CHECKING:
    from sdkit_ggml.runtime.lib import GgmlLib

# ONNX dtypes a runtime tensor may have, and how ggml stores them.
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))
INT_DTYPES = tuple(np.dtype(t) for t in (np.int64, np.int32, np.int16, np.int8, np.uint8, np.uint16))
BOOL = np.dtype(np.bool_)


class Unsupported(Exception):
    """A node (or its attributes, dtypes or shapes) that ggml cannot run; the message says why."""


class NeedsValue(Exception):
    """A graph input is used where a compile-time constant is required (a shape, axes...):
    the compiled model specialises on that input's value and builds again."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def storage_type(dtype: np.dtype[Any]) -> int:
    """The ggml type holding an ONNX dtype: floats and bools (0/1) in F32, integers in I32."""
    if dtype in FLOAT_DTYPES or dtype == BOOL:
        return L.GGML_TYPE_F32
    if dtype in INT_DTYPES:
        return L.GGML_TYPE_I32
    raise Unsupported(f"ggml has no {dtype} tensors")


def storage_numpy(ggml_type: int) -> np.dtype[Any]:
    if ggml_type == L.GGML_TYPE_F32:
        return np.dtype(np.float32)
    if ggml_type == L.GGML_TYPE_F16:
        return np.dtype(np.float16)
    return np.dtype(np.int32)


def ne_of(shape: Sequence[int]) -> tuple[int, int, int, int]:
    """ggml ne (innermost first) for an ONNX shape; leading dims beyond 4 merge into ne[3]."""
    dims = [int(d) for d in shape]
    if len(dims) > 4:
        dims = [math.prod(dims[: len(dims) - 3]), *dims[-3:]]
    ne = [*reversed(dims), *([1] * (4 - len(dims)))]
    return ne[0], ne[1], ne[2], ne[3]


@dataclass(frozen=True, eq=False)
class Tensor:
    """A runtime value: a ggml tensor pointer, its ONNX shape and ONNX dtype."""

    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    ggml_type: int = L.GGML_TYPE_F32
    # Known value range of an integer tensor (argmax results, index arithmetic): lets
    # computed gather indices be proven in range at compile time.
    bounds: tuple[int, int] | None = None

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)


Value = Tensor | np.ndarray


@dataclass
class Node:
    """One ONNX node as converters see it."""

    proto: onnx.NodeProto
    inputs: list[Value | None]  # None for an omitted optional input
    opset: int
    attrs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.attrs = {a.name: helper.get_attribute_value(a) for a in self.proto.attribute}

    @property
    def op(self) -> str:
        return self.proto.op_type

    def attr(self, name: str, default: Any = None) -> Any:
        value = self.attrs.get(name, default)
        return value.decode() if isinstance(value, bytes) else value

    def has(self, index: int) -> bool:
        return index < len(self.inputs) and self.inputs[index] is not None

    def value(self, index: int) -> Value:
        value = self.inputs[index] if index < len(self.inputs) else None
        if value is None:
            raise Unsupported(f"input {index} is missing")
        return value

    def input_name(self, index: int) -> str:
        return str(self.proto.input[index])


@dataclass
class WeightEntry:
    """A constant uploaded to a weight buffer; ``source`` names the graph value it comes from
    (recomputed on refit) and ``transform`` the compile-time preprocessing applied to it."""

    tensor: Tensor
    source: str | None
    array: np.ndarray
    transform: Callable[[np.ndarray], np.ndarray] | None = None


class Builder:
    """Creates the ggml graph of one shape signature. Every ggml call goes through ``op`` so
    that the tensor count stays under the context's capacity and each result's ne is checked."""

    def __init__(
        self,
        lib: GgmlLib,
        capacity: int,
        precision: str = "fp32",
        shared_weights: Mapping[tuple[str, str], Tensor] | None = None,
    ) -> None:
        self.lib = lib
        # Weights already on the device from another signature's graph: reused, not re-uploaded.
        self.shared_weights = shared_weights or {}
        self.capacity = capacity
        self.precision = precision
        overhead = lib.ggml_tensor_overhead()
        params = L.InitParams(overhead * capacity + lib.ggml_graph_overhead_custom(capacity, False), None, True)
        self.ctx = lib.ggml_init(params)
        self.wctx = lib.ggml_init(L.InitParams(overhead * capacity, None, True))
        if not self.ctx or not self.wctx:
            raise MemoryError("ggml_init failed")
        self.count = 0
        self.weight_count = 0
        self.weights: list[WeightEntry] = []
        self.weight_cache: dict[tuple[str, str], Tensor] = {}
        # Graph values that depend on the weights only (initializers and what folds from them).
        self.weight_derived: set[str] = set()
        # Graph values refit may change (initializers and anything folded from them): never
        # specialised on their contents.
        self.weight_dependent: set[str] = set()
        self.structural: dict[str, np.ndarray] = {}  # constants the graph's structure depends on
        self.input_names: dict[int, str] = {}  # graph input tensor ptr -> input name
        # Runtime index inputs to range-check before compute (ggml asserts on a bad index):
        # input name -> size of the indexed dim.
        self.index_bounds: dict[str, int] = {}

    # -- low level -------------------------------------------------------------------------
    def _reserve(self, n: int = 1) -> None:
        if self.count + n > self.capacity:
            raise Unsupported(f"graph needs more than {self.capacity} ggml tensors")
        self.count += n

    def op(
        self,
        fn: str,
        *args: Any,
        shape: Sequence[int],
        dtype: np.dtype[Any] | None = None,
        ggml_type: int = L.GGML_TYPE_F32,
    ) -> Tensor:
        """Call ggml function ``fn(ctx, *args)`` expected to produce ONNX ``shape``."""
        if any(d < 0 for d in shape):
            raise Unsupported(f"negative dimension in {list(shape)}")
        if 0 in shape:
            raise Unsupported(f"empty tensor {list(shape)}: ggml cannot allocate zero-sized tensors")
        self._reserve()
        ptr = getattr(self.lib, fn)(self.ctx, *args)
        if not ptr:
            raise Unsupported(f"{fn} returned no tensor")
        want = ne_of(shape)
        head = L.tensor_head(ptr)
        got = tuple(head.ne)
        if got != want:
            # A lowering bug, not a user error: fail loudly rather than compute garbage.
            raise RuntimeError(f"{fn}: ggml produced ne={got}, expected {want} for ONNX shape {tuple(shape)}")
        return Tensor(ptr, tuple(int(d) for d in shape), np.dtype(dtype or np.float32), head.type)

    def new_input(self, shape: Sequence[int], dtype: np.dtype[Any]) -> Tensor:
        if 0 in shape:
            raise Unsupported(f"empty tensor {list(shape)}: ggml cannot allocate zero-sized tensors")
        self._reserve()
        ggml_type = storage_type(dtype)
        ptr = self.lib.ggml_new_tensor_4d(self.ctx, ggml_type, *ne_of(shape))
        self.lib.ggml_set_input(ptr)
        self.input_names[ptr] = ""
        return Tensor(ptr, tuple(int(d) for d in shape), np.dtype(dtype), ggml_type)

    # -- constants -------------------------------------------------------------------------
    def _new_weight(
        self,
        array: np.ndarray,
        ggml_type: int,
        dtype: np.dtype[Any],
        source: str | None,
        transform: Callable[[np.ndarray], np.ndarray] | None,
    ) -> Tensor:
        if self.weight_count + 1 > self.capacity:
            raise Unsupported(f"graph needs more than {self.capacity} weight tensors")
        if array.size == 0:
            raise Unsupported("empty constant: ggml cannot allocate zero-sized tensors")
        self.weight_count += 1
        ptr = self.lib.ggml_new_tensor_4d(self.wctx, ggml_type, *ne_of(array.shape))
        tensor = Tensor(ptr, tuple(int(d) for d in array.shape), np.dtype(dtype), ggml_type)
        self.weights.append(WeightEntry(tensor, source, array, transform))
        return tensor

    def constant(
        self,
        array: np.ndarray | float,
        dtype: np.dtype[Any] | None = None,
        *,
        source: str | None = None,
        transform: Callable[[np.ndarray], np.ndarray] | None = None,
        key: str = "",
        half: bool = False,
    ) -> Tensor:
        """Upload a compile-time constant. ``source`` (a graph value name) makes it refittable;
        ``transform`` is re-applied to the new value on refit; ``half`` stores it as F16
        (precision="fp16" weights of matmul and conv)."""
        raw = np.asarray(array)
        if source is not None:
            cache_key = (source, key + ("/f16" if half else ""))
            if cache_key in self.weight_cache:
                return self.weight_cache[cache_key]
            if cache_key in self.shared_weights:
                return self.shared_weights[cache_key]
        value = transform(raw) if transform is not None else raw
        onnx_dtype = np.dtype(dtype or (raw.dtype if raw.dtype != np.float64 else np.float32))
        ggml_type = L.GGML_TYPE_F16 if half else storage_type(onnx_dtype)
        tensor = self._new_weight(value, ggml_type, onnx_dtype, source, transform)
        if source is not None:
            self.weight_cache[cache_key] = tensor
        return tensor

    def tensor(
        self,
        node: Node,
        index: int,
        transform: Callable[[np.ndarray], np.ndarray] | None = None,
        key: str = "",
        half: bool = False,
    ) -> Tensor:
        """Input ``index`` of ``node`` as a ggml tensor, uploading it if it is a constant."""
        value = node.value(index)
        if isinstance(value, Tensor):
            if transform is not None:
                raise Unsupported(f"input {index} must be a constant (weights known at compile time)")
            return value
        return self.constant(value, source=node.input_name(index), transform=transform, key=key, half=half)

    def fixed_value(self, node: Node, index: int) -> np.ndarray | None:
        """Input ``index`` as a constant refit cannot change (attributes, shapes), else None."""
        value = node.value(index)
        if isinstance(value, Tensor) or node.input_name(index) in self.weight_dependent:
            return None
        return np.asarray(value)

    def const(self, node: Node, index: int, what: str = "") -> np.ndarray:
        """Input ``index`` of ``node`` as a compile-time constant the graph structure depends on
        (a shape, axes, pads...). A runtime tensor there cannot be compiled: Unsupported."""
        value = node.value(index)
        if isinstance(value, Tensor):
            source = self.input_names.get(value.ptr)
            if source:
                raise NeedsValue(source)
            raise Unsupported(
                f"input {index}{' (' + what + ')' if what else ''} must be a constant known at compile time"
            )
        name = node.input_name(index)
        self.structural.setdefault(name, np.array(value, copy=True))
        return value

    def free(self) -> None:
        for attr in ("ctx", "wctx"):
            ptr = getattr(self, attr, None)
            if ptr:
                self.lib.ggml_free(ptr)
                setattr(self, attr, None)
