"""``Builder``: creates the ggml tensors of one input signature, checking every precondition
ggml would assert on. It works over a tensor factory: ``GgmlContext`` (runtime) for a real
build, or ``ShapeOnlyContext`` for ``check()``, which runs the same converters on shapes alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from sdkit.limits import check_bytes, memory_budget, shape_bytes
from sdkit_ggml.compiler.context import NeedsValue, Node, Tensor, Unsupported, ValueUnknown, WeightEntry, ne_of
from sdkit_ggml.compiler.conv_strategy import ConvShape
from sdkit_ggml.runtime import lib as L
from sdkit_ggml.runtime.quantize import quantizable
from sdkit_ggml.runtime.tensors import storage_type, tensor_bytes, type_size

Ne = tuple[int, int, int, int]

# The compute tensors one graph may have (ggml keeps ~0.5 KB of metadata per tensor and graph
# node: 0.5 GB at this bound). Not a per-node estimate: lowerings such as the chunked conv
# make tensors in proportion to the image, so the contexts grow (``GgmlContext``); this only
# refuses a runaway graph, the same way in check() and in the build.
MAX_TENSORS = 1 << 20


class TensorFactory(Protocol):
    """Where tensors are created: ggml contexts, or shapes only (``check()``)."""

    capacity: int  # weight tensors it can hold

    def call(self, fn: str, *args: Any) -> tuple[int, Ne | None, int]: ...  # ptr, ne, ggml type

    def new_tensor(self, ggml_type: int, ne: Ne, *, weight: bool) -> int: ...

    def set_prec_f32(self, ptr: int) -> None: ...

    def set_mul_mat_prec_f32(self, ptr: int) -> None: ...

    def free(self) -> None: ...


@dataclass(frozen=True)
class WeightTransform:
    """Compile-time preprocessing of a weight (a transpose, a kernel flip...), re-applied on
    refit, with the shape it produces: check(), which has no weight values, takes the shape
    instead of running it on a placeholder."""

    apply: Callable[[np.ndarray], np.ndarray]
    out_shape: Callable[[tuple[int, ...]], tuple[int, ...]]

    def __call__(self, array: np.ndarray) -> np.ndarray:
        return self.apply(array)


def ggml_storage(dtype: np.dtype[Any]) -> int:
    ggml_type = storage_type(np.dtype(dtype))
    if ggml_type is None:
        raise Unsupported(f"ggml has no {dtype} tensors")
    return ggml_type


class Builder:
    """Creates the ggml graph of one shape signature. Every ggml call goes through ``op`` so
    that the tensor count stays under ``max_tensors`` and each result's ne is checked."""

    def __init__(
        self,
        factory: TensorFactory,
        precision: str = "fp32",
        shared_weights: Mapping[tuple[str, str], Tensor] | None = None,
        *,
        keep_weights: bool = True,
    ) -> None:
        self.factory = factory
        # False for check(): weight arrays (placeholders there) are not kept once shaped
        self.keep_weights = keep_weights
        self.capacity = factory.capacity  # weight tensors
        self.max_tensors = MAX_TENSORS  # compute tensors
        # Whether the device computes a node (ggml_backend_supports_op); None: every node (the
        # CPU, and check(), which knows no device). Lowerings with another way ask ``supported``.
        self.device_supports: Callable[[int], bool] | None = None
        # Every tensor's byte size is checked against the budget in Python integers before
        # ggml sees its ne: ggml's own size_t arithmetic wraps (a 2^62-element tensor gets a
        # 32-byte buffer) and its asserts abort the process.
        self.memory_budget = memory_budget()
        self.weight_bytes = 0
        self.precision = precision
        # precision="q8_0": the matrix weights stored quantized, and those kept at F16 because
        # their rows are not whole Q8_0 blocks (graph value name -> stored shape)
        self.quantized: dict[str, tuple[int, ...]] = {}
        self.kept: dict[str, tuple[int, ...]] = {}
        # Weights already on the device from another signature's graph: reused, not re-uploaded.
        self.shared_weights = shared_weights or {}
        self.count = 0
        self.weight_count = 0
        self.weights: list[WeightEntry] = []
        self.weight_cache: dict[tuple[str, str], Tensor] = {}
        # Graph values that depend on the weights only (initializers and what folds from them).
        self.weight_derived: set[str] = set()
        # Graph values refit may change (initializers and anything folded from them): never
        # specialised on their contents.
        self.weight_dependent: set[str] = set()
        # check() only: constants whose values are placeholders (weights check() never sees).
        self.unknown_values: set[str] = set()
        self.structural: dict[str, np.ndarray] = {}  # constants the graph's structure depends on
        self.input_names: dict[int, str] = {}  # graph input tensor ptr -> input name
        # Runtime index inputs to range-check before compute: input name -> size of the dim.
        self.index_bounds: dict[str, int] = {}
        # ... and every dim each one indexes: negative indices wrap only where that is one dim
        self.index_dims: dict[str, set[int]] = {}
        # Integer inputs computed in F32 (converters/integer.py): input name -> the interval
        # their values must lie in, checked before compute (F32 holds integers exactly there).
        self.input_ranges: dict[str, tuple[int, int]] = {}
        # Whether the loaded library binds an optional ggml function (runtime/lib.py); check(),
        # which loads no library, assumes it does.
        self.has_function: Callable[[str], bool] = lambda _name: True
        # Which lowering a 2-D conv shape gets (compiler/conv_strategy.py); None: im2col
        # (check(), which has no device to time on, and builds that do not choose).
        self.conv_choice: Callable[[ConvShape], str] | None = None
        # im2col results by (input, kernel window, strides/pads/dilations, type): built once
        # per graph and reused by every conv of that window reading the same tensor
        self.im2col_cache: dict[tuple[Any, ...], Tensor] = {}
        # ConvConcat nodes (pass conv_concat) lowered as split products / as Concat + Conv
        self.conv_concat = {"split": 0, "concat_conv": 0}
        # precision fp16/q8_0 with f16_activations on (compiler/lowering_modes.py): products of
        # two activations and flash attention's K, V take F16 operands
        self.f16_activations = False
        # matmul_prec="f32": every mul_mat asks for F32 compute (ggml_mul_mat_set_prec; on CUDA
        # F16 operands are then widened, not multiplied in F16 with F16 accumulation)
        self.mul_mat_prec_f32 = False

    # -- low level -------------------------------------------------------------------------
    def _check_size(self, shape: Sequence[int], ggml_type: int, what: str) -> None:
        dims = [int(d) for d in shape]
        if any(d < 0 for d in dims):
            raise Unsupported(f"negative dimension in {dims}")
        nbytes = shape_bytes(dims, type_size(ggml_type), what)
        if nbytes > self.memory_budget:
            check_bytes(nbytes, f"{what} {dims}", self.memory_budget)

    def _reserve(self, n: int = 1) -> None:
        if self.count + n > self.max_tensors:
            raise Unsupported(f"graph needs more than {self.max_tensors} ggml tensors")
        self.count += n

    def op(
        self,
        fn: str,
        *args: Any,
        shape: Sequence[int],
        dtype: np.dtype[Any] | None = None,
    ) -> Tensor:
        """Call ggml function ``fn(ctx, *args)`` expected to produce ONNX ``shape``."""
        if any(d < 0 for d in shape):
            raise Unsupported(f"negative dimension in {list(shape)}")
        if 0 in shape:
            raise Unsupported(f"empty tensor {list(shape)}: ggml cannot allocate zero-sized tensors")
        # the result's size, before ggml computes it (F32 is the widest type ops produce here)
        self._check_size(shape, L.GGML_TYPE_F32, "an intermediate tensor")
        self._reserve()
        ptr, got, ggml_type = self.factory.call(fn, *args)
        if not ptr:
            raise Unsupported(f"{fn} returned no tensor")
        want = ne_of(shape)
        if got is not None and got != want:
            # A lowering bug, not a user error: fail loudly rather than compute garbage.
            raise RuntimeError(f"{fn}: ggml produced ne={got}, expected {want} for ONNX shape {tuple(shape)}")
        if fn == "ggml_mul_mat" and self.mul_mat_prec_f32:
            self.factory.set_mul_mat_prec_f32(ptr)
        return Tensor(ptr, tuple(int(d) for d in shape), np.dtype(dtype or np.float32), ggml_type)

    def supported(self, t: Tensor) -> bool:
        """Whether the device computes ``t``'s op as built (a GPU backend lacks some ops or
        operand layouts the CPU has); an unused node costs a tensor slot, never compute."""
        return self.device_supports is None or bool(self.device_supports(t.ptr))

    def set_precision_f32(self, t: Tensor) -> None:
        """Ask for F32 accumulation in ``t``'s op (flash attention; ignored where ggml has no choice)."""
        self.factory.set_prec_f32(t.ptr)

    def new_input(self, shape: Sequence[int], dtype: np.dtype[Any]) -> Tensor:
        if 0 in shape:
            raise Unsupported(f"empty tensor {list(shape)}: ggml cannot allocate zero-sized tensors")
        ggml_type = ggml_storage(dtype)
        self._check_size(shape, ggml_type, "an input")
        self._reserve()
        ptr = self.factory.new_tensor(ggml_type, ne_of(shape), weight=False)
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
        shape: tuple[int, ...] | None = None,
    ) -> Tensor:
        """``shape``: the uploaded shape where ``array`` is transformed at upload (pending)."""
        pending = shape is not None
        shape = tuple(int(d) for d in (array.shape if shape is None else shape))
        if self.weight_count + 1 > self.capacity:
            raise Unsupported(f"graph needs more than {self.capacity} weight tensors")
        if array.size == 0 or 0 in shape:
            raise Unsupported("empty constant: ggml cannot allocate zero-sized tensors")
        self._check_size(shape, ggml_type, "a constant")
        self.weight_bytes += tensor_bytes(shape, ggml_type)
        # check() builds shapes only (keep_weights=False) and allocates nothing: the budget is
        # the compile's to enforce (a 12B-weight graph is checkable on a 24 GB machine)
        if self.keep_weights and self.weight_bytes > self.memory_budget:
            check_bytes(self.weight_bytes, "the weights together", self.memory_budget)
        self.weight_count += 1
        ptr = self.factory.new_tensor(ggml_type, ne_of(shape), weight=True)
        tensor = Tensor(ptr, shape, np.dtype(dtype), ggml_type)
        if self.keep_weights:
            self.weights.append(WeightEntry(tensor, source, array, transform, pending))
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
        quantize: bool = False,
    ) -> Tensor:
        """Upload a compile-time constant. ``source`` (a graph value name) makes it refittable;
        ``transform`` is re-applied to the new value on refit; ``half`` stores it as F16
        (precision="fp16" weights of matmul and conv); ``quantize`` as Q8_0 where its rows are
        whole blocks, else as F16 (precision="q8_0" matrix weights)."""
        raw = np.asarray(array)
        cache_key = (source or "", key + ("/q8_0" if quantize else "/f16" if half else ""))
        if source is not None:
            if cache_key in self.weight_cache:
                return self.weight_cache[cache_key]
            if cache_key in self.shared_weights:
                return self.shared_weights[cache_key]
        onnx_dtype = np.dtype(dtype or (raw.dtype if raw.dtype != np.float64 else np.float32))
        if self.keep_weights and isinstance(transform, WeightTransform):
            # transformed at upload, one weight at a time (WeightEntry.pending): building the
            # graph holds no transposed copy of the model's weights
            shape = transform.out_shape(tuple(int(d) for d in raw.shape))
            ggml_type = self._weight_type(shape, onnx_dtype, source, half=half, quantize=quantize)
            tensor = self._new_weight(raw, ggml_type, onnx_dtype, source, transform, shape)
        else:
            value = self._transformed(raw, source, transform)
            ggml_type = self._weight_type(tuple(value.shape), onnx_dtype, source, half=half, quantize=quantize)
            tensor = self._new_weight(value, ggml_type, onnx_dtype, source, transform)
        if source is not None:
            self.weight_cache[cache_key] = tensor
        return tensor

    def _weight_type(
        self, shape: tuple[int, ...], dtype: np.dtype[Any], source: str | None, *, half: bool, quantize: bool
    ) -> int:
        if quantize:
            name = source or f"<literal {len(self.kept) + len(self.quantized)}>"
            if quantizable(shape, L.GGML_TYPE_Q8_0):
                self.quantized[name] = tuple(shape)
                return L.GGML_TYPE_Q8_0
            # as stable-diffusion.cpp does: a row that is not whole blocks stays unquantized
            self.kept[name] = tuple(shape)
            return L.GGML_TYPE_F16
        return L.GGML_TYPE_F16 if half else ggml_storage(dtype)

    def _transformed(
        self, raw: np.ndarray, source: str | None, transform: Callable[[np.ndarray], np.ndarray] | None
    ) -> np.ndarray:
        if transform is None:
            return raw
        if source in self.unknown_values and isinstance(transform, WeightTransform):
            # a placeholder (check()): only the shape matters, and no memory is touched
            return np.broadcast_to(np.zeros((), dtype=np.float32), transform.out_shape(tuple(raw.shape)))
        return transform(raw)

    def tensor(
        self,
        node: Node,
        index: int,
        transform: Callable[[np.ndarray], np.ndarray] | None = None,
        key: str = "",
        half: bool = False,
        quantize: bool = False,
    ) -> Tensor:
        """Input ``index`` of ``node`` as a ggml tensor, uploading it if it is a constant."""
        value = node.value(index)
        if isinstance(value, Tensor):
            if transform is not None:
                raise Unsupported(f"input {index} must be a constant (weights known at compile time)")
            return value
        return self.constant(
            value, source=node.input_name(index), transform=transform, key=key, half=half, quantize=quantize
        )

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
        if name in self.unknown_values:
            raise ValueUnknown(name)
        self.structural.setdefault(name, np.array(value, copy=True))
        return value

    def free(self) -> None:
        self.factory.free()
