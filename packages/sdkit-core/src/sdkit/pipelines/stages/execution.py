"""Running a compiled component the way its graph wants: input dtypes, fixed batch sizes,
output names (optimum's exports name them; other exports may not); and ``check_finite``, the
loop's and the VAE's check that no NaN or infinity slipped in."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from sdkit.backend import CompiledModel
from sdkit.errors import InputError, ModelFormatError, NonFiniteError
from sdkit.types import TensorInfo


def input_info(compiled: CompiledModel, name: str) -> TensorInfo | None:
    """The compiled model's input called ``name``, if it has one."""
    return next((i for i in compiled.inputs if i.name == name), None)


def output_named(outputs: Mapping[str, np.ndarray], preferred: tuple[str, ...], component: str) -> np.ndarray:
    """The first of ``preferred`` present in ``outputs``, else the only/first output."""
    for name in preferred:
        if name in outputs:
            return outputs[name]
    if not outputs:
        raise InputError(f"the {component} model returned no outputs")
    return next(iter(outputs.values()))


def fixed_batch(compiled: CompiledModel, name: str) -> int | None:
    """The fixed batch size of input ``name`` (None when the batch axis is dynamic)."""
    info = input_info(compiled, name)
    if info is None or not info.shape:
        return None
    first = info.shape[0]
    return first if isinstance(first, int) and first > 0 else None


def run_batched(
    compiled: CompiledModel,
    feeds: Mapping[str, np.ndarray],
    batched: tuple[str, ...],
    output: tuple[str, ...],
    component: str,
) -> np.ndarray:
    """Run ``compiled`` once, or in chunks when its graph fixes a smaller batch size. ``batched``
    names the feeds split along their first axis (the first one sets the batch)."""
    batch = feeds[batched[0]].shape[0]
    chunk = fixed_batch(compiled, batched[0]) or batch
    if batch % chunk:
        raise InputError(f"the {component} model takes batches of {chunk}; {batch} cannot be split into them")
    parts = []
    for start in range(0, batch, chunk):
        part = {k: (v[start : start + chunk] if k in batched else v) for k, v in feeds.items()}
        parts.append(np.asarray(output_named(compiled.run(part), output, component)))
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)


def run_main_input(
    compiled: CompiledModel, name: str, array: np.ndarray, output: tuple[str, ...], component: str
) -> np.ndarray:
    """Run a one-input model: the input called ``name`` (else the first), in its dtype."""
    info = input_info(compiled, name) or compiled.inputs[0]
    return run_batched(compiled, {info.name: array.astype(info.dtype)}, (info.name,), output, component)


def run_outputs(
    compiled: CompiledModel, name: str, array: np.ndarray, outputs: tuple[str, ...], component: str
) -> dict[str, np.ndarray]:
    """Run a one-input model (input ``name``, in its dtype) and return exactly ``outputs``, by
    name: a missing one is a ModelFormatError listing what the graph has (no fallback, unlike
    ``output_named``: SDXL reads two outputs of one text encoder and must not mix them up)."""
    info = input_info(compiled, name) or compiled.inputs[0]
    feeds = {info.name: array.astype(info.dtype)}
    chunk = fixed_batch(compiled, info.name) or array.shape[0]
    if array.shape[0] % chunk:
        raise InputError(f"the {component} model takes batches of {chunk}; {array.shape[0]} cannot be split into them")
    parts: list[dict[str, np.ndarray]] = []
    for start in range(0, array.shape[0], chunk):
        result = compiled.run({k: v[start : start + chunk] for k, v in feeds.items()})
        missing = [o for o in outputs if o not in result]
        if missing:
            raise ModelFormatError(
                f"the {component} model has no output {missing[0]!r} (it has: {', '.join(result) or 'none'})"
            )
        parts.append({o: np.asarray(result[o]) for o in outputs})
    return {o: np.concatenate([p[o] for p in parts], axis=0) for o in outputs}


def check_finite(values: np.ndarray, where: str, hint: str = "") -> None:
    """A ``NonFiniteError`` naming ``where`` when ``values`` (floating point) hold a NaN or an
    infinity: a pass over latents-sized arrays, once per stage or step, never per op. Without
    it a NaN weight gives a black image and success."""
    array = np.asarray(values)
    if array.dtype.kind not in "fc" or bool(np.isfinite(array).all()):
        return
    nan, inf = bool(np.isnan(array).any()), bool(np.isinf(array).any())
    kind = "NaN and infinity" if nan and inf else "NaN" if nan else "infinity"
    count = int(array.size - np.count_nonzero(np.isfinite(array)))
    raise NonFiniteError(
        f"{kind} first appeared in {where} ({count} of {array.size} values)" + (f"; {hint}" if hint else "")
    )
