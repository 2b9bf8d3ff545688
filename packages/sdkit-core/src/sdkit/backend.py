"""The backend contract: ``Backend`` (one per plugin) and ``CompiledModel``.

A backend is registered as a class through ``sdkit_register_backends``; core instantiates it
with no arguments, so ``__init__`` must be cheap and import no vendor SDK. ``probe`` imports
lazily and says why the backend cannot run here; ``check`` reports every node it cannot run;
``compile`` turns a Graph + WeightSet into a ``CompiledModel`` for one device.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from sdkit.device import CPU, Device
from sdkit.errors import InputError, UnsupportedNode
from sdkit.limits import empty_input_message
from sdkit.types import Dim, TensorInfo

if TYPE_CHECKING:
    from sdkit.model import Graph, WeightSet
    from sdkit.options import Options

__all__ = [
    "Availability",
    "Backend",
    "CompiledModel",
    "Dim",
    "SupportReport",
    "TensorInfo",
    "check_feeds",
]


@dataclass(frozen=True)
class Availability:
    """The answer of ``Backend.probe()``: usable here or not, and what to do about it."""

    ok: bool
    reason: str = ""
    install_hint: str = ""
    version: str = ""


@dataclass
class SupportReport:
    """What ``Backend.check(graph)`` found: every node the backend cannot run, at once."""

    backend: str
    unsupported: list[UnsupportedNode] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.unsupported

    def summary(self) -> str:
        if self.ok:
            return "supported"
        ops = sorted({f"{u.op_type}" for u in self.unsupported})
        return f"{len(self.unsupported)} unsupported node(s): {', '.join(ops)}"


class CompiledModel(abc.ABC):
    """A model ready to run on one device. ``run`` validates feeds, then ``execute``s."""

    inputs: Sequence[TensorInfo]
    outputs: Sequence[TensorInfo]
    device: Device = CPU
    backend_name: str = ""  # set by sdkit.compile

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the model on ``{input name: array}``; returns ``{output name: array}``."""
        checked = check_feeds(self.inputs, feeds)
        return self.execute(checked)

    @abc.abstractmethod
    def execute(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run on feeds already checked against ``inputs`` (names, dtypes, ranks, dims)."""

    def refit(self, weights: WeightSet) -> None:
        """Swap every weight without recompiling. Backends that cannot, raise."""
        raise NotImplementedError(f"{type(self).__name__} cannot refit weights")

    def close(self) -> None:
        """Release device memory early (the object is unusable afterwards)."""

    def __enter__(self) -> CompiledModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Backend(abc.ABC):
    """One compiler/runtime. Subclasses set ``name`` and ``priority`` and implement the rest."""

    name: ClassVar[str]
    priority: ClassVar[int] = 50  # tie-break only; the reference backend is 0
    refittable: ClassVar[bool] = True  # False: the cache key includes the weights hash
    extra_options: ClassVar[Mapping[str, type | tuple[type, ...]]] = {}
    description: ClassVar[str] = ""
    # The ``precision`` options it compiles (of ``sdkit.options.PRECISIONS``): ``backend="auto"``
    # passes over a backend that does not offer the one asked for. None: not declared, taken as
    # every precision (its compile refuses those it cannot run).
    precisions: ClassVar[tuple[str, ...] | None] = None

    @abc.abstractmethod
    def probe(self) -> Availability:
        """Cheap: is the runtime importable and usable here? Import the vendor SDK lazily."""

    @abc.abstractmethod
    def devices(self) -> list[Device]:
        """Devices this backend can compile for (empty when unavailable)."""

    @abc.abstractmethod
    def check(self, graph: Graph) -> SupportReport:
        """Every node of ``graph`` that this backend cannot run, with the reason."""

    @abc.abstractmethod
    def compile(self, graph: Graph, weights: WeightSet, device: Device, options: Options) -> CompiledModel:
        """Build a runnable model for ``device``. Raise SdkitError subclasses on bad input."""


def _dims_text(shape: Sequence[Any]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def check_feeds(inputs: Sequence[TensorInfo], feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Validate feeds: every input present, no unknown names, dtype, rank and fixed dims,
    symbolic dims consistent across inputs. Returns contiguous numpy arrays."""
    expected = {i.name: i for i in inputs}
    unknown = [n for n in feeds if n not in expected]
    if unknown:
        raise InputError(f"unknown input {unknown[0]!r}; the model's inputs are {', '.join(expected) or 'none'}")
    missing = [n for n in expected if n not in feeds]
    if missing:
        raise InputError(f"missing input {missing[0]!r} ({expected[missing[0]].describe()})")
    symbols: dict[str, tuple[int, str]] = {}
    out: dict[str, np.ndarray] = {}
    for name, info in expected.items():
        value = feeds[name]
        if info.kind != "tensor":
            out[name] = value
            continue
        array = np.asarray(value)
        if array.dtype != info.dtype:
            raise InputError(f"input {name!r} has dtype {array.dtype}, the model expects {info.dtype}")
        if array.ndim != len(info.shape):
            raise InputError(
                f"input {name!r} has shape {_dims_text(array.shape)} (rank {array.ndim}), "
                f"the model expects rank {len(info.shape)} {_dims_text(info.shape)}"
            )
        for axis, (got, want) in enumerate(zip(array.shape, info.shape, strict=True)):
            if got == 0 and want != 0:
                raise InputError(empty_input_message(name, array.shape, info.shape, axis))
            if isinstance(want, int) and want >= 0 and got != want:
                raise InputError(
                    f"input {name!r} has shape {_dims_text(array.shape)}, "
                    f"the model expects {_dims_text(info.shape)} (axis {axis})"
                )
            if isinstance(want, str) and want:
                seen = symbols.setdefault(want, (got, name))
                if seen[0] != got:
                    raise InputError(
                        f"dimension {want!r} is {seen[0]} in input {seen[1]!r} but {got} in input {name!r}"
                    )
        out[name] = array if array.flags.c_contiguous else np.array(array, order="C")
    return out
