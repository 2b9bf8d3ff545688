"""Input shapes an engine is built for: one fixed call signature, or optimization profiles.

TensorRT engines are specialised to shapes. Without profiles, sdkit builds (and caches) one
engine per call signature, the first time ``run`` sees it. With the ``profiles`` option,
``{"latent": ((1, 4, 32, 32), (1, 4, 64, 64), (1, 4, 128, 128))}`` (min, opt, max per input),
one engine serves every shape inside the range; a call outside it is an InputError.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sdkit.backend import TensorInfo
from sdkit.errors import InputError, OptionError

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Profile:
    """min/opt/max shapes of one input."""

    min: Shape
    opt: Shape
    max: Shape

    def contains(self, shape: Sequence[int]) -> bool:
        return len(shape) == len(self.min) and all(
            lo <= d <= hi for lo, d, hi in zip(self.min, shape, self.max, strict=True)
        )

    def key(self) -> list[list[int]]:
        return [list(self.min), list(self.opt), list(self.max)]


Profiles = dict[str, Profile]


def _shape(value: Any, what: str) -> Shape:
    if not isinstance(value, (tuple, list)) or not all(isinstance(d, int) and not isinstance(d, bool) for d in value):
        raise OptionError(f"{what} must be a tuple of integers, not {value!r}")
    if any(d < 1 for d in value):
        raise OptionError(f"{what} has a dimension below 1: {list(value)}")
    return tuple(int(d) for d in value)


def parse_profiles(raw: Mapping[str, Any], inputs: Sequence[TensorInfo]) -> Profiles:
    """Validate the ``profiles`` option against the graph's inputs.

    Each named input gets (min, opt, max) shapes of its rank with min <= opt <= max; a fixed
    dim of the graph must be fixed in the profile too; a symbolic dim shared by several
    inputs must get the same range everywhere; every input with a dynamic dim needs a profile
    (TensorRT cannot build a range for one input and a fixed size for its partner)."""
    by_name = {i.name: i for i in inputs}
    profiles: Profiles = {}
    for name, triple in raw.items():
        if name not in by_name:
            raise OptionError(
                f"profiles: {name!r} is not an input of the model; its inputs are {', '.join(by_name) or 'none'}"
            )
        if not isinstance(triple, (tuple, list)) or len(triple) != 3:
            raise OptionError(f"profiles[{name!r}] must be (min_shape, opt_shape, max_shape)")
        lo, opt, hi = (_shape(s, f"profiles[{name!r}][{i}]") for i, s in enumerate(triple))
        info = by_name[name]
        if not len(lo) == len(opt) == len(hi) == len(info.shape):
            raise OptionError(
                f"profiles[{name!r}]: every shape must have the input's rank {len(info.shape)} ({info.describe()})"
            )
        for axis, (a, b, c) in enumerate(zip(lo, opt, hi, strict=True)):
            if not a <= b <= c:
                raise OptionError(f"profiles[{name!r}]: axis {axis} needs min <= opt <= max, got {a}, {b}, {c}")
            want = info.shape[axis]
            if isinstance(want, int) and want >= 0 and not a == b == c == want:
                raise OptionError(
                    f"profiles[{name!r}]: axis {axis} is fixed to {want} by the model, the profile gives {a}..{c}"
                )
        profiles[name] = Profile(lo, opt, hi)
    _check_symbols(profiles, inputs)
    return profiles


def _check_symbols(profiles: Profiles, inputs: Sequence[TensorInfo]) -> None:
    ranges: dict[str, tuple[tuple[int, int, int], str]] = {}
    for info in inputs:
        dynamic = any(not (isinstance(d, int) and d >= 0) for d in info.shape)
        profile = profiles.get(info.name)
        if profile is None:
            if dynamic and profiles:
                raise OptionError(
                    f"profiles: input {info.name!r} has dynamic dims ({info.describe()}) and needs a profile too"
                )
            continue
        for axis, dim in enumerate(info.shape):
            if isinstance(dim, str) and dim:
                span = (profile.min[axis], profile.opt[axis], profile.max[axis])
                seen = ranges.setdefault(dim, (span, info.name))
                if seen[0] != span:
                    raise OptionError(
                        f"profiles: dimension {dim!r} is {seen[0]} in input {seen[1]!r} "
                        f"but {span} in input {info.name!r}"
                    )


def signature(feeds: Mapping[str, Any]) -> tuple[tuple[str, Shape], ...]:
    """A call signature: input names with their shapes, in a stable order."""
    return tuple(sorted((name, tuple(int(d) for d in getattr(array, "shape", ()))) for name, array in feeds.items()))


def is_static(inputs: Sequence[TensorInfo]) -> bool:
    return all(isinstance(d, int) and d >= 0 for i in inputs for d in i.shape)


def check_in_profiles(profiles: Profiles, feeds: Mapping[str, Any]) -> None:
    for name, profile in profiles.items():
        shape = tuple(feeds[name].shape)
        if not profile.contains(shape):
            raise InputError(
                f"input {name!r} has shape {list(shape)}, outside the compiled profile "
                f"{list(profile.min)}..{list(profile.max)}; compile with a wider 'profiles' range"
            )
