"""Resource limits checked before anything is allocated: the memory budget.

A request that would need more memory than the budget is refused with a ``ResourceLimitError``
naming what asked for it, before a byte is allocated: a model declaring a 1x4x200000x200000
input, ``--random`` shapes, image sizes and batch counts, a safetensors header claiming
terabytes. Nothing gets OOM-killed (or, worse, wraps a size computation) for asking.

The budget is, first found: ``set_memory_budget(...)``, ``SDKIT_MEMORY_BUDGET`` (``"8G"``,
``"512MiB"``, ``"75%"`` of the machine, or a byte count), ``memory_budget`` in the config
file, else what the machine has (physical memory, or the cgroup limit or ``ulimit -v`` when
lower). A model's weights count too (``check_weights``): backends copy them into their own
memory, even where they come memory-mapped from an external data file.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sdkit.config import config_path, load_config
from sdkit.errors import InputError, OptionError, ResourceLimitError

ENV = "SDKIT_MEMORY_BUDGET"
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_override: int | None = None


def machine_memory() -> int:
    """Physical memory, or the cgroup (container) limit or the address-space limit (``ulimit
    -v``) when one is lower."""
    try:
        total = int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # not POSIX: no known bound
        total = 1 << 62
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < total:
            total = int(text)
    return min(total, _address_space_limit())


def _address_space_limit() -> int:
    """``ulimit -v`` (RLIMIT_AS): no allocation or memory map may pass it, whatever is free."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, OSError, ValueError):  # not POSIX
        return 1 << 62
    return soft if 0 < soft != resource.RLIM_INFINITY else 1 << 62


def parse_size(text: str | int, what: str = ENV) -> int:
    """``"8G"``, ``"512MiB"``, ``"1.5t"``, ``"75%"`` (of the machine's memory) or bytes."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(%|[kmgt]?)(?:i?b)?\s*", str(text).lower())
        if not match:
            raise OptionError(f"{what} must be a size like 8G, 512M, 75% or a byte count, not {text!r}")
        number, unit = float(match.group(1)), match.group(2)
        value = int(machine_memory() * number / 100) if unit == "%" else int(number * _UNITS[unit])
    if value < 1:
        raise OptionError(f"{what} must be positive, not {text!r}")
    return value


def set_memory_budget(budget: int | str | None) -> None:
    """Set this process's budget (bytes or a size text); None returns to the default."""
    global _override
    _override = None if budget is None else parse_size(budget, "memory budget")


def memory_budget() -> int:
    """The budget in bytes (see the module's docstring for where it comes from)."""
    if _override is not None:
        return _override
    env = os.environ.get(ENV, "").strip()
    if env:
        return parse_size(env)
    configured = load_config().get("memory_budget")
    if configured is not None:
        return parse_size(configured, f"memory_budget in {config_path()}")
    return machine_memory()


def empty_input_message(name: str, shape: Sequence[int], declared: Sequence[Any], axis: int) -> str:
    """Why an empty input is refused: every backend alike, an empty tensor is accepted only
    where the model itself declares a zero-size dim (ONNX's empty sets, an empty axes list)."""
    return (
        f"input {name!r} has shape {_dims(shape)}, empty along axis {axis}, where the model expects "
        f"{_dims(declared)}: empty inputs are refused unless the model declares that dim as 0"
    )


def _dims(shape: Sequence[Any]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def human(nbytes: int) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= size:
            return f"{nbytes / size:.3g} {unit}"
    return f"{nbytes} bytes"


def shape_bytes(shape: Iterable[int], itemsize: int, what: str = "tensor") -> int:
    """Bytes of a dense tensor, computed without overflow; negative dims are an InputError."""
    dims = [int(d) for d in shape]
    if any(d < 0 for d in dims):
        raise InputError(f"{what}: negative dimension in {dims}")
    return math.prod(dims) * int(itemsize)


def check_bytes(nbytes: int, what: str, budget: int | None = None) -> None:
    """Refuse ``nbytes`` (what ``what`` would allocate) when it exceeds the budget."""
    budget = memory_budget() if budget is None else budget
    if nbytes > budget:
        raise ResourceLimitError(
            f"{what} needs {human(nbytes)}, over the memory budget of {human(budget)} "
            f"(set {ENV}, e.g. {ENV}=64G, to change it)"
        )


def check_weights(nbytes: int, count: int) -> None:
    """Refuse weights (``count`` tensors, ``nbytes`` in all) over the budget, before a backend
    maps or copies them: every backend holds a compiled model's weights in its own memory, and
    a memory-mapped external file costs nothing until read."""
    check_bytes(nbytes, f"loading the model's {count} weight tensors")


def check_shape(shape: Sequence[int], dtype: Any, what: str) -> None:
    """Refuse a tensor of ``shape`` and ``dtype`` with negative dims or over the budget."""
    itemsize = np.dtype(dtype).itemsize if dtype is not None else 4
    dims = [int(d) for d in shape]
    check_bytes(shape_bytes(dims, itemsize, what), f"{what} ({np.dtype(dtype or np.float32)}{dims})")


def check_generation(num_images: int, width: int, height: int, latent_shape: Sequence[int], img2img: bool) -> None:
    """Refuse a generation whose own arrays would exceed the budget, before any is made: the
    latents (noise, sample, the guided 2N batch in and out, the scheduler's state: ~8 copies),
    the decoded float32 images and their uint8 copies, and an init image. A lower bound: the
    denoiser's activations come on top, and the backends check those when they compile."""
    latent = shape_bytes(latent_shape, 4, "latents")
    pixels = int(num_images) * int(width) * int(height) * 3
    need = 8 * latent + pixels * (4 + 1) + (int(width) * int(height) * 3 * 4 if img2img else 0)
    check_bytes(need, f"{num_images} image(s) of {width}x{height}")


def _value_bytes(value: Any) -> tuple[int, list[int], Any] | None:
    """(bytes, dims, dtype) of a value info with a fully static tensor shape, else None."""
    if value.type.WhichOneof("value") != "tensor_type":
        return None
    tensor = value.type.tensor_type
    if not tensor.HasField("shape") or not all(d.HasField("dim_value") for d in tensor.shape.dim):
        return None
    dtype = _DTYPES.get(tensor.elem_type)
    if dtype is None:
        return None
    dims = [int(d.dim_value) for d in tensor.shape.dim]
    return shape_bytes(dims, dtype.itemsize, value.name), dims, dtype


def _onnx_dtypes() -> dict[int, np.dtype[Any]]:
    from onnx import TensorProto, helper

    found = {}
    for elem_type in TensorProto.DataType.values():
        try:
            found[elem_type] = np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
        except (KeyError, TypeError, ValueError):
            continue
    return found


_DTYPES: dict[int, np.dtype[Any]] = {}


def check_graph_memory(proto: Any, shape_values: dict[str, np.ndarray] | None = None) -> None:
    """Refuse a graph one of whose tensors (inputs, outputs, and every intermediate ONNX shape
    inference can size) would exceed the budget, before any backend allocates it.

    ``shape_values``: small integer initializers (shapes, axes) whose values inference may
    propagate, e.g. the target shape of an Expand; other initializers stay weightless."""
    import onnx

    if not _DTYPES:
        _DTYPES.update(_onnx_dtypes())
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    if shape_values:
        from onnx import numpy_helper

        for i, tensor in enumerate(model.graph.initializer):
            if tensor.name in shape_values:
                model.graph.initializer[i].CopyFrom(numpy_helper.from_array(shape_values[tensor.name], tensor.name))
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception:  # inference is a best effort here: backends check what it cannot
        inferred = model
    graph = inferred.graph
    budget = memory_budget()
    for value in (*graph.input, *graph.value_info, *graph.output):
        sized = _value_bytes(value)
        if sized is not None and sized[0] > budget:
            nbytes, dims, dtype = sized
            check_bytes(nbytes, f"tensor {value.name!r} ({dtype}{dims})", budget)


def shape_like(proto: Any, weights: Any, limit: int = 64) -> dict[str, np.ndarray]:
    """The values of the integer initializers small enough to be shapes or axes (for
    ``check_graph_memory``), chosen from the graph's metadata so no large weight is read."""
    from onnx import TensorProto

    integer = {TensorProto.INT64, TensorProto.INT32}
    found: dict[str, np.ndarray] = {}
    for tensor in proto.graph.initializer:
        if tensor.data_type in integer and math.prod(tensor.dims) <= limit and tensor.name in weights:
            found[tensor.name] = np.asarray(weights[tensor.name])
    return found
