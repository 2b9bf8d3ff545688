"""The model: an ONNX graph with its weights stripped (``Graph``) plus a ``WeightSet``.

Keeping weights apart from the graph is what lets a compiled engine be refit with a user's
checkpoint, a LoRA merge or a VAE swap instead of rebuilt: the graph hash, and with it the
compiled artifact, stays the same when only weights change.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol, cast, runtime_checkable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from sdkit.errors import InputError, ModelFormatError, SdkitError
from sdkit.external_data import load_external
from sdkit.files import check_safetensors_header
from sdkit.limits import check_shape, empty_input_message
from sdkit.onnx_checks import (
    check_declared_dims,
    check_external_locations,
    check_nodes,
    check_opsets,
    refuse_external,
)
from sdkit.types import Dim, TensorInfo

# Pickle-based formats: never loaded (arbitrary code execution on load).
PICKLED_SUFFIXES = (".ckpt", ".pt", ".pth", ".bin", ".pkl", ".pickle")
_STRIPPED = "sdkit:weightset"  # external-data location marking a stripped initializer
_PROTO_LIMIT = 2_000_000_000  # protobuf's 2 GiB message limit, with headroom


def pickle_refusal(name: str, what: str = "pickled checkpoints are refused") -> str:
    """Why a pickled checkpoint is refused, and the safe way to convert it (one line)."""
    stem = Path(name).stem
    return (
        f"{name}: {what} (unpickling can run code); download the model's "
        f".safetensors version, or convert this file once with PyTorch's restricted loader: "
        f"python -c \"import torch, safetensors.torch as st; d = torch.load('{name}', map_location='cpu', "
        f"weights_only=True); d = d.get('state_dict', d); st.save_file({{k: v.contiguous() for k, v in d.items() "
        f"if isinstance(v, torch.Tensor)}}, '{stem}.safetensors')\""
    )


def refuse_unsafe_or_missing(path: Path, what: str = "model file") -> None:
    """Refuse pickle-based files unread (loading them can run code) and missing paths."""
    if path.suffix.lower() in PICKLED_SUFFIXES:
        raise ModelFormatError(pickle_refusal(path.name))
    if not path.exists():
        raise ModelFormatError(f"{what} not found: {path}")


def _np_dtype(elem_type: int) -> np.dtype[Any]:
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


def _value_info(vi: onnx.ValueInfoProto) -> TensorInfo:
    kind = vi.type.WhichOneof("value")
    if kind != "tensor_type":
        names = {"sequence_type": "sequence", "optional_type": "optional", "map_type": "map"}
        return TensorInfo(vi.name, np.dtype(object), (), names.get(str(kind), str(kind)))
    tensor = vi.type.tensor_type
    dims: list[Dim] = []
    for d in tensor.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param"):
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return TensorInfo(vi.name, _np_dtype(tensor.elem_type), tuple(dims))


@runtime_checkable
class LazyArray(Protocol):
    """A weight read on demand: its shape and dtype are known without reading it, and
    ``load()`` returns a fresh array each time (e.g. a tensor of a memory-mapped checkpoint
    converted from fp16 to the graph's fp32). ``WeightSet`` holds these for large files, so
    loading a checkpoint never holds a converted copy of all of it at once."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> np.dtype[Any]: ...

    def load(self) -> np.ndarray: ...


def _is_lazy(entry: object) -> bool:
    # Not isinstance(entry, LazyArray): a runtime Protocol check costs ~0.3 ms per call.
    return not isinstance(entry, np.ndarray) and callable(getattr(entry, "load", None))


def _entry_spec(entry: np.ndarray | LazyArray) -> tuple[tuple[int, ...], np.dtype[Any]]:
    if _is_lazy(entry):
        lazy = cast("LazyArray", entry)
        return tuple(lazy.shape), np.dtype(lazy.dtype)
    array = np.asarray(entry)
    return tuple(array.shape), array.dtype


class WeightSet(Mapping[str, np.ndarray]):
    """Weights by ONNX initializer name. Immutable; ``updated`` returns a new set.

    Entries are arrays or ``LazyArray``s: a lazy entry is read (and converted) on every access
    and never kept, so ``weights[name]`` of a checkpoint-backed set costs a read each time; hold
    the array when you need it twice. ``spec(name)`` gives shape and dtype without reading.
    """

    def __init__(self, arrays: Mapping[str, np.ndarray | LazyArray] | None = None) -> None:
        self._arrays: dict[str, np.ndarray | LazyArray] = dict(arrays or {})

    def __getitem__(self, name: str) -> np.ndarray:
        entry = self._arrays[name]
        if _is_lazy(entry):
            return cast("LazyArray", entry).load()
        return cast("np.ndarray", entry)

    def __iter__(self) -> Iterator[str]:
        return iter(self._arrays)

    def __contains__(self, name: object) -> bool:
        # Mapping's default would read the entry (``self[name]``): a lazy one from its file.
        return name in self._arrays

    def __len__(self) -> int:
        return len(self._arrays)

    def __repr__(self) -> str:
        lazy = sum(1 for entry in self._arrays.values() if _is_lazy(entry))
        note = f", {lazy} read on access" if lazy else ""
        return f"WeightSet({len(self)} tensors, {self.nbytes / 1e6:.1f} MB{note})"

    def spec(self, name: str) -> tuple[tuple[int, ...], np.dtype[Any]]:
        """Shape and dtype of one weight, without reading a lazy one."""
        return _entry_spec(self._arrays[name])

    def is_lazy(self, name: str) -> bool:
        """Whether ``name`` is read on access (from a file) rather than held in memory."""
        return _is_lazy(self._arrays[name])

    def entries(self) -> dict[str, np.ndarray | LazyArray]:
        """The stored entries, lazy ones unread (to build another set from this one)."""
        return dict(self._arrays)

    @property
    def nbytes(self) -> int:
        total = 0
        for entry in self._arrays.values():
            shape, dtype = _entry_spec(entry)
            total += math.prod(int(d) for d in shape) * dtype.itemsize  # Python ints: no wrap
        return total

    def hash(self) -> str:
        """Content hash over names, dtypes, shapes and bytes (sorted by name); a lazy entry is
        read for it, one at a time, and hashes like the same values held in memory."""
        digest = hashlib.sha256()
        for name in sorted(self._arrays):
            array = np.ascontiguousarray(self[name])
            digest.update(f"{name}\0{array.dtype.str}\0{array.shape}\0".encode())
            digest.update(array.tobytes() if array.dtype.hasobject else array.reshape(-1).view(np.uint8).data)
        return digest.hexdigest()

    def subset(self, names: Iterable[str]) -> WeightSet:
        """The weights named (those present), lazy entries left unread."""
        return WeightSet({name: self._arrays[name] for name in names if name in self._arrays})

    def updated(self, changes: Mapping[str, np.ndarray | LazyArray], strict: bool = True) -> WeightSet:
        """A new set with ``changes`` applied. With ``strict``, every name must exist with
        the same shape and dtype, so a mistyped or mis-shaped weight is an error. Lazy entries
        (of this set or of ``changes``) stay unread."""
        if strict:
            for name, change in changes.items():
                if name not in self._arrays:
                    raise InputError(f"weight {name!r} is not in the model")
                (old_shape, old_dtype), (shape, dtype) = self.spec(name), _entry_spec(change)
                if shape != old_shape or dtype != old_dtype:
                    raise InputError(
                        f"weight {name!r} has shape {shape} {dtype}, the model expects {old_shape} {old_dtype}"
                    )
        merged = dict(self._arrays)
        for name, change in changes.items():
            merged[name] = change if _is_lazy(change) else np.asarray(change)
        return WeightSet(merged)

    @classmethod
    def load_safetensors(cls, path: str | os.PathLike[str]) -> WeightSet:
        """Read a ``.safetensors`` file (names are ONNX initializer names)."""
        from safetensors import SafetensorError
        from safetensors.numpy import load_file

        path = Path(path)
        refuse_unsafe_or_missing(path, "weights file")
        check_safetensors_header(path)  # shapes, duplicate names, the budget: before the reader allocates
        try:
            return cls(load_file(str(path)))
        except (SafetensorError, OSError, ValueError) as exc:
            raise ModelFormatError(f"{path.name} is not a valid safetensors file: {exc}") from None

    def save_safetensors(self, path: str | os.PathLike[str], metadata: dict[str, str] | None = None) -> None:
        from safetensors.numpy import save_file

        save_file({k: np.ascontiguousarray(self[k]) for k in self._arrays}, str(path), metadata=metadata)


@dataclass(frozen=True, eq=False)
class Graph:
    """An ONNX ModelProto whose initializers carry names, dtypes and dims but no data."""

    proto: onnx.ModelProto

    @cached_property
    def hash(self) -> str:
        return hashlib.sha256(self.proto.SerializeToString(deterministic=True)).hexdigest()

    @cached_property
    def initializer_names(self) -> frozenset[str]:
        return frozenset(t.name for t in self.proto.graph.initializer)

    @property
    def inputs(self) -> list[TensorInfo]:
        """Graph inputs that are not initializers."""
        return [_value_info(v) for v in self.proto.graph.input if v.name not in self.initializer_names]

    @property
    def outputs(self) -> list[TensorInfo]:
        return [_value_info(v) for v in self.proto.graph.output]

    def opset(self, domain: str = "") -> int:
        for entry in self.proto.opset_import:
            if entry.domain in (domain, "ai.onnx" if domain == "" else domain):
                return int(entry.version)
        return 0

    @property
    def nodes(self) -> list[onnx.NodeProto]:
        return list(self.proto.graph.node)

    def with_input_shapes(self, shapes: Mapping[str, tuple[int, ...]]) -> Graph:
        """Fix symbolic input dims from concrete shapes (same symbol, same size everywhere)."""
        by_name = {i.name: i for i in self.inputs}
        symbols: dict[str, int] = {}
        for name, shape in shapes.items():
            if name not in by_name:
                raise InputError(f"unknown input {name!r}; the model's inputs are {', '.join(by_name)}")
            info = by_name[name]
            check_shape(shape, info.dtype if info.kind == "tensor" else None, f"input {name!r}")
            if len(shape) != len(info.shape):
                raise InputError(
                    f"input {name!r}: shape {list(shape)} has rank {len(shape)}, expected {len(info.shape)}"
                )
            for axis, (want, got) in enumerate(zip(info.shape, shape, strict=True)):
                if got == 0 and want != 0:
                    raise InputError(empty_input_message(name, shape, info.shape, axis))
                if isinstance(want, int) and want != got:
                    raise InputError(f"input {name!r}: shape {list(shape)} does not fit {list(info.shape)}")
                if isinstance(want, str) and want and symbols.setdefault(want, int(got)) != int(got):
                    raise InputError(f"dimension {want!r} given as both {symbols[want]} and {got}")
        proto = onnx.ModelProto()
        proto.CopyFrom(self.proto)
        for vi in proto.graph.input:
            if vi.name in self.initializer_names:
                continue
            given = shapes.get(vi.name)
            for axis, dim in enumerate(vi.type.tensor_type.shape.dim):
                if given is not None:
                    dim.Clear()
                    dim.dim_value = int(given[axis])
                elif dim.HasField("dim_param") and dim.dim_param in symbols:
                    size = symbols[dim.dim_param]
                    dim.Clear()
                    dim.dim_value = size
        return Graph(proto)

    def to_onnx(self, weights: Mapping[str, np.ndarray]) -> onnx.ModelProto:
        """A complete ModelProto with ``weights`` filled in (for runtimes that parse ONNX)."""
        missing = [n for n in self.initializer_names if n not in weights]
        if missing:
            raise InputError(f"weights are missing {len(missing)} initializer(s), e.g. {missing[0]!r}")
        proto = onnx.ModelProto()
        proto.CopyFrom(self.proto)
        del proto.graph.initializer[:]
        proto.graph.initializer.extend(
            numpy_helper.from_array(np.asarray(weights[t.name]), t.name) for t in self.proto.graph.initializer
        )
        return proto

    def save(self, path: str | os.PathLike[str], weights: Mapping[str, np.ndarray]) -> Path:
        """Write an ``.onnx`` file; weights go to ``<name>.data`` beside it when large."""
        path = Path(path)
        proto = self.to_onnx(weights)
        large = sum(np.asarray(w).nbytes for w in weights.values()) > _PROTO_LIMIT // 2
        onnx.save_model(
            proto,
            str(path),
            save_as_external_data=large,
            all_tensors_to_one_file=True,
            location=path.name + ".data",
            size_threshold=1024,
        )
        return path

    def infer_shapes(self, weights: Mapping[str, np.ndarray] | None = None) -> Graph:
        """Run ONNX shape inference (with constant data propagation where weights are given)."""
        source = self.to_onnx(weights) if weights is not None else self.proto
        try:
            inferred = onnx.shape_inference.infer_shapes(source, strict_mode=False, data_prop=True)
        except Exception as exc:  # onnx raises several internal types
            raise ModelFormatError(f"shape inference failed: {exc}") from None
        return strip_weights(inferred)[0]


def _copy_without_initializers(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` without its graph's initializers. Copying the whole model and deleting them
    would keep their bytes in the copy's protobuf arena for as long as the Graph lives (as much
    memory again as the weights: measured 190 MB on the SD 1.5 VAE decoder)."""
    stripped = onnx.ModelProto()
    for field, value in proto.ListFields():
        if field.name != "graph":
            _copy_field(stripped, field, value)
    for field, value in proto.graph.ListFields():
        if field.name != "initializer":
            _copy_field(stripped.graph, field, value)
    return stripped


def _checkable_without_weights(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` for ``onnx.checker``, its weights left out: the graph without its initializers,
    each one a graph input of its dtype and shape instead. ``check_model(proto)`` serializes the
    whole model and parses it again in C++, and sizing it first (upb's ``ByteSize()``) serializes
    it too: each one copy of the weights on top of the loaded model, which set the peak of
    ``memory="offload"`` (a 337 MB T5 encoder: 686 MB to load, 1,012 MB to check). The tensors'
    data is checked where ``strip_weights`` reads them (a size that does not match the dims is a
    ``ModelFormatError`` there). Small too, so no 2 GiB limit applies to it."""
    checked = _copy_without_initializers(proto)
    inputs = {value.name for value in checked.graph.input}
    for tensor in proto.graph.initializer:
        if tensor.name not in inputs:  # IR < 4 lists initializers among the inputs already
            checked.graph.input.append(
                onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims))
            )
    return checked


def _copy_field(target: Any, field: Any, value: Any) -> None:
    if isinstance(value, str | bytes | int | float):
        setattr(target, field.name, value)
    elif hasattr(value, "CopyFrom"):  # a message
        getattr(target, field.name).CopyFrom(value)
    else:  # a repeated field
        getattr(target, field.name).extend(value)


def strip_weights(
    proto: onnx.ModelProto, name: str = "the model", external: Mapping[str, LazyArray] | None = None
) -> tuple[Graph, WeightSet]:
    """Split a loaded ModelProto into a weightless Graph and a WeightSet. Every model passes
    here: its opsets and tensors are checked (``sdkit.onnx_checks``) for every backend alike.
    ``external``: initializers left as external references, read on access (``load_onnx``)."""
    external = external or {}
    check_opsets(proto, name)
    check_declared_dims(proto, name)
    check_nodes(proto, name)
    refuse_external(proto, name, initializers=not external)
    arrays: dict[str, np.ndarray | LazyArray] = {}
    stripped = _copy_without_initializers(proto)
    for tensor in proto.graph.initializer:
        try:
            arrays[tensor.name] = external[tensor.name] if tensor.name in external else numpy_helper.to_array(tensor)
        except Exception as exc:
            raise ModelFormatError(f"initializer {tensor.name!r} cannot be read: {exc}") from None
        meta = TensorProto(name=tensor.name, data_type=tensor.data_type, dims=list(tensor.dims))
        meta.data_location = TensorProto.EXTERNAL
        entry = meta.external_data.add()
        entry.key, entry.value = "location", _STRIPPED
        stripped.graph.initializer.append(meta)
    return Graph(stripped), WeightSet(arrays)


def fixed_shapes(graph: Graph) -> dict[str, tuple[int, ...]] | None:
    """Every input's shape when all are fixed, else None."""
    shapes = {}
    for info in graph.inputs:
        if info.kind != "tensor" or not all(isinstance(d, int) and d >= 0 for d in info.shape):
            return None
        shapes[info.name] = tuple(int(d) for d in info.shape if isinstance(d, int))
    return shapes


def shaped(graph: Graph, input_shapes: Mapping[str, Sequence[int]] | None) -> Graph:
    """``graph`` with the given input dims fixed (unchanged without any)."""
    if not input_shapes:
        return graph
    return graph.with_input_shapes({k: tuple(int(d) for d in v) for k, v in input_shapes.items()})


@dataclass(frozen=True, eq=False)
class Model:
    """A Graph and the WeightSet it runs with."""

    graph: Graph
    weights: WeightSet
    path: Path | None = None

    @property
    def inputs(self) -> list[TensorInfo]:
        return self.graph.inputs

    @property
    def outputs(self) -> list[TensorInfo]:
        return self.graph.outputs

    def with_weights(self, weights: Mapping[str, np.ndarray], strict: bool = True) -> Model:
        """The same graph with some or all weights replaced (checked by name and shape)."""
        return Model(self.graph, self.weights.updated(weights, strict=strict), self.path)

    @classmethod
    def from_proto(
        cls, proto: onnx.ModelProto, path: Path | None = None, external: Mapping[str, LazyArray] | None = None
    ) -> Model:
        graph, weights = strip_weights(proto, path.name if path is not None else "the model", external)
        return cls(graph, weights, path)


def load_onnx(path: str | os.PathLike[str], weights: str | os.PathLike[str] | None = None) -> Model:
    """Load an ``.onnx`` file (external data included); optionally override weights from a
    ``.safetensors`` file keyed by initializer name."""
    path = Path(path)
    refuse_unsafe_or_missing(path)
    if path.is_dir():
        raise ModelFormatError(f"{path} is a directory, not an .onnx file")
    try:
        proto = onnx.load_model(str(path), load_external_data=False)
        # locations checked before any external file is opened (special ones, outside the folder)
        check_external_locations(proto, path.parent, path.name)
        # external initializers are memory-mapped, read on access (sdkit.external_data)
        external = load_external(proto, path.parent)
    except SdkitError:  # a refused location, an external tensor over the memory budget
        raise
    except Exception as exc:  # protobuf DecodeError, missing external data, OSError...
        raise ModelFormatError(
            f"{path.name} is not a readable ONNX model: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from None
    if not proto.graph.node and not proto.graph.output:
        raise ModelFormatError(f"{path.name} is not an ONNX model (empty graph)")
    try:
        if not external:  # the graph alone: see _checkable_without_weights
            onnx.checker.check_model(_checkable_without_weights(proto))
        else:  # by path: the checker finds the external files beside it (past protobuf's limit too)
            onnx.checker.check_model(str(path))
    except Exception as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise ModelFormatError(f"{path.name} is not a valid ONNX model: {first}") from None
    model = Model.from_proto(proto, path, external)
    if weights is not None:
        model = model.with_weights(WeightSet.load_safetensors(weights))
    return model
