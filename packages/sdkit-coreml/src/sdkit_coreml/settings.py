"""sdkit Options -> what a Core ML conversion and load need, validated.

Keys of ``Options.extra`` (``sdkit.compile(..., key=value)``):

- ``compute_units``: ``ALL``, ``CPU_AND_NE``, ``CPU_AND_GPU`` or ``CPU_ONLY``; default from the
  device (``ane`` -> CPU_AND_NE, ``gpu`` -> CPU_AND_GPU, ``cpu`` -> CPU_ONLY). A load-time
  choice: one package serves them all.
- ``target``: minimum deployment target, ``macOS13`` (default), ``macOS14``, ``macOS15``.
- ``enumerated_shapes``: ``{input: [shape, ...]}``, one package for exactly those shapes.
- ``shape_ranges``: ``{input: (min_shape, max_shape)}``, one package for every shape between.

Without either shape option, sdkit converts one package per call signature (static shapes:
every shape computation folds, and the Neural Engine takes static shapes best).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sdkit.backend import TensorInfo
from sdkit.device import Device
from sdkit.errors import OptionError
from sdkit.options import Options
from sdkit_coreml.runtime import DEFAULT_TARGET, Target, target_named

COMPUTE_UNITS = ("ALL", "CPU_AND_NE", "CPU_AND_GPU", "CPU_ONLY")
DEVICE_UNITS = {"ane": "CPU_AND_NE", "gpu": "CPU_AND_GPU", "cpu": "CPU_ONLY"}
PRECISIONS = ("fp32", "fp16")
Shape = tuple[int, ...]


@dataclass(frozen=True)
class Flexible:
    """One input's flexible shape: an enumeration, or a (min, max) range per dim."""

    enumerated: tuple[Shape, ...] = ()
    low: Shape = ()
    high: Shape = ()

    def key(self) -> dict[str, Any]:
        if self.enumerated:
            return {"enumerated": [list(s) for s in self.enumerated]}
        return {"min": list(self.low), "max": list(self.high)}

    def accepts(self, shape: Sequence[int]) -> bool:
        if self.enumerated:
            return tuple(shape) in self.enumerated
        return len(shape) == len(self.low) and all(
            lo <= d <= hi for lo, d, hi in zip(self.low, shape, self.high, strict=True)
        )


@dataclass(frozen=True)
class Settings:
    precision: str
    target: Target
    compute_units: str
    flexible: Mapping[str, Flexible] = field(default_factory=dict)

    def key(self) -> dict[str, Any]:
        """What decides the package's contents (compute units do not: chosen at load)."""
        return {
            "precision": self.precision,
            "target": self.target.name,
            "flexible": {k: v.key() for k, v in sorted(self.flexible.items())},
        }


def _shape(value: Any, what: str) -> Shape:
    if not isinstance(value, (tuple, list)) or not all(isinstance(d, int) and not isinstance(d, bool) for d in value):
        raise OptionError(f"{what} must be a tuple of integers, not {value!r}")
    if any(d < 1 for d in value):
        raise OptionError(f"{what} has a dimension below 1: {list(value)}")
    return tuple(value)


def _fits(info: TensorInfo, shape: Shape, what: str) -> None:
    if len(shape) != len(info.shape):
        raise OptionError(f"{what}: {list(shape)} does not have the rank of {info.describe()}")
    for axis, (want, got) in enumerate(zip(info.shape, shape, strict=True)):
        if isinstance(want, int) and want >= 0 and want != got:
            raise OptionError(f"{what}: axis {axis} is fixed to {want} by the model, not {got}")


def parse_flexible(extra: Mapping[str, Any], inputs: Sequence[TensorInfo]) -> dict[str, Flexible]:
    by_name = {i.name: i for i in inputs}
    enumerated, ranges = extra.get("enumerated_shapes", {}), extra.get("shape_ranges", {})
    found: dict[str, Flexible] = {}
    for option, table in (("enumerated_shapes", enumerated), ("shape_ranges", ranges)):
        for name, value in table.items():
            if name not in by_name:
                raise OptionError(f"{option}: {name!r} is not an input; the inputs are {', '.join(by_name)}")
            if name in found:
                raise OptionError(f"input {name!r} is in both enumerated_shapes and shape_ranges")
            what = f"{option}[{name!r}]"
            if option == "enumerated_shapes":
                if not isinstance(value, (list, tuple)) or not value:
                    raise OptionError(f"{what} must be a non-empty list of shapes")
                shapes = tuple(_shape(s, what) for s in value)
                for s in shapes:
                    _fits(by_name[name], s, what)
                found[name] = Flexible(enumerated=shapes)
            else:
                if not isinstance(value, (list, tuple)) or len(value) != 2:
                    raise OptionError(f"{what} must be (min_shape, max_shape)")
                low, high = _shape(value[0], f"{what}[0]"), _shape(value[1], f"{what}[1]")
                _fits(by_name[name], low, what)
                _fits(by_name[name], high, what)
                if any(lo > hi for lo, hi in zip(low, high, strict=True)):
                    raise OptionError(f"{what}: min {list(low)} exceeds max {list(high)}")
                found[name] = Flexible(low=low, high=high)
    if found:
        loose = [i.describe() for i in inputs if i.name not in found and any(not isinstance(d, int) for d in i.shape)]
        if loose:
            raise OptionError(f"inputs with symbolic dims need a flexible shape too: {', '.join(loose)}")
    return found


def settings_for(options: Options, device: Device, inputs: Sequence[TensorInfo]) -> Settings:
    if options.precision not in PRECISIONS:
        raise OptionError(f"Core ML computes in fp32 or fp16, not {options.precision}")
    units = options.extra.get("compute_units", DEVICE_UNITS.get(device.kind, "ALL"))
    if units not in COMPUTE_UNITS:
        raise OptionError(f"compute_units must be one of {', '.join(COMPUTE_UNITS)}, not {units!r}")
    target = target_named(options.extra.get("target", DEFAULT_TARGET))
    return Settings(options.precision, target, units, parse_flexible(options.extra, inputs))
