"""Weights for weight-stripped, refittable engines: validation, and what refit cannot change.

Engines are built with STRIP_PLAN + REFIT and refit from the complete WeightSet every time,
by ONNX initializer name, so a LoRA merge never accumulates on top of an earlier one and no
weight is silently stale: a missing, extra, mis-shaped or mistyped weight is an InputError.

TensorRT folds some initializers into the engine instead of exposing them to the refitter
(shape constants, Resize scales, values it constant-folds). Their content is recorded as
``baked`` digests beside the plan: a cached plan built with different values is rebuilt,
and a refit that would change one is refused with the reason.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

import numpy as np
from onnx import helper

from sdkit.errors import InputError
from sdkit.model import Graph, WeightSet

_SHOWN = 5


def expected_weights(graph: Graph) -> dict[str, tuple[tuple[int, ...], np.dtype[np.generic]]]:
    """Initializer name -> (shape, dtype) from the stripped graph's metadata."""
    return {
        t.name: (tuple(int(d) for d in t.dims), np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)))
        for t in graph.proto.graph.initializer
    }


def _listed(names: Iterable[str]) -> str:
    names = sorted(names)
    shown = ", ".join(repr(n) for n in names[:_SHOWN])
    return shown + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


def validate_weights(graph: Graph, weights: Mapping[str, np.ndarray]) -> WeightSet:
    """The full weight set for ``graph``, or an InputError naming every kind of mismatch."""
    expected = expected_weights(graph)
    missing = [n for n in expected if n not in weights]
    extra = [n for n in weights if n not in expected]
    problems = []
    if missing:
        problems.append(f"{len(missing)} weight(s) missing: {_listed(missing)} (refit takes the complete set)")
    if extra:
        problems.append(f"{len(extra)} weight(s) not in the model: {_listed(extra)}")
    for name, (shape, dtype) in expected.items():
        if name not in weights:
            continue
        array = np.asarray(weights[name])
        if tuple(array.shape) != shape or array.dtype != dtype:
            problems.append(
                f"weight {name!r} is {array.dtype}{list(array.shape)}, the model expects {dtype}{list(shape)}"
            )
    if problems:
        raise InputError(
            "; ".join(problems[:8]) + ("" if len(problems) <= 8 else f"; and {len(problems) - 8} more problems")
        )
    return WeightSet({name: np.asarray(weights[name]) for name in expected})


def digest(array: np.ndarray) -> str:
    array = np.ascontiguousarray(array)
    h = hashlib.sha256(f"{array.dtype.str}{array.shape}".encode())
    h.update(array.tobytes())
    return h.hexdigest()


def baked_digests(weights: Mapping[str, np.ndarray], refittable: Iterable[str]) -> dict[str, str]:
    """Digests of the weights that the engine did not expose as refittable."""
    exposed = set(refittable)
    return {name: digest(np.asarray(array)) for name, array in weights.items() if name not in exposed}


def changed_baked(baked: Mapping[str, str], weights: Mapping[str, np.ndarray]) -> list[str]:
    """Baked weights whose content differs in ``weights`` (they need a rebuild, not a refit)."""
    return sorted(name for name, want in baked.items() if name in weights and digest(np.asarray(weights[name])) != want)


def refuse_baked_change(names: list[str]) -> None:
    if names:
        raise InputError(
            f"refit cannot change {_listed(names)}: TensorRT folded them into the engine at build time "
            "(shape constants, Resize scales, fp8 weight scales); compile the model again with these weights"
        )
