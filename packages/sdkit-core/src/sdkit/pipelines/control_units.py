"""ControlNet units as a request holds them: which loaded ControlNet, its conditioning image, its
weight and when in the schedule it acts (A1111's ControlNet extension calls one such a *unit*).

    ControlUnit(image="pose.png", model="control_openpose", scale=1.0, start=0.0, end=1.0)
    ("edges.png", "control_canny", 0.8)                     # the same as a tuple, in that order:
    (image, model, scale, start, end, preprocessor)         # (everything after model optional)
    {"input_image": ..., "model": ..., "weight": 0.8, "guidance_start": 0.1, "module": "canny"}

The dict form also takes the keys of A1111's ControlNet API (``input_image``, ``module``,
``weight``, ``guidance_start``, ``guidance_end``). ``model`` names a ControlNet loaded with
``load_pipeline(..., controlnets=...)`` or ``pipe.set_controlnets(...)`` (None: the only one
loaded). ``scale`` multiplies its residuals (diffusers' ``controlnet_conditioning_scale``);
``start`` and ``end`` are fractions of the steps (diffusers' ``control_guidance_start/end``: the
ControlNet acts at step ``i`` of ``n`` unless ``i / n < start`` or ``(i + 1) / n > end``).
``preprocessor``: a model-free preprocessor of ``sdkit.pipelines.imaging.controlnet_preprocessors`` run on the image
when the unit is made (bad parameters fail before any model loads), with
``preprocessor_params`` (e.g. ``{"low_threshold": 50}`` for canny). ``hint`` is the image the
ControlNet sees (uint8 RGB, before the pipeline resizes it to the generation size).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sdkit.errors import InputError
from sdkit.pipelines.imaging.controlnet_preprocessors import PREPROCESSORS, preprocess
from sdkit.pipelines.imaging.images import open_init_image

FIELDS = ("image", "model", "scale", "start", "end", "preprocessor", "preprocessor_params")
A1111_KEYS = {
    "input_image": "image",
    "module": "preprocessor",
    "weight": "scale",
    "guidance_start": "start",
    "guidance_end": "end",
}


@dataclass(frozen=True, eq=False)
class ControlUnit:
    """One ControlNet with its conditioning image, checked when made (see the module docstring)."""

    image: Any  # a PIL image, a uint8 HxWx3 array or a path; held as an RGB PIL image
    model: str | None = None
    scale: float = 1.0
    start: float = 0.0
    end: float = 1.0
    preprocessor: str | None = None
    preprocessor_params: Mapping[str, Any] = field(default_factory=dict)
    hint: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        image = open_init_image(self.image, "ControlNet image")
        model = self.model
        if model is not None and (not isinstance(model, str) or not model):
            raise InputError(f"a ControlNet unit's model must be a ControlNet's name, got {model!r}")
        scale = _number(self.scale, "scale")
        start, end = _number(self.start, "start"), _number(self.end, "end")
        if scale < 0:
            raise InputError(f"a ControlNet unit's scale must be >= 0, got {scale:g}")
        if not 0.0 <= start < end <= 1.0:
            raise InputError(f"a ControlNet unit needs 0 <= start < end <= 1, got start {start:g}, end {end:g}")
        preprocessor = None if self.preprocessor in (None, "", "none") else self.preprocessor
        if preprocessor is not None and preprocessor not in PREPROCESSORS:
            raise InputError(
                f"unknown ControlNet preprocessor {preprocessor!r}; use one of none, {', '.join(PREPROCESSORS)}"
            )
        params = dict(self.preprocessor_params or {})
        if params and preprocessor is None:
            raise InputError("preprocessor_params given without a preprocessor")
        rgb = np.asarray(image, dtype=np.uint8)
        hint = preprocess(preprocessor, rgb, **params) if preprocessor is not None else rgb
        for name, value in (("image", image), ("scale", scale), ("start", start), ("end", end)):
            object.__setattr__(self, name, value)
        object.__setattr__(self, "preprocessor", preprocessor)
        object.__setattr__(self, "preprocessor_params", params)
        object.__setattr__(self, "hint", np.ascontiguousarray(hint))

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) of the control image."""
        return int(self.hint.shape[1]), int(self.hint.shape[0])

    @classmethod
    def create(cls, value: Any) -> ControlUnit:
        """A unit from a ``ControlUnit``, a tuple ``(image, model, scale, start, end,
        preprocessor)`` (everything after ``model`` optional) or a dict (module docstring)."""
        if isinstance(value, ControlUnit):
            return value
        if isinstance(value, Mapping):
            named = {A1111_KEYS.get(str(k), str(k)): v for k, v in value.items()}
            unknown = [k for k in named if k not in FIELDS]
            if unknown:
                raise InputError(f"unknown ControlNet unit key {unknown[0]!r}; keys: {', '.join(FIELDS)}")
            return cls(**named)
        if isinstance(value, (tuple, list)) and 1 <= len(value) <= 6:
            return cls(**dict(zip(FIELDS, value, strict=False)))
        raise InputError(
            "a ControlNet unit is a ControlUnit, a dict or a tuple (image, model, scale, start, end, "
            f"preprocessor), not {type(value).__name__}"
        )


def control_units(value: Any) -> tuple[ControlUnit, ...]:
    """The request's ``control`` field: a list of units (or one ``ControlUnit`` or dict)."""
    if value is None:
        return ()
    if isinstance(value, (ControlUnit, Mapping)):
        return (ControlUnit.create(value),)
    if not isinstance(value, (list, tuple)):
        raise InputError(f"control must be a list of ControlNet units, not {type(value).__name__}")
    if value and _image_like(value[0]):
        raise InputError("control must be a list of ControlNet units: wrap a single tuple unit in a list")
    return tuple(ControlUnit.create(unit) for unit in value)


def _image_like(value: Any) -> bool:
    from PIL import Image

    return isinstance(value, (str, os.PathLike, np.ndarray, Image.Image))


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool):
        raise InputError(f"a ControlNet unit's {what} must be a number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InputError(f"a ControlNet unit's {what} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise InputError(f"a ControlNet unit's {what} must be finite, got {value!r}")
    return number
