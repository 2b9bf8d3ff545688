"""Checking a generation request's scalar arguments before any model is loaded or run."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from sdkit.errors import InputError


@dataclass(frozen=True)
class Request:
    """The checked, canonical form of a request's scalar arguments."""

    steps: int
    num_images: int
    guidance_scale: float
    strength: float
    sampler: str
    schedule: str


def as_float(value: Any, what: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{what} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise InputError(f"{what} must be a finite number, got {value!r}")
    return number


def check_request(
    *,
    steps: Any,
    width: Any,
    height: Any,
    sampler: str,
    schedule: str | None,
    guidance_scale: Any,
    strength: Any,
    num_images: Any,
    img2img: bool,
) -> Request:
    """Check a request's scalar arguments without loading anything (the CLI calls it before
    loading the model, so a typo fails in a second, not after compiling)."""
    from sdkit.schedulers import resolve

    checked_steps = as_int(steps, "steps", 1)
    count = as_int(num_images, "num_images", 1)
    for value, what in ((width, "width"), (height, "height")):
        if value is not None and as_int(value, what, 8) % 8:
            raise InputError(f"{what} must be a multiple of 8, got {value}")
    scale = as_float(guidance_scale, "guidance_scale")
    denoise = as_float(strength, "strength")
    if img2img and not 0.0 < denoise <= 1.0:
        raise InputError(f"strength must be in (0, 1], got {strength!r}")
    canonical, resolved = resolve(sampler, schedule)
    return Request(checked_steps, count, scale, denoise, canonical, resolved)


def as_int(value: Any, what: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < minimum:
        raise InputError(f"{what} must be an integer >= {minimum}, got {value!r}")
    return int(value)
